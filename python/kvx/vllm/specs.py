"""vLLM's KV cache specs as the connector reads them: each layer's own spec (inside a group's
UniformTypeKVCacheSpecs too), its kvx view kind, and per transfer group what of a request's
block list moves (a sliding window's tail, a mamba group's running state, a ring's block).

Spec classes are matched by name along the MRO, so this module imports no vLLM and the unit
tests can stand in for vLLM's classes with their own of the same names."""


def _is(spec, *class_names):
    return any(cls.__name__ in class_names for cls in type(spec).__mro__)


def layer_specs(group_spec, layer_names):
    """{layer: its own spec} of one KV cache group: a UniformTypeKVCacheSpecs group (one
    spec per layer, DeepSeek-V4's groups) or one spec shared by every layer of the group."""
    inner = getattr(group_spec, "kv_cache_specs", None)
    if _is(group_spec, "UniformTypeKVCacheSpecs") and isinstance(inner, dict):
        return dict(inner)
    return dict.fromkeys(layer_names, group_spec)


def transfer_layer_specs(kv_cache_config):
    """{layer: (transfer group index, its own spec)} over the groups vLLM transfers."""
    out = {}
    for index, group in enumerate(kv_cache_config.transfer_groups):
        for layer, spec in layer_specs(group.kv_cache_spec, group.layer_names).items():
            out[layer] = (index, spec)
    return out


# vLLM's spec classes, most specific first, to kvx's view kinds (spec/regions.md): a
# compressor ring is scratch (never a packed row's cover), a TP-replicated mamba state is ple
_KINDS = (
    ("CircularBufferSpec", "scratch"),
    ("MambaSpec", "mamba"),
    ("SlidingWindowMLASpec", "swa_mla"),
    ("SlidingWindowSpec", "swa"),
    ("MLAAttentionSpec", "mla"),
    ("FullAttentionSpec", "attn"),
)


def view_kind(spec):
    """The kvx view kind of one layer's vLLM KV cache spec; ValueError, naming the class,
    for a spec kvx cannot move (cross-attention, chunked local attention, ...)."""
    for name, kind in _KINDS:
        if _is(spec, name):
            if kind == "mamba" and getattr(spec, "tp_replicated", False):
                return "ple"
            return kind
    raise ValueError("kvx: KV cache spec %s is not supported (full, sliding-window, MLA, "
                     "compressor-ring and mamba caches are)" % type(spec).__name__)


def is_ring(spec):
    return _is(spec, "CircularBufferSpec")


def group_window_blocks(group):
    """Blocks of a sliding-window group that D needs: cdiv(window, the group's own block
    size) + 1 (a window need not start at a block's edge), or 0 for a group that keeps every
    block. Only a real sliding-window spec class clips: with the hybrid manager off, vLLM
    folds sliding-window layers into a full-attention group whose spec still carries a
    `sliding_window` attribute, and those layers read every block."""
    specs = list(layer_specs(group.kv_cache_spec, group.layer_names).values())
    if not specs or not all(_is(s, "SlidingWindowSpec") for s in specs):
        return 0
    windows = {int(s.sliding_window) for s in specs}
    sizes = {int(s.block_size) for s in specs}
    if len(windows) != 1 or len(sizes) != 1:
        return 0  # layers that disagree: move every block rather than guess
    window, block_size = windows.pop(), sizes.pop()
    return -(-window // block_size) + 1


def group_mamba_scratch(group):
    """A mamba group's speculative scratch slots (its blocks are [superseded states...,
    the running state, scratch...]); None for any other group."""
    specs = list(layer_specs(group.kv_cache_spec, group.layer_names).values())
    if specs and all(_is(s, "MambaSpec") for s in specs):
        return int(getattr(specs[0], "num_speculative_blocks", 0))
    return None


# specs whose i-th block holds the tokens [i * block_size, (i + 1) * block_size) for sure
_TOKEN_ROWS = ("FullAttentionSpec", "SlidingWindowSpec", "MLAAttentionSpec")


def group_tokens_per_block(group):
    """Tokens per block of a group whose block list indexes token positions (full, sliding-
    window and MLA attention, exactly those classes, uncompressed), so that a prefix of the
    tokens is a prefix of the list; None where that is not known (compressed or ring
    caches, mamba states, layers that disagree)."""
    specs = list(layer_specs(group.kv_cache_spec, group.layer_names).values())
    if not specs or any(type(s).__name__ not in _TOKEN_ROWS or
                        getattr(s, "compress_ratio", 1) not in (None, 1) for s in specs):
        return None
    sizes = {int(s.block_size) for s in specs}
    return sizes.pop() if len(sizes) == 1 else None
