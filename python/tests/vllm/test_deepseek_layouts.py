"""DeepSeek-V4 and V4.1 caches as vLLM hands them to register_kv_caches, built from vLLM's own
spec classes over one storage, and what the connector's layout makes of them (no engine).

V4 (dsv4_caches.json, recorded from vLLM 0.32's CPU build running the tiny V4 of models.py):
six KV cache groups overlaid in one 47,808-byte row; the connector must register what vLLM's
NIXL connector registers: one whole-row region, `mla,packed_row`, nine members.

V4.1 needs a GPU engine, but not its layout: swa caches (padded fp8 MLA pages), compressor
rings (CircularBufferSpec, fp32, narrower than the swa page, non-MLA) and indexer K caches
overlaid at each layer's offset of one block-major row. No wider page may ever be shortened by
a narrower alias, rings stay apart from the MLA pages they alias, and with whole-row regions
(spec/regions.md example 3) one packed row covers every shorter alias."""

import json
import os

import pytest
import torch

import kvx
from kvx.vllm import layout, specs

kv = pytest.importorskip("vllm.v1.kv_cache_interface")

HERE = os.path.dirname(os.path.abspath(__file__))
U8, F32 = torch.uint8, torch.float32


def vllm_config(block_size):
    import types

    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(block_size=block_size, cache_dtype="fp8_ds_mla"),
        model_config=types.SimpleNamespace(
            served_model_name="tiny-deepseek-v4", model="/m", revision=None,
            dtype=torch.bfloat16, get_total_num_kv_heads=lambda: 1, get_head_size=lambda: 512,
            get_total_num_hidden_layers=lambda: 3))


def views_of(storage, placements):
    """{layer: tensor}: each (layer, dtype, shape, byte strides, byte offset) a strided view
    of the one uint8 storage, as vLLM's block-outermost allocation makes them."""
    out = {}
    for name, dtype, shape, strides, offset in placements:
        esize = torch.tensor([], dtype=dtype).element_size()
        base = storage.view(dtype) if dtype != U8 else storage
        out[name] = torch.as_strided(base, shape, [s // esize for s in strides],
                                     offset // esize)
    return out


def regions_of(d):
    return list(kvx.Layout.from_dict(d).regions())


def assert_every_view_moves_whole(d, regions):
    """Each view's bytes of block b lie inside its region's bytes of block b (regions.md
    step 4, checked here from the connector's own layout): nothing is truncated."""
    views = {(v["name"], v["offset"]): v for v in d["views"]}
    for r in regions:
        for member in r.members:
            for v in (v for (n, _), v in views.items() if n == member):
                assert r.stride == v["stride"], (member, r)
                assert r.offset <= v["offset"] and \
                    v["offset"] + v["page"] <= r.offset + r.block_len, (member, r)


# ---- DeepSeek-V4, as recorded from the CPU engine ------------------------------------------

def v4_spec(fields):
    """vLLM's own spec class, made again from the recorded fields (the stride alignment, a
    kernel detail that sizes nothing here, left out), checked to size the same page."""
    import dataclasses

    cls = getattr(kv, fields["class"])
    args = {f.name: fields[f.name] for f in dataclasses.fields(cls)
            if f.init and f.name in fields and f.name != "block_stride_alignment"}
    args["dtype"] = getattr(torch, args["dtype"])
    spec = cls(**args)
    assert spec.page_size_bytes == fields["page_size_bytes"], fields
    return spec


def v4_recorded():
    with open(os.path.join(HERE, "dsv4_caches.json")) as f:
        return json.load(f)


def v4_cache(rec, num_blocks):
    """The recorded groups and views again, over a storage of `num_blocks` rows: what
    register_kv_caches receives, with KVCacheConfig's groups in vLLM's own classes."""
    groups = []
    for g in rec["groups"]:
        layer_specs = {name: v4_spec(f) for name, f in g["layer_specs"].items()}
        groups.append(kv.KVCacheGroupSpec(list(layer_specs), kv.UniformTypeKVCacheSpecs(
            block_size=g["spec"]["block_size"], kv_cache_specs=layer_specs)))
    config = kv.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                              kv_cache_groups=groups)
    row = rec["views"][0]["stride"][0] * rec["views"][0]["element_size"]
    storage = torch.zeros(num_blocks * row, dtype=U8)
    tensors = views_of(storage, [
        (v["name"], getattr(torch, v["dtype"]), [num_blocks] + v["shape"][1:],
         [st * v["element_size"] for st in v["stride"]], v["offset_bytes"])
        for v in rec["views"]])
    return tensors, config, storage, row


def test_v4_registers_one_packed_row_of_nine_members():
    rec = v4_recorded()
    assert rec["num_blocks"] * 47808 == rec["views"][0]["storage_nbytes"]  # vLLM's 1 GiB
    tensors, config, storage, row = v4_cache(rec, 64)
    assert row == 47808
    d, memory = layout.build(tensors, config, vllm_config(rec["cache_config_block_size"]))
    assert len(d["views"]) == 9 and {v["dense"] for v in d["views"]} == {False}
    assert not d["csa_linear"]
    regions = regions_of(d)
    assert [(r.offset, r.block_len, r.stride, r.group, r.mla, r.packed_row, len(r.members))
            for r in regions] == [(0, row, row, -1, True, True, 9)]
    assert sum(r.num_blocks for r in regions) == 64  # NIXL's table: one descriptor a row
    assert memory["kv_cache0"].nbytes == storage.numel()
    assert_every_view_moves_whole(d, regions)
    # a group's blocks hold their own number of tokens: P and D must agree on each
    assert d["model"]["backend"] == "kv cache group block sizes " + ",".join(
        str(g["spec"]["block_size"]) for g in rec["groups"])


def test_v4_windows_clip_in_each_groups_own_block_size():
    rec = v4_recorded()
    _, config, _, _ = v4_cache(rec, 8)
    # the swa caches: a 128-token window in 64-token blocks; the compressed MLA and indexer
    # group keeps every block; the compressor states: windows of 8 and 128 tokens in blocks
    # of 4 and 8
    assert [specs.group_window_blocks(g) for g in config.transfer_groups] == \
        [3, 3, 3, 0, 3, 17]


# ---- DeepSeek-V4.1's layout, without an engine ---------------------------------------------

SWA_PAGE, RING_PAGE = 37440, 32768  # the padded fp8 MLA page; a ring of 8 fp32 rows of 1024


def v41_specs():
    swa = kv.SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=512, dtype=U8,
                                  sliding_window=128, cache_dtype_str="fp8_ds_mla",
                                  alignment=576, model_version="deepseek_v4",
                                  state_content_bytes=584)
    ring = kv.CircularBufferSpec(block_size=8, num_kv_heads=1, head_size=1024, head_size_v=0,
                                 dtype=F32)
    indexer = kv.MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype=U8,
                                  model_version="deepseek_v4")
    assert (swa.page_size_bytes, swa.real_page_size_bytes) == (SWA_PAGE, 37376)
    assert ring.page_size_bytes == RING_PAGE and indexer.page_size_bytes == 8448
    return swa, ring, indexer


def v41_cache(layers=3, num_blocks=16):
    """Each layer's swa cache, compressor ring and indexer K cache at the layer's offset of
    one block-major row (three groups overlaid, as vLLM's block-outermost allocation of
    V4.1 places them); the swa and indexer groups wrapped as UniformTypeKVCacheSpecs."""
    swa, ring, indexer = v41_specs()
    row = layers * SWA_PAGE
    names = {kind: ["layers.%d.attn.%s" % (i, kind) for i in range(layers)]
             for kind in ("swa_cache", "compressor.state_cache", "indexer.k_cache")}
    groups = [
        kv.KVCacheGroupSpec(names["swa_cache"], kv.UniformTypeKVCacheSpecs(
            block_size=64, kv_cache_specs=dict.fromkeys(names["swa_cache"], swa))),
        kv.KVCacheGroupSpec(names["compressor.state_cache"], ring),
        kv.KVCacheGroupSpec(names["indexer.k_cache"], kv.UniformTypeKVCacheSpecs(
            block_size=64, kv_cache_specs=dict.fromkeys(names["indexer.k_cache"], indexer))),
    ]
    config = kv.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    storage = torch.zeros(num_blocks * row, dtype=U8)
    placements = []
    for i in range(layers):
        at = i * SWA_PAGE
        placements += [
            (names["swa_cache"][i], U8, [num_blocks, 1, 64, 584], [row, 0, 584, 1], at),
            (names["compressor.state_cache"][i], F32, [num_blocks, 1, 8, 1024],
             [row, 0, 4096, 4], at),
            (names["indexer.k_cache"][i], U8, [num_blocks, 1, 64, 132], [row, 0, 132, 1], at),
        ]
    return views_of(storage, placements), config, row


def test_v41_rings_and_narrow_aliases_never_shorten_a_wider_page():
    tensors, config, row = v41_cache()
    d, _ = layout.build(tensors, config, vllm_config(64))
    assert d["csa_linear"]  # a CircularBufferSpec group
    kinds = {v["name"]: (v["kind"], v["page"], v["dense"]) for v in d["views"]}
    assert kinds["layers.0.attn.swa_cache"] == ("swa_mla", SWA_PAGE, False)
    assert kinds["layers.0.attn.compressor.state_cache"] == ("scratch", RING_PAGE, True)
    assert kinds["layers.0.attn.indexer.k_cache"] == ("mla", 8448, True)
    regions = regions_of(d)
    # three aliases at each layer's base, three lengths: three regions, none truncated
    assert sorted((r.offset, r.block_len) for r in regions) == sorted(
        (i * SWA_PAGE, n) for i in range(3) for n in (SWA_PAGE, RING_PAGE, 8448))
    for r in regions:
        assert r.stride == row and not r.packed_row
        assert r.scratch == all(".compressor." in m for m in r.members)  # rings apart
    assert_every_view_moves_whole(d, regions)


def test_v41_whole_row_covers_its_shorter_aliases():
    """The same cache with whole-row regions (regions.md example 3): every swa and indexer
    page is a whole row of the block, and the ring at the row's base, shorter and not MLA,
    joins that packed row; the other layers' rings start inside the row, not at its base, so
    they stay regions of their own (their bytes move once: docs/plan.md "Each byte once")."""
    tensors, config, row = v41_cache()
    d, _ = layout.build(tensors, config, vllm_config(64))
    d["whole_row_regions"] = True
    regions = regions_of(d)
    assert [(r.offset, r.block_len, r.stride, r.group, r.packed_row, r.scratch, len(r.members))
            for r in regions] == [(0, row, row, -1, True, True, 7),
                                  (SWA_PAGE, RING_PAGE, row, 1, False, True, 1),
                                  (2 * SWA_PAGE, RING_PAGE, row, 1, False, True, 1)]
    assert "layers.0.attn.compressor.state_cache" in regions[0].members
    assert_every_view_moves_whole(d, regions)


def test_v41_ring_groups_move_their_one_block():
    _, config, _ = v41_cache()
    windows = [specs.group_window_blocks(g) for g in config.transfer_groups]
    assert windows == [3, 0, 0]  # the swa window in 64-token blocks; the ring is one block
