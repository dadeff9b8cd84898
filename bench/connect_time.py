"""connect_time.py: what a first load from a new prefill costs as the KV cache grows.

A prefill process (P) and this process (D), each with an engine-sized cache of SIZE bytes in
memory the engine owns (numpy, every page touched, as vLLM's torch.zeros cache), laid out as
DeepSeek-V4's packed rows (47,808-byte rows, one whole-row region). P's loop runs as the vLLM
connector runs it: on the agent's native progress thread (--p-loop native), or, as before
it, on a Python thread that sleeps on the agent's descriptor and calls progress(0)
(--p-loop python). With --spin, P's main thread spins as an idle vLLM worker's does (polling
its shared-memory queue, yielding). Printed per size, medians of --runs runs, in ms:
  - P create: kvx.Agent over the cache, then listen (registration included);
  - D create: kvx.Agent over the cache, then fileno() (the agent made);
  - connect: agent.connect(P) (side channel, handshake, UCX endpoint, remote keys);
  - first read: one 256-token block (one row) read and its done counted, after connect;
  - first load: connect + first read, what D's first request from a new P waits.
With --loaded, two busy processes keep both cores occupied for the whole run (a busy
machine is the normal case). A benchmark: it asserts nothing. 2 noisy cores.

usage: PYTHONPATH=build/python UCX_NET_DEVICES=lo python3 bench/connect_time.py
           [--sizes 64M,1G,8G] [--runs 3] [--loaded] [--spin] [--p-loop native|python]"""

import argparse
import json
import multiprocessing
import os
import select
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

ROW = 47808  # bytes: DeepSeek-V4's packed row (shared/VLLM.md)


def layout_of(size):
    rows = size // ROW
    return {"kvx_layout": 1, "block_size": 256,
            "storages": [{"name": "kv_cache0", "size": rows * ROW}],
            "views": [{"name": "layers.0.attn", "kind": "mla", "storage": "kv_cache0",
                       "page": 37440, "stride": ROW, "num_blocks": rows, "dense": False}]}


def engine_cache(layout):
    cache = np.empty(layout["storages"][0]["size"], dtype=np.uint8)
    cache.fill(0)  # every page touched, as an engine's zeroed cache
    return cache


def progress_thread(agent, stop):
    """The vLLM worker's loop: sleep on the descriptor (1 ms while busy), progress(0)."""
    fd = agent.fileno()
    while not stop.is_set():
        select.select([fd], [], [], 0.001)
        agent.progress(0)


def prefill(size, auth, conn, spin, loop):
    import kvx

    d = layout_of(size)
    cache = engine_cache(d)
    t0 = time.monotonic()
    agent = kvx.Agent(kvx.Layout.from_dict(d), {"kv_cache0": cache}, auth=auth,
                      log_level="warn")
    address = agent.listen("127.0.0.1:0")
    created = time.monotonic() - t0
    token = agent.hold(1, {0: [7]})
    stop = threading.Event()
    thread = threading.Thread(target=progress_thread, args=(agent, stop), daemon=True)
    if loop == "native":
        agent.start_progress_thread()
    else:
        thread.start()
    conn.send((address, token, created))
    if spin:  # vLLM's idle worker: its main thread polls a shared-memory queue, yielding
        while not conn.poll():
            for _ in range(100):
                os.sched_yield()
    conn.recv()  # D is done
    stop.set()
    if thread.is_alive():
        thread.join()
    agent.close()


def one_run(size, auth, spin, loop):
    import kvx

    here, there = multiprocessing.Pipe()
    p = multiprocessing.get_context("spawn").Process(target=prefill, args=(size, auth, there, spin, loop))
    p.start()
    try:
        address, token, p_created = here.recv()
        d = layout_of(size)
        cache = engine_cache(d)
        t0 = time.monotonic()
        agent = kvx.Agent(kvx.Layout.from_dict(d), {"kv_cache0": cache}, auth=auth)
        agent.fileno()
        t1 = time.monotonic()
        peer = agent.connect(address)
        t2 = time.monotonic()
        peer.read({0: [3]}, {0: [7]}, request_id=1, token=token)
        t3 = time.monotonic()
        agent.close()
        return {"p_create": p_created, "d_create": t1 - t0, "connect": t2 - t1,
                "first_read": t3 - t2, "first_load": t3 - t1}
    finally:
        here.send("done")
        p.join(60)


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64M,1G,8G")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loaded", action="store_true")
    parser.add_argument("--spin", action="store_true",
                        help="P's main thread spins as vLLM's idle worker does")
    parser.add_argument("--p-loop", choices=("native", "python"), default="native")
    parser.add_argument("--json")
    args = parser.parse_args()
    build = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build")
    auth = os.path.join(build, "connect-time.key")
    if not os.path.exists(auth):
        subprocess.run([os.path.join(build, "kvx"), "auth-key", auth], check=True,
                       stdout=subprocess.DEVNULL)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(2 if args.loaded else 0)]
    rows = {}
    try:
        for text in args.sizes.split(","):
            runs = [one_run(parse_size(text), auth, args.spin, args.p_loop) for _ in range(args.runs)]
            rows[text] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows[text]["max_first_load"] = max(r["first_load"] for r in runs)
    finally:
        for hog in hogs:
            hog.kill()
    print("kvx first load from a new prefill, %s machine (2 noisy cores%s), P's loop on a %s "
          "thread%s, medians of %d runs, ms" % (
              "loaded" if args.loaded else "quiet", ": two busy processes" if args.loaded
              else "", args.p_loop, ", P's main thread spinning" if args.spin else "",
              args.runs))
    print("| cache | P create | D create | connect | first read | first load | worst load |")
    print("|---|---|---|---|---|---|---|")
    for text, r in rows.items():
        print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
            text, 1e3 * r["p_create"], 1e3 * r["d_create"], 1e3 * r["connect"],
            1e3 * r["first_read"], 1e3 * r["first_load"], 1e3 * r["max_first_load"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
