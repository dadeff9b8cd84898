"""peers.py: kvx against NIXL and Mooncake on the same blocks, the same transports and the same
machine, in one run: each peer's GB/s and µs per transfer and kvx's ratio to each peer.

kvx is measured by `kvx bench --malloc` (run REPEATS times per point: it times one run per
call); NIXL and Mooncake by bench/peer_nixl.py and bench/peer_mooncake.py, which repeat
inside one call (bench/peer_common.py has their contract). Every point moves every other one
of 2 x batch caller-allocated host blocks, verified. Only the standard library is used here:
the peers' packages live in the interpreter given by --python. Normally run by peers.sh."""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

from peer_common import capped, ints  # the drivers' own cap and list parsing (numpy optional)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PUSH = "tcp"  # kvx bench's own --push-transports default (docs/security.md)
MOONCAKE_SET = "tcp"  # Mooncake has no transport here but TCP, so it runs in this set only
MODE = {"read": "pull", "write": "push"}
PEERS = ("kvx", "nixl", "mooncake")


def log(*words):
    print("peers:", *words, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvx", required=True, help="the kvx binary")
    p.add_argument("--python", required=True, help="an interpreter with nixl, mooncake, numpy")
    p.add_argument("--peer-setup-error", help="why --python cannot run the peers (peers.sh "
                   "passes it when the venv could not be made): each peer reports it")
    p.add_argument("--blocks", type=ints, default=ints("4096,65536,1048576,16777216"))
    p.add_argument("--batches", type=ints, default=ints("1,64"))
    p.add_argument("--ops", type=lambda s: s.split(","), default=["read", "write"])
    p.add_argument("--transports", action="append",
                   help="a transport set, e.g. sm,cma,tcp; repeat for several "
                        "(default: sm,cma,tcp then tcp)")
    p.add_argument("--repeats", type=int)
    p.add_argument("--iters", type=int, help="transfers per repeat for every block size "
                   "(default 200 up to 64K, 100 up to 1M, 30 above; a quarter with --quick)")
    p.add_argument("--warmup", type=int, default=200,
                   help="untimed transfers before each point, kvx's and the drivers' alike "
                        "(fewer for large points, as iters); the first hundred or so touch "
                        "UCX's shared-memory buffers for the first time")
    p.add_argument("--max-bytes-per-run", type=int, default=1 << 30)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds any one kvx bench or driver call may take")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 repeats, fewer iters")
    p.add_argument("--json", action="store_true", help="one JSON object per line and point")
    a = p.parse_args(argv)
    a.transports = a.transports or ["sm,cma,tcp", "tcp"]
    if a.repeats is None:
        a.repeats = 3 if a.quick else 5
    bad = [op for op in a.ops if op not in MODE]
    if bad or a.repeats < 1 or a.warmup < 0 or (a.iters is not None and a.iters < 1):
        p.error("ops are read,write; repeats and iters >= 1, warmup >= 0")
    return a


def nominal_iters(block, args):
    if args.iters is not None:
        return args.iters
    n = 200 if block <= 65536 else 100 if block <= 1 << 20 else 30
    return max(3, n // 4) if args.quick else n


def groups(items, key):
    """items split by key(item), in first-seen order: one call per group."""
    out = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out.items()


def run(cmd, timeout, env=None):
    """(exit status or None on timeout, stdout, stderr) of cmd. It gets its own session so
    that a timeout kills what it started too (kvx bench's prefill, the drivers' sides)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def why(rc, err, timeout):
    """A failed call's cause in one line: its last lines naming an error (kvx's "kvx:
    error:" pairs say what failed and where), else its last lines of stderr."""
    if rc is None:
        return "no result within %.0f s (killed)" % timeout
    lines = [line for line in err.splitlines() if line.strip()]
    mine = [line for line in lines if "error" in line.lower()]
    return "exit status %d: %s" % (rc, " / ".join((mine or lines or ["no message"])[-2:]))


def json_lines(text):
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                pass


def spread(values, digits):
    """Median, min and max over the repeats, as the drivers report them."""
    return (round(statistics.median(values), digits), round(min(values), digits),
            round(max(values), digits))


# --- kvx ---------------------------------------------------------------------------------

def ucx_version_of(binary):
    """The UCX version `binary` loaded, as `kvx --version` prints it: "kvx 0.1.0 (UCX 1.22.0)"."""
    rc, out, _ = run([binary, "--version"], 30)
    m = re.search(r"\(UCX ([0-9.]+)\)", out) if rc == 0 else None
    return m.group(1) if m else "?"


def kvx_points(args, tset, op, push, ucx):
    """kvx's lines for one transport set and op (and, for write, P's push transports):
    per batch, one kvx bench call per repeat and group of block sizes sharing an iteration
    count. Yields dicts in the drivers' shape, or point error lines."""
    for batch in args.batches:
        def runs_of(block):  # (iters, warm-ups): capped as the drivers cap theirs
            return (capped(nominal_iters(block, args), block * batch, args.max_bytes_per_run, 3),
                    capped(args.warmup, block * batch, args.max_bytes_per_run, 1))
        for (iters, warmup), blocks in groups(args.blocks, runs_of):
            cmd = [args.kvx, "bench", "--malloc", "--json", "--mode", MODE[op],
                   "--block-sizes", ",".join(map(str, blocks)), "--batch", str(batch),
                   "--iters", str(iters), "--warmup", str(warmup), "--transports", tset]
            if op == "write":
                cmd += ["--push-transports", push]
            runs, error, used = {b: [] for b in blocks}, None, ""
            for _ in range(args.repeats):
                rc, out, err = run(cmd, args.timeout)
                got = {r.get("block_size"): r for r in json_lines(out)}
                if rc != 0 or any(b not in got for b in blocks):
                    error = "kvx bench %s: %s" % (" ".join(cmd[2:]), why(rc, err, args.timeout))
                    break
                for b in blocks:
                    runs[b].append(got[b])
                # A pull names the lanes D's endpoint used; in a push that endpoint is idle
                # and kvx bench prints its configured list, so name P's push list instead.
                used = got[blocks[0]].get("transports", "") if op == "read" else \
                    "push over " + push
            for b in blocks:
                base = {"peer": "kvx", "op": op, "block": b, "batch": batch}
                if op == "write":
                    base["push_transports"] = push
                if error:
                    yield dict(base, error=error)
                    continue
                gbps = spread([r["gbps"] for r in runs[b]], 4)
                us = spread([r["latency_us"]["p50"] for r in runs[b]], 2)
                yield dict(base, gbps=gbps[0], gbps_min=gbps[1], gbps_max=gbps[2],
                           us_per_transfer=us[0], us_min=us[1], us_max=us[2], iters=iters,
                           warmup=warmup, repeats=args.repeats,
                           transport="UCX %s %s" % (ucx, used))


# --- the drivers -------------------------------------------------------------------------

def driver_points(args, peer, tset):
    """The driver's lines for one transport set: one call per group of block sizes that
    share a nominal iteration count (the driver caps it per point as kvx_points does). A
    peer that cannot start gives one line {"peer", "error"} and no more calls."""
    if args.peer_setup_error:
        yield {"peer": peer, "error": args.peer_setup_error}
        return
    if not os.access(args.python, os.X_OK):
        yield {"peer": peer, "error": "no interpreter at %s (peers.sh makes it)" % args.python}
        return
    env = dict(os.environ)
    if peer == "nixl":
        env["UCX_TLS"] = tset
    script = os.path.join(HERE, "peer_%s.py" % peer)
    limit = args.timeout - min(30.0, args.timeout / 4)  # the driver stops its sides first
    for iters, blocks in groups(args.blocks, lambda b: nominal_iters(b, args)):
        cmd = [args.python, script, "--blocks", ",".join(map(str, blocks)),
               "--batches", ",".join(map(str, args.batches)), "--ops", ",".join(args.ops),
               "--iters", str(iters), "--warmup", str(args.warmup),
               "--repeats", str(args.repeats),
               "--max-bytes-per-run", str(args.max_bytes_per_run),
               "--timeout", str(min(120.0, limit)), "--time-limit", str(limit)]
        rc, out, err = run(cmd, args.timeout, env)
        lines = list(json_lines(out))
        yield from lines
        if any("error" in r and "block" not in r for r in lines):
            return  # it could not start, or lost a side: the next call would say the same
        if rc != 0 or not lines:
            yield {"peer": peer, "error": "%s: %s" % (os.path.basename(script),
                                                       why(rc, err, args.timeout))}
            return


# --- the comparison ----------------------------------------------------------------------

def add_ratios(lines, tset):
    """On each kvx point line, ratio: kvx's GB/s over each other peer's at the same op,
    block and batch in this set. A kvx write whose push transports are not the set's (the
    secure default, kept for reference) has no peer on the same transports: no ratios."""
    by_point = {}
    for r in lines:
        if "gbps" in r and r["peer"] != "kvx":
            by_point.setdefault((r["op"], r["block"], r["batch"]), {})[r["peer"]] = r["gbps"]
    for r in lines:
        if r["peer"] != "kvx" or "gbps" not in r:
            continue
        others = {} if r.get("push_transports", tset) != tset else \
            by_point.get((r["op"], r["block"], r["batch"]), {})
        r["ratio"] = {p: round(r["gbps"] / g, 3) for p, g in others.items() if g > 0}


def run_set(args, tset, ucx):
    lines = []
    for op in args.ops:
        log("[%s] kvx %s" % (tset, op))
        lines += kvx_points(args, tset, op, tset, ucx)
        if op == "write" and tset != DEFAULT_PUSH:
            log("[%s] kvx write, push over %s" % (tset, DEFAULT_PUSH))
            lines += kvx_points(args, tset, op, DEFAULT_PUSH, ucx)
    for peer in ("nixl", "mooncake"):
        if peer == "mooncake" and tset != MOONCAKE_SET:
            continue
        log("[%s] %s" % (tset, peer))
        lines += driver_points(args, peer, tset)
    for r in lines:
        r["transports"] = tset
    add_ratios(lines, tset)
    return lines


# --- the table ---------------------------------------------------------------------------

def size_text(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, unit)
    return str(b)


def num(x):
    return "%.3g" % x if x < 1000 else "%.0f" % x


def table(lines, tset, repeats):
    """One transport set as text: a column pair per peer (and for kvx's push over its
    default transports, where that differs), then kvx's ratios."""
    points = [r for r in lines if "block" in r]
    cols = [("kvx", tset)]
    if any(r.get("push_transports") not in (None, tset) for r in points):
        cols.append(("kvx", DEFAULT_PUSH))
    cols += [(p, None) for p in PEERS[1:] if any(r["peer"] == p for r in lines)]
    names = ["kvx push %s" % push if push not in (None, tset) else peer for peer, push in cols]
    others = [c[0] for c in cols if c[0] != "kvx"]
    cell = {}
    for r in points:
        col = (r["peer"], r.get("push_transports", tset) if r["peer"] == "kvx" else None)
        cell[(r["op"], r["block"], r["batch"], col)] = r
    head = ["op", "block", "batch"]
    for n in names:
        head += ["%s GB/s (min-max)" % n, "µs"]
    head += ["kvx/%s" % p for p in others]
    rows = [head]
    keys = sorted({(r["op"], r["block"], r["batch"]) for r in points},
                  key=lambda k: (list(MODE).index(k[0]), k[1], k[2]))
    for op, block, batch in keys:
        row = [op, size_text(block), str(batch)]
        for c in cols:
            r = cell.get((op, block, batch, c))
            if r is None:
                row += ["-", "-"]
            elif "error" in r:
                row += ["error", "-"]
            else:
                row += ["%s (%s-%s)" % (num(r["gbps"]), num(r["gbps_min"]), num(r["gbps_max"])),
                        num(r["us_per_transfer"])]
        ratio = cell.get((op, block, batch, cols[0]), {}).get("ratio", {})
        row += [num(ratio[p]) if p in ratio else "-" for p in others]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    out = ["transports %s (%d repeats per point; kvx write: push over %s)" % (
        tset, repeats, tset)]
    for row in rows:
        out.append("  ".join(v.ljust(w) if i < 3 else v.rjust(w)
                             for i, (v, w) in enumerate(zip(row, widths))).rstrip())
    for r in lines:
        if "error" in r:
            where = " %s %s batch %d" % (r["op"], size_text(r["block"]), r["batch"]) \
                if "block" in r else ""
            if r.get("push_transports") not in (None, tset):
                where += " (push %s)" % r["push_transports"]
            out.append("  error: %s%s: %s" % (r["peer"], where, r["error"]))
    return "\n".join(out)


def versions(lines, kvx_ucx):
    seen = {"kvx": "UCX %s" % kvx_ucx}
    for r in lines:
        # The drivers name what carried a point: "UCX 1.23.0 get: ...", "mooncake 0.3.13 ..."
        m = re.match(r"(UCX |mooncake )(\S+)", r.get("transport", ""))
        if m and r["peer"] not in seen:
            seen[r["peer"]] = m.group(2) if m.group(1) == "mooncake " else m.group(0)
    return ", ".join("%s %s" % (p, v) for p, v in seen.items())


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")  # loopback only, kvx and NIXL alike
    ucx = ucx_version_of(args.kvx)
    start = time.monotonic()
    all_lines = []
    for tset in args.transports:
        lines = run_set(args, tset, ucx)
        all_lines += lines
        if args.json:
            for r in lines:
                print(json.dumps(r), flush=True)
    if not args.json:
        print("kvx vs peers, %s, %d noisy cores; medians of %d runs; %s; %s" % (
            time.strftime("%Y-%m-%d %H:%M %Z"), os.cpu_count(), args.repeats,
            versions(all_lines, ucx), "UCX_NET_DEVICES=%s" % os.environ["UCX_NET_DEVICES"]))
        print("GB/s: bytes moved over summed wall time; µs: median per transfer (kvx: its "
              "p50); warm-ups: %d per point, fewer for large ones\n" % args.warmup)
        print("\n\n".join(table([r for r in all_lines if r["transports"] == t], t,
                                args.repeats) for t in args.transports))
    log("done in %.0f s" % (time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
