"""vLLM's OpenAI servers on kvx behind kvx's own proxy (python -m kvx.vllm.proxy): a client's
completion through P then D equals the same request to one instance, token for token."""

import json
import threading
import urllib.request

import pytest

from conftest import PROMPTS, Server, auth_file, model
from kvx.vllm.proxy import Proxy


def kvx_config(role):
    return {"kv_connector": "KvxConnector", "kv_connector_module_path": "kvx.vllm",
            "kv_role": role, "kv_buffer_device": "cpu",
            "kv_connector_extra_config": {"auth_file": auth_file()}}


@pytest.fixture(scope="module")
def servers():
    path = model("llama", 0)
    p = Server("server-p", 0, path, "tiny-llama", kvx_config("kv_producer"))
    d = Server("server-d", 1, path, "tiny-llama", kvx_config("kv_consumer"))
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


def complete(url, prompt, **extra):
    body = dict({"model": "tiny-llama", "prompt": prompt, "max_tokens": 8, "temperature": 0},
                **extra)
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["text"]


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
