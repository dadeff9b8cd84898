"""Run-time workarounds that let vLLM 0.32's CPU wheel serve DeepSeek-V4
(`DeepseekV4ForCausalLM`, vllm/models/deepseek_v4/cpu/) without changing vLLM's files.
Installed by sitecustomize.py (this directory is first on the engines' PYTHONPATH, so every
process vLLM spawns, engine core and workers alike, gets them); nothing happens until the
modules concerned are imported, so engines of other models pay one meta-path entry and no
import.

Two things stop the wheel's first DeepSeek-V4 request (shared/VLLM.md, "DeepSeek-V4 on CPU"):

1. `TypeError: 'function' object is not subscriptable` (v1/attention/ops/metadata.py).
   The attention metadata builders of the sparse-SWA, sparse-MLA, compressor and indexer
   layers launch Triton kernels, and on x86 vLLM expects triton-cpu, which PyPI does not
   have: with Triton disabled (`vllm.triton_utils.HAS_TRITON` false), `triton.jit` leaves
   plain functions, and `kernel[grid](...)` fails. vLLM's own hook for this case,
   `vllm.triton_utils.dispatcher.register_kernels` (what CpuPlatform.
   register_triton_kernel_overrides uses for the kernels it ports), replaces them here:
   - `metadata._token_request_mapping_kernel` (token -> request index, read by the
     compressors and the sparse-MLA layers) and
     `compressor_utils.CompressedSlotMappingKernel.kernel` (where each compressed state is
     written: the C4A/C128A KV caches and the indexer's K cache) get plain torch
     equivalents, line for line the kernels' arithmetic.
   - The SWA-index kernel (`ComputeSWAIndicesAndLensKernel`), the prefill-gather-length
     kernel (`ComputePrefillMetadataKernel`) and the indexer's metadata kernels
     (`PrepareUniformDecodeKernel`, `BuildPrefillChunkMetadataKernel`,
     `metadata._indexer_decode_metadata_kernel`) become no-ops. Their outputs are never
     read on CPU: DeepseekV4CPUAttention reads only the SWA metadata's block table, slot
     mapping, token-to-request map and block size, and recomputes its windows and top-k
     from the positions (models/deepseek_v4/cpu/cpu_sparse.py, cpu_mla.py); and the CPU
     indexer takes its short-context path (every compressed token selected, topk filled
     from the positions, the indexer kernels not run) whenever
     max_seq_len // 4 <= index_topk, which holds for every request while
     max_model_len <= 4 * index_topk (2,048 for the test model's index_topk 512). A model
     served with a longer max_model_len would need the real indexer metadata.
   They are registered when their module is first imported (before any launch, and before
   any other module copies a kernel by name; register_kernels also rebinds copies), and
   only while Triton is disabled: with triton-cpu the kernels run as they are. Registering
   at import rather than in the platform's register_triton_kernel_overrides keeps engines
   that never import these modules free of them; the platform's own overrides name other
   kernels, so the order between the two does not matter.

2. `KeyError: 'c1a'` (v1/attention/backends/mla/sparse_swa.py). The shared SWA builder
   reads five per-layer-type tile-scheduler entries (swaonly, c4a, c128a, c1a, c2a), and
   the CPU builder's `build_tile_scheduler` (models/deepseek_v4/cpu/cpu_mla.py) returns
   only the first three. On CPU each entry is None (CPU never runs FlashMLA's tile
   scheduler, the shared base's own CPU branch returns all five as None), so returning
   all five keys, the missing ones None, is exactly the intended value.

Both are bugs of the 0.32 CPU wheel, not kvx's: without them the engine fails at its first
request whatever its KV connector."""

import importlib.abc
import importlib.util
import sys

_METADATA = "vllm.v1.attention.ops.metadata"
_COMPRESSOR_UTILS = "vllm.v1.attention.backends.mla.compressor_utils"
_SPARSE_SWA = "vllm.v1.attention.backends.mla.sparse_swa"
_INDEXER = "vllm.v1.attention.backends.mla.indexer"
_CPU_MLA = "vllm.models.deepseek_v4.cpu.cpu_mla"


def _triton_disabled():
    from vllm.triton_utils import HAS_TRITON

    return not HAS_TRITON


def _noop(*args, **kwargs):
    """A replaced kernel whose outputs the CPU forward never reads (module docstring)."""
    return None


def token_request_mapping(query_start_loc, output, num_reqs, num_mapped, num_tokens,
                          **launch_options):
    """metadata._token_request_mapping_kernel in torch: for each of the first `num_tokens`
    tokens, the request whose query holds it (the last request whose start is at or before
    it; zero-length padding requests are skipped like the kernel's binary search skips
    them), clamped to num_reqs - 1; tokens at or past `num_mapped` map to 0."""
    import torch

    num_reqs, num_mapped, num_tokens = int(num_reqs), int(num_mapped), int(num_tokens)
    if num_tokens <= 0:
        return
    token = torch.arange(num_tokens, dtype=query_start_loc.dtype,
                         device=query_start_loc.device)
    ends = query_start_loc[1:num_reqs + 1].contiguous()
    req = torch.searchsorted(ends, token, right=True).clamp_(max=max(num_reqs - 1, 0))
    req = torch.where(token < num_mapped, req, torch.zeros_like(req))
    output[:num_tokens] = req.to(output.dtype)


def compressed_slot_mapping(compressed_slot_mapping_ptr, slot_mapping_ptr,
                            query_start_loc_ptr, seq_lens_ptr, block_table_ptr,
                            block_table_stride, block_size, dcp_world_size, cp_interleave,
                            COMPRESS_RATIO, PAD_ID, TRITON_BLOCK_SIZE):
    """compressor_utils.CompressedSlotMappingKernel.kernel in torch (one program per row of
    the block table there): every COMPRESS_RATIO-th position writes its compressed state,
    to the slot of compressed position pos // COMPRESS_RATIO (DCP-local) in its request's
    blocks; other tokens, and tokens whose own slot is PAD (SWA bounded replay), get PAD.
    The caller filled the output with PAD beforehand; only the requests' tokens are
    written, as by the kernel."""
    import torch

    device = query_start_loc_ptr.device
    num_reqs = min(block_table_ptr.shape[0], query_start_loc_ptr.shape[0] - 1)
    if num_reqs <= 0:
        return
    qsl = query_start_loc_ptr[:num_reqs + 1].to(torch.int64)
    lens = (qsl[1:] - qsl[:-1]).clamp(min=0)
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), lens)
    if req.numel() == 0:
        return
    offset = torch.arange(req.numel(), device=device) - (
        torch.cumsum(lens, 0) - lens)[req]
    token = qsl[req] + offset
    pos = seq_lens_ptr[:num_reqs].to(torch.int64)[req] - lens[req] + offset
    slot = slot_mapping_ptr[token]
    ratio, pad = int(COMPRESS_RATIO), int(PAD_ID)
    valid = ((pos + 1) % ratio == 0) & (slot != pad)
    interleave, world = int(cp_interleave), int(dcp_world_size)
    local_pos = pos // (interleave * world) * interleave + pos % interleave
    compressed = local_pos // ratio
    block_id = torch.where(valid, compressed // int(block_size), torch.zeros_like(compressed))
    block_number = block_table_ptr[req, block_id].to(torch.int64)
    slot_id = block_number * int(block_size) + compressed % int(block_size)
    compressed_slot_mapping_ptr[token] = torch.where(
        valid, slot_id, torch.full_like(slot_id, pad)).to(compressed_slot_mapping_ptr.dtype)


def _register(overrides):
    if not _triton_disabled():
        return
    import warnings

    from vllm.triton_utils.dispatcher import register_kernels

    with warnings.catch_warnings():  # its scan of sys.modules touches deprecated names
        warnings.simplefilter("ignore", FutureWarning)
        register_kernels(overrides)


def _patch_metadata(module):
    _register({
        _METADATA + "._token_request_mapping_kernel": token_request_mapping,
        _METADATA + "._indexer_decode_metadata_kernel": _noop,
    })


def _patch_compressor_utils(module):
    _register({_COMPRESSOR_UTILS + ".CompressedSlotMappingKernel.kernel":
               compressed_slot_mapping})


def _patch_sparse_swa(module):
    _register({
        _SPARSE_SWA + ".ComputeSWAIndicesAndLensKernel.kernel": _noop,
        _SPARSE_SWA + ".ComputePrefillMetadataKernel.kernel": _noop,
    })


def _patch_indexer(module):
    _register({
        _INDEXER + ".PrepareUniformDecodeKernel.kernel": _noop,
        _INDEXER + ".BuildPrefillChunkMetadataKernel.kernel": _noop,
    })


def _patch_cpu_mla(module):
    from vllm.v1.attention.backends.mla import sparse_swa

    builder = module.DeepseekV4CPUSparseSWAMetadataBuilder
    keys = [getattr(sparse_swa, name) for name in dir(sparse_swa)
            if name.startswith("_LAYER_TYPE_")]

    def build_tile_scheduler(self, num_decode_tokens):
        """All five layer types' entries, each None: CPU runs no FlashMLA tile scheduler."""
        return dict.fromkeys(keys)

    builder.build_tile_scheduler = build_tile_scheduler


_PATCHES = {
    _METADATA: _patch_metadata,
    _COMPRESSOR_UTILS: _patch_compressor_utils,
    _SPARSE_SWA: _patch_sparse_swa,
    _INDEXER: _patch_indexer,
    _CPU_MLA: _patch_cpu_mla,
}


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the module's patch."""

    def __init__(self, loader, patch):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the patched modules through the other finders and wraps their loaders."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, patch)
        return spec


def install():
    """Once per process; modules imported already are patched now."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())
