"""vLLM P/D on kvx with DeepSeek-V4, the model kvx exists for: a tiny random-weight V4
(models.py: SWA-only, C4A with its indexer, C128A) on vLLM 0.32's CPU build, whose six KV
cache groups (blocks of 64, 64, 64, 256, 4 and 8 tokens) overlay one 47,808-byte row. Every
engine runs as a user would start it: vLLM's default cache size (1 GiB here, 22,459 rows)
and block size (256), kvx's default deadlines and lease.

Prompts of 1 to 400 tokens cross rows of every group (beyond one 256-token MLA block). D's
greedy output equals one instance's in pull (every transfer verified by checksums on both
sides) and in push; a P on other weights changes it; a stale reference, whose blocks P
reused since, is refused before a byte is used."""

import copy

import pytest

from conftest import Engine, auth_file, delta, model, running, wait_for
import models

pytestmark = pytest.mark.skipif(models.deepseek_v4_missing() is not None,
                                reason=str(models.deepseek_v4_missing()))

LENGTHS = (1, 5, 100, 130, 300, 400)
PROMPTS = models.prompts_ids(LENGTHS, seed=4)
V4 = dict(served="tiny-deepseek-v4", connector="kvx", tokenizer_mode="hf", max_model_len=512,
          block_size=None, num_blocks=None)  # vLLM's choices: 256-token blocks, 1 GiB


@pytest.fixture(scope="module")
def v4():
    extra = {"auth_file": auth_file()}
    same, other = model("deepseek_v4", 0), model("deepseek_v4", 1)
    e = {
        "p": Engine("v4-p", 0, model=same, role="kv_producer", extra=extra, **V4),
        "p_other": Engine("v4-p-other", 0, model=other, role="kv_producer", extra=extra, **V4),
        "d": Engine("v4-d-pull", 1, model=same, role="kv_consumer", policy="recompute",
                    extra=dict(extra, verify_one_in=1), **V4),
        "d_push": Engine("v4-d-push", 1, model=same, role="kv_consumer", mode="push",
                         policy="fail", extra=extra, **V4),
    }
    with running(e, reference=False):
        e["ref"] = e["p"].generate(PROMPTS)["tokens"]  # no kv_transfer_params: one instance
        yield e


def prefill(p, prompts=PROMPTS):
    out = p.generate(prompts, max_tokens=1, remote_decode=True)
    assert all(params and params.get("remote_request_id") for params in out["params"]), out
    return out["params"]


def test_the_cache_is_one_packed_row_of_six_groups(v4):
    log = v4["d"].log_text()
    assert "9 views in 6 groups, 1 storages registered in place as 1 regions" in log, \
        [line for line in log.splitlines() if "kvx:" in line][:5]


def test_pull_equals_one_instance_and_verifies(v4):
    p_before, before = v4["p"].kvx_stats(), v4["d"].kvx_stats()
    params = prefill(v4["p"])
    # P hands over one block list per group: a window's tail only, in its own block size
    assert all(len(p["remote_block_ids"]) == 6 for p in params)
    out = v4["d"].generate(PROMPTS, params=params)
    assert out["tokens"] == v4["ref"]
    after = v4["d"].kvx_stats()
    assert delta(after, before, "transfers") == len(PROMPTS)
    assert delta(after, before, "transfers_failed") == 0
    assert delta(after, before, "transfers_verified") == len(PROMPTS)
    assert delta(after, before, "verify_mismatches") == 0
    wait_for(lambda: delta(v4["p"].kvx_stats(), p_before, "released") == len(PROMPTS),
             "P releases every hold once D's dones came")


def test_push_equals_one_instance(v4):
    before = v4["d_push"].kvx_stats()
    out = v4["d_push"].generate(PROMPTS, params=prefill(v4["p"]))
    assert out["tokens"] == v4["ref"]
    assert delta(v4["d_push"].kvx_stats(), before, "transfers") == len(PROMPTS)


def test_other_weights_change_the_output(v4):
    before = v4["d"].kvx_stats()
    out = v4["d"].generate(PROMPTS, params=prefill(v4["p_other"]))
    after = v4["d"].kvx_stats()
    assert (delta(after, before, "transfers"), delta(after, before, "transfers_failed")) == \
        (len(PROMPTS), 0)
    for n, tokens, ref in zip(LENGTHS, out["tokens"], v4["ref"]):
        if n > 1:  # a 1-token prompt's last token is D's to compute: its output may agree
            assert tokens != ref, "prompt of %d tokens: D ignored P's KV" % n


def test_stale_reference_is_refused_and_recomputed(v4):
    """A reference whose blocks P freed (its done came) and reused for other prompts since:
    P refuses it at D's done, so D never uses a byte of it; recomputed, one instance's."""
    params = prefill(v4["p"])
    assert v4["d"].generate(PROMPTS, params=params)["tokens"] == v4["ref"]
    prefill(v4["p"], models.prompts_ids(LENGTHS, seed=5))  # P's blocks serve other prompts
    before = v4["d"].kvx_stats()
    out = v4["d"].generate(PROMPTS, params=copy.deepcopy(params))
    assert out["tokens"] == v4["ref"]
    assert delta(v4["d"].kvx_stats(), before, "transfers") == 0
    assert "released already" in v4["d"].log_text()
