"""One repetition of a test_threads.py race, in a process of its own so that a crash is an exit
status, not the end of pytest. usage: threads_decode.py MODE LAYOUT ADDRESS TOKEN FIRST_ID
- progress: two threads progress() one agent while its main thread pulls from the prefill
  process (request ids FIRST_ID...), completed by those threads alone; every byte compared.
- close: one thread in progress(1000) and one pulling in a loop (wait()) when the main thread
  closes the agent: both raise InvalidError("the agent is closed"), and so does every later
  call on the agent, its peer and transfers.
- views: storage() views used after close(), kvx's memory and the engine's, then released.
- drop: an agent dropped, never closed, right after its transfer in flight was: destroyed
  once the cancelled transfer settled (stderr stays silent), not left allocated.
Exit status 0: passed; otherwise a traceback (or the signal that killed it)."""
import gc
import sys
import threading
import time

import numpy as np

import kvx
import patterns

PAGE = 4096
PULLS = [[1], [2, 3], [5, 6, 7], [9, 10, 11, 12, 13, 14, 15]]  # mode progress: disjoint
DEADLINE_S = 30  # far above any pull on loopback: only a hang reaches it


def expect_bytes(memory, blocks):
    """Pulled blocks hold the prefill's pattern, every other byte is still 0."""
    pattern = patterns.filled(len(memory), 0, 0)
    expected = np.zeros_like(memory)
    for b in blocks:
        expected[b * PAGE:(b + 1) * PAGE] = pattern[b * PAGE:(b + 1) * PAGE]
    assert np.array_equal(memory, expected)


def expect_closed(call):
    try:
        call()
    except kvx.InvalidError as e:
        assert e.args == ("the agent is closed", -1), e.args
    else:
        raise AssertionError("%r did not raise InvalidError" % call)


def two_threads_progress(layout, address, token, first):
    memory = np.zeros(layout.storage_sizes()[0], dtype=np.uint8)
    agent = kvx.Agent(layout, {"kv": memory})
    peer = agent.connect(address)
    stop, failures = threading.Event(), []
    lined_up = threading.Barrier(3)

    def progress():
        lined_up.wait()
        try:
            while not stop.is_set():
                agent.progress(5)
        except BaseException as e:  # noqa: B902
            failures.append(e)

    threads = [threading.Thread(target=progress) for _ in range(2)]
    for t in threads:
        t.start()
    lined_up.wait()  # both threads are about to progress: every pull races them
    for k, blocks in enumerate(PULLS):
        transfer = peer.read_async({0: blocks}, request_id=first + k, token=token)
        deadline = time.monotonic() + DEADLINE_S
        while not transfer.done:  # nobody here progresses: the two threads complete it
            assert time.monotonic() < deadline, "pull %d not done" % k
            stop.wait(0.0005)
        assert transfer.result().bytes == len(blocks) * PAGE
        transfer.release()
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures
    expect_bytes(memory, [b for blocks in PULLS for b in blocks])
    agent.close()


def close_during_progress_and_wait(layout, address, token, first):
    memory = np.zeros(layout.storage_sizes()[0], dtype=np.uint8)
    agent = kvx.Agent(layout, {"kv": memory})
    peer = agent.connect(address)
    progressing, pulled = threading.Event(), threading.Event()
    ended = {}
    transfers = []

    def progress():
        progressing.set()
        try:
            while True:
                agent.progress(1000)
        except BaseException as e:  # noqa: B902
            ended["progress"] = e

    def pull():
        try:
            for k in range(50):
                transfer = peer.read_async({0: [1 + k % 15]}, request_id=first + k, token=token)
                transfers.append(transfer)
                transfer.wait()
                pulled.set()
            while True:  # out of held requests: wait in progress() instead
                agent.progress(1000)
        except BaseException as e:  # noqa: B902
            ended["pull"] = e

    threads = [threading.Thread(target=progress), threading.Thread(target=pull)]
    for t in threads:
        t.start()
    assert progressing.wait(DEADLINE_S) and pulled.wait(DEADLINE_S)
    agent.close()  # the one thread in progress(1000), the other mostly in wait()
    for t in threads:
        t.join(DEADLINE_S)
        assert not t.is_alive(), "a thread did not return after close()"
    for name in ("progress", "pull"):
        e = ended.get(name)
        assert isinstance(e, kvx.InvalidError) and e.args == ("the agent is closed", -1), \
            (name, e)
    # every later call raises the same; closing and releasing have nothing left to do
    transfer = transfers[-1]
    for call in (lambda: agent.progress(0), agent.stats, agent.released, agent.logs,
                 agent.fileno, lambda: agent.storage("kv"), lambda: agent.hold(1, {0: [1]}),
                 lambda: agent.connect(address), lambda: peer.read({0: [1]}),
                 lambda: peer.transports, peer.reconnect, lambda: transfer.done,
                 transfer.wait, transfer.stats, lambda: transfer.failed_blocks,
                 transfer.verify_result):
        expect_closed(call)
    agent.close()
    peer.close()
    transfer.release()


def views_after_close(layout, address, token, first):
    # kvx's own memory: the view keeps the C agent (and its memory) until it is released
    agent = kvx.Agent(layout)
    peer = agent.connect(address)
    assert peer.read({0: [1, 5]}, request_id=first, token=token).bytes == 2 * PAGE
    view = agent.storage("kv")
    array = np.frombuffer(view, dtype=np.uint8)  # a second export, through the view
    expect_bytes(array, [1, 5])
    agent.close()
    expect_bytes(array, [1, 5])  # still there, and writable
    view[0] = 7
    array[PAGE - 1] = 9
    assert view[0] == 7 and array[PAGE - 1] == 9
    expect_closed(lambda: agent.storage("kv"))
    expect_closed(agent.stats)
    del array
    view.release()  # the last export: the C agent is destroyed now
    # the engine's memory, and an agent dropped before its view
    memory = np.zeros(layout.storage_sizes()[0], dtype=np.uint8)
    agent = kvx.Agent(layout, {"kv": memory})
    peer = agent.connect(address)
    peer.read({0: [2]}, request_id=first + 1, token=token)
    view = agent.storage("kv")
    agent.close()
    del agent, peer
    assert bytes(view[2 * PAGE:3 * PAGE]) == patterns.filled(3 * PAGE, 0, 0)[2 * PAGE:].tobytes()
    view[0] = 1
    assert memory[0] == 1
    view.release()


def dropped_with_a_transfer_in_flight(layout, address, token, first):
    memory = np.zeros(layout.storage_sizes()[0], dtype=np.uint8)
    agent = kvx.Agent(layout, {"kv": memory})
    peer = agent.connect(address)
    transfer = peer.read_async({0: list(range(16))}, request_id=first, token=token)
    del transfer, peer, agent  # cancelled, then the peer and the agent go: nothing settled yet
    gc.collect()


MODES = {"progress": two_threads_progress, "close": close_during_progress_and_wait,
         "views": views_after_close, "drop": dropped_with_a_transfer_in_flight}


def main():
    mode, path, address, token, first = sys.argv[1:6]
    layout = kvx.Layout.load(path)
    MODES[mode](layout, address, bytes.fromhex(token), int(first))


if __name__ == "__main__":
    main()
