"""The connector's pure parts without an engine: vLLM's cache tensors to a kvx layout that kvx
itself accepts (layout.py), and kv_connector_extra_config checked by name (config.py)."""

import json
import types

import pytest
import torch

import kvx
from kvx.vllm import config, layout, params


class FullAttentionSpec:
    def __init__(self, heads=2, block_size=32, page=None):
        self.num_kv_heads, self.block_size = heads, block_size
        self.page_size_bytes = page or heads * block_size * 2 * 32 * 2  # K and V, bf16


class SlidingWindowSpec(FullAttentionSpec):
    sliding_window = 64


class MLAAttentionSpec(FullAttentionSpec):
    pass


class CrossAttentionSpec:
    block_size = 32


def cache_config(groups, num_blocks):
    """A KVCacheConfig's fields the layout reads: groups of (spec, layer names)."""
    kv_groups = [types.SimpleNamespace(kv_cache_spec=spec, layer_names=names)
                 for spec, names in groups]
    return types.SimpleNamespace(
        num_blocks=num_blocks, kv_cache_groups=kv_groups, transfer_groups=kv_groups,
        transfer_group_index_by_layer={n: g for g, (_, names) in enumerate(groups) for n in names})


VLLM_CONFIG = types.SimpleNamespace(
    cache_config=types.SimpleNamespace(block_size=32, cache_dtype="auto"),
    model_config=types.SimpleNamespace(
        served_model_name="tiny", model="/m", revision=None, dtype=torch.bfloat16,
        get_total_num_kv_heads=lambda: 2, get_head_size=lambda: 32,
        get_total_num_hidden_layers=lambda: 2))


def test_cpu_layer_views_of_one_storage_become_one_storage_and_fold_into_regions():
    """vLLM's CPU cache: one tensor per layer, [blocks, heads, block, 2 * head] of one
    storage, layer after layer (shared/VLLM.md): one storage, one view per layer."""
    blocks, per_layer = 10, 2 * 32 * 64
    whole = torch.zeros(2 * blocks * per_layer, dtype=torch.bfloat16)
    caches = {"l0": whole[:blocks * per_layer].view(blocks, 2, 32, 64),
              "l1": whole[blocks * per_layer:].view(blocks, 2, 32, 64)}
    d, memory = layout.build(caches, cache_config([(FullAttentionSpec(), ["l0", "l1"])], blocks),
                             VLLM_CONFIG)
    assert [s["size"] for s in d["storages"]] == [whole.numel() * 2]
    page = per_layer * 2
    assert [(v["offset"], v["page"], v["stride"], v["kind"], v["heads"]) for v in d["views"]] == [
        (0, page, page, "attn", 2), (blocks * page, page, page, "attn", 2)]
    assert memory["kv_cache0"].nbytes == whole.numel() * 2  # the whole storage, in place
    assert d["model"]["id"] == "tiny" and d["model"]["dtype"] == "bfloat16"
    regions = kvx.Layout.from_dict(d).regions()  # kvx accepts it
    assert len(regions) == 2


def test_split_k_and_v_give_two_views_per_layer_and_groups_keep_their_numbers():
    blocks = 8
    full = torch.zeros(2, blocks, 32, 2, 16, dtype=torch.float16)
    window = torch.zeros(2, blocks, 32, 2, 16, dtype=torch.float16)
    d, _ = layout.build({"full": full, "swa": window},
                        cache_config([(FullAttentionSpec(), ["full"]),
                                      (SlidingWindowSpec(), ["swa"])], blocks), VLLM_CONFIG)
    assert len(d["storages"]) == 2
    kv = [(v["name"], v["group"], v["kind"], v["offset"]) for v in d["views"]]
    half = blocks * 32 * 2 * 16 * 2
    assert kv == [("full", 0, "attn", 0), ("full", 0, "attn", half),
                  ("swa", 1, "swa", 0), ("swa", 1, "swa", half)]
    kvx.Layout.from_dict(d).regions()


def test_mla_is_one_head_and_unknown_specs_or_shapes_are_refused_by_name():
    assert layout.view_kind(MLAAttentionSpec()) == "mla"
    with pytest.raises(ValueError, match="CrossAttentionSpec"):
        layout.view_kind(CrossAttentionSpec())
    with pytest.raises(ValueError, match="no dimension of 10 blocks"):
        layout.build({"l0": torch.zeros(3, 4)},
                     cache_config([(FullAttentionSpec(), ["l0"])], 10), VLLM_CONFIG)


def test_extra_config_keys_are_checked_by_name():
    assert config.settings_from(None) == config.Settings()
    assert config.settings_from({"transfer_mode": "push", "lease_ms": 5}).lease_ms == 5
    for bad, part in [({"transfer_mod": "push"}, "unknown key 'transfer_mod'"),
                      ({"transfer_mode": "both"}, "transfer_mode"),
                      ({"timeout_ms": -1}, "timeout_ms"), ({"insecure": "yes"}, "insecure"),
                      ({"insecure": True, "auth_file": "/k"}, "choose one")]:
        with pytest.raises(ValueError, match=part):
            config.settings_from(bad)


def test_nixl_keys_switch_with_the_connector_name(caplog):
    """Issue 35 finding 9: a NixlConnector config is accepted: its lease (seconds) becomes
    kvx's, the keys kvx has no use for are said and ignored, and a disagreement is refused."""
    with caplog.at_level("WARNING", logger="vllm.kvx"):
        s = config.settings_from({"backends": ["UCX"], "kv_lease_duration": 45,
                                  "num_threads": 8, "engine_ttl": 600})
    assert s == config.Settings(lease_ms=45000, peer_ttl_ms=600000)
    assert "backends is NixlConnector's, ignored" in caplog.text
    assert "num_threads is NixlConnector's, ignored" in caplog.text
    for bad, part in [({"kv_lease_duration": 45, "lease_ms": 5}, "disagree"),
                      ({"kv_lease_duration": "long"}, "kv_lease_duration")]:
        with pytest.raises(ValueError, match=part):
            config.settings_from(bad)


def signed_params(key, addresses=("127.0.0.1:5000",), consumers=1, **changes):
    """P's params (signed with `key`, for `addresses` and `consumers`), then `changes`."""
    made = params.make(key, engine_id="e", request_id=7, token=bytes(range(1, 17)),
                       block_ids=[[3, 4]], addresses=list(addresses), num_tokens=40,
                       prompt_ids=list(range(40)), transfer_mode="pull", consumers=consumers)
    made.update(changes)
    return made


def test_params_d_accepts_only_what_a_p_of_the_deployment_signed_for_this_prompt():
    """Issue 35 finding 5: kv_transfer_params are accepted only signed with the deployment's
    key, unchanged (through JSON, as a router passes them), for this prompt and its token
    count, with a real token; without a key (insecure) the rest is still checked."""
    key, digest = params.signing_key(b"s" * 32), params.prompt_digest(list(range(40)))
    good = json.loads(json.dumps(signed_params(key)))
    assert params.refusal(key, good, digest, 40) is None
    assert "not signed" in params.refusal(params.signing_key(b"t" * 32), good, digest, 40)
    for change in ({"remote_block_ids": [[5, 6]]}, {"remote_request_id": 8},
                   {"remote_addresses": ["10.0.0.1:1"]}, {"signature": None}):
        assert "not signed" in params.refusal(key, dict(good, **change), digest, 40), change
    assert "another prompt" in params.refusal(key, good, params.prompt_digest([1]), 40)
    assert "generated past the prompt" in params.refusal(key, good, digest, 39)
    assert "not kvx's" in params.refusal(key, dict(good, kvx=2), digest, 40)
    unsigned = signed_params(None, remote_token="00" * 16)
    assert "signature" not in unsigned
    assert "no hold token" in params.refusal(None, unsigned, digest, 40)
    assert params.refusal(None, signed_params(None), digest, 40) is None
    assert "block ids" in params.refusal(None, signed_params(None, remote_block_ids=[[-1]]),
                                         digest, 40)


def test_holds_wait_for_as_many_dones_as_d_has_ranks_per_p_rank():
    """Issue 35 finding 11: a P told its Ds' TP (decode_tp_size) holds each request for
    decode / prefill dones per rank and signs that count; D refuses params whose holds would
    wait for another number of its ranks (fewer: P would free blocks another rank still
    reads), and TP sizes of which neither divides the other."""
    assert config.consumers_per_rank(config.Settings(), 2) == 1
    assert config.consumers_per_rank(config.Settings(decode_tp_size=4), 2) == 2
    assert config.consumers_per_rank(config.Settings(decode_tp_size=1), 2) == 1
    with pytest.raises(ValueError, match="neither is a multiple"):
        config.consumers_per_rank(config.Settings(decode_tp_size=3), 2)
    with pytest.raises(ValueError, match="not a TP size"):
        config.settings_from({"decode_tp_size": 0})
    key, digest = params.signing_key(b"s" * 32), params.prompt_digest(list(range(40)))
    one_rank = signed_params(key)  # P of TP 1, holds for one done
    assert params.refusal(key, one_rank, digest, 40, decode_tp=1) is None
    assert "decode_tp_size to 2 on P" in params.refusal(key, one_rank, digest, 40, decode_tp=2)
    two = signed_params(key, consumers=2)
    assert params.refusal(key, two, digest, 40, decode_tp=2) is None
    assert "wait for 2 decode ranks" in params.refusal(key, two, digest, 40, decode_tp=1)
    assert "not signed" in params.refusal(key, dict(two, remote_consumers=1), digest, 40)
    two_ranks = signed_params(key, addresses=["127.0.0.1:1", "127.0.0.1:2"])
    assert params.refusal(key, two_ranks, digest, 40, decode_tp=1) is None  # D reads both
    assert "neither divides" in params.refusal(key, two_ranks, digest, 40, decode_tp=3)


def test_no_secret_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("KVX_AUTH_FILE", raising=False)
    with pytest.raises(ValueError, match="KVX_AUTH_FILE"):
        config.auth_of(config.Settings())
    assert config.auth_of(config.Settings(insecure=True)) == {"insecure": True}


def test_listen_address_per_rank(monkeypatch):
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.5")
    assert config.listen_address(config.Settings(), 1) == "10.0.0.5:0"
    assert config.listen_address(config.Settings(listen="10.0.0.6:7000"), 2) == "10.0.0.6:7002"
    assert config.listen_address(config.Settings(listen="[::1]:7000"), 0) == "[::1]:7000"


def test_context_parallel_is_refused_and_dp_ranks_listen_apart():
    """Issue 35 finding 13: DCP/PCP refused by name at start-up; with a fixed port, each
    data-parallel rank's workers take ports of their own."""
    from kvx.vllm.connector import refuse_unsupported

    refuse_unsupported(types.SimpleNamespace(decode_context_parallel_size=1,
                                             prefill_context_parallel_size=1))
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        with pytest.raises(ValueError, match="%s 2 is not supported" % name):
            refuse_unsupported(types.SimpleNamespace(**{name: 2}))
    listen = config.Settings(listen="10.0.0.6:7000")
    # TP 2, DP 2: ranks (dp 0, tp 0..1) and (dp 1, tp 0..1) as the worker numbers them
    assert [config.listen_address(listen, tp + dp * 2) for dp in (0, 1) for tp in (0, 1)] == \
        ["10.0.0.6:%d" % p for p in (7000, 7001, 7002, 7003)]


def test_stats_join_samples_for_histograms_and_log_their_median():
    from kvx.vllm.connector import KvxConnector

    a = KvxConnector.build_kv_connector_stats({"transfers": 1, "seconds": 0.004,
                                               "load_seconds": [0.004]})
    b = KvxConnector.build_kv_connector_stats({"transfers": 2, "seconds": 0.002,
                                               "load_seconds": [0.001, 0.001],
                                               "handshake_failures": 1})
    joined = a.aggregate(b)
    assert joined.data["load_seconds"] == [0.004, 0.001, 0.001]
    assert joined.reduce() == {"transfers": 3, "seconds": 0.006, "handshake_failures": 1,
                               "avg_transfer_ms": 2.0, "load_ms_p50": 1.0, "load_ms_max": 4.0}
    assert KvxConnector._cache_hit_source.value == "p2p"


def test_the_connector_says_it_registers_the_cache_for_vllm_034(monkeypatch):
    """vLLM 0.34 constructs out-of-tree connectors with kv_cache_config as the third argument
    (KvxConnector's is) and asks kv_cache_access(); 0.32 has no KVCacheAccess, so 0.34's
    flags (vllm/config/kv_transfer.py, read from its wheel) stand in for it here."""
    import enum
    import inspect

    import vllm.config.kv_transfer
    from kvx.vllm.connector import KvxConnector

    flags = enum.IntFlag("KVCacheAccess", ["REGISTERS", "EXPORTS_FD", "EXPORTS_FABRIC",
                                           "LEGACY_IPC"])
    monkeypatch.setattr(vllm.config.kv_transfer, "KVCacheAccess", flags, raising=False)
    assert KvxConnector.kv_cache_access(None) == flags.REGISTERS
    assert KvxConnector.supports_sleep_mode(None) is False
    assert list(inspect.signature(KvxConnector).parameters)[:3] == \
        ["vllm_config", "role", "kv_cache_config"]


def test_heads_outermost_in_a_block_is_required_except_for_mla():
    """Issue 35 finding 12: a TP-mismatched load splits a block by head ranges, so the
    connector asks vLLM for heads outermost inside a block (LBHNC), as NIXL does; MLA's one
    latent head is kept whole by every rank."""
    from kvx.vllm.connector import KvxConnector

    def config(use_mla):
        return types.SimpleNamespace(model_config=types.SimpleNamespace(use_mla=use_mla))

    assert KvxConnector.get_required_kvcache_layout(config(False)) == "LBHNC"
    assert KvxConnector.get_required_kvcache_layout(config(True)) is None


def test_proxy_answers_every_request_naming_what_failed():
    """kvx.vllm.proxy with no server behind it: a 502 naming the prefill server, a 400 for a
    body that is not a JSON object, a 404 elsewhere; never a dropped connection."""
    import json
    import socket
    import threading
    import urllib.error
    import urllib.request

    from kvx.vllm.proxy import Proxy

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    http = Proxy([dead], [dead], timeout_s=5).serve("127.0.0.1", 0)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % http.server_address[1]
    try:
        for path, body, status, part in [
                ("/v1/completions", json.dumps({"prompt": "a"}), 502, "cannot reach " + dead),
                ("/v1/completions", "nope", 400, "bad JSON body"),
                ("/v1/completions", "[1]", 400, "not an object"),
                ("/v1/other", "{}", 404, "not found")]:
            request = urllib.request.Request(url + path, data=body.encode())
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(request, timeout=30)
            assert e.value.code == status and part in e.value.read().decode()
    finally:
        http.shutdown()


def test_null_placeholders_are_never_written_and_a_slid_window_is_refused():
    """A sliding window's lists start with vLLM's null block (0) for blocks that slid out:
    a pair whose block on D is null is not moved (the null block is shared), and a pair whose
    block on P is null while D keeps one is refused (P no longer has what D would read)."""
    from kvx.vllm.worker import LoadRefused, _aligned

    local, remote = _aligned([[0, 0, 7, 8], [3]], [[0, 0, 0, 21, 22], [5, 9]])
    assert (local, remote) == ([[7, 8], [3]], [[21, 22], [9]])  # paired from the end
    with pytest.raises(LoadRefused, match="group 0: P's block list has a null block"):
        _aligned([[6, 7, 8]], [[0, 21, 22]])
    with pytest.raises(LoadRefused, match="group 0: 3 blocks to load, P holds 2"):
        _aligned([[6, 7, 8]], [[21, 22]])
