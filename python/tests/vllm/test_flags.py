"""vLLM P/D on kvx with the flags a vLLM maintainer turns on before merging a connector
(issue 35): prefix caching on D, so that a prompt whose first blocks D computed before loads
only the rest (its block list is P's tail: docs/vllm.md), chunked prefill on P (32 tokens a
step, so P computes a long prompt over several steps before it hands it over), and a D whose
cache is too small for its batch, so that vLLM preempts requests that loaded their KV and
recomputes them later. D's greedy output equals one instance's for every prompt."""

import pytest

from conftest import Engine, auth_file, delta, model, prefill, running, wait_for
import models

BLOCK = 32


@pytest.fixture(scope="module")
def flags():
    common = dict(model=model("llama", 0), served="tiny-llama", connector="kvx",
                  extra={"auth_file": auth_file()})
    e = {
        "p": Engine("flags-p-chunked", 0, role="kv_producer", max_num_batched_tokens=BLOCK,
                    **common),
        "d": Engine("flags-d-prefix-cache", 1, role="kv_consumer", policy="recompute",
                    prefix_caching=True, **common),
        # 24 blocks of 32 tokens for 6 requests of 100 + 64 tokens (6 blocks each)
        "d_small": Engine("flags-d-small-cache", 1, role="kv_consumer", policy="recompute",
                          num_blocks=24, max_model_len=512, **common),
    }
    with running(e, reference=False):
        yield e


def test_partial_prefix_hits_on_d_load_only_the_rest(flags):
    """Three prompts: A (100 tokens), then A's first 96 tokens (three whole blocks) followed
    by 60 other tokens, then A with 20 more. D computes A alone first (its blocks enter D's
    prefix cache); each later prompt's cached blocks are not loaded, the rest is, from a P
    that computed it 32 tokens a step."""
    (a,) = models.prompts_ids([100], seed=11)
    (tail,) = models.prompts_ids([60], seed=12)
    (more,) = models.prompts_ids([20], seed=13)
    prompts = [a[:96] + tail, a + more]
    one = flags["p"].generate(prompts)["tokens"]  # no params: one instance (P's, chunked)
    flags["d"].generate([a])  # D computes A: its 3 whole blocks enter D's prefix cache
    before = flags["d"].kvx_stats()
    out = flags["d"].generate(prompts, params=prefill(flags["p"], prompts))
    assert out["tokens"] == one
    after = flags["d"].kvx_stats()
    assert delta(after, before, "transfers") == 2
    assert delta(after, before, "transfers_failed") == 0
    # D loaded 5 - 3 and 4 - 3 blocks, not the 3 of A it had: 16 KiB each (2 layers, K and
    # V, 2 heads of 32, bf16, 32 tokens)
    assert delta(after, before, "bytes") == 3 * 16384


def test_preempted_requests_that_loaded_their_kv_equal_one_instance(flags):
    """D's cache holds 24 blocks; six 100-token prompts that each grow to 164 tokens need 36:
    vLLM preempts running requests (whose KV came from P) and recomputes them when blocks
    free up. Every output equals one instance's, and every load moved bytes."""
    prompts = models.prompts_ids([100] * 6, seed=21)
    one = flags["p"].generate(prompts, max_tokens=64)["tokens"]
    before = flags["d_small"].kvx_stats()
    out = flags["d_small"].generate(prompts, max_tokens=64, params=prefill(flags["p"], prompts))
    assert out["tokens"] == one
    after = flags["d_small"].kvx_stats()
    assert delta(after, before, "transfers") == len(prompts)
    assert delta(after, before, "transfers_failed") == 0


def test_48_in_flight_with_aborts_among_them(flags):
    """48 requests with P's KV at once on D, one in four aborted after D's first step (some
    loading, some queued, some loaded). The others equal one instance's; every hold P made
    ends by a done (a load's, or D's notify-only release), none at the lease, and P holds
    nothing afterwards."""
    prompts = models.prompts_ids([5, 40, 100] * 16, seed=31)
    one = flags["p"].generate(prompts)["tokens"]
    p_before = flags["p"].kvx_stats()
    params = prefill(flags["p"], prompts)
    aborted = set(range(0, 48, 4))
    out = flags["d_small"].call("abort_some", prompts=prompts, params=params, max_tokens=8,
                                steps=1, abort=sorted(aborted), tag=1)
    for i, (tokens, ref) in enumerate(zip(out["tokens"], one)):
        if i not in aborted:
            assert tokens == ref, "request %d" % i
    wait_for(lambda: flags["p"].kvx_stats()[0]["held"] == 0, "P holds nothing")
    p_after = flags["p"].kvx_stats()
    assert delta(p_after, p_before, "released") == 48
    assert delta(p_after, p_before, "leases_expired") == 0
