"""The soak of issue 35: vLLM's OpenAI servers for P and D on kvx behind kvx's proxy, several
clients at once, and faults among them; every answer compared with one instance's.

Faults, one at a time with quiet gaps between (the order is drawn from the seed):
- stop_p: P's whole process group stopped (SIGSTOP) for 4 s, then continued;
- kill_p, kill_d: a server killed (SIGKILL, its whole group) and started again on its port;
- stale: P's kv_transfer_params used twice, straight to D (the second names a hold P ended);
- out_of_range: P's params with block ids past P's cache, signed again with the
  deployment's key (an insider's, or a router's bug), straight to D;
- disconnect: a client that closes its connection before the answer.

What counts: a whole answer (HTTP 200, finished by its length or a stop) whose text is not
one instance's is wrong, always; a failed request, or one a server ended early (an answer
cut short by a server going down, finish_reason "abort"), is an error, allowed only while a fault lasts and for GRACE_S after it (a killed
server's requests, a restart); every other failure is an error outside faults. Afterwards
both servers' KV cache usage must come back to 0 (vLLM's `vllm:kv_cache_usage_perc`): no
block held for a D that is gone, none leaked by an aborted or failed load.

Used by test_soak.py (the short form, in CI) and scripts/vllm-soak (the long form)."""

import http.client
import json
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request

from conftest import Server, auth_file, model, resign
import models
from kvx.vllm.proxy import Proxy

GRACE_S = 15.0  # after a fault: D's deadline (10 s) and a request's own time
REQUEST_S = 120.0
PROMPT_LENGTHS = (1, 5, 31, 32, 33, 64, 100, 150, 200, 300)


def kvx_config(role, **extra):
    return {"kv_connector": "KvxConnector", "kv_connector_module_path": "kvx.vllm",
            "kv_role": role, "kv_buffer_device": "cpu",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": dict({"auth_file": auth_file()}, **extra)}


def post(url, body, timeout=REQUEST_S):
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def completion(prompt, **extra):
    return dict({"model": "tiny-llama", "prompt": prompt, "max_tokens": 8, "temperature": 0},
                **extra)


def kv_usage(url):
    """vLLM's KV cache usage (0..1) as its /metrics says, or None when it does not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("vllm:kv_cache_usage_perc")]
    return max(values) if values else None


class Soak:
    def __init__(self, seed=0, clients=3):
        self.rng = random.Random(seed)
        self.clients = clients
        self.prompts = models.prompts_ids(PROMPT_LENGTHS, seed=100 + seed)
        self.path = model("llama", 0)
        self.lock = threading.Lock()
        self.windows = []  # (start, end) of each fault, end None while it lasts
        self.faults = {}   # kind -> count
        self.results = {"ok": 0, "wrong": 0, "errors_in_faults": 0, "errors_outside": 0,
                        "disconnected": 0}
        self.wrong = []    # (prompt index, text, expected) of each wrong answer
        self.outside = []  # what failed outside faults
        self.restarts = {"p": 0, "d": 0}
        self.servers = {"p": self.start("p"), "d": self.start("d")}
        self.proxy = None

    # ---- servers ---------------------------------------------------------------------
    def start(self, role, port=None):
        name = "soak-%s-%d" % (role, self.restarts[role])
        core = 0 if role == "p" else 1
        config = kvx_config("kv_producer" if role == "p" else "kv_consumer")
        return Server(name, core, self.path, "tiny-llama", config, port=port)

    def restart(self, role):
        old = self.servers[role]
        old.kill()
        self.restarts[role] += 1
        self.servers[role] = self.start(role, port=old.port)
        self.servers[role].wait_ready()

    def __enter__(self):
        for server in self.servers.values():
            server.wait_ready()
        self.http = Proxy([self.servers["p"].url], [self.servers["d"].url]).serve("127.0.0.1", 0)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.proxy = "http://127.0.0.1:%d" % self.http.server_address[1]
        p = self.servers["p"].url
        self.ref = [post(p, completion(prompt))["choices"][0]["text"] for prompt in self.prompts]
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        for server in self.servers.values():
            server.stop()

    # ---- accounting ------------------------------------------------------------------
    def in_fault(self, start, end):
        with self.lock:
            return any(s - 1.0 <= end and (e is None or start <= e + GRACE_S)
                       for s, e in self.windows)

    def record(self, index, text, start, error=None):
        end = time.monotonic()
        with self.lock:
            if error is None and text == self.ref[index]:
                self.results["ok"] += 1
                return
            if error is None:
                self.results["wrong"] += 1
                self.wrong.append((index, text, self.ref[index]))
                return
        if self.in_fault(start, end):
            with self.lock:
                self.results["errors_in_faults"] += 1
        else:
            with self.lock:
                self.results["errors_outside"] += 1
                self.outside.append("%.1f s: %s" % (end - self.t0, error))

    # ---- clients -----------------------------------------------------------------------
    def ask(self, url, index, **extra):
        """Asks prompt `index` of `url` and records the outcome; whether it was answered."""
        start = time.monotonic()
        try:
            choice = post(url, completion(self.prompts[index], **extra))["choices"][0]
        except (OSError, urllib.error.HTTPError, ValueError, KeyError) as e:
            self.record(index, None, start, repr(e)[:200])
            return False
        if choice.get("finish_reason") not in ("length", "stop"):
            self.record(index, None, start, "ended early: finish_reason %r after %r"
                        % (choice.get("finish_reason"), choice["text"]))
            return False
        self.record(index, choice["text"], start)
        return True

    def client(self, rng, until):
        while time.monotonic() < until:
            if not self.ask(self.proxy, rng.randrange(len(self.prompts))):
                time.sleep(0.5)  # a server down refuses at once: not thousands of those

    # ---- faults ------------------------------------------------------------------------
    def prefill_params(self, index):
        """P's kv_transfer_params for prompt `index`, asked of P directly (as the proxy does)."""
        answer = post(self.servers["p"].url, completion(
            self.prompts[index], max_tokens=1, kv_transfer_params={"do_remote_decode": True}))
        return answer["kv_transfer_params"]

    def fault(self, kind):
        """One fault of `kind`; the disruptive ones (a server stopped or restarted) open a
        window in which, and GRACE_S after which, failed requests are allowed."""
        index = self.rng.randrange(len(self.prompts))
        window = [time.monotonic(), None]
        with self.lock:
            self.faults[kind] = self.faults.get(kind, 0) + 1
            if kind in ("stop_p", "kill_p", "kill_d"):
                self.windows.append(window)
        try:
            if kind == "stop_p":
                group = self.servers["p"].proc.pid  # its own process group (Server)
                os.killpg(group, signal.SIGSTOP)
                time.sleep(4)
                os.killpg(group, signal.SIGCONT)
            elif kind in ("kill_p", "kill_d"):
                self.restart(kind[-1])
            elif kind == "stale":
                params = self.prefill_params(index)
                d = self.servers["d"].url
                self.ask(d, index, kv_transfer_params=params)
                self.ask(d, index, kv_transfer_params=params)  # P's hold ended: refused
            elif kind == "out_of_range":
                params = self.prefill_params(index)
                params["remote_block_ids"] = [[b + 10 ** 6 for b in ids]
                                              for ids in params["remote_block_ids"]]
                self.ask(self.servers["d"].url, index, kv_transfer_params=resign([params])[0])
            elif kind == "disconnect":
                port = int(self.proxy.rsplit(":", 1)[1])
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_S)
                conn.request("POST", "/v1/completions",
                             json.dumps(completion(self.prompts[index], max_tokens=64)),
                             {"Content-Type": "application/json"})
                time.sleep(0.3)
                conn.close()  # before the answer: the proxy's and the servers' aborts
                with self.lock:
                    self.results["disconnected"] += 1
        except (OSError, urllib.error.HTTPError, ValueError, KeyError) as e:
            with self.lock:
                self.results["errors_outside"] += 1
                self.outside.append("fault %s: %r" % (kind, e))
        finally:
            window[1] = time.monotonic()

    def run(self, duration_s, kinds, gap_s=8.0):
        """Clients for `duration_s`, faults of `kinds` (in a seeded order, each at least once
        when time allows) with `gap_s` of quiet between; then the leak check. A report."""
        self.t0 = time.monotonic()
        until = self.t0 + duration_s
        threads = [threading.Thread(target=self.client, args=(random.Random(i), until),
                                    daemon=True) for i in range(self.clients)]
        for t in threads:
            t.start()
        order = list(kinds)
        self.rng.shuffle(order)
        while time.monotonic() + gap_s < until:
            time.sleep(gap_s)
            kind = order.pop(0) if order else self.rng.choice(list(kinds))
            self.fault(kind)
        for t in threads:
            t.join(REQUEST_S + 30)
        return dict(self.results, seconds=round(time.monotonic() - self.t0, 1),
                    requests=sum(self.results[k] for k in ("ok", "wrong", "errors_in_faults",
                                                          "errors_outside")),
                    faults=dict(self.faults), restarts=dict(self.restarts),
                    wrong_answers=self.wrong[:5], errors_outside_faults=self.outside[:5],
                    kv_usage_after=self.usage_after())

    def usage_after(self, timeout_s=90.0):
        """Each server's KV cache usage once it came back to 0, or what it was at the timeout
        (P's holds end by D's dones, or at their 30 s lease for a D that was killed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            usage = {role: kv_usage(server.url) for role, server in self.servers.items()}
            if all(u == 0 for u in usage.values()) or time.monotonic() > deadline:
                return usage
            time.sleep(1)
