"""vLLM P/D on kvx with the flags a vLLM maintainer turns on before merging a connector
(issue 35): prefix caching on D, so that a prompt whose first blocks D computed before loads
only the rest (its block list is P's tail: docs/vllm.md), and chunked prefill on P (32
tokens a step, so P computes a long prompt over several steps before it hands it over).
D's greedy output equals one instance's for every prompt, each load moving only the blocks
D did not have."""

import pytest

from conftest import Engine, auth_file, delta, model, prefill, running
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
