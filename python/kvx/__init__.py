"""kvx: move KV-cache blocks between prefill and decode workers, from Python.

A thin layer over the C extension `kvx._kvx` (include/kvx.h); docs/python.md has the API,
ownership and threading rules. Every call that can wait releases the GIL; callbacks run only
inside progress() and the blocking calls, never on their own.

Threads: an Agent, its Peers and Transfers may be used from several threads at once (a
model-runner thread posting and polling, a progress thread driving the loop): a lock per agent
serializes every C call, progress() and wait() let the other threads in between their turns,
and close() from any thread makes every call in progress or later raise InvalidError("the
agent is closed")."""

import collections
import collections.abc
import itertools
import json
import os
import threading
import warnings
import time

from . import _kvx
from ._kvx import (  # noqa: F401  (the error classes are part of the API)
    BusyError,
    CanceledError,
    Error,
    InternalError,
    InvalidError,
    IOFailure,
    MismatchError,
    NoMemoryError,
    OutOfRangeError,
    PeerDownError,
    PeerRefusedError,
    PeerTimeoutError,
)

__all__ = ["Layout", "Regions", "RegionInfo", "Agent", "Peer", "Transfer", "ReadStats",
           "VerifyResult", "Error",
           "token_generate", "auth_key_load", "auth_key_generate", "auth_file", "AUTH_FILE_ENV",
           "ucx_version"]

RegionInfo = collections.namedtuple(
    "RegionInfo",
    "index name storage offset block_len stride num_blocks first_descriptor group heads "
    "mla packed_row scratch ssm ple members")

ReadStats = collections.namedtuple("ReadStats", "descriptors posted bytes seconds")

token_generate = _kvx.token_generate
ucx_version = _kvx.ucx_version  # "1.22.0": what UCX does differs by version (docs/performance.md)
auth_key_load = _kvx.auth_key_load
auth_key_generate = _kvx.auth_key_generate
auth_file = _kvx.auth_file  # the key file: the one given, else KVX_AUTH_FILE's, else None
AUTH_FILE_ENV = _kvx.AUTH_FILE_ENV


class Regions:
    """A registered region table: a sequence of RegionInfo."""

    def __init__(self, table):
        self._table = table

    def __len__(self):
        return len(self._table)

    def __getitem__(self, index):
        if index < 0:
            index += len(self)
        return RegionInfo(*self._table.get(index))

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def storage_names(self):
        return self._table.storage_names()

    def compat_hash(self, push=False):
        """The handshake's compatibility hash (docs/wire.md), 32 bytes."""
        return self._table.compat_hash(push)

    def probe(self, address, *, auth=None, insecure=False, timeout_ms=None, tp_rank=0,
              tp_size=1):
        """Whether the prefill agent at "HOST:PORT" answers and would pass a connect's checks
        against this table (kvx_peer_probe): its metadata over the side channel, the
        compatibility hash, the region table. No agent is involved and the GIL is released,
        so a thread can wait for a peer that may never answer while an agent works on. Raises
        what a connect would (PeerDownError when nothing listens, PeerTimeoutError when it
        does not answer within timeout_ms, MismatchError naming what differs)."""
        key = None if insecure else Agent._auth_key(auth)
        self._table.probe(address, key, insecure,
                          _kvx.DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms,
                          tp_rank, tp_size)

    def to_json(self):
        """The kvx_plan document, byte for byte what `kvx plan --json` prints (the table, then
        the pull-mode compatibility hash)."""
        text = self._table.to_json()
        end = text.rindex("}") + 1
        return '%s,\n  "compat_hash": "%s"\n}\n' % (text[:end - 2], self.compat_hash().hex())


class Layout:
    """A paged-cache layout (docs/layout-format.md), checked as the C library checks it."""

    def __init__(self, handle):
        self._handle = handle

    @classmethod
    def load(cls, path):
        return cls(_kvx.layout_load(os.fspath(path)))

    @classmethod
    def from_json(cls, text):
        return cls(_kvx.layout_from_json(text))

    @classmethod
    def from_dict(cls, d):
        return cls.from_json(json.dumps(d))

    def regions(self):
        return Regions(self._handle.regions())

    def storage_sizes(self):
        return self._handle.storage_sizes()

    def storage_mems(self):
        """Each storage's memory kind: "dram" (host) or "vram" (GPU)."""
        return self._handle.storage_mems()

    def in_host_memory(self):
        """Turns the layout's "vram" storages into host memory, as `kvx serve --memory host`
        does, and returns the layout (Layout.load(path).in_host_memory() reads as it should).
        An Agent given host memory for a "vram" storage does this for that storage itself."""
        self._handle.in_host_memory()
        return self


_DLPACK_CPU, _DLPACK_CUDA = 1, 2  # DLPack's device types kDLCPU and kDLCUDA


def _cuda_array_memory(obj):
    """(address, bytes) of an object with __cuda_array_interface__ (CuPy, Numba, a CUDA
    torch.Tensor): writable and C-contiguous, or an error saying which it is not."""
    cai = obj.__cuda_array_interface__
    address, readonly = cai["data"]
    if readonly:
        raise BufferError("__cuda_array_interface__: the array is read-only")
    itemsize = int(cai["typestr"][2:])
    shape = tuple(cai["shape"])
    count = 1
    for n in shape:
        count *= n
    strides = cai.get("strides")
    if strides is not None:
        expected = itemsize
        for n, stride in reversed(list(zip(shape, strides))):
            if n > 1 and stride != expected:
                raise ValueError("__cuda_array_interface__: the array is not C-contiguous")
            expected *= n
    return address, count * itemsize


def _memory_of(obj):
    """What kvx registers for `obj`, and the memory kind it is: ("vram", (address, bytes)) for
    CUDA memory (__cuda_array_interface__, or DLPack on a CUDA device), ("dram", buffer) for
    anything with the buffer protocol (or a CPU torch.Tensor's numpy view), ("dram",
    (address, bytes)) for a CPU DLPack tensor without one."""
    if hasattr(obj, "__cuda_array_interface__"):
        return "vram", _cuda_array_memory(obj)
    try:
        memoryview(obj)
        return "dram", obj
    except TypeError:
        pass
    if hasattr(obj, "__dlpack__"):
        address, size, device_type, _ = _kvx.dlpack_memory(obj.__dlpack__())
        if device_type not in (_DLPACK_CPU, _DLPACK_CUDA):
            raise ValueError("DLPack: device type %d is neither CPU nor CUDA" % device_type)
        return ("vram" if device_type == _DLPACK_CUDA else "dram"), (address, size)
    if hasattr(obj, "numpy"):
        return "dram", obj.numpy()
    raise TypeError("memory: %s has neither the buffer protocol, __cuda_array_interface__ nor "
                    "DLPack" % type(obj).__name__)


def _groups(blocks, max_group):
    """Block ids per group: a mapping {group: ids} or a sequence indexed by group; ids are any
    sequence of integers, and a numpy uint64 array is passed without a copy. A group above
    `max_group` (the layout's highest) is refused before the list is made: {2**31: [1]} would
    otherwise build a list of 2**31 groups."""
    if blocks is None:
        return None
    if isinstance(blocks, collections.abc.Mapping):
        if not blocks:
            return []
        if any(not isinstance(g, int) or g < 0 for g in blocks):
            raise ValueError("blocks: group numbers must be integers >= 0")
        if max(blocks) > max_group:
            raise OutOfRangeError("blocks: group %d is above the layout's highest, %d"
                                  % (max(blocks), max_group), -2)
        return [blocks.get(g, ()) for g in range(max(blocks) + 1)]
    return list(blocks)


_ERRORS = {-1: InvalidError, -2: OutOfRangeError, -3: IOFailure, -4: CanceledError,
           -5: BusyError, -6: MismatchError, -100: PeerDownError, -101: PeerTimeoutError, -102: PeerRefusedError,
           -200: NoMemoryError, -201: InternalError}
_INPROGRESS = 1


VerifyResult = collections.namedtuple(
    "VerifyResult", "status segments bytes mismatches seconds reported")
VerifyResult.__doc__ = """A transfer's verification (docs/agent.md, "Verification"): status 0
when every (region, block) segment's checksums agreed; reported lists the first mismatches as
dicts naming the region, block, views and both sides' storage, offset and checksum."""


class Transfer:
    """A posted pull or push. The agent's progress completes it (progress(), wait(), or
    awaiting it in asyncio); nothing runs behind the program's back."""

    def __init__(self, agent, handle):
        self._agent = agent
        self._handle = handle

    @property
    def done(self):
        return self._handle.status()[0] != _INPROGRESS

    @property
    def failed_blocks(self):
        """{group: [block ids]} a failed transfer did not load: all of its blocks."""
        return self._handle.failed_blocks()

    def stats(self):
        return ReadStats(*self._handle.stats())

    def result(self):
        """ReadStats of a completed transfer; raises the kvx.Error of a failed one, with its
        failed_blocks."""
        status, message = self._handle.status()
        if status == _INPROGRESS:
            raise InvalidError("the transfer is still in progress", -1)
        if status != 0:
            error = _ERRORS.get(status, Error)(message, status)
            error.failed_blocks = self.failed_blocks
            raise error
        return self.stats()

    def verify(self):
        """Verifies the transfer with checksums asked of the prefill ranks. In progress: it is
        verified before it completes (a pull before its dones) and fails with MismatchError
        if any segment differs. Completed: verified now (GIL released); returns the
        VerifyResult, or raises MismatchError (its .verify_result says where)."""
        status, message = self._handle.verify()
        if not self.done:
            return None
        result = self.verify_result()
        if status != 0:
            error = _ERRORS.get(status, Error)(message, status)
            error.verify_result = result
            raise error
        return result

    def verify_result(self):
        """The last VerifyResult, or None if the transfer was not verified."""
        r = self._handle.verify_result()
        return VerifyResult(*r) if r is not None else None

    def wait(self):
        """Progresses the agent until it completed or failed (GIL released; other threads use
        the agent between its turns): result(). InvalidError if the agent is closed meanwhile."""
        self._handle.wait()
        return self.result()

    def release(self):
        """Lets the transfer go now (one in progress is cancelled); a Peer closes only once
        its transfers are released or collected. Does nothing once the agent is closed."""
        self._handle.release()

    def __await__(self):
        import asyncio

        loop = asyncio.get_running_loop()
        fd = self._agent.fileno()
        while True:
            self._agent.progress(0)
            if self.done:
                return self.result()
            woken = loop.create_future()
            loop.add_reader(fd, lambda: woken.done() or woken.set_result(None))
            try:
                # UCX does not signal every local completion: look again within 1 ms
                yield from asyncio.wait([woken], timeout=0.001).__await__()
            finally:
                loop.remove_reader(fd)


class Peer:
    """The prefill ranks of a request (one for TP 1), as this decode agent sees them. Made by
    Agent.connect."""

    def __init__(self, agent, handle):
        self._agent = agent
        self._handle = handle

    def _post(self, push, blocks, remote_blocks, request_id, token):
        if request_id is None:
            request_id = self._agent._next_request_id()
        max_group = self._agent._max_group
        return Transfer(self._agent, self._handle.post(push, _groups(blocks, max_group),
                                                       _groups(remote_blocks, max_group),
                                                       request_id, token))

    def read_async(self, blocks, remote_blocks=None, *, request_id=None, token=None):
        """Posts a pull of `blocks` ({group: ids}; remote_blocks: the prefill's ids when they
        differ); `token` is the hold's. Returns a Transfer."""
        return self._post(False, blocks, remote_blocks, request_id, token)

    def read(self, blocks, remote_blocks=None, *, request_id=None, token=None, timeout_ms=None,
             verify=False):
        """Pulls and waits (GIL released); returns ReadStats or raises with failed_blocks.
        timeout_ms (at most the agent's own deadline) gives up sooner: the transfer is
        cancelled and PeerTimeoutError names every block. verify=True verifies it with
        checksums before it completes: MismatchError when bytes differ."""
        return self._blocking(self.read_async(blocks, remote_blocks, request_id=request_id,
                                              token=token), blocks, timeout_ms, verify)

    def _blocking(self, transfer, blocks, timeout_ms, verify=False):
        try:
            if verify:
                transfer.verify()
            if timeout_ms is None:
                return transfer.wait()
            deadline = time.monotonic() + timeout_ms / 1000
            while not transfer.done and time.monotonic() < deadline:
                self._agent.progress(max(1, int((deadline - time.monotonic()) * 1000)))
            if transfer.done:
                return transfer.result()
            error = PeerTimeoutError("transfer not done within %d ms: cancelled" % timeout_ms,
                                     -101)
            groups = _groups(blocks, self._agent._max_group)
            error.failed_blocks = {g: [int(i) for i in ids] for g, ids in enumerate(groups)
                                   if len(ids)}
            raise error
        finally:
            transfer.release()  # cancels one in progress; a traceback must not keep it

    def write_async(self, blocks, remote_blocks=None, *, request_id=None, token=None):
        """Posts a push: the prefill ranks write the blocks into ours. The first one to a peer
        registers our writer there, which waits up to the timeout."""
        return self._post(True, blocks, remote_blocks, request_id, token)

    def write(self, blocks, remote_blocks=None, *, request_id=None, token=None, timeout_ms=None,
              verify=False):
        """Pushes and waits; returns ReadStats or raises with failed_blocks. verify as read's."""
        return self._blocking(self.write_async(blocks, remote_blocks, request_id=request_id,
                                               token=token), blocks, timeout_ms, verify)

    @property
    def transports(self):
        """What UCX really uses, per rank."""
        return [info[0] for info in self._handle.info()]

    @property
    def down_reason(self):
        """None while every rank is usable, else the first rank's reason."""
        return next((info[1] for info in self._handle.info() if info[1] is not None), None)

    def reconnect(self):
        self._handle.reconnect()

    def want(self, request_id, token):
        """Decode side: the request (whose hold token is `token`) is still wanted from these
        prefill ranks: the agent's progress heartbeats them, keeping its holds' leases alive,
        until a transfer of it completes or unwant()."""
        self._handle.want(request_id, token)

    def unwant(self, request_id):
        """No more heartbeats for the request (it was aborted): its holds end at their leases."""
        self._handle.unwant(request_id)

    def close(self):
        """Closes the connections to the ranks; refused while a Transfer of the peer exists.
        Does nothing once the agent is closed."""
        self._handle.close()
        self._agent._peers.discard(self)


class Agent:
    """One worker's storages, region table, transport and side channel.

    memory maps storage names to writable memory the engine owns, registered in place: host
    buffers (bytearray, numpy arrays, memoryview, CPU torch tensors) for "dram" storages, and
    for "vram" storages GPU memory through __cuda_array_interface__ or DLPack (a CUDA
    torch.Tensor, CuPy; docs/gpu.md). Without it kvx allocates every storage
    (agent.storage(name)). The C agent is made on first use: call listen() first on
    a prefill agent. auth is a key file's path or the secret's bytes (default: the file
    KVX_AUTH_FILE names); insecure=True allows no secret, on loopback only.

    Thread-safe: any thread may call any method of the agent, its peers and transfers at any
    time (docs/python.md, "Ownership and threading"). Released holds are named by released(),
    the agent's log lines by logs(), or passed to the callbacks of set_release_callback() and
    set_log_callback()."""

    def __init__(self, layout, memory=None, *, auth=None, insecure=False, tp_rank=0, tp_size=1,
                 **params):
        self._layout = layout
        regions = layout.regions()
        self._names = regions.storage_names()
        self._max_group = regions._table.max_group()
        self._memory = self._memory_list(memory)
        self._params = dict(params, tp_rank=tp_rank, tp_size=tp_size)
        if insecure:
            if auth is not None:
                raise ValueError("auth and insecure: choose one")
            self._params["insecure"] = True
        else:
            self._params["auth_key"] = self._auth_key(auth)
        self._handle = None
        self._peers = set()
        self._request_ids = itertools.count(1)  # next() is atomic: threads post at once
        self._create_lock = threading.Lock()  # one C agent, whichever thread uses it first
        self._closed = False
        self._on_release = None  # set_release_callback
        self._on_log = None  # set_log_callback
        self._undelivered = collections.deque()  # (callback kind, item) drained, not yet called

    def _memory_list(self, memory):
        if memory is None:
            return None
        unknown = set(memory) - set(self._names)
        if unknown:
            raise ValueError("memory: no storage named %s" % ", ".join(sorted(unknown)))
        self._owners = dict(memory)  # what the registered addresses belong to, kept alive
        memory = {name: _memory_of(obj) for name, obj in memory.items()}
        # checked now, before any agent exists: the C layer checks again when it registers
        for name, size, mem in zip(self._names, self._layout.storage_sizes(),
                                   self._layout.storage_mems()):
            if name not in memory:
                continue
            kind, registered = memory[name]
            if kind == "dram" and mem == "vram":
                # The layout describes a deployment, the buffer says what it is: host memory
                # for a GPU storage is registered as host memory, as `kvx serve` does by default.
                warnings.warn("kvx: storage %s is \"vram\" in the layout; its memory is host "
                              "memory, registered as such" % name, stacklevel=3)
                self._layout._handle.in_host_memory(self._names.index(name))
            elif kind != mem:
                raise ValueError(
                    "memory: storage %s is \"%s\" in the layout, its memory is GPU memory "
                    "(a GPU storage is \"vram\" in the layout file)" % (name, mem))
            nbytes = registered[1] if isinstance(registered, tuple) else None
            if nbytes is None:
                view = memoryview(registered)
                if view.readonly:
                    raise BufferError("memory: storage %s: the buffer is read-only" % name)
                nbytes = view.nbytes
            if nbytes < size:
                raise ValueError("memory: storage %s needs %d bytes, its memory has %d"
                                 % (name, size, nbytes))
        return [memory[name][1] if name in memory else None for name in self._names]

    @staticmethod
    def _auth_key(auth):
        if auth is None:
            auth = _kvx.auth_file()
            if auth is None:
                raise InvalidError("no auth key: give auth= (a key file or its secret), set "
                                   "%s, or insecure=True on loopback" % AUTH_FILE_ENV, -1)
        if isinstance(auth, (bytes, bytearray)):
            return bytes(auth)
        return _kvx.auth_key_load(os.path.expanduser(os.fspath(auth)))

    def _agent(self, listen=None):
        with self._create_lock:
            if self._closed:
                raise InvalidError("the agent is closed", -1)
            if self._handle is None:
                params = dict(self._params)
                if listen is not None:
                    params["listen"] = listen
                self._handle = _kvx.Agent(self._layout._handle, self._memory, params)
            elif listen is not None:
                raise InvalidError("listen() must come before any other use of the agent", -1)
            return self._handle

    def _next_request_id(self):
        return next(self._request_ids)

    def listen(self, address):
        """Binds the side channel at HOST:PORT (port 0: a free one); returns the real address."""
        return self._agent(address).listen_address()

    def connect(self, address):
        """A Peer: the prefill agent at "HOST:PORT", or a list of them (the ranks of a TP
        prefill group, read together)."""
        addresses = [address] if isinstance(address, str) else list(address)
        peer = Peer(self, self._agent().connect(addresses))
        self._peers.add(peer)
        return peer

    def progress(self, timeout_ms=0):
        """Runs the agent's loop until the turn after an event, or `timeout_ms` (0: one turn).
        It sleeps on the agent's descriptor without the agent's lock and takes it one turn at
        a time, so other threads (posting, polling, another progress()) get in between; while
        transfers are in flight it looks again every 1 ms. Raises InvalidError once the agent
        is closed, from any thread, also while it sleeps. Then it calls the release and log
        callbacks (set_release_callback, set_log_callback) with what came meanwhile."""
        self._agent().progress(timeout_ms)
        self._deliver()

    def set_release_callback(self, callback):
        """Prefill side: callback(request_id) once per released hold (every consumer's done,
        or its lease ended), called by progress() on the thread calling it, with the GIL and
        without the agent's lock (it may call the agent). None stops it; while one is set,
        released() returns nothing: the ids go to the callback. If a callback raises, progress()
        raises it, and the items still to deliver wait for the next progress()."""
        if callback is not None and not callable(callback):
            raise TypeError("set_release_callback: a callable or None")
        self._on_release = callback

    def set_log_callback(self, callback):
        """callback(line) once per log line of the agent (what logs() returns otherwise, UCX's
        own warnings among them: docs/python.md), called as the release callback is. None
        stops it."""
        if callback is not None and not callable(callback):
            raise TypeError("set_log_callback: a callable or None")
        self._on_log = callback

    def _deliver(self):
        """Drains what the set callbacks want into one queue, then calls them one item at a
        time: a popleft is atomic, so with progress() in several threads each item is delivered
        once (in order per thread, not across threads)."""
        handle = self._handle
        if handle is None:
            return
        if self._on_release is not None:
            self._undelivered.extend(("release", i) for i in handle.released())
        if self._on_log is not None:
            self._undelivered.extend(("log", line) for line in handle.logs())
        while True:
            try:
                kind, item = self._undelivered.popleft()
            except IndexError:
                return
            callback = self._on_release if kind == "release" else self._on_log
            if callback is not None:
                callback(item)

    def fileno(self):
        return self._agent().fileno()

    def start_progress_thread(self):
        """Runs the agent's loop on a native thread of its own until close(), never taking
        the GIL: what the agent answers its peers (handshakes, heartbeats, dones, served reads)
        then never waits for a Python thread, which a busy engine may starve of the GIL for
        seconds. Transfers complete and holds are released on it; released(), logs() and
        Transfer.done see them. The release and log callbacks are not called from it (a
        progress() call of yours runs them). Idempotent."""
        self._agent().start_progress_thread()

    def stats(self):
        """kvx's counters as a dict, and this layer's: released_dropped and logs_dropped count
        what released() and logs() could not keep (more than 2^20 ids, 1024 lines undrained)."""
        return self._agent().stats()

    def released(self):
        """Prefill side: the request ids whose holds were released (every consumer's done, or
        the lease ended) since the last call, in release order. Queued by the agent's loop
        (whichever thread runs it) and emptied by this call; at most 2^20 ids wait, more are
        counted in stats()["released_dropped"]."""
        handle = self._handle_if_made()
        return handle.released() if handle is not None else []

    def logs(self):
        """The agent's log lines (peers connected, dead, restarted; transfers failed; leases
        expired) since the last call, emptied by it; at most 1024 wait, more are counted in
        stats()["logs_dropped"]."""
        handle = self._handle_if_made()
        return handle.logs() if handle is not None else []

    def _handle_if_made(self):
        """The C agent, None if not made yet (nothing happened to it); raises once closed."""
        with self._create_lock:
            if self._closed:
                raise InvalidError("the agent is closed", -1)
            return self._handle

    def storage(self, name):
        """Storage `name` (or its index) as a writable memoryview; host storages only. The
        view keeps the memory alive: close() destroys the C agent (and lets go of the engine's
        buffers) only once every such view is released (view.release(), or collected)."""
        return self._agent().storage(self._index(name))

    def read_storage(self, name, offset, nbytes):
        """`nbytes` bytes of storage `name` (or its index) from `offset`, host or GPU."""
        return self._agent().read_storage(self._index(name), offset, nbytes)

    def write_storage(self, name, offset, data):
        """Copies `data` (host memory) into storage `name` (or its index) at `offset`."""
        self._agent().write_storage(self._index(name), offset, data)

    def _index(self, name):
        return self._names.index(name) if isinstance(name, str) else name

    def hold(self, request_id, blocks, *, consumers=1, token=None):
        """Prefill side: holds the blocks until `consumers` ranks reported done or the lease
        expired; returns the token (a new one unless given) to carry to the decode side."""
        token = token if token is not None else token_generate()
        self._agent().hold(request_id, _groups(blocks, self._max_group), consumers, token)
        return token

    def close(self):
        """Closes the agent, from any thread: a progress() or wait() in another thread wakes
        and raises InvalidError("the agent is closed"), as does every later call on the
        agent, its peers and transfers (but close(), Peer.close() and Transfer.release(),
        which have nothing left to do). Transfers in flight are cancelled and peers closed. It
        waits for a call holding the agent in another thread (a connect's handshake at most
        its timeout). Idempotent."""
        with self._create_lock:
            self._closed = True
            handle = self._handle
        if handle is not None:
            handle.close()
        self._peers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
