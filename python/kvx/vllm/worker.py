"""The connector's worker half, one per TP rank: the kvx agent over vLLM's own cache tensors,
and the threads that drive it.

The agent's loop runs on its native progress thread (Agent.start_progress_thread), which
never takes the GIL: a busy model runner, or a loaded machine, starves an engine's Python
threads for seconds, and what P answers its peers (the side channel's handshake, heartbeats,
dones, served reads) must not wait for them (a handshake P answered 5.5 s late was seen).

vLLM calls the worker hooks from its model-runner thread, which must never wait on the
network. So the hooks only hand orders to an order thread and collect what it finished:
every other kvx call (connect, hold, read, write) happens on that one Python thread, which
wakes for each order and every millisecond while transfers or holds are in flight, to
collect what completed."""

import collections
import logging
import os
import queue
import select
import threading
import time

import kvx

from . import layout as engine_layout
from .config import auth_of, consumers_per_rank, listen_address

logger = logging.getLogger("vllm.kvx")  # under vLLM's own handlers

IDLE_WAIT_S = 0.05   # the order thread's sleep with nothing in flight (an order wakes it)
BUSY_WAIT_S = 0.001  # while a transfer of ours is in flight, or P holds blocks
UNREACHABLE_S = 1.0  # a P whose handshake failed is not asked again for this long, doubled
UNREACHABLE_MAX_S = 60.0  # with each failure in a row up to this
ENDED_KEPT = 65536   # loads remembered as reported (an abort for one comes a step later)
SWEEP_S = 60.0       # how often the order thread forgets peers that are down and unused (at
                     # most; more often with a shorter peer_ttl_ms)


class LoadRefused(Exception):
    """A load that is not even tried: its parameters are wrong for this request."""


class Probing(Exception):
    """A P not connected yet is probed on a thread of its own first: wait for the answer."""

    def __init__(self, key):
        super().__init__("probing %s" % ",".join(key))
        self.key = key


NULL_BLOCK = 0  # vLLM's null block (BlockPool's first): a placeholder, never a request's


def _aligned(local, remote):
    """(local, remote) ids per group, paired from the end: D's blocks that hit its own prefix
    cache are not loaded, so its list is P's tail. More local blocks than P sent is refused.
    A sliding window's list starts with null placeholders for blocks that slid out: a pair
    whose local block is null is dropped (D does not keep that block), and one whose remote
    block is null while D's is not is refused (P no longer has what D would read)."""
    if len(local) != len(remote):
        raise LoadRefused("P sent block ids for %d groups, this engine has %d"
                          % (len(remote), len(local)))
    out_local, out_remote = [], []
    for g, (lo, re) in enumerate(zip(local, remote)):
        if len(lo) > len(re):
            raise LoadRefused("group %d: %d blocks to load, P holds %d" % (g, len(lo), len(re)))
        pairs = [(a, b) for a, b in zip(lo, re[len(re) - len(lo):]) if a != NULL_BLOCK]
        if any(b == NULL_BLOCK for _, b in pairs):
            raise LoadRefused("group %d: P's block list has a null block where this engine "
                              "keeps one (its window slid further)" % g)
        out_local.append([a for a, _ in pairs])
        out_remote.append([b for _, b in pairs])
    return out_local, out_remote


class KvxWorker:
    def __init__(self, vllm_config, kv_cache_config, settings):
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.settings = settings
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.tp_rank = get_tensor_model_parallel_rank() if self.tp_size > 1 else 0
        self.consumers = consumers_per_rank(settings, self.tp_size)  # P: dones per hold
        ktc = vllm_config.kv_transfer_config
        self.is_producer = ktc.is_kv_producer
        self.engine_id = ktc.engine_id
        self.single_group = len(kv_cache_config.kv_cache_groups) == 1
        self.agent = None
        self.address = None
        self.orders = queue.SimpleQueue()
        self.results_lock = threading.Lock()  # the sets below, between the two threads
        self.finished_sending = set()
        self.finished_recving = set()
        self.failed_recving = {}  # vLLM request id -> its blocks, of every group
        self.load_errors = set()
        self.stats = {}
        # owned by the order thread
        self.held = {}       # kvx request id -> vLLM request id (P)
        self.leases_expired = 0  # the agent's count, as last reported (P)
        self.transfers = {}  # vLLM request id -> (Transfer, local ids, start time) (D)
        self.aborted = set()
        self.ended = collections.OrderedDict()  # vLLM request ids whose load was reported
        self.wanted = {}     # vLLM request id -> (Peer, kvx request id, token): heartbeated (D)
        self.releasing = []  # notify-only Transfers releasing holds D will not read (D)
        self.peers = {}      # tuple of P addresses -> kvx.Peer
        self.unreachable = {}  # tuple of P addresses -> (until, failures, error) (handshakes)
        self.answered = set()  # P address tuples whose probe just passed: connect now
        self.parked = {}       # P address tuple -> [(order, Want or Load, start)] (probing)
        self.probed = queue.SimpleQueue()  # (P address tuple, error or None), from probes
        self.swept = time.monotonic()
        self.sweep_s = min(SWEEP_S, (settings.peer_ttl_ms or SWEEP_S * 1000) / 1000)
        self.thread = None
        self.stopping = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)

    # ---- model-runner thread ----------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        layout, memory = engine_layout.build(kv_caches, self.kv_cache_config, self.vllm_config)
        params = {"name": "vllm-%s-%d" % (self.engine_id[:16], self.tp_rank),
                  "tp_rank": self.tp_rank, "tp_size": self.tp_size,
                  "engine_id": str(self.engine_id)[:64]}
        for key in ("timeout_ms", "lease_ms", "peer_ttl_ms", "transports"):
            if getattr(self.settings, key) is not None:
                params[key] = getattr(self.settings, key)
        if self.settings.verify_one_in:
            params["verify_one_in"] = self.settings.verify_one_in
        if self.is_producer:  # its info lines are per request (dones, releases): warnings only
            params["log_level"] = "warn"
        self.layout = kvx.Layout.from_dict(layout)
        self.agent = kvx.Agent(self.layout, memory, **auth_of(self.settings), **params)
        if self.is_producer:
            dp_rank = getattr(self.vllm_config.parallel_config, "data_parallel_rank", 0) or 0
            self.address = self.agent.listen(listen_address(
                self.settings, self.tp_rank + dp_rank * self.tp_size))
        self.agent.start_progress_thread()  # the agent is made now: its errors are start-up's
        self.regions = regions = self.layout.regions()
        logger.info("kvx: %d views in %d groups, %d storages registered in place as %d "
                    "regions%s", len(layout["views"]), len({v["group"] for v in layout["views"]}),
                    len(layout["storages"]), len(regions),
                    ", listening at %s" % self.address if self.address else "")
        self.thread = threading.Thread(target=self._run, name="kvx-orders", daemon=True)
        self.thread.start()

    def handle(self, meta):
        """This step's orders from the scheduler, for the order thread."""
        if meta is None or not (meta.holds or meta.loads or meta.wants or meta.unwants
                                or meta.aborted):
            return
        self.orders.put(meta)
        os.write(self.wake_w, b"x")

    def take_results(self, as_block_errors=False):
        """(finished sending, finished receiving, failed receiving) since the last call. With
        as_block_errors (a caller of the older get_finished, which has no failed set), a failed
        load's blocks become load errors of every group: a block id of another group's request
        may be recomputed needlessly, but no failed load passes for a loaded one."""
        with self.results_lock:
            out = (self.finished_sending, self.finished_recving, set(self.failed_recving))
            if as_block_errors:
                for blocks in self.failed_recving.values():
                    self.load_errors |= blocks
            self.finished_sending, self.finished_recving, self.failed_recving = set(), set(), {}
        return out

    def take_load_errors(self):
        with self.results_lock:
            errors, self.load_errors = self.load_errors, set()
        return errors

    def take_stats(self):
        with self.results_lock:
            stats, self.stats = self.stats, {}
        return stats

    def shutdown(self):
        if self.thread is not None:
            self.stopping = True
            os.write(self.wake_w, b"x")
            self.thread.join(timeout=10)
            self.thread = None
        if self.agent is not None:
            for transfer in [t for t, _, _ in self.transfers.values()] + self.releasing:
                transfer.release()
            self.transfers.clear()
            self.releasing.clear()
            self.agent.close()
            self.agent = None

    # ---- order thread ----------------------------------------------------------------
    def _run(self):
        while not self.stopping:
            try:
                self._take_probes()
                self._take_orders()
                # in flight: our transfers, or on P holds whose dones (or pushes) may come:
                # what the agent's thread completed is collected within a millisecond
                busy = self.transfers or self.held or self.releasing
                select.select([self.wake_r], [], [], BUSY_WAIT_S if busy else IDLE_WAIT_S)
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
                self._collect()
                if time.monotonic() - self.swept > self.sweep_s:
                    self._sweep()
            except Exception:  # never let the thread die silently: vLLM would hang
                logger.exception("kvx: order thread")
                time.sleep(IDLE_WAIT_S)

    def _take_orders(self):
        while True:
            try:
                meta = self.orders.get_nowait()
            except queue.Empty:
                return
            self.aborted |= meta.aborted
            for hold in meta.holds:
                self._each(hold.req_id, self._hold, hold, on_error=self._sent)
            for want in meta.wants:
                self._each(want.req_id, self._want, want)
            for req_id in meta.unwants:
                self._each(req_id, self._release, req_id)
            for load in meta.loads:
                self._take_load(load, time.monotonic())
            for req_id in meta.aborted:
                self._each(req_id, self._abort, req_id)

    def _take_load(self, load, start):
        self._each(load.req_id, self._load, load, start,
                   on_error=lambda req_id, e: self._failed(req_id, load.local_ids, e, start))

    def _take_probes(self):
        """Carries on with the orders parked on P's probe: connects and loads once it
        answered, fails the loads if it did not (and backs off from that P)."""
        while True:
            try:
                key, error = self.probed.get_nowait()
            except queue.Empty:
                return
            parked = [(order, what, start) for order, what, start in self.parked.pop(key, [])
                      if what.req_id not in self.ended]  # not aborted while it waited
            if error is not None:
                self._count(handshake_failures=1)
                self._unreachable(key, error)
            elif parked:
                self.answered.add(key)
            for order, what, start in parked:
                if order == "want":
                    self._each(what.req_id, self._want, what)
                else:
                    self._take_load(what, start)

    def _each(self, req_id, order, *args, on_error=None):
        """Carries out one order. An error none of them expects is logged with its trace and
        ends that request's order (on_error), never the step's other orders."""
        try:
            order(*args)
        except Exception as e:
            logger.exception("kvx: request %s: %s", req_id, order.__name__.strip("_"))
            if on_error is not None and req_id not in self.ended and req_id not in self.transfers:
                on_error(req_id, e)

    def _sent(self, req_id, error=None):
        """P: the request's blocks may be freed (held, or never to be)."""
        with self.results_lock:
            self.finished_sending.add(req_id)

    def _abort(self, req_id):
        if req_id in self.ended:
            del self.ended[req_id]  # reported already: vLLM ended it for that report
            self.aborted.discard(req_id)
        elif req_id not in self.transfers:
            self._release(req_id)
            self._loaded(req_id, None)  # never posted: nothing writes its blocks

    def _hold(self, hold):
        try:
            self.agent.hold(hold.kvx_id, hold.block_ids, consumers=self.consumers,
                            token=hold.token)
            self.held[hold.kvx_id] = hold.req_id
        except kvx.Error as e:
            logger.error("kvx: request %s: not held (%s); its blocks are freed now",
                         hold.req_id, e.args[0])
            self._sent(hold.req_id)

    def _want(self, want):
        """Connects to P now (the load then finds the peer ready) and heartbeats the request
        until its load completes, so that P's lease outlasts D's queue."""
        try:
            peer = self._peer(want.params["remote_addresses"])
        except Probing as probing:
            self.parked[probing.key].append(("want", want, None))
            return
        except kvx.Error:
            return  # the load tries again, and reports what fails
        try:
            kvx_id = int(want.params["remote_request_id"])
            token = bytes.fromhex(want.params["remote_token"])
            peer.want(kvx_id, token)
            self.wanted[want.req_id] = (peer, kvx_id, token)
        except (kvx.Error, KeyError, TypeError, ValueError):
            pass  # the load tries again, and reports what fails

    def _unwant(self, req_id):
        """Stops heartbeating the request; returns what _want kept of it, or None."""
        wanted = self.wanted.pop(req_id, None)
        if wanted is not None:
            try:
                wanted[0].unwant(wanted[1])
            except kvx.Error:
                pass  # a closed peer heartbeats nothing
        return wanted

    def _release(self, req_id):
        """A request that ends on D without a transfer (aborted or rejected in D's queue, a
        full local prefix hit, a refused load): tells P at once with a notify-only done (the
        hold's token, no blocks), so that P frees the blocks now, not at the lease's end."""
        wanted = self._unwant(req_id)
        if wanted is None:
            return  # never connected for it: its hold ends at the lease
        peer, kvx_id, token = wanted
        try:
            self.releasing.append(peer.read_async({0: []}, request_id=kvx_id, token=token))
        except kvx.Error as e:
            logger.info("kvx: request %s: P's hold not released (%s); it ends at its lease",
                        req_id, e.args[0])

    def _peer(self, addresses):
        """The connected Peer of P's ranks. A P not connected (or down) is probed first, on a
        thread of its own (Probing: the order waits for the answer), because kvx's connect is
        one blocking call under the agent's lock: a P that takes connections and never
        answers would otherwise stop every transfer of this worker until the handshake's
        deadline. A P whose probe or handshake failed is not tried again for UNREACHABLE_S,
        doubled with each failure in a row (up to UNREACHABLE_MAX_S), so the requests of a
        dead P fail at once."""
        key = tuple(addresses)
        until, failures, error = self.unreachable.get(key, (0.0, 0, None))
        if time.monotonic() < until:
            raise error
        peer = self.peers.get(key)
        if peer is not None and peer.down_reason is None:
            return peer
        if key not in self.answered:
            self._probe(key)
            raise Probing(key)
        self.answered.discard(key)  # once: a P that goes down later is probed again
        try:
            start = time.monotonic()
            if peer is None:
                peer = self.peers[key] = self.agent.connect(list(addresses))
            else:
                peer.reconnect()
            logger.info("kvx: connected to %s in %.1f ms", ",".join(addresses),
                        1e3 * (time.monotonic() - start))
            self._sample("handshake_seconds", time.monotonic() - start)
        except kvx.Error as e:
            self._count(handshake_failures=1)
            self._unreachable(key, e)
            raise
        self.unreachable.pop(key, None)
        return peer

    def _sweep(self):
        """Forgets the Ps this worker no longer talks to: a peer kvx took down (dead, or idle
        past peer_ttl_ms: its connection is closed then) that no waiting request uses is
        closed and dropped, and back-offs long over are dropped, so that Ps restarted on new
        ports or scaled away leave nothing behind. A later request for one starts afresh."""
        now = self.swept = time.monotonic()
        used = {id(peer) for peer, _, _ in self.wanted.values()}
        forgotten = []
        for key, peer in list(self.peers.items()):
            reason = peer.down_reason
            if reason is not None and id(peer) not in used:
                try:
                    peer.close()
                except RuntimeError:
                    continue  # a transfer of it not collected yet: the next sweep
                del self.peers[key]
                forgotten.append("%s (%s)" % (",".join(key), reason))
        if forgotten:
            logger.info("kvx: forgot %d peers: %s", len(forgotten), "; ".join(forgotten))
        for key, (until, _, _) in list(self.unreachable.items()):
            if now - until > UNREACHABLE_MAX_S:
                del self.unreachable[key]

    def _unreachable(self, key, error):
        _, failures, _ = self.unreachable.get(key, (0.0, 0, None))
        wait = min(UNREACHABLE_S * 2 ** failures, UNREACHABLE_MAX_S)
        self.unreachable[key] = (time.monotonic() + wait, failures + 1, error)

    def _probe(self, key):
        """Starts a probe of P's ranks (Regions.probe: its metadata and the connect's checks,
        no agent involved) on a thread of its own, unless one runs; its answer comes back
        through self.probed and wakes the order thread."""
        if key in self.parked:
            return  # one runs: the order parks beside the others
        self.parked[key] = []
        auth = auth_of(self.settings)

        def probe():
            error = None
            try:
                for address in key:
                    self.regions.probe(address, timeout_ms=self.settings.timeout_ms,
                                       tp_rank=self.tp_rank, tp_size=self.tp_size, **auth)
            except kvx.Error as e:
                error = e
            except Exception as e:  # never lose the answer: the parked orders wait on it
                error = kvx.InternalError("probe: %r" % (e,), -201)
            self.probed.put((key, error))
            os.write(self.wake_w, b"x")

        threading.Thread(target=probe, name="kvx-probe", daemon=True).start()

    def _load(self, load, start):
        if load.req_id in self.aborted:
            return
        try:
            p = load.params  # accepted by the scheduler (params.refusal)
            addresses = p["remote_addresses"]  # as many as P's ranks (params.refusal)
            token = bytes.fromhex(p["remote_token"])
            try:
                peer = self._peer(addresses)  # kvx's handshake first: it names what differs
            except Probing as probing:
                self.parked[probing.key].append(("load", load, start))
                return
            local, remote = _aligned(load.local_ids, p["remote_block_ids"])
            push = self.settings.transfer_mode == "push"  # D's own setting decides
            post = peer.write_async if push else peer.read_async
            transfer = post(local, remote, request_id=int(p["remote_request_id"]), token=token)
            self._sample("post_seconds", time.monotonic() - start)
        except (kvx.Error, LoadRefused, KeyError, TypeError, ValueError) as e:
            self._release(load.req_id)  # nothing was posted: P's hold is of no use now
            self._failed(load.req_id, load.local_ids, e, start)
            return
        self.transfers[load.req_id] = (transfer, load.local_ids, start)

    def _collect(self):
        for line in self.agent.logs():  # kvx's own: peers connected or dead, leases expired
            logger.info("kvx: %s", line)
        for req_id, (transfer, local_ids, start) in list(self.transfers.items()):
            if not transfer.done:
                continue
            del self.transfers[req_id]
            try:
                stats = transfer.result()
            except kvx.Error as e:
                self._failed(req_id, local_ids, e, start)
            else:
                self._count(bytes=stats.bytes, transfers=1, seconds=time.monotonic() - start)
                self._sample("load_seconds", stats.seconds)
                self._loaded(req_id, None)
            finally:
                transfer.release()
        for transfer in [t for t in self.releasing if t.done]:
            self.releasing.remove(transfer)
            try:
                transfer.result()
            except kvx.Error as e:  # P died, or the hold ended meanwhile: nothing to free
                logger.info("kvx: a hold's release was not counted (%s)", e.args[0])
            finally:
                transfer.release()
        if self.is_producer:
            released = [self.held.pop(kvx_id, None) for kvx_id in self.agent.released()]
            released = [req_id for req_id in released if req_id is not None]
            if released:
                expired = self.agent.stats()["leases_expired"]
                self._count(holds_released=len(released),
                            leases_expired=expired - self.leases_expired)
                self.leases_expired = expired
                with self.results_lock:
                    self.finished_sending.update(released)

    def _failed(self, req_id, local_ids, error, start):
        message = error.args[0] if error.args else str(error)
        logger.warning("kvx: request %s: KV not loaded (%s: %s); vLLM's kv_load_failure_policy "
                       "decides", req_id, type(error).__name__, message)
        self._count(failures=1, seconds=time.monotonic() - start)
        self._loaded(req_id, {b for ids in local_ids for b in ids if b != NULL_BLOCK})

    def _loaded(self, req_id, failed_blocks):
        """Reports a load's end to vLLM, exactly once: a request vLLM ends because its load
        failed comes back as an abort, and a second report would name a request vLLM has
        forgotten (its scheduler asserts it knows every one)."""
        self.aborted.discard(req_id)
        self.ended[req_id] = True
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)
        self._unwant(req_id)  # a completed transfer ended it already; a failed one did not
        with self.results_lock:
            self.finished_recving.add(req_id)
            if failed_blocks is not None:
                self.failed_recving[req_id] = failed_blocks
                if self.single_group:  # block ids are unique only within a group
                    self.load_errors |= failed_blocks

    def _count(self, **counts):
        with self.results_lock:
            for key, value in counts.items():
                self.stats[key] = self.stats.get(key, 0) + value

    def _sample(self, key, seconds):
        """One sample of a histogram (connector.PROM_HISTOGRAMS)."""
        with self.results_lock:
            self.stats.setdefault(key, []).append(seconds)
