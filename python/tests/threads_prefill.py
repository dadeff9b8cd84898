"""A prefill process for test_threads.py: serves a layout from numpy memory filled with the
known pattern, holds many requests with one token, and runs its agent's loop on a thread of its
own while the main thread answers the test on stdin (a second thread using the agent).
usage: threads_prefill.py LAYOUT HOLDS_JSON, HOLDS_JSON [[first_id, last_id, {group: [block
ids]}], ...]: requests first_id..last_id hold those blocks.
It prints one JSON line (address, token); then for each line "released N" it prints the ids
released() named once it named at least N (or 60 s passed); when stdin closes, its report:
memory intact, stats, and what released() and logs() still had."""
import json
import sys
import threading
import time

import numpy as np

import kvx
import patterns


def progress_until(agent, stop, failures):
    try:
        while not stop.is_set():
            agent.progress(100)
    except BaseException as e:  # noqa: B902 (reported by the main thread)
        failures.append(repr(e))


def main():
    layout = kvx.Layout.load(sys.argv[1])
    layout.in_host_memory()
    holds = {r: {int(g): ids for g, ids in blocks.items()}
             for first, last, blocks in json.loads(sys.argv[2]) for r in range(first, last + 1)}
    names = layout.regions().storage_names()
    memory = {name: patterns.filled(nbytes, 0, s)
              for s, (name, nbytes) in enumerate(zip(names, layout.storage_sizes()))}
    with kvx.Agent(layout, memory, lease_ms=600000) as agent:
        address = agent.listen("127.0.0.1:0")
        token = kvx.token_generate()
        for request_id, blocks in holds.items():
            agent.hold(request_id, blocks, token=token)
        stop, failures = threading.Event(), []
        progress = threading.Thread(target=progress_until, args=(agent, stop, failures))
        progress.start()
        print(json.dumps({"address": address, "token": token.hex()}), flush=True)
        for line in sys.stdin:
            wanted = int(line.split()[1])
            released, deadline = [], time.monotonic() + 60
            while len(released) < wanted and time.monotonic() < deadline:
                released += agent.released()
                stop.wait(0.01)
            print(json.dumps({"released": released}), flush=True)
        stop.set()
        progress.join()
        intact = all(np.array_equal(memory[n], patterns.filled(len(memory[n]), 0, s))
                     for s, n in enumerate(names))
        print(json.dumps({"intact": intact, "stats": agent.stats(), "failures": failures,
                          "released": agent.released(), "logs": agent.logs()}), flush=True)


if __name__ == "__main__":
    main()
