"""The driver of the vLLM end-to-end tests: engines in their own processes (engine.py), one
command at a time, every wait with a deadline and a check that the engine still lives.

Run by ctest's test_vllm with the project's .venv-vllm (scripts/install-deps --vllm) and
PYTHONPATH=build/python. Models are made once per run under KVX_VLLM_WORK (default: a
directory in the build tree), by the test, from fixed seeds (models.py)."""

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import models  # noqa: E402

LENGTHS = (1, 5, 31, 32, 33, 100)  # tokens: one block to four, edges of a 32-token block
PROMPTS = models.prompts_ids(LENGTHS)

START_S = 900     # an engine's start-up on 2 busy cores: 20-90 s measured, with margin
COMMAND_S = 300   # one command (a batch of requests, deadlines inside included)
_ports = itertools.count(5610)


def work_dir():
    path = os.environ.get("KVX_VLLM_WORK") or os.path.join(
        os.environ.get("KVX_BINARY_DIR", "/tmp"), "vllm-work")
    os.makedirs(path, exist_ok=True)
    return path


def model(kind, seed):
    return models.make(kind, os.path.join(work_dir(), "%s-%d" % (kind, seed)), seed)


def engine_env(core):
    """The environment of an engine process pinned to `core`: loopback only, a small KV
    cache, and amx/sitecustomize.py first on its path (AMX machines: it says why)."""
    path = os.path.join(HERE, "amx")
    if os.environ.get("PYTHONPATH"):
        path += os.pathsep + os.environ["PYTHONPATH"]
    return dict(os.environ, UCX_NET_DEVICES="lo", VLLM_HOST_IP="127.0.0.1",
                VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(core),
                PYTHONPATH=path)


STARTED = []  # every Engine of the session, for a failed test's report


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with each engine's last kvx warnings: a failure whose cause
    is inside an engine (a load that failed, a refused handshake) shows it in CI's log."""
    report = (yield).get_result()
    if report.failed:
        for engine in STARTED:
            lines = [line for line in engine.log_text().splitlines()
                     if "kvx" in line and ("WARNING" in line or "ERROR" in line)]
            if lines:
                report.sections.append(("%s: its last kvx warnings" % engine.name,
                                        "\n".join(lines[-3:])))


class Engine:
    """One engine process; `name` names its log file (work_dir()/NAME.log). A spec's
    "kv_space_gib" sizes the KV cache vLLM allocates (VLLM_CPU_KVCACHE_SPACE, default 1)."""

    def __init__(self, name, core, host=None, **spec):
        """`host`: None (this one, loopback) or a Host (test_hosts.py): the engine runs in that
        network namespace and reaches the others over its veth only."""
        self.name = name
        self.dir = work_dir()
        self.log_path = os.path.join(self.dir, name + ".log")
        spec_path = os.path.join(self.dir, name + ".json")
        self.ready_file = os.path.join(self.dir, name + ".ready")
        if os.path.exists(self.ready_file):
            os.unlink(self.ready_file)
        with open(spec_path, "w") as f:
            json.dump(dict(spec, ready_file=self.ready_file), f)
        env = dict(engine_env(core), VLLM_ALLOW_INSECURE_SERIALIZATION="1",
                   VLLM_NIXL_SIDE_CHANNEL_PORT=str(next(_ports)))
        command = [sys.executable, os.path.join(HERE, "engine.py"), spec_path]
        if host is not None:
            env.update(UCX_NET_DEVICES=host.device, VLLM_HOST_IP=host.address)
            command = ["ip", "netns", "exec", host.namespace] + command
        if spec.get("kv_space_gib") is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(spec["kv_space_gib"])
        self.log = open(self.log_path, "w")
        STARTED.append(self)
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, text=True,
                                     process_group=0)  # killed with its children
        self.ready = False
        self.seq = 0

    def wait_ready(self):
        deadline = time.monotonic() + START_S
        while not self.ready:
            if self.proc.poll() is not None:
                raise AssertionError("%s exited before it was ready:\n%s" % (self.name, self.tail()))
            if time.monotonic() > deadline:
                raise AssertionError("%s not ready within %d s" % (self.name, START_S))
            self.ready = os.path.exists(self.ready_file)
            time.sleep(0.1)
        return self

    def tail(self, n=40):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def call(self, op, **args):
        return self.result(self.send(op, **args), op)

    def send(self, op, **args):
        """Sends a command without waiting: result() collects its answer."""
        self.wait_ready()
        self.seq += 1
        out = os.path.join(self.dir, "%s-%d.out" % (self.name, self.seq))
        if os.path.exists(out):
            os.unlink(out)  # an earlier run's answer under the same name is not this one's
        self.proc.stdin.write(json.dumps(dict(args, op=op, out=out)) + "\n")
        self.proc.stdin.flush()
        return out

    def result(self, out, op="command"):
        deadline = time.monotonic() + COMMAND_S
        while not os.path.exists(out):
            if self.proc.poll() is not None:
                raise AssertionError("%s died during %s:\n%s" % (self.name, op, self.tail()))
            if time.monotonic() > deadline:
                raise AssertionError("%s: %s not answered within %d s" % (self.name, op, COMMAND_S))
            time.sleep(0.002)  # bench/vllm_pd.py times the gaps between engines' answers
        with open(out) as f:
            return json.load(f)

    def generate(self, prompts, max_tokens=8, params=None, remote_decode=False):
        return self.call("generate", prompts=prompts, max_tokens=max_tokens, params=params,
                         remote_decode=remote_decode)

    def kvx_stats(self):
        return self.call("kvx_stats")["stats"]

    def log_text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def signal_all(self, sig):
        """`sig` to the engine and every process vLLM spawned (its own group): SIGSTOP and
        SIGCONT stop and continue the whole engine, as a host that hangs would."""
        os.killpg(self.proc.pid, sig)

    def kill(self):
        """SIGKILL to the engine and the processes vLLM spawned (its own group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()  # whatever of its group is left
        self.log.close()


@pytest.fixture(scope="session")
def engines():
    """Engines made by a test module's fixtures, stopped at the end of the session."""
    made = []
    yield made
    for engine in made:
        engine.stop()


@contextlib.contextmanager
def running(engines, reference=True):
    """A module's engines ({"p": P, ...}, started together), ready; with "ref", one instance's
    greedy output of PROMPTS (P's, without kv_transfer_params). Stopped at the end."""
    started = list(engines.values())
    try:
        for engine in started:
            engine.wait_ready()
        if reference:
            engines["ref"] = engines["p"].generate(PROMPTS)["tokens"]
        yield engines
    finally:
        for engine in started:
            engine.stop()


def wait_for(predicate, what, timeout_s=COMMAND_S):
    """Polls predicate() until true: for states another process reaches (a lease that ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("not within %d s: %s" % (timeout_s, what))
        time.sleep(0.2)


def auth_file():
    key = os.path.join(work_dir(), "auth.key")
    if not os.path.exists(key):
        subprocess.run([os.path.join(os.environ["KVX_BINARY_DIR"], "kvx"), "auth-key", key],
                       check=True)
    return key


def resign(params):
    """Signs kv_transfer_params a test changed with the deployment's key: what only a holder
    of the secret (an insider, or a faulty P) could hand D, past its signature check."""
    import kvx
    from kvx.vllm import params as transfer_params

    key = transfer_params.signing_key(kvx.auth_key_load(auth_file()))
    for p in params:
        p["signature"] = transfer_params.signature(key, p)
    return params


def delta(after, before, key):
    """How much worker 0's kvx counter `key` grew."""
    return after[0][key] - before[0][key]


def prefill(p, prompts=PROMPTS):
    """P's prefill of `prompts` for a remote decode: its kv_transfer_params, one per prompt."""
    out = p.generate(prompts, max_tokens=1, remote_decode=True)
    assert all(params and params.get("remote_request_id") for params in out["params"]), out
    return out["params"]


@pytest.fixture(scope="session")
def llama(engines):
    """A tiny Llama's P (the secure default: a shared key file), a P of the same name and
    config on other weights, a pulling D (policy recompute, every transfer verified) and a
    pushing D (policy fail); ref: one instance's greedy output."""
    extra = {"auth_file": auth_file()}
    same, other = model("llama", 0), model("llama", 1)
    common = dict(served="tiny-llama", connector="kvx")
    e = {
        "p": Engine("llama-p", 0, model=same, role="kv_producer", extra=extra, **common),
        # the same path name and config, other weights: D must then answer differently
        "p_other": Engine("llama-p-other", 0, model=other, role="kv_producer", extra=extra,
                          **common),
        "d": Engine("llama-d-pull", 1, model=same, role="kv_consumer", policy="recompute",
                    extra=dict(extra, verify_one_in=1), **common),
        "d_push": Engine("llama-d-push", 1, model=same, role="kv_consumer", mode="push",
                         policy="fail", extra=extra, **common),
    }
    engines.extend(e.values())
    for engine in e.values():
        engine.wait_ready()
    e["ref"] = e["p"].generate(PROMPTS)["tokens"]  # no kv_transfer_params: one instance
    return e




class Server:
    """vLLM's OpenAI server in its own process group, on a free port of 127.0.0.1."""

    def __init__(self, name, core, model, served, kv_transfer_config=None, port=None,
                 extra_args=()):
        """`port`: a restarted server's (None: a free one)."""
        import socket

        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
            s.bind(("127.0.0.1", port or 0))
            self.port = s.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(work_dir(), name + ".log")
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--served-model-name", served, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "bfloat16", "--block-size", "32", "--enforce-eager",
                "--max-model-len", "4096", "--num-gpu-blocks-override", "512", "--seed", "0",
                "--no-enable-prefix-caching"]
        if kv_transfer_config:
            args += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
        args += list(extra_args)
        env = engine_env(core)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     process_group=0)

    def wait_ready(self):
        import urllib.request

        deadline = time.monotonic() + START_S
        while True:
            if self.proc.poll() is not None:
                with open(self.log_path, errors="replace") as f:
                    raise AssertionError("server exited:\n" + "".join(f.readlines()[-40:]))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("server not ready within %d s" % START_S)
            time.sleep(0.5)

    def kill(self):
        """SIGKILL to the server and everything it started (its own group), as a host that
        dies would."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        self.kill()  # whatever of its group is left
