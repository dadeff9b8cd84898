"""The soak's short form (soak.py; the long form is scripts/vllm-soak): P and D servers behind
kvx's proxy, three clients for 150 s, and a stopped P, a killed and restarted D, a stale and
an out-of-range reference and a client that disconnects among them. No answer other than
one instance's, failures only around the faults, and both servers' KV caches empty after."""

from soak import Soak

KINDS = ("stop_p", "kill_d", "stale", "out_of_range", "disconnect")


def test_soak_short():
    with Soak(seed=1) as soak:
        report = soak.run(150, KINDS)
    print(report)
    assert report["wrong"] == 0, report["wrong_answers"]
    assert report["errors_outside"] == 0, report["errors_outside_faults"]
    assert set(report["faults"]) == set(KINDS), report["faults"]
    assert report["ok"] > 20
    assert report["kv_usage_after"] == {"p": 0, "d": 0}
