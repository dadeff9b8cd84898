"""vLLM's KV cache as a kvx layout: the tensors register_kv_caches receives and the
KVCacheConfig they came from, turned into storages and views (docs/layout-format.md).

No planning here: kvx folds aliased views into regions itself (spec/regions.md). This module
only describes what vLLM allocated, byte for byte, and refuses what it cannot describe."""

from collections import OrderedDict

# vLLM's KV cache spec classes, most specific first, to kvx's view kinds. Matched by class
# name along the spec's MRO so that this module needs no vLLM import.
_KINDS = (
    ("MambaSpec", "mamba"),
    ("SlidingWindowMLASpec", "swa_mla"),
    ("SlidingWindowSpec", "swa"),
    ("MLAAttentionSpec", "mla"),
    ("FullAttentionSpec", "attn"),
)


def view_kind(spec):
    """The kvx view kind of a vLLM KV cache spec; ValueError for a spec kvx cannot move."""
    names = [cls.__name__ for cls in type(spec).__mro__]
    for name, kind in _KINDS:
        if name in names:
            return kind
    raise ValueError("kvx: KV cache spec %s is not supported (full, sliding-window, MLA and "
                     "mamba attention are)" % type(spec).__name__)


def _heads(spec, kind):
    if kind in ("mla", "swa_mla", "mamba"):
        return 1
    return max(1, int(getattr(spec, "num_kv_heads", 1)))


def _tensors(value):
    """A layer's cache: one tensor, or several (mamba's conv and ssm states)."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _block_views(t, num_blocks):
    """(offset from the tensor's start, page, stride) in bytes of each view of tensor `t`:
    one for a block-major tensor [num_blocks, ...], two for [2 (K, V), num_blocks, ...]."""
    esize = t.element_size()
    if t.dim() >= 1 and t.shape[0] == num_blocks:
        parts, block_dim = [0], 0
    elif t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == num_blocks:
        parts, block_dim = [0, t.stride(0) * esize], 1
    else:
        raise ValueError("kvx: a KV cache tensor of shape %s has no dimension of %d blocks "
                         "first (or second, after K and V)" % (tuple(t.shape), num_blocks))
    block = t.select(block_dim, 0)
    if block_dim == 1:
        block = block.select(0, 0)
    if not block.is_contiguous():
        raise ValueError("kvx: a block of the KV cache tensor of shape %s is not contiguous "
                         "(strides %s)" % (tuple(t.shape), t.stride()))
    page = block.numel() * esize
    return [(part, page, t.stride(block_dim) * esize) for part in parts]


def model_identity(vllm_config):
    """The model fields of the compatibility hash (docs/wire.md): P and D must agree."""
    mc = vllm_config.model_config
    name = mc.served_model_name
    if isinstance(name, (list, tuple)):
        name = name[0]
    return {
        "id": str(name or mc.model)[:255],
        "revision": str(mc.revision or "")[:255],
        "dtype": str(mc.dtype).replace("torch.", ""),
        "cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "kv_heads": int(mc.get_total_num_kv_heads()),
        "head_size": int(mc.get_head_size()),
        "layers": int(mc.get_total_num_hidden_layers()),
    }


def build(kv_caches, kv_cache_config, vllm_config):
    """(layout dict, {storage name: memory}) for kvx.Agent: one storage per distinct untyped
    storage (registered in place, no copy), one view per layer (two for split K and V) with
    its transfer group's number, kind and heads."""
    num_blocks = kv_cache_config.num_blocks
    group_of = kv_cache_config.transfer_group_index_by_layer
    spec_of = {}
    for group in kv_cache_config.kv_cache_groups:
        for layer in group.layer_names:
            spec_of[layer] = group.kv_cache_spec
    block_size = int(vllm_config.cache_config.block_size)
    storages = OrderedDict()  # storage base address -> (name, size, memory, mem, device)
    views = []
    for layer, value in kv_caches.items():
        if layer not in group_of:
            continue  # a group vLLM does not transfer (its KVCacheConfig says so)
        spec = spec_of[layer]
        kind = view_kind(spec)
        # a mamba block is one request's state, whatever its spec's token count (vLLM gives
        # it max_model_len without prefix caching): its page is what moves
        if kind != "mamba" and getattr(spec, "block_size", block_size) != block_size:
            raise ValueError("kvx: layer %s has blocks of %d tokens, the engine %d: one block "
                             "size for every group is supported" % (layer, spec.block_size,
                                                                    block_size))
        for t in _tensors(value):
            storage = t.untyped_storage()
            base = storage.data_ptr()
            if base not in storages:
                storages[base] = ("kv_cache%d" % len(storages), storage.nbytes(), t,
                                  "vram" if t.device.type == "cuda" else "dram",
                                  t.device.index or 0)
            name = storages[base][0]
            for part, page, stride in _block_views(t, num_blocks):
                views.append({"name": layer, "group": group_of[layer], "kind": kind,
                              "storage": name, "offset": t.data_ptr() - base + part,
                              "page": page, "stride": stride, "num_blocks": num_blocks,
                              "heads": _heads(spec, kind)})
    if not views:
        raise ValueError("kvx: the engine registered no KV cache tensor of a transfer group")
    layout = {
        "kvx_layout": 1,
        "block_size": block_size,
        "model": model_identity(vllm_config),
        "storages": [{"name": name, "size": size, "mem": mem, "device": device}
                     for name, size, _, mem, device in storages.values()],
        "views": views,
    }
    memory = {name: _whole_storage(t) for name, _, t, _, _ in storages.values()}
    return layout, memory


def _whole_storage(t):
    """The engine's whole storage behind tensor `t` as bytes kvx registers in place: a numpy
    view for host memory, a uint8 CUDA tensor (__cuda_array_interface__) for GPU memory."""
    import torch

    whole = torch.empty(0, dtype=torch.uint8, device=t.device)
    whole.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes(),), (1,))
    return whole if t.device.type == "cuda" else whole.numpy()
