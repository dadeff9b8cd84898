"""vLLM's OpenAI servers on kvx behind kvx's own proxy (python -m kvx.vllm.proxy): a client's
completion through P then D equals the same request to one instance, token for token."""

import json
import socket
import threading
import urllib.request

import pytest

from conftest import PROMPTS, Server, auth_file, model, resign, wait_for
from kvx.vllm.proxy import Proxy


def kvx_config(role, **extra):
    return {"kv_connector": "KvxConnector", "kv_connector_module_path": "kvx.vllm",
            "kv_role": role, "kv_buffer_device": "cpu",
            "kv_connector_extra_config": dict({"auth_file": auth_file()}, **extra)}


@pytest.fixture(scope="module")
def servers():
    path = model("llama", 0)
    p = Server("server-p", 0, path, "tiny-llama", kvx_config("kv_producer"))
    # D's handshake deadline far beyond any test: a P that never answers holds its probe
    # for the whole module (test_a_silent_prefill_never_holds_up_another_request); and P
    # dropped after 3 idle seconds (test_an_idle_prefill_is_forgotten_and_found_again)
    d = Server("server-d", 1, path, "tiny-llama", kvx_config("kv_consumer", timeout_ms=600000,
                                                             peer_ttl_ms=3000))
    try:
        p.wait_ready()
        d.wait_ready()
        http = Proxy([p.url], [d.url]).serve("127.0.0.1", 0)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        yield {"p": p, "d": d, "proxy": "http://127.0.0.1:%d" % http.server_address[1]}
        http.shutdown()
    finally:
        p.stop()
        d.stop()


def post(url, prompt, **extra):
    body = dict({"model": "tiny-llama", "prompt": prompt, "max_tokens": 8, "temperature": 0},
                **extra)
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.loads(r.read())


def complete(url, prompt, **extra):
    return post(url, prompt, **extra)["choices"][0]["text"]


def test_completions_through_p_and_d_equal_one_instance(servers):
    for prompt in PROMPTS:
        one = complete(servers["p"].url, prompt)  # P alone, no kv_transfer_params
        assert complete(servers["proxy"], prompt) == one, "prompt of %d tokens" % len(prompt)
    with open(servers["d"].log_path, errors="replace") as f:
        log = f.read()
    assert "KV not loaded" not in log  # D loaded every prompt's KV, recomputed none


def test_a_clients_own_kv_transfer_params_never_reach_d(servers):
    """Issue 35 finding 5: a client that sends its own kv_transfer_params, for a prompt P
    hands nothing over for (one token), gets one instance's answer, and D never sees them:
    the proxy passes D only what P handed over (and D would refuse unsigned ones)."""
    forged = {"do_remote_prefill": True, "kvx": 1, "remote_request_id": 1,
              "remote_token": "00" * 16, "remote_block_ids": [[1, 2, 3]],
              "remote_addresses": ["127.0.0.1:1"], "remote_num_tokens": 1}
    prompt = PROMPTS[0]  # one token
    one = complete(servers["p"].url, prompt)
    assert complete(servers["proxy"], prompt, kv_transfer_params=forged) == one
    with open(servers["d"].log_path, errors="replace") as f:
        assert "kv_transfer_params refused" not in f.read()


def d_log(servers):
    with open(servers["d"].log_path, errors="replace") as f:
        return f.read()


def test_an_idle_prefill_is_forgotten_and_found_again(servers):
    """Issue 35 finding 8: a P that D no longer uses (idle past peer_ttl_ms; restarted on a
    new port, or scaled away) is dropped by kvx and then forgotten by the worker, so nothing
    of it stays; a later request from it connects afresh and equals one instance."""
    one = complete(servers["p"].url, PROMPTS[3])
    assert complete(servers["proxy"], PROMPTS[3]) == one
    wait_for(lambda: "kvx: forgot 1 peers" in d_log(servers), "D forgets the idle P")
    assert complete(servers["proxy"], PROMPTS[3]) == one
    assert d_log(servers).count("kvx: connected to") >= 2


def test_a_silent_prefill_never_holds_up_another_request(servers):
    """Issue 35 finding 6: one request names a P that takes TCP connections and never answers
    (a hung host); D probes it on a thread of its own, so another request, through the proxy
    from the live P, completes meanwhile with one instance's answer. kvx's connect is one
    blocking call under the agent's lock: made on D's order thread, it held every other load
    of that worker until its deadline (10 s by default; 600 s here, so that nothing but the
    probe's thread could let the second request through). Last: the silent request stays."""
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(300)  # D must probe it: a D that does not fails here, not hangs
    stuck_prompt, prompt = PROMPTS[5], PROMPTS[4]
    params = post(servers["p"].url, stuck_prompt, max_tokens=1,
                  kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
    params["remote_addresses"] = ["127.0.0.1:%d" % silent.getsockname()[1]]
    def post_stuck():
        try:  # its load fails once the test closes the silent P: D answers with an error
            post(servers["d"].url, stuck_prompt, kv_transfer_params=resign([params])[0])
        except OSError:
            pass

    stuck = threading.Thread(target=post_stuck, daemon=True)
    stuck.start()
    accepted, _ = silent.accept()  # D's probe waits on the silent P now
    one = complete(servers["p"].url, prompt)
    assert complete(servers["proxy"], prompt) == one
    assert stuck.is_alive()
    accepted.close()
    silent.close()
