"""peer_common.py: what bench/peer_nixl.py and bench/peer_mooncake.py share: the driver
contract's arguments, the block pattern and its check, the figures, and a supervisor that runs
the prefill and decode sides as two spawned processes with a deadline on every reply. It
knows no transfer API: each driver supplies a Side class (see Side below) and calls main().

Per (block, batch) point each side maps 2 x batch blocks of anonymous memory, the engine's
own cache; blocks 0, 2, 4, ... move, one descriptor each, prefill -> decode. "read" is
initiated by decode, "write" by prefill. The supervisor prints one JSON line per point and
op on stdout; the children send nothing there (their fd 1 goes to a file, see _child)."""
import argparse
import ctypes
import json
import mmap
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback

try:
    import numpy as np
except ImportError as e:  # main() reports it as the contract's one error line
    np, NUMPY_MISSING = None, "import numpy: %s" % e
else:
    NUMPY_MISSING = None

TRANSFER_DEADLINE_S = 60.0   # a child gives up on one transfer after this
SENTINEL = 0x5A              # the destination's bytes before a run: shows untouched blocks
INITIATOR = {"read": "decode", "write": "prefill"}


def log(*words):
    print(*words, file=sys.stderr, flush=True)


def ints(text):
    return [int(x) for x in text.split(",") if x]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=ints, default=ints("4096,65536,1048576,16777216"))
    p.add_argument("--batches", type=ints, default=ints("1,64"))
    p.add_argument("--ops", type=lambda s: s.split(","), default=["read", "write"])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-bytes-per-run", type=int, default=1 << 30)
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds the supervisor waits for any one reply from a side "
                        "(one repeat of a point, a setup, a check)")
    p.add_argument("--time-limit", type=float, default=3600.0,
                   help="seconds for the whole run; past it the sides are killed")
    a = p.parse_args(argv)
    bad = [op for op in a.ops if op not in INITIATOR]
    if bad or a.iters < 1 or a.repeats < 1 or a.warmup < 0:
        p.error("ops are read,write; iters and repeats >= 1, warmup >= 0")
    return a


def capped(n, point_bytes, max_bytes, floor):
    """n transfers, fewer if n of them would move more than max_bytes, but at least floor
    (or n, if smaller): a 1 GiB transfer must not run 100 times to make one figure."""
    return min(n, max(floor, max_bytes // point_bytes))


# --- memory and pattern ---------------------------------------------------------------

def block_pattern(seed, index, nbytes):
    """Bytes of source block `index` for a point's seed: a counter through a 64-bit mix,
    so every byte varies and no two blocks or points share content."""
    x = np.arange(index << 32, (index << 32) + (nbytes + 7) // 8, dtype=np.uint64)
    x ^= np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
    x *= np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(31)
    return x.view(np.uint8)[:nbytes]


class Cache:
    """2 x batch blocks of page-aligned anonymous memory, as an engine would hold them."""

    def __init__(self, block, batch):
        self.block, self.batch = block, batch
        self._map = mmap.mmap(-1, 2 * batch * block)
        self.mem = np.frombuffer(self._map, dtype=np.uint8)
        self.addr = self.mem.ctypes.data
        self.nbytes = self.mem.nbytes

    def moved_offsets(self):
        return [2 * i * self.block for i in range(self.batch)]

    def fill_source(self, seed):
        for i in range(2 * self.batch):
            self.mem[i * self.block:(i + 1) * self.block] = block_pattern(seed, i, self.block)

    def fill_sentinel(self):
        self.mem.fill(SENTINEL)

    def check_destination(self, seed):
        """None if every moved block holds the source's bytes and every other block is
        still SENTINEL, else what differs first."""
        for i in range(2 * self.batch):
            got = self.mem[i * self.block:(i + 1) * self.block]
            if i % 2 == 0:
                want = block_pattern(seed, i, self.block)
                if not np.array_equal(got, want):
                    at = int(np.flatnonzero(got != want)[0])
                    return "moved block %d differs at byte %d" % (i, at)
            elif not np.all(got == SENTINEL):
                return "unmoved block %d was written" % i
        return None

    def close(self):
        del self.mem
        self._map.close()


# --- the side interface ---------------------------------------------------------------

class Side:
    """One process's engine. A driver subclasses it; all calls may raise with a one-line
    message. Both sides: register(cache) -> picklable info the other side needs;
    connect(remote_info); release() undoes both. Initiator only: prepare(op, local_addrs,
    remote_addrs, block) builds what one transfer posts; transfer() posts the batch and
    waits for it (the timed call); transport(op) names what carried it."""

    def __init__(self, role):
        self.role = role

    def register(self, cache):
        raise NotImplementedError

    def connect(self, remote_info):
        raise NotImplementedError

    def prepare(self, op, local_addrs, remote_addrs, block):
        raise NotImplementedError

    def transfer(self):
        raise NotImplementedError

    def transport(self, op):
        return "unknown"

    def release(self):
        pass


def drain_captured_stdout():
    """Text the libraries wrote to this child's fd 1 since the last call (UCX prints its
    protocol tables there), copied to stderr so it stays visible."""
    f = _child_state["stdout"]
    f.seek(_child_state["stdout_pos"])
    text = f.read()
    _child_state["stdout_pos"] = f.tell()
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    return text


_child_state = {}


def _die_with_parent():
    """If the supervisor dies, the kernel kills this child too (PR_SET_PDEATHSIG), even
    while it is stuck in a library call."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _child(side_cls, role, conn):
    _die_with_parent()
    out = tempfile.TemporaryFile("w+")
    os.dup2(out.fileno(), 1)  # keep library prints off the supervisor's JSON stdout
    _child_state.update(stdout=out, stdout_pos=0)
    side, cache, remote_addr, seed = None, None, 0, 0
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            os._exit(1)
        cmd = msg[0]
        try:
            if cmd == "start":
                side = side_cls(role)
                reply = None
            elif cmd == "setup":      # (block, batch, seed)
                _, block, batch, seed = msg
                cache = Cache(block, batch)
                if role == "prefill":
                    cache.fill_source(seed)
                else:
                    cache.fill_sentinel()
                reply = (cache.addr, side.register(cache))
            elif cmd == "connect":    # (remote base address, remote info)
                remote_addr = msg[1]
                side.connect(msg[2])
                reply = None
            elif cmd == "reset":
                cache.fill_sentinel()
                reply = None
            elif cmd == "run":        # (op, warmup, iters, repeats)
                _, op, warmup, iters, repeats = msg
                local = [cache.addr + o for o in cache.moved_offsets()]
                remote = [remote_addr + o for o in cache.moved_offsets()]
                side.prepare(op, local, remote, cache.block)
                for _ in range(warmup):
                    side.transfer()
                for _ in range(repeats):
                    conn.send(("rep", _timed(side, iters)))
                reply = side.transport(op)  # after the runs: some engines log it on first use
            elif cmd == "verify":
                reply = cache.check_destination(seed)
            elif cmd == "teardown":   # also after a failed setup: undo what exists
                if side is not None:
                    side.release()
                if cache is not None:
                    cache.close()
                cache = None
                reply = None
            elif cmd == "quit":
                conn.send(("ok", None))
                sys.stdout.flush()
                drain_captured_stdout()
                os._exit(0)  # skip library destructors: nothing is measured there
            else:
                raise ValueError("unknown command %r" % (cmd,))
            conn.send(("ok", reply))
        except BaseException as e:  # noqa: B902 - every failure goes back as one line
            log("[%s] %s" % (role, traceback.format_exc().rstrip()))
            conn.send(("err", ("%s: %s" % (type(e).__name__, e)).replace("\n", " ")))


def _timed(side, iters):
    """Wall seconds of each of iters transfers, back to back; besides the engine's post and
    wait this holds one Python method call and two clock reads per transfer."""
    times = []
    clock = time.perf_counter
    for _ in range(iters):
        t = clock()
        side.transfer()
        times.append(clock() - t)
    return times


# --- the supervisor -------------------------------------------------------------------

class SideFailed(Exception):
    """A side answered with an error: the point fails, the run goes on."""


class SideLost(Exception):
    """A side died or missed a deadline: the run ends."""


class Supervisor:
    def __init__(self, side_cls, args):
        ctx = multiprocessing.get_context("spawn")
        self.args = args
        self.end = time.monotonic() + args.time_limit
        self.conns, self.procs = {}, {}
        for role in ("prefill", "decode"):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(side_cls, role, theirs),
                               name="peer-" + role, daemon=True)
            proc.start()
            theirs.close()
            self.conns[role], self.procs[role] = mine, proc

    def recv(self, role):
        conn = self.conns[role]
        deadline = min(time.monotonic() + self.args.timeout, self.end)
        while not conn.poll(0.2):
            if not self.procs[role].is_alive():
                raise SideLost("%s process died (exit code %s)"
                               % (role, self.procs[role].exitcode))
            if time.monotonic() > deadline:
                raise SideLost("%s gave no reply within %.0f s" % (role, self.args.timeout))
        try:
            return conn.recv()
        except EOFError:
            raise SideLost("%s process closed its pipe" % role)

    def ask(self, role, *msg):
        self.conns[role].send(msg)
        kind, value = self.recv(role)
        if kind != "ok":
            raise SideFailed("%s: %s" % (role, value))
        return value

    def both(self, *msg):
        for role in self.conns:
            self.conns[role].send(msg)
        out, failed = {}, None
        for role in self.conns:
            kind, value = self.recv(role)
            if kind != "ok":
                failed = failed or "%s: %s" % (role, value)
            out[role] = value
        if failed:
            raise SideFailed(failed)
        return out

    def close(self, lost=False):
        """Ask each side to quit, or kill it at once if the run was lost: a side stuck in
        a library call would only run out the reply deadline."""
        for role, proc in self.procs.items():
            if not lost:
                try:
                    self.conns[role].send(("quit",))
                    self.recv(role)
                except (SideLost, OSError):
                    pass
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def figures(reps, point_bytes):
    """Per repeat: GB/s over the summed wall time, median µs per transfer; then median,
    min and max of each over the repeats."""
    gbps = [point_bytes * len(t) / sum(t) / 1e9 for t in reps]
    us = [statistics.median(t) * 1e6 for t in reps]
    return {"gbps": round(statistics.median(gbps), 4), "gbps_min": round(min(gbps), 4),
            "gbps_max": round(max(gbps), 4), "us_per_transfer": round(statistics.median(us), 2),
            "us_min": round(min(us), 2), "us_max": round(max(us), 2)}


def emit(obj):
    print(json.dumps(obj), flush=True)


def run_point(sup, peer, block, batch, args):
    a = args
    point_bytes = block * batch
    iters = capped(a.iters, point_bytes, a.max_bytes_per_run, 3)
    warmup = capped(a.warmup, point_bytes, a.max_bytes_per_run, 1)  # connects, faults pages
    seed = (block * 1000003 + batch) * 2654435761
    base = {"peer": peer, "block": block, "batch": batch}
    try:
        stage = "setup"
        info = sup.both("setup", block, batch, seed)
        stage = "connect"
        sup.ask("prefill", "connect", *info["decode"])
        sup.ask("decode", "connect", *info["prefill"])
    except SideFailed as e:
        for op in a.ops:
            emit(dict(base, op=op, error="%s: %s" % (stage, e)))
        sup.both("teardown")
        return
    for n, op in enumerate(a.ops):
        try:
            if n:
                sup.ask("decode", "reset")
            who = INITIATOR[op]
            sup.conns[who].send(("run", op, warmup, iters, a.repeats))
            reps = []
            while True:
                kind, value = sup.recv(who)
                if kind == "rep":
                    reps.append(value)
                    continue
                if kind != "ok":
                    raise SideFailed("%s: %s" % (who, value))
                transport = value
                break
            bad = sup.ask("decode", "verify")
            if bad:
                raise SideFailed("verify: " + bad)
        except SideFailed as e:
            emit(dict(base, op=op, error=str(e)))
            continue
        emit(dict(base, op=op, **figures(reps, point_bytes), iters=iters, warmup=warmup,
                  repeats=a.repeats, transport=transport))
    sup.both("teardown")


def main(peer, side_cls, argv=None):
    """Run the contract for one peer: every point and op, one JSON line each; any failure
    to start becomes the one line {"peer", "error"} and exit status 0. The sides inherit
    os.environ: set a library's variables before calling this."""
    args = parse_args(argv)
    if NUMPY_MISSING:
        emit({"peer": peer, "error": NUMPY_MISSING})
        return 0
    sup, where, lost = None, "start", False
    try:
        sup = Supervisor(side_cls, args)
        sup.both("start")
        for block in args.blocks:
            for batch in args.batches:
                where = "block %d batch %d" % (block, batch)
                log("[%s] %s" % (peer, where))
                run_point(sup, peer, block, batch, args)
    except SideFailed as e:
        emit({"peer": peer, "error": str(e) if where == "start" else "%s: %s" % (where, e)})
    except SideLost as e:
        lost = True
        emit({"peer": peer, "error": "%s: %s" % (where, e)})
    finally:
        if sup:
            sup.close(lost)
    return 0
