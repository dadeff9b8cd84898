"""A prefill process whose Python threads get no GIL once it is serving: it holds request 7,
prints one JSON line (address, token), and then its main thread keeps the GIL for good (a
switch interval of 1000 s: the way a busy engine's model runner starves other Python
threads, made certain). With `thread` its agent's loop runs on the native progress thread
(Agent.start_progress_thread); with `python` on a Python thread, as an engine's own would.
usage: starved_prefill.py LAYOUT thread|python; the test kills it."""
import json
import sys
import threading

import kvx
import patterns


def main():
    layout = kvx.Layout.load(sys.argv[1])
    sizes = layout.storage_sizes()
    names = layout.regions().storage_names()
    memory = {name: patterns.filled(n, 0, s) for s, (name, n) in enumerate(zip(names, sizes))}
    agent = kvx.Agent(layout, memory)
    address = agent.listen("127.0.0.1:0")
    token = agent.hold(7, {0: list(range(16))})
    if sys.argv[2] == "thread":
        agent.start_progress_thread()
    else:
        threading.Thread(target=lambda: [agent.progress(10) for _ in iter(int, 1)],
                         daemon=True).start()
    print(json.dumps({"address": address, "token": token.hex()}), flush=True)
    sys.setswitchinterval(1000)
    while True:
        pass


if __name__ == "__main__":
    main()
