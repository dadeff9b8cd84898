"""vLLM's KV cache as a kvx layout: the tensors register_kv_caches receives and the
KVCacheConfig they came from, turned into storages and views (docs/layout-format.md).

No planning here: kvx folds aliased views into regions itself (spec/regions.md). This module
only describes what vLLM allocated, byte for byte, and refuses what it cannot describe."""

from collections import OrderedDict

from .specs import is_ring, transfer_layer_specs, view_kind


def _heads(spec, kind):
    if kind in ("mla", "swa_mla", "mamba", "ple", "scratch"):
        return 1
    return max(1, int(getattr(spec, "num_kv_heads", 1)))


def _tensors(value):
    """A layer's cache: one tensor, or several (mamba's conv and ssm states)."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _block_extent(block, esize):
    """Bytes from a block's first byte to just past its last: its data span, whatever its
    strides (a narrower view of a wider row is not contiguous)."""
    if block.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(block.shape, block.stride())) + 1) * esize


def _block_views(t, num_blocks, spec_page=None):
    """(offset from the tensor's start, page, stride, dense) in bytes of each view of tensor
    `t`: one for a block-major tensor [num_blocks, ...], two for [2 (K, V), num_blocks, ...].

    A block-major view's page is the page vLLM sized for it (`spec_page`, the layer spec's
    page_size_bytes, padding included) whenever the block's data lies inside it and it fits
    the stride: kvx's region rules then see the padded pages of a packed row and register
    the whole row once (spec/regions.md step 2), as vLLM's own NIXL connector does. `dense`
    says whether the block is exactly its page, one contiguous run. Without a spec page (K
    and V apart, mamba states) the page is the block's contiguous data."""
    esize = t.element_size()
    if t.dim() >= 1 and t.shape[0] == num_blocks:
        parts, block_dim = [0], 0
    elif t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == num_blocks:
        parts, block_dim, spec_page = [0, t.stride(0) * esize], 1, None
    else:
        raise ValueError("kvx: a KV cache tensor of shape %s has no dimension of %d blocks "
                         "first (or second, after K and V)" % (tuple(t.shape), num_blocks))
    block = t.select(block_dim, 0)
    if block_dim == 1:
        block = block.select(0, 0)
    stride = t.stride(block_dim) * esize
    extent = _block_extent(block, esize)
    contiguous = block.is_contiguous()
    if extent and spec_page is not None and extent <= spec_page <= stride:
        page = spec_page
    elif extent and contiguous:
        page = extent
    else:
        raise ValueError("kvx: a block of the KV cache tensor of shape %s is not contiguous "
                         "(strides %s) and its spec's page (%s bytes) does not hold it"
                         % (tuple(t.shape), t.stride(), spec_page))
    dense = contiguous and extent == page
    return [(part, page, stride, dense) for part in parts]


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


def _group_block_sizes(kv_cache_config, block_size):
    """The transfer groups' block sizes, as text for the compatibility hash, when one differs
    from the engine's (DeepSeek-V4: 64, 4 and 8 beside 256); else None. Such a group's block
    id names a row of the shared storage, so P and D must agree on every group's block size,
    not only the engine's: a P/D pair that differs is refused at the handshake, naming it."""
    sizes = [int(g.kv_cache_spec.block_size) for g in kv_cache_config.transfer_groups]
    if all(size == block_size for size in sizes):
        return None
    return "kv cache group block sizes " + ",".join(map(str, sizes))


def build(kv_caches, kv_cache_config, vllm_config):
    """(layout dict, {storage name: memory}) for kvx.Agent: one storage per distinct untyped
    storage (registered in place, no copy), one view per layer (two for split K and V) with
    its transfer group's number, its own spec's kind, heads and padded page.

    A group's blocks may hold another number of tokens than the engine's block size (the
    group's own spec says how many): a block id names block b of each of the group's views,
    whatever it holds, so only the window clipping (scheduler.py) reads that size."""
    num_blocks = kv_cache_config.num_blocks
    specs = transfer_layer_specs(kv_cache_config)
    block_size = int(vllm_config.cache_config.block_size)
    storages = OrderedDict()  # storage base address -> (name, size, memory, mem, device)
    views = []
    for layer, value in kv_caches.items():
        if layer not in specs:
            continue  # a group vLLM does not transfer (its KVCacheConfig says so)
        group, spec = specs[layer]
        kind = view_kind(spec)
        # a mamba block is one request's state, whatever its spec's token count; its conv and
        # ssm tensors are views of their own, so the spec's page (their sum) is no one's
        spec_page = None if kind in ("mamba", "ple") else int(spec.page_size_bytes)
        for t in _tensors(value):
            storage = t.untyped_storage()
            base = storage.data_ptr()
            if base not in storages:
                storages[base] = ("kv_cache%d" % len(storages), storage.nbytes(), t,
                                  "vram" if t.device.type == "cuda" else "dram",
                                  t.device.index or 0)
            name = storages[base][0]
            for part, page, stride, dense in _block_views(t, num_blocks, spec_page):
                views.append({"name": layer, "group": group, "kind": kind, "storage": name,
                              "offset": t.data_ptr() - base + part, "page": page,
                              "stride": stride, "num_blocks": num_blocks, "dense": dense,
                              "heads": _heads(spec, kind)})
    if not views:
        raise ValueError("kvx: the engine registered no KV cache tensor of a transfer group")
    model = model_identity(vllm_config)
    sizes = _group_block_sizes(kv_cache_config, block_size)
    if sizes is not None:
        model["backend"] = sizes
    layout = {
        "kvx_layout": 1,
        "block_size": block_size,
        # compressor rings (CircularBufferSpec): attention and state aliases of one row stay
        # apart unless a packed MLA row covers them (spec/regions.md step 2)
        "csa_linear": any(is_ring(spec) for _, spec in specs.values()),
        "model": model,
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
