"""vLLM P/D on kvx with other model kinds than test_llama's and test_gemma2's.

MLA (a tiny DeepSeek-V2: one 576-wide latent row per token and layer, block size 16, which
vLLM's CPU MLA backend forces): the connector describes and moves the cache in pull mode, and
every transfer is verified by checksums on both sides (verify_one_in 1). Its output is not
compared with one instance's: vLLM's CPU MLA backend (CPU_MLA) gives one instance different
greedy tokens for the same prompts in another batch order or one at a time, so no output is
"one instance's". A mamba hybrid: below. What did not work (P TP 2 to D TP 1) is in
docs/vllm.md."""

import pytest

from conftest import PROMPTS, Engine, auth_file, delta, model, prefill, running


@pytest.fixture(scope="module")
def mla():
    common = dict(model=model("deepseek_v2", 0), served="tiny-deepseek-v2", connector="kvx",
                  extra={"auth_file": auth_file()})
    e = {
        "p": Engine("mla-p", 0, role="kv_producer", **common),
        "d": Engine("mla-d-pull", 1, role="kv_consumer", policy="fail",
                    **dict(common, extra=dict(common["extra"], verify_one_in=1))),
    }
    with running(e, reference=False):  # no reference: see above
        yield e


def test_mla_latent_rows_move(mla):
    assert "MLA" in mla["p"].log_text()
    before = mla["d"].kvx_stats()
    out = mla["d"].generate(PROMPTS, params=prefill(mla["p"]))
    assert "error" not in out, out
    assert all(len(tokens) == 8 for tokens in out["tokens"]), out
    after = mla["d"].kvx_stats()
    assert delta(after, before, "transfers") == len(PROMPTS)
    assert delta(after, before, "transfers_verified") == len(PROMPTS)  # bytes equal P's
    assert delta(after, before, "verify_mismatches") == 0


@pytest.fixture(scope="module")
def mamba():
    common = dict(model=model("granitemoehybrid", 0), served="tiny-granite-hybrid",
                  connector="kvx", extra={"auth_file": auth_file()})
    e = {
        "p": Engine("mamba-p", 0, role="kv_producer", **common),
        "d": Engine("mamba-d-pull", 1, role="kv_consumer", policy="fail", **common),
    }
    with running(e):
        yield e


def test_mamba_hybrid_pull_equals_one_instance(mamba):
    """A mamba2 + attention hybrid (GraniteMoeHybrid, 96-token blocks): P prefills all but the
    last prompt token, D loads the attention blocks and the running recurrent state and
    computes that token. Prompts of one token, or of more than one block, are D's alone (the
    latter's output differed past its first token: docs/vllm.md)."""
    before = mamba["d"].kvx_stats()
    out = mamba["d"].generate(PROMPTS, params=prefill_some(mamba["p"]))
    assert out["tokens"] == mamba["ref"]
    handed_over = sum(1 < len(prompt) <= 96 for prompt in PROMPTS)
    assert handed_over == 4
    assert delta(mamba["d"].kvx_stats(), before, "transfers") == handed_over


def prefill_some(p):
    """P's parameters: None for a prompt P hands nothing over for (D computes it)."""
    return p.generate(PROMPTS, max_tokens=1, remote_decode=True)["params"]
