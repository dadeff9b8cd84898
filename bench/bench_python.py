"""bench_python.py: the per-request cost of kvx from Python against the same request from C.

The prefill side is `kvx serve` (idle between requests, as in `kvx bench --idle-prefill`)
on the sweep layout `kvx bench` builds: one storage and one view per block size, 2 x BATCH
blocks each, every other block moved, so each request posts BATCH descriptors. The decode
side is this process, reading into kvx-allocated memory through the kvx package. Printed per
block size: wall p50 per request and GB/s over the summed wall time, from Python and from
`kvx bench` run just before; the difference is the Python layer's overhead per request.
A benchmark, not a test: 2 noisy cores move these numbers; take medians of runs.

usage: PYTHONPATH=build/python /usr/bin/python3 bench/bench_python.py [BUILD] [ITERS]"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
ITERS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
BATCH = 8
SIZES = [4096, 65536, 1 << 20]
sys.path.insert(0, os.path.join(BUILD, "python"))
import kvx  # noqa: E402

KVX = os.path.join(BUILD, "kvx")


def sweep_layout():
    return {"kvx_layout": 1,
            "storages": [{"name": "s%d" % i, "size": size * 2 * BATCH}
                         for i, size in enumerate(SIZES)],
            "views": [{"name": "layers.%d.mla" % i, "kind": "mla", "storage": "s%d" % i,
                       "page": size, "stride": size, "num_blocks": 2 * BATCH, "group": i}
                      for i, size in enumerate(SIZES)]}


def c_figures():
    out = subprocess.run([KVX, "bench", "--json", "--idle-prefill", "--batch", str(BATCH),
                          "--iters", str(ITERS), "--block-sizes",
                          ",".join("%dK" % (s // 1024) for s in SIZES)],
                         check=True, capture_output=True, text=True).stdout
    points = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {p["block_size"]: (p["latency_us"]["p50"], p["gbps"]) for p in points}


def python_figures(directory):
    layout_path = os.path.join(directory, "sweep.json")
    with open(layout_path, "w") as f:
        json.dump(sweep_layout(), f)
    serve = subprocess.Popen([KVX, "serve", layout_path, "--listen", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = serve.stdout.readline()
        address = line.split(" on ")[1].split(":")[0] + ":" + line.split(" on ")[1].split(":")[1]
        layout = kvx.Layout.from_dict(sweep_layout())
        figures = {}
        with kvx.Agent(layout) as agent:
            peer = agent.connect(address)
            for g, size in enumerate(SIZES):
                blocks = {i: [] for i in range(len(SIZES))}  # every group, as kvx bench
                blocks[g] = list(range(0, 2 * BATCH, 2))
                for _ in range(3):  # wire-up, as kvx bench warms up
                    peer.read(blocks)
                walls = []
                for _ in range(ITERS):
                    start = time.perf_counter()
                    peer.read(blocks)
                    walls.append(time.perf_counter() - start)
                figures[size] = (statistics.median(walls) * 1e6,
                                 size * BATCH * len(walls) / sum(walls) / 1e9)
            peer.close()
        return figures
    finally:
        serve.terminate()
        serve.wait()


def main():
    with tempfile.TemporaryDirectory() as directory:
        key = os.path.join(directory, "auth.key")
        subprocess.run([KVX, "auth-key", key], check=True, capture_output=True)
        os.environ["KVX_AUTH_FILE"] = key
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
        c = c_figures()
        py = python_figures(directory)
    print("block  batch  C p50 us  Python p50 us  overhead us  C GB/s  Python GB/s  ratio")
    for size in SIZES:
        (cp50, cg), (pp50, pg) = c[size], py[size]
        print("%5dK %6d %9.1f %14.1f %12.1f %7.2f %12.2f %6.2f"
              % (size // 1024, BATCH, cp50, pp50, pp50 - cp50, cg, pg, pg / cg))
    print("(%d requests per point; 2 noisy cores: take medians of several runs)" % ITERS)


if __name__ == "__main__":
    main()
