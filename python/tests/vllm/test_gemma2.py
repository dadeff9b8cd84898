"""vLLM P/D on kvx with a hybrid model: a tiny Gemma2 alternates full and sliding-window
attention, so vLLM's hybrid KV cache manager gives it two KV cache groups, each with its own
block ids (SupportsHMA). D's greedy output equals one instance's in pull and in push mode;
a P of another model is refused at kvx's handshake, naming the difference."""

import pytest

from conftest import PROMPTS, Engine, auth_file, delta, model, prefill, running


@pytest.fixture(scope="module")
def gemma2():
    common = dict(model=model("gemma2", 0), served="tiny-gemma2", connector="kvx",
                  extra={"auth_file": auth_file()})
    e = {
        "p": Engine("gemma2-p", 0, role="kv_producer", **common),
        "d": Engine("gemma2-d-pull", 1, role="kv_consumer", policy="recompute", **common),
        "d_push": Engine("gemma2-d-push", 1, role="kv_consumer", mode="push",
                         policy="recompute", **common),
    }
    with running(e):
        yield e


def test_two_kv_cache_groups(gemma2):
    assert "2 groups" in gemma2["d"].log_text()


def test_pull_equals_one_instance(gemma2):
    before = gemma2["d"].kvx_stats()
    out = gemma2["d"].generate(PROMPTS, params=prefill(gemma2["p"]))
    assert out["tokens"] == gemma2["ref"]
    assert delta(gemma2["d"].kvx_stats(), before, "transfers") == len(PROMPTS)


def test_push_equals_one_instance(gemma2):
    out = gemma2["d_push"].generate(PROMPTS, params=prefill(gemma2["p"]))
    assert out["tokens"] == gemma2["ref"]


def test_incompatible_prefill_is_refused_naming_the_difference(gemma2, llama):
    """A Llama P's references given to a Gemma2 D: refused at the handshake, recomputed."""
    before = gemma2["d"].kvx_stats()
    out = gemma2["d"].generate(PROMPTS, params=prefill(llama["p"]))
    assert out["tokens"] == gemma2["ref"]
    assert delta(gemma2["d"].kvx_stats(), before, "transfers") == 0
    assert "tiny-llama" in gemma2["d"].log_text()
