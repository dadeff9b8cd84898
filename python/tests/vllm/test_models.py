"""vLLM P/D on kvx with other model kinds than test_llama's and test_gemma2's.

- MLA (a tiny DeepSeek-V2: one 576-wide latent row per token and layer, block size 16, which
  vLLM's CPU MLA backend forces): the connector describes and moves the cache in pull mode
  (every prompt's blocks read). Its output is not compared with one instance's: vLLM's CPU
  MLA backend (CPU_MLA) gives one instance different greedy tokens for the same prompts in
  another batch order or one at a time, so no output is "one instance's".
- A mamba hybrid (GraniteMoeHybrid: mamba2 and attention layers) runs on vLLM's CPU build
  and registers, but D's output differs: D recomputes the last prompt token over a state that
  already holds it. P must stop one token short, as vLLM's NIXL connector does
  (_prefill_backoff); skipped until the scheduler does.
- TP 2 P to TP 1 D: P TP 2 runs as one instance; D's reads of rank 1 end in "hold's lease
  expired"; skipped until that is understood."""

import pytest

from conftest import PROMPTS, Engine, auth_file, delta, model, prefill


@pytest.fixture(scope="module")
def mla():
    common = dict(model=model("deepseek_v2", 0), served="tiny-deepseek-v2", connector="kvx",
                  extra={"auth_file": auth_file()})
    e = {
        "p": Engine("mla-p", 0, role="kv_producer", **common),
        "d": Engine("mla-d-pull", 1, role="kv_consumer", policy="fail", **common),
    }
    try:
        for engine in e.values():
            engine.wait_ready()
        yield e
    finally:
        for engine in e.values():
            engine.stop()


def test_mla_latent_rows_move(mla):
    assert "MLA" in mla["p"].log_text()
    before = mla["d"].kvx_stats()
    out = mla["d"].generate(PROMPTS, params=prefill(mla["p"]))
    assert "error" not in out, out
    assert all(len(tokens) == 8 for tokens in out["tokens"]), out
    assert delta(mla["d"].kvx_stats(), before, "transfers") == len(PROMPTS)


@pytest.mark.skip(reason="mamba hybrid: P must prefill all but the last prompt token "
                         "(scheduler.py), D's output differs from one instance's until then")
def test_mamba_hybrid_pull_equals_one_instance():
    pass


@pytest.mark.skip(reason="P TP 2 -> D TP 1: D's read of rank 1 ends in \"hold's lease expired\"")
def test_tp2_prefill_tp1_decode_equals_one_instance():
    pass
