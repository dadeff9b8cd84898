"""The kvx package used from several threads at once, as an engine does (a model-runner thread
posting and polling, a progress thread driving the loop), against a real prefill process
(threads_prefill.py, whose own loop runs on a thread of its own). Each race is repeated in
fresh processes (threads_decode.py): a crash fails the repetition, and pytest goes on. Threads
are lined up with events and barriers; no outcome depends on the machine's speed."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import kvx
import patterns

SOURCE = pathlib.Path(os.environ.get("KVX_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BINARY = pathlib.Path(os.environ.get("KVX_BINARY_DIR", SOURCE / "build"))
HERE = pathlib.Path(__file__).parent
SMALL = {"kvx_layout": 1, "storages": [{"name": "kv", "size": 65536}],
         "views": [{"name": "layers.0.mla", "kind": "mla", "storage": "kv", "page": 4096,
                    "stride": 4096, "num_blocks": 16}]}
REPETITIONS = 20
IDS_PER_REPETITION = 100  # request ids held for each repetition (threads_decode.py uses <= 50)
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(HERE)]))


@pytest.fixture(autouse=True)
def secret(tmp_path, monkeypatch):
    key = tmp_path / "auth.key"
    subprocess.run([str(BINARY / "kvx"), "auth-key", str(key)], check=True, capture_output=True)
    monkeypatch.setenv("KVX_AUTH_FILE", str(key))
    ENV["KVX_AUTH_FILE"] = str(key)
    return key


@pytest.fixture
def layout_path(tmp_path):
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(SMALL))
    return path


class Prefill:
    """threads_prefill.py holding `holds`: [(first_id, last_id, {group: [ids]})]."""

    def __init__(self, layout_path, holds):
        # Its stdout carries the JSON lines read here, so UCX logs to stderr: UCX 1.22 logs an
        # ERROR line ("shmat ... failed") when a decode process it answers has dropped its agent.
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "threads_prefill.py"), str(layout_path), json.dumps(holds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(ENV, UCX_LOG_FILE="stderr"))
        line = json.loads(self.process.stdout.readline())
        self.address = line["address"]
        self.token = bytes.fromhex(line["token"])

    def released(self, count):
        """The ids its released() named, once at least `count` (or after 60 s)."""
        self.process.stdin.write("released %d\n" % count)
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())["released"]

    def finish(self):
        self.process.stdin.close()
        report = json.loads(self.process.stdout.readline())
        assert self.process.wait(timeout=60) == 0
        assert report["intact"] and not report["failures"], report
        return report


def repeat(mode, layout_path, repetitions=REPETITIONS, quiet=False):
    """Runs threads_decode.py MODE `repetitions` times, each in a fresh process with request
    ids of its own, against one prefill process; every run must exit 0 (and, if `quiet`,
    write nothing on stderr)."""
    prefill = Prefill(layout_path,
                      [(1, repetitions * IDS_PER_REPETITION, {0: list(range(16))})])
    try:
        for rep in range(repetitions):
            run = subprocess.run(
                [sys.executable, str(HERE / "threads_decode.py"), mode, str(layout_path),
                 prefill.address, prefill.token.hex(), str(1 + rep * IDS_PER_REPETITION)],
                capture_output=True, text=True, env=ENV, timeout=120)
            assert run.returncode == 0, "repetition %d of %d exited %d:\n%s" % (
                rep + 1, repetitions, run.returncode, run.stderr[-4000:])
            assert not (quiet and run.stderr), run.stderr[-4000:]
    finally:
        report = prefill.finish()
    return report


def test_two_threads_progress_one_agent_while_it_pulls(layout_path):
    report = repeat("progress", layout_path)
    assert report["stats"]["released"] == REPETITIONS * 4  # every pull's done arrived


def test_close_while_threads_are_in_progress_and_wait(layout_path):
    repeat("close", layout_path)


def test_storage_views_outlive_close(layout_path):
    repeat("views", layout_path, repetitions=1)


def test_an_agent_dropped_with_a_transfer_in_flight_is_destroyed(layout_path):
    repeat("drop", layout_path, quiet=True)


def test_released_names_the_holds_the_decode_side_finished(layout_path):
    """The prefill side holds requests 7, 8 and 9; the decode side pulls 7 and 9 (every byte
    compared): released() names exactly 7 and then 9, while 8 stays held."""
    holds = {7: {0: [1, 2]}, 8: {0: [3]}, 9: {0: [4, 5]}}
    prefill = Prefill(layout_path, [(r, r, blocks) for r, blocks in holds.items()])
    memory = np.zeros(65536, dtype=np.uint8)
    try:
        with kvx.Agent(kvx.Layout.load(layout_path), {"kv": memory}) as agent:
            peer = agent.connect(prefill.address)
            for request_id in (7, 9):
                peer.read(holds[request_id], request_id=request_id, token=prefill.token)
            assert agent.released() == []  # the decode side holds nothing
            released = prefill.released(2)
    finally:
        report = prefill.finish()
    pattern = patterns.filled(65536, 0, 0)
    expected = np.zeros_like(memory)
    for b in (1, 2, 4, 5):
        expected[b * 4096:(b + 1) * 4096] = pattern[b * 4096:(b + 1) * 4096]
    assert np.array_equal(memory, expected)
    assert released == [7, 9]
    assert report["released"] == []  # drained: nothing named twice
    assert (report["stats"]["held"], report["stats"]["released"]) == (1, 2)
    assert report["stats"]["released_dropped"] == 0
    assert all(isinstance(line, str) for line in report["logs"])


def test_released_and_logs_before_the_agent_is_made_and_after_close():
    agent = kvx.Agent(kvx.Layout.from_dict(SMALL), insecure=True)
    assert agent.released() == [] and agent.logs() == []  # made by neither
    agent.listen("127.0.0.1:0")
    assert agent.released() == []
    agent.close()
    agent.close()
    with pytest.raises(kvx.InvalidError, match="the agent is closed"):
        agent.released()


def starved_prefill(layout_path, mode):
    process = subprocess.Popen([sys.executable, str(HERE / "starved_prefill.py"),
                                str(layout_path), mode], stdout=subprocess.PIPE, text=True,
                               env=dict(ENV, UCX_LOG_FILE="stderr"))
    line = json.loads(process.stdout.readline())
    return process, line["address"], bytes.fromhex(line["token"])


@pytest.mark.parametrize("mode", ["thread", "python"])
def test_a_prefill_starved_of_the_gil_serves_only_from_its_native_progress_thread(
        layout_path, mode):
    """A prefill whose Python never runs again once it holds a request (its main thread keeps
    the GIL): with start_progress_thread its agent still answers the handshake (the ZAP answer
    is the agent loop's), the read and the done, and the decode side gets every byte; with
    its loop on a Python thread, the decode side's connect fails at its deadline."""
    process, address, token = starved_prefill(layout_path, mode)
    try:
        layout = kvx.Layout.load(str(layout_path))
        memory = np.zeros(65536, dtype=np.uint8)
        with kvx.Agent(layout, {"kv": memory}, timeout_ms=3000) as agent:
            if mode == "python":
                with pytest.raises(kvx.Error):
                    agent.connect(address)
                return
            peer = agent.connect(address)
            peer.read({0: list(range(16))}, request_id=7, token=token)
        assert np.array_equal(memory, patterns.filled(65536, 0, 0))
    finally:
        process.kill()
        process.wait()
