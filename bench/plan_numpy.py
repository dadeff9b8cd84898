#!/usr/bin/python3
"""plan_numpy.py: the NumPy baseline of bench_plan (docs/performance.md "Planning").

Builds a request's descriptors the way Python connectors do: per region, the base addresses
plus block_ids * stride, broadcast with NumPy into arrays of local and remote addresses, then a
Python list of (local_addr, remote_addr, len) tuples, which is what the peers post and what
costs them. For every case of `bench_plan --list` it runs the C bench (--json, --dump), checks
that both produce exactly the same descriptors, in the same order, and that kvx's coalesced
count is what merging that list gives, then prints both speeds and their ratio.

An "address" is (storage index << 48) + offset: every storage base is 0 and the index keeps
storages apart, so both sides' numbers compare exactly.

    /usr/bin/python3 bench/plan_numpy.py --kvx build/bench/bench_plan
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

STORAGE_SHIFT = 48  # address = (storage << 48) + offset; offsets stay below 2^48
GOAL_RATIO = 50.0  # kvx at least 50x faster than NumPy on the 128k-token rows
GOAL_TOKENS = 131072
WARMUPS = 2


class Peer:
    """What a connector prepares once per peer: per-region base addresses, strides and
    lengths as NumPy columns (the analogue of kvx_peer_plan_create)."""

    def __init__(self, local_regions, remote_regions):
        lr = np.array(local_regions, dtype=np.uint64).reshape(-1, 5)
        rr = np.array(remote_regions, dtype=np.uint64).reshape(-1, 5)
        if lr.shape != rr.shape or not np.array_equal(lr[:, 2], rr[:, 2]):
            raise SystemExit("plan_numpy.py: the baseline handles TP 1 and equal block lengths "
                             "only (pairs are identity)")
        shift = np.uint64(STORAGE_SHIFT)
        # columns: storage offset block_len stride num_blocks
        self.local_base = ((lr[:, 0] << shift) + lr[:, 1])[:, None]
        self.local_stride = lr[:, 3][:, None]
        self.remote_base = ((rr[:, 0] << shift) + rr[:, 1])[:, None]
        self.remote_stride = rr[:, 3][:, None]
        self.block_len = lr[:, 2]


def plan_numpy(peer, block_ids):
    """One request: block ids as the scheduler hands them (a list of ints) to the list of
    (local_addr, remote_addr, len) tuples, region by region, block by block in request order
    (regions.md "Descriptors" with one group, as kvx emits them)."""
    ids = np.asarray(block_ids, dtype=np.uint64)[None, :]
    local = (peer.local_base + ids * peer.local_stride).ravel()
    remote = (peer.remote_base + ids * peer.remote_stride).ravel()
    lens = np.repeat(peer.block_len, ids.shape[1])
    return list(zip(local.tolist(), remote.tolist(), lens.tolist()))


def dump_read(path):
    """Reads bench_plan --dump: regions of both sides, block ids, uncoalesced pairs."""
    with open(path, encoding="ascii") as f:
        lines = f.read().split("\n")
    pos = 0

    def header(key):
        nonlocal pos
        words = lines[pos].split()
        if not words or words[0] != key:
            raise SystemExit(f"plan_numpy.py: {path}: line {pos + 1}: expected '{key}', "
                             f"got {lines[pos]!r}")
        pos += 1
        return words[1:]

    def numbers(count):
        nonlocal pos
        block = lines[pos:pos + count]
        pos += count
        return np.array(" ".join(block).split(), dtype=np.uint64)

    if header("kvx_bench_plan_dump") != ["1"]:
        raise SystemExit(f"plan_numpy.py: {path}: not a version 1 dump")
    name = header("case")[0]
    n = int(header("regions")[0])
    local_regions = numbers(n)
    n = int(header("remote_regions")[0])
    remote_regions = numbers(n)
    n = int(header("ids")[0])
    ids = numbers(n)
    reads = int(header("reads")[0])
    if reads != 1:
        raise SystemExit(f"plan_numpy.py: {path}: {reads} reads; TP 1 has one")
    _, count = header("read")
    pairs = numbers(int(count)).reshape(-1, 5)
    return name, local_regions, remote_regions, ids, pairs


def kvx_addresses(pairs):
    """kvx pairs (local_storage remote_storage local_offset remote_offset len) as rows of
    (local_addr, remote_addr, len)."""
    shift = np.uint64(STORAGE_SHIFT)
    return np.stack([(pairs[:, 0] << shift) + pairs[:, 2],
                     (pairs[:, 1] << shift) + pairs[:, 3], pairs[:, 4]], axis=1)


def coalesced_count(rows):
    """Pairs left after merging each pair into the previous one when both ranges continue it
    (kvx's rule, no length limit)."""
    if len(rows) == 0:
        return 0
    end = rows[:-1, 0] + rows[:-1, 2]
    merge = (end == rows[1:, 0]) & (rows[:-1, 1] + rows[:-1, 2] == rows[1:, 1])
    return len(rows) - int(np.count_nonzero(merge))


def first_difference(a, b):
    if a.shape != b.shape:
        return f"kvx has {a.shape[0]} descriptors, NumPy {b.shape[0]}"
    i = int(np.argmax(np.any(a != b, axis=1)))
    return (f"descriptor {i}: kvx (0x{int(a[i, 0]):x}, 0x{int(a[i, 1]):x}, {int(a[i, 2])}),"
            f" NumPy (0x{int(b[i, 0]):x}, 0x{int(b[i, 1]):x}, {int(b[i, 2])})")


def time_numpy(peer, block_ids, iters):
    """Median, min and p90 (nearest rank) in ms of `iters` timed calls after WARMUPS."""
    for _ in range(WARMUPS):
        plan_numpy(peer, block_ids)
    samples = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        descs = plan_numpy(peer, block_ids)
        samples.append(time.perf_counter_ns() - start)
        del descs
    samples.sort()
    p90 = samples[(9 * len(samples) + 9) // 10 - 1]
    return statistics.median(samples) / 1e6, samples[0] / 1e6, p90 / 1e6


def run_case(args, name, tmp):
    dump = os.path.join(tmp, "pairs.txt")
    cmd = [args.kvx, "--case", name, "--json", "--dump", dump]
    if args.kvx_iters is not None:
        cmd += ["--iters", str(args.kvx_iters)]
    if args.layouts is not None:
        cmd += ["--layouts", args.layouts]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    case = report["cases"][0]

    dumped, local_regions, remote_regions, ids, pairs = dump_read(dump)
    if dumped != name:
        raise SystemExit(f"plan_numpy.py: {dump}: case {dumped}, asked for {name}")
    peer = Peer(local_regions, remote_regions)
    block_ids = ids.tolist()  # what a scheduler hands a connector
    ours = np.array(plan_numpy(peer, block_ids), dtype=np.uint64).reshape(-1, 3)
    theirs = kvx_addresses(pairs)
    if not np.array_equal(ours, theirs):
        print(f"plan_numpy.py: FAIL: {name}: kvx and NumPy descriptors differ: "
              f"{first_difference(theirs, ours)}", file=sys.stderr)
        sys.exit(1)
    if len(ours) != case["descriptors"] or coalesced_count(ours) != case["coalesced"]:
        print(f"plan_numpy.py: FAIL: {name}: kvx reports {case['descriptors']} descriptors and "
              f"{case['coalesced']} coalesced; the list has {len(ours)}, merging to "
              f"{coalesced_count(ours)}", file=sys.stderr)
        sys.exit(1)

    median_ms, min_ms, p90_ms = time_numpy(peer, block_ids, args.iters)
    return {
        "case": name,
        "tokens": case["tokens"],
        "kvx_us": case["plan_request"],
        "numpy_ms": {"median": median_ms, "min": min_ms, "p90": p90_ms},
        "ratio": median_ms * 1e3 / case["plan_request"]["median"],
        "descriptors": case["descriptors"],
        "coalesced": case["coalesced"],
        "machine": report["machine"],
        "kvx_iters": report["iters"],
    }


def main():
    parser = argparse.ArgumentParser(
        description="Check bench_plan's descriptors against NumPy and compare the speed.")
    parser.add_argument("--kvx", required=True, help="the bench_plan executable")
    parser.add_argument("--iters", type=int, default=20,
                        help="timed NumPy runs per case, after 2 warm-ups (default 20)")
    parser.add_argument("--kvx-iters", type=int, help="passed to bench_plan --iters")
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    parser.add_argument("--layouts", help="passed to bench_plan --layouts")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    names = subprocess.run([args.kvx, "--list"], check=True, capture_output=True,
                           text=True).stdout.split()
    if args.case:
        unknown = [c for c in args.case if c not in names]
        if unknown:
            parser.error(f"unknown case {unknown[0]} (bench_plan --list)")
        names = [n for n in names if n in args.case]

    rows = []
    with tempfile.TemporaryDirectory(prefix="kvx-plan-") as tmp:
        for name in names:
            rows.append(run_case(args, name, tmp))
            if not args.json:
                print(f"  checked {name}: {rows[-1]['descriptors']} descriptors identical",
                      file=sys.stderr)

    goal_rows = [r for r in rows if r["tokens"] == GOAL_TOKENS]
    goal_met = all(r["ratio"] >= GOAL_RATIO for r in goal_rows)
    if args.json:
        json.dump({"bench": "plan_numpy", "numpy": np.__version__,
                   "python": sys.version.split()[0], "numpy_iters": args.iters,
                   "goal_ratio": GOAL_RATIO, "goal_met": goal_met, "cases": rows},
                  sys.stdout, indent=1)
        print()
        return

    machine = rows[0]["machine"] if rows else {}
    print(f"machine: nproc {machine.get('nproc')}, {machine.get('cpu')}; noisy cores, "
          f"so read the medians")
    print(f"kvx: kvx_peer_plan_request, {rows[0]['kvx_iters'] if rows else 0} timed runs; "
          f"NumPy {np.__version__} on Python {sys.version.split()[0]}: "
          f"{args.iters} timed runs; descriptors identical in every case\n")
    print(f"{'case':<34} {'kvx us':>9} {'numpy ms':>9} {'ratio':>7} {'descriptors':>11} "
          f"{'coalesced':>9}")
    for r in rows:
        print(f"{r['case']:<34} {r['kvx_us']['median']:>9.2f} {r['numpy_ms']['median']:>9.3f} "
              f"{r['ratio']:>6.0f}x {r['descriptors']:>11} {r['coalesced']:>9}")
    if goal_rows:
        worst = min(goal_rows, key=lambda r: r["ratio"])
        print(f"\ngoal: kvx >= {GOAL_RATIO:.0f}x faster than NumPy at 128k tokens: "
              f"{'met' if goal_met else 'missed'} (lowest: {worst['ratio']:.0f}x, "
              f"{worst['case']})")


if __name__ == "__main__":
    main()
