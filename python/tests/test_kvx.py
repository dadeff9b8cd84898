"""The kvx package between real processes: a prefill process (prefill.py) and this process
as the decode side move blocks between numpy arrays, and every transferred byte, and every
byte that must stay untouched, is compared."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kvx
import patterns

SOURCE = pathlib.Path(os.environ.get("KVX_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BINARY = pathlib.Path(os.environ.get("KVX_BINARY_DIR", SOURCE / "build"))
KVX = BINARY / "kvx"
HERE = pathlib.Path(__file__).parent
SECRET = b"the python tests' own secret...."  # 32 bytes, shared with prefill.py's agents

SMALL = {"kvx_layout": 1, "storages": [{"name": "kv", "size": 65536}],
         "views": [{"name": "layers.0.mla", "kind": "mla", "storage": "kv", "page": 4096,
                    "stride": 4096, "num_blocks": 16}]}
DEMO = SOURCE / "layouts/models/deepseek-v4.1-demo.json"


@pytest.fixture(autouse=True)
def secret(tmp_path, monkeypatch):
    key = tmp_path / "auth.key"
    subprocess.run([str(KVX), "auth-key", str(key)], check=True, capture_output=True)
    monkeypatch.setenv("KVX_AUTH_FILE", str(key))
    return key


class Prefill:
    """A prefill process on `layout_path`, holding request 7's `blocks`."""

    def __init__(self, layout_path, blocks, rank=0, size=1):
        # UCX logs to stderr: stdout carries the JSON lines read here (test_threads.py says why)
        env = dict(os.environ, UCX_LOG_FILE="stderr", PYTHONPATH=os.pathsep.join(
            [os.environ.get("PYTHONPATH", ""), str(HERE)]))
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "prefill.py"), str(layout_path),
             json.dumps({str(g): ids for g, ids in blocks.items()}), str(rank), str(size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = json.loads(self.process.stdout.readline())
        self.address = line["address"]
        self.token = bytes.fromhex(line["token"])

    def finish(self):
        """Stops it; returns its last report (its memory intact, its stats)."""
        self.process.stdin.close()
        report = json.loads(self.process.stdout.readline())
        assert self.process.wait(timeout=60) == 0
        return report


def pairs_of(layout_path, blocks_text):
    """The (local offset, length) pairs kvx plans for the request, from `kvx plan --json`."""
    out = subprocess.run([str(KVX), "plan", str(layout_path), "--peer", str(layout_path),
                          "--blocks", blocks_text, "--json"], check=True, capture_output=True,
                         text=True).stdout
    return [(p[1], p[4]) for read in json.loads(out)["reads"] for p in read["pairs"]]


def blocks_text(blocks):
    return ";".join("%d:%s" % (g, ",".join(map(str, ids))) for g, ids in sorted(blocks.items()))


def check_bytes(memory, layout_path, blocks):
    """Every byte of the planned pairs is the prefill's pattern, every other byte still 0."""
    expected = np.zeros_like(memory)
    pattern = patterns.filled(len(memory), 0, 0)
    for offset, length in pairs_of(layout_path, blocks_text(blocks)):
        expected[offset:offset + length] = pattern[offset:offset + length]
    assert np.array_equal(memory, expected)


def write_layout(tmp_path, d):
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize("push", [False, True], ids=["pull", "push"])
@pytest.mark.parametrize("which", ["small", "deepseek-v4.1-demo"])
def test_blocks_move_byte_exact(tmp_path, which, push):
    path = write_layout(tmp_path, SMALL) if which == "small" else DEMO
    blocks = {0: [1, 5, 6, 7]} if which == "small" else {0: [0, 3, 9], 1: [2], 2: [2]}
    prefill = Prefill(path, blocks)
    layout = kvx.Layout.load(path)
    layout.in_host_memory()  # the demo layout's storages say "vram"; numpy memory is host
    name = layout.regions().storage_names()[0]
    memory = np.zeros(layout.storage_sizes()[0], dtype=np.uint8)
    with kvx.Agent(layout, {name: memory}) as agent:
        peer = agent.connect(prefill.address)
        ids = {g: np.array(v, dtype=np.uint64) for g, v in blocks.items()}  # no copy
        stats = (peer.write if push else peer.read)(ids, request_id=7, token=prefill.token)
        assert stats.bytes > 0 and stats.descriptors >= stats.posted
        check_bytes(memory, path, blocks)
    report = prefill.finish()
    assert report["intact"]
    assert report["stats"]["released"] == 1  # a push with the hold's token is its done too


def test_region_tables_equal_kvx_plan_json():
    for path in sorted(SOURCE.glob("layouts/**/*.json")):
        plan = subprocess.run([str(KVX), "plan", "--json", str(path)], capture_output=True,
                              text=True)
        if plan.returncode != 0:  # a layout kvx refuses: so must Python
            with pytest.raises(kvx.Error):
                kvx.Layout.load(path).regions()
            continue
        assert kvx.Layout.load(path).regions().to_json() == plan.stdout, path


def test_ucx_version_is_the_one_kvx_loaded():
    version = subprocess.run([str(KVX), "--version"], capture_output=True, text=True).stdout
    assert version.endswith("(UCX %s)\n" % kvx.ucx_version()), version


def test_regions_iterate_with_named_fields():
    regions = kvx.Layout.from_dict(SMALL).regions()
    assert len(regions) == 1
    (r,) = list(regions)
    assert (r.name, r.storage, r.block_len, r.num_blocks, r.mla) == \
        ("layers.0.mla", "kv", 4096, 16, True)


def test_a_killed_prefill_raises_within_the_deadline(tmp_path):
    path = write_layout(tmp_path, SMALL)
    prefill = Prefill(path, {0: [1]})
    layout = kvx.Layout.load(path)
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(layout, {"kv": memory}, timeout_ms=3000, heartbeat_ms=500) as agent:
        peer = agent.connect(prefill.address)
        prefill.process.kill()
        prefill.process.wait()
        start = time.monotonic()
        with pytest.raises((kvx.PeerDownError, kvx.PeerTimeoutError)) as failure:
            for _ in range(100):  # shared memory may outlive it: until the loss is seen
                peer.read({0: [2]})
                agent.progress(100)
        assert time.monotonic() - start < 60
        assert failure.value.args[1] in (-100, -101)
        assert failure.value.failed_blocks == {0: [2]}


def test_reconnect_to_a_dead_prefill_fails_at_once(tmp_path):
    """Issue 24 item 2: nothing listens at a killed prefill's port, so a reconnect is refused
    at once (PeerDownError, saying so) instead of waiting out timeout_ms."""
    path = write_layout(tmp_path, SMALL)
    prefill = Prefill(path, {0: [1]})
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(kvx.Layout.load(path), {"kv": memory}, transports="tcp", timeout_ms=30000,
                   heartbeat_ms=200) as agent:
        peer = agent.connect(prefill.address)
        prefill.process.kill()
        prefill.process.wait()
        with pytest.raises((kvx.PeerDownError, kvx.PeerTimeoutError)):
            for _ in range(100):  # until the loss is seen
                peer.read({0: [2]})
                agent.progress(100)
        assert peer.down_reason is not None
        start = time.monotonic()
        with pytest.raises(kvx.PeerDownError) as failure:
            peer.reconnect()
        assert time.monotonic() - start < 10  # not the 30 s of timeout_ms
        assert "connection refused" in str(failure.value), failure.value
        peer.close()


def test_a_stopped_prefill_times_out_at_the_callers_deadline(tmp_path):
    """A prefill process stopped (SIGSTOP) while it holds our request: a read of engine
    memory, which the prefill must serve, gives up at timeout_ms with every block named."""
    import signal

    path = write_layout(tmp_path, SMALL)
    prefill = Prefill(path, {0: [1]})
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(kvx.Layout.load(path), {"kv": memory}, transports="tcp") as agent:
        peer = agent.connect(prefill.address)
        os.kill(prefill.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(kvx.PeerTimeoutError) as failure:
                peer.read({0: np.array([4, 5], dtype=np.uint64)}, timeout_ms=500)
            assert failure.value.failed_blocks == {0: [4, 5]}
        finally:
            prefill.process.kill()  # continued, UCX 1.13's TCP lane may abort it: a known
            prefill.process.wait()  # UCX bug (docs/agent.md), not what this test is about
        peer.close()


def test_hostile_input_raises_and_changes_nothing(tmp_path):
    layout = kvx.Layout.from_dict(SMALL)
    with pytest.raises(kvx.InvalidError):
        kvx.Layout.from_json('{"kvx_layout": 1, "storages": []}')
    with pytest.raises(ValueError):  # a buffer smaller than its storage
        kvx.Agent(layout, {"kv": bytearray(100)})
    with pytest.raises(ValueError):
        kvx.Agent(layout, {"nosuch": bytearray(65536)})
    with pytest.raises(BufferError):  # read-only memory cannot be registered
        kvx.Agent(layout, {"kv": bytes(65536)})
    prefill = Prefill(write_layout(tmp_path, SMALL), {0: [1]})
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(layout, {"kv": memory}) as agent:
        peer = agent.connect(prefill.address)
        with pytest.raises(ValueError):
            peer.read({0: [-1]})
        with pytest.raises(TypeError):
            peer.read({0: ["x"]})
        with pytest.raises(kvx.OutOfRangeError):
            peer.read({0: [16]})
        with pytest.raises(ValueError):
            peer.read({0: [1]}, token=b"short")
        assert not memory.any()  # nothing moved
        peer.read({0: [1]}, request_id=7, token=prefill.token)  # and it still works
        check_bytes(memory, write_layout(tmp_path, SMALL), {0: [1]})
    assert prefill.finish()["stats"]["released"] == 1


def test_integers_out_of_range_are_refused_not_wrapped(tmp_path):
    """Issue 36 finding 12: hold(2**64) held request 0, consumers=2**40 became 0, and
    {2**31: [1]} built a list of 2**31 groups (a hang). Every conversion is range-checked
    now: each raises at once and holds, moves or reads nothing."""
    layout = kvx.Layout.from_dict(SMALL)
    prefill = Prefill(write_layout(tmp_path, SMALL), {0: [1]})
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(layout, {"kv": memory}) as agent:
        for request_id in (2**64, -1):
            with pytest.raises(ValueError, match="not an integer of 0..18446744073709551615"):
                agent.hold(request_id, {0: [1]})
        with pytest.raises(ValueError, match="not an integer of 0..4294967295"):
            agent.hold(7, {0: [1]}, consumers=2**40)
        started = time.monotonic()
        with pytest.raises(kvx.OutOfRangeError, match="group 2147483648 is above"):
            agent.hold(7, {2**31: [1]})
        assert time.monotonic() - started < 1  # refused, not built
        with pytest.raises(ValueError):
            agent.read_storage("kv", 2**64, 1)
        assert agent.stats()["held"] == 0
        peer = agent.connect(prefill.address)
        with pytest.raises(ValueError):
            peer.read({0: [1]}, request_id=2**64 + 7, token=prefill.token)
        with pytest.raises(kvx.OutOfRangeError):
            peer.read({2**31: [1]}, request_id=7, token=prefill.token)
        with pytest.raises(ValueError):
            peer.want(2**64 + 7, prefill.token)
        assert not memory.any()  # nothing moved
        with pytest.raises(ValueError):
            kvx.Layout.from_dict(SMALL).regions().probe(prefill.address, timeout_ms=2**32)
        peer.read({0: [1]}, request_id=7, token=prefill.token)  # and the real one works
    report = prefill.finish()
    assert report["stats"]["released"] == 1 and report["stats"]["tokens_refused"] == 0


def test_no_secret_is_refused_unless_insecure(monkeypatch):
    monkeypatch.delenv("KVX_AUTH_FILE")
    layout = kvx.Layout.from_dict(SMALL)
    with pytest.raises(kvx.InvalidError):
        kvx.Agent(layout)
    with kvx.Agent(layout, insecure=True) as agent:
        assert agent.listen("127.0.0.1:0").startswith("127.0.0.1:")
        assert len(agent.storage("kv")) == 65536


def test_auth_file_is_resolved_by_the_library(monkeypatch, secret):
    """Issue 24: KVX_AUTH_FILE is looked up in one place, the library's kvx_auth_file, which
    the C commands, kvx.Agent and the vLLM connector all ask: a file given wins, an empty
    one is none, and without the variable there is no file."""
    assert kvx.AUTH_FILE_ENV == "KVX_AUTH_FILE"
    assert kvx.auth_file() == str(secret)
    assert kvx.auth_file("/given.key") == "/given.key"
    assert kvx.auth_file(pathlib.Path("/given.key")) == "/given.key"
    assert kvx.auth_file("") == str(secret)
    monkeypatch.setenv("KVX_AUTH_FILE", "")
    assert kvx.auth_file() is None
    monkeypatch.delenv("KVX_AUTH_FILE")
    assert kvx.auth_file() is None
    with pytest.raises(kvx.InvalidError, match="KVX_AUTH_FILE"):
        kvx.Agent(kvx.Layout.from_dict(SMALL))


def test_stats_has_every_field_of_kvx_agent_stats_t():
    """Issue 24: stats() walks the library's list of stats fields, so every field that
    kvx.h declares (read from the header, not from that list) is a key: a histogram as its
    _count and _sum."""
    sys.path.insert(0, str(SOURCE / "tests/support"))
    try:
        from stats_fields import stats_fields
    finally:
        sys.path.pop(0)
    want = set()
    for name, kind in stats_fields(SOURCE / "include/kvx.h"):
        want |= {name + "_count", name + "_sum"} if kind == "histogram" else {name}
    with kvx.Agent(kvx.Layout.from_dict(SMALL), insecure=True) as agent:
        stats = agent.stats()
    assert "done_repeated" in want and "post_us_count" in want
    assert set(stats) == want | {"released_dropped", "logs_dropped"}
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())


def test_tp2_to_1_and_asyncio(tmp_path):
    """Two prefill ranks hold half of every layer's heads each; one decode rank reads both
    halves, once blocking and once awaited in asyncio."""
    import asyncio

    half = {"kvx_layout": 1, "storages": [{"name": "kv", "size": 32 * 4096}],
            "views": [{"name": "layers.0.attn", "kind": "attn", "storage": "kv", "page": 4096,
                       "stride": 4096, "num_blocks": 32, "heads": 4}]}
    full = dict(half, storages=[{"name": "kv", "size": 32 * 8192}],
                views=[dict(half["views"][0], page=8192, stride=8192, heads=8)])
    half_path = tmp_path / "half.json"
    half_path.write_text(json.dumps(half))
    ranks = [Prefill(half_path, {0: [3, 4]}, rank, 2) for rank in range(2)]
    assert ranks[0].token != ranks[1].token  # each holds with its own: the reads use neither
    memory = np.zeros(32 * 8192, dtype=np.uint8)
    with kvx.Agent(kvx.Layout.from_dict(full), {"kv": memory}) as agent:
        peer = agent.connect([r.address for r in ranks])
        peer.read({0: [3]})
        async def pull():
            return await peer.read_async({0: range(4, 5)})

        stats = asyncio.run(pull())
        assert stats.bytes == 8192
    for rank in range(2):  # block b's rank-r half: its heads' bytes of rank r's block b
        pattern = patterns.filled(32 * 4096, rank, 0)
        for block in (3, 4):
            got = memory[block * 8192 + rank * 4096:block * 8192 + (rank + 1) * 4096]
            assert np.array_equal(got, pattern[block * 4096:(block + 1) * 4096])
    untouched = np.ones(32 * 8192, dtype=bool)
    untouched[3 * 8192:5 * 8192] = False
    assert not memory[untouched].any()
    for r in ranks:
        assert r.finish()["intact"]


def test_a_cpu_torch_tensor_is_registered_in_place(tmp_path):
    """A CPU torch.Tensor as an engine's cache: registered through the numpy array that shares
    its memory, and the pulled bytes land in the tensor itself."""
    torch = pytest.importorskip("torch")  # Debian's python3-torch; not installed by CI
    path = write_layout(tmp_path, SMALL)
    prefill = Prefill(path, {0: [1]})
    cache = torch.zeros(65536, dtype=torch.uint8)
    with kvx.Agent(kvx.Layout.load(path), {"kv": cache}) as agent:
        peer = agent.connect(prefill.address)
        peer.read({0: [1]}, request_id=7, token=prefill.token)
        check_bytes(cache.numpy(), path, {0: [1]})
        peer.close()
    assert prefill.finish()["stats"]["released"] == 1


class CudaArray:
    """An object that says it is CUDA memory (__cuda_array_interface__, as CuPy arrays and CUDA
    torch tensors do) over a numpy array's host memory: enough to follow the path to the
    registration, which must refuse it (no GPU here; on a GPU machine: not device memory)."""

    def __init__(self, array, readonly=False, strides=None):
        self.array = array
        self.__cuda_array_interface__ = {"data": (array.ctypes.data, readonly),
                                         "shape": array.shape, "typestr": array.dtype.str,
                                         "strides": strides, "version": 3}


class DLPackOnly:
    """A tensor known only through DLPack (no buffer protocol), over a numpy array."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


VRAM = dict(SMALL, storages=[{"name": "kv", "size": 65536, "mem": "vram", "device": 0}])


def test_cuda_memory_for_a_vram_storage_is_refused_by_name_unless_it_is_device_memory():
    """GPU memory from Python reaches the registration, which checks it with the CUDA driver:
    host memory claiming to be CUDA's is refused, naming the storage (and, without a GPU,
    what is missing)."""
    layout = kvx.Layout.from_dict(VRAM)
    assert layout.storage_mems() == ["vram"]
    agent = kvx.Agent(layout, {"kv": CudaArray(np.zeros(65536, np.uint8))}, insecure=True)
    with pytest.raises(kvx.InvalidError, match=r'storage kv \("mem": "vram", device 0\): '):
        agent.stats()


def test_gpu_memory_for_a_host_storage_is_refused_before_any_agent():
    with pytest.raises(ValueError, match=r'storage kv is "dram" in the layout, its memory is '
                                         r'GPU memory'):
        kvx.Agent(kvx.Layout.from_dict(SMALL), {"kv": CudaArray(np.zeros(65536, np.uint8))},
                  insecure=True)


def test_host_memory_for_a_vram_storage_is_registered_as_host_memory_with_a_note():
    """Issue 24 item 1: the buffer says what it is; the layout's "vram" describes a deployment.
    The agent registers it (a host-only build too) and says so once."""
    layout = kvx.Layout.from_dict(VRAM)
    cache = np.zeros(65536, np.uint8)
    with pytest.warns(UserWarning, match=r'storage kv is "vram" in the layout; its memory is '
                                         r'host memory, registered as such'):
        agent = kvx.Agent(layout, {"kv": cache}, insecure=True)
    with agent:
        assert layout.storage_mems() == ["dram"]
        agent.write_storage("kv", 100, b"kvx")
        assert bytes(cache[100:103]) == b"kvx"  # registered in place, no copy


def test_in_host_memory_returns_the_layout_for_chaining():
    layout = kvx.Layout.from_dict(VRAM).in_host_memory()
    assert isinstance(layout, kvx.Layout) and layout.storage_mems() == ["dram"]


def test_cuda_array_interface_memory_must_be_writable_contiguous_and_large_enough():
    layout = kvx.Layout.from_dict(VRAM)
    with pytest.raises(BufferError, match="read-only"):
        kvx.Agent(layout, {"kv": CudaArray(np.zeros(65536, np.uint8), readonly=True)},
                  insecure=True)
    with pytest.raises(ValueError, match="not C-contiguous"):
        kvx.Agent(layout, {"kv": CudaArray(np.zeros((256, 256), np.uint8), strides=(1, 256))},
                  insecure=True)
    with pytest.raises(ValueError, match="needs 65536 bytes, its memory has 32768"):
        kvx.Agent(layout, {"kv": CudaArray(np.zeros(16384, np.float16))}, insecure=True)


def test_a_dlpack_tensor_is_registered_in_place(tmp_path):
    """A tensor known only through DLPack: registered at its own address, so a pull lands
    in it, and read_storage/write_storage reach the same bytes."""
    path = write_layout(tmp_path, SMALL)
    prefill = Prefill(path, {0: [1]})
    cache = np.zeros(65536, np.uint8)
    with kvx.Agent(kvx.Layout.load(path), {"kv": DLPackOnly(cache)}) as agent:
        peer = agent.connect(prefill.address)
        peer.read({0: [1]}, request_id=7, token=prefill.token)
        check_bytes(cache, path, {0: [1]})
        agent.write_storage("kv", 100, b"abc")
        assert bytes(cache[100:103]) == b"abc"
        assert agent.read_storage("kv", 4096, 16) == cache[4096:4112].tobytes()
        with pytest.raises(kvx.OutOfRangeError, match="pass its end"):
            agent.read_storage("kv", 65536 - 8, 16)
        peer.close()
    assert prefill.finish()["stats"]["released"] == 1
    strided = DLPackOnly(np.zeros((256, 512), np.uint8)[:, ::2])
    with pytest.raises(ValueError, match="DLPack: the tensor is not C-contiguous"):
        kvx.Agent(kvx.Layout.load(path), {"kv": strided}, insecure=True)


@pytest.mark.parametrize("push", [False, True], ids=["pull", "push"])
def test_a_transfer_verified_by_checksums_and_a_changed_byte_named(tmp_path, push):
    """verify=True checks the transfer with the prefill side's checksums before it completes;
    a byte changed afterwards is found by verifying the completed transfer again, and named by
    region, block and view."""
    path = write_layout(tmp_path, SMALL)
    prefill = Prefill(path, {0: [1, 5]})
    layout = kvx.Layout.load(path)
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(layout, {"kv": memory}) as agent:
        peer = agent.connect(prefill.address)
        post = peer.write_async if push else peer.read_async
        transfer = post({0: [1, 5]}, request_id=7, token=prefill.token)
        assert transfer.verify() is None  # in progress: verified before it completes
        stats = transfer.wait()
        result = transfer.verify_result()
        assert result.status == 0 and result.segments == 2 and result.bytes == stats.bytes
        assert result.mismatches == 0 and result.reported == []
        memory[5 * 4096 + 17] ^= 0x5A
        with pytest.raises(kvx.MismatchError, match=r"block 5") as caught:
            transfer.verify()
        (m,) = caught.value.verify_result.reported
        assert (m["region_name"], m["block"], m["views"]) == ("layers.0.mla", 5, ["layers.0.mla"])
        assert m["local"] == (0, 5 * 4096) and m["len"] == 4096
        assert m["local_checksum"] != m["remote_checksum"]
        memory[5 * 4096 + 17] ^= 0x5A
        assert transfer.verify().mismatches == 0
        transfer.release()
        assert peer.read({0: [6]}, request_id=8, verify=True).bytes == 4096
        assert agent.stats()["transfers_verified"] == 4
        peer.close()
    with kvx.Agent(layout, {"kv": memory}, verify_one_in=2) as agent:  # sampled: 1st and 3rd
        peer = agent.connect(prefill.address)
        for request_id in (9, 10, 11):
            peer.read({0: [7]}, request_id=request_id)
        assert agent.stats()["transfers_verified"] == 2
        peer.close()
    prefill.finish()


def test_a_misspelt_agent_parameter_is_refused():
    with pytest.raises(ValueError, match="'verify_one_inn' is not a parameter"):
        kvx.Agent(kvx.Layout.from_dict(SMALL), insecure=True, verify_one_inn=3).stats()


def test_want_heartbeats_the_hold_until_a_read_or_unwant(tmp_path):
    """peer.want heartbeats a held request with its token (what the vLLM connector does while
    a request waits in D's queue, keeping P's lease alive); P takes them, refusing none, and
    the read that follows still releases the hold once. The lease arithmetic itself is
    test_hold's, on an injectable clock."""
    prefill = Prefill(write_layout(tmp_path, SMALL), {0: [1]})
    layout = kvx.Layout.from_dict(SMALL)
    with kvx.Agent(layout, {"kv": np.zeros(65536, dtype=np.uint8)}, heartbeat_ms=10) as agent:
        peer = agent.connect(prefill.address)
        peer.want(7, prefill.token)
        deadline = time.monotonic() + 60
        while agent.stats()["heartbeats_sent"] < 3 and time.monotonic() < deadline:
            agent.progress(10)
        assert agent.stats()["heartbeats_sent"] >= 3
        peer.read({0: [1]}, request_id=7, token=prefill.token)
        peer.want(8, prefill.token)  # never held there: its heartbeats change nothing
        peer.unwant(8)
        agent.progress(20)
        with pytest.raises(ValueError):
            peer.want(7, b"short")
    report = prefill.finish()
    assert report["stats"]["released"] == 1 and report["stats"]["tokens_refused"] == 0
    assert report["stats"]["notifications"] >= 3


def test_a_read_of_no_blocks_releases_the_hold_without_moving_a_byte(tmp_path):
    """What the vLLM connector sends for a request that ends on D without loading (aborted in
    D's queue, a full local prefix hit): a notify-only read with the hold's token releases
    P's hold at once, moves nothing, and a second one is refused as the hold is gone."""
    prefill = Prefill(write_layout(tmp_path, SMALL), {0: [1, 2]})
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(kvx.Layout.from_dict(SMALL), {"kv": memory}) as agent:
        peer = agent.connect(prefill.address)
        assert peer.read({0: []}, request_id=7, token=prefill.token).bytes == 0
        with pytest.raises(kvx.PeerRefusedError, match="released already"):
            peer.read({0: []}, request_id=7, token=prefill.token)
        assert not memory.any()
    report = prefill.finish()
    assert report["stats"]["released"] == 1 and report["stats"]["held"] == 0
    assert report["stats"]["served_bytes"] == 0 and report["intact"]


def test_probe_answers_without_an_agent_while_a_silent_peer_waits_apart(tmp_path):
    """Regions.probe (what the vLLM connector does before connecting to a P it does not know,
    on a thread of its own): a live prefill passes; nothing listening is PeerDownError; a
    peer that takes the TCP connection and never answers is PeerTimeoutError at the probe's
    deadline; and a probe of that silent peer on another thread leaves an agent's reads
    from the live prefill alone."""
    import socket

    prefill = Prefill(write_layout(tmp_path, SMALL), {0: [1]})
    layout = kvx.Layout.from_dict(SMALL)
    regions = layout.regions()
    regions.probe(prefill.address)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(kvx.PeerDownError):
        regions.probe("127.0.0.1:%d" % port, timeout_ms=2000)
    silent = socket.create_server(("127.0.0.1", 0))
    silent_address = "127.0.0.1:%d" % silent.getsockname()[1]

    def wait_for_silence():
        try:
            regions.probe(silent_address, timeout_ms=600000)
        except kvx.Error:
            pass

    waiting = threading.Thread(target=wait_for_silence, daemon=True)
    waiting.start()
    accepted, _ = silent.accept()  # the probe is waiting on the silent peer now
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(layout, {"kv": memory}) as agent:
        peer = agent.connect(prefill.address)
        assert peer.read({0: [1]}, request_id=7, token=prefill.token).bytes == 4096
    assert waiting.is_alive()  # the read did not wait for it
    with pytest.raises(kvx.PeerTimeoutError):
        regions.probe(silent_address, timeout_ms=200)
    accepted.close()
    silent.close()
    assert prefill.finish()["stats"]["released"] == 1


def test_release_and_log_callbacks_name_the_request(tmp_path):
    """Issue 24 item 10: this process serves as the prefill side, a `kvx fetch` process reads
    request 7 with the hold's token and a second one with a wrong token; the release callback
    gets 7 (and released() nothing, its ids go to the callback), the log callback the
    admission, the counted done, the release and the refused done, each called by progress()
    on this thread. The served counters come from the dones (issue 24 item 9)."""
    path = write_layout(tmp_path, SMALL)
    memory = np.zeros(65536, dtype=np.uint8)
    released, lines, threads = [], [], set()
    with kvx.Agent(kvx.Layout.load(path), {"kv": memory}) as agent:
        address = agent.listen("127.0.0.1:0")
        agent.set_release_callback(lambda request_id: (released.append(request_id),
                                                       threads.add(threading.get_ident())))
        agent.set_log_callback(lines.append)
        token = agent.hold(7, {0: [1, 2]})
        outputs = []
        for t in ("01" * 16, token.hex()):  # the wrong token first, while the hold stands
            fetch = subprocess.Popen(
                [str(KVX), "fetch", str(path), "--peer", address, "--blocks", "0:1-2",
                 "--request", "7", "--token", t], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 60
            while fetch.poll() is None and time.monotonic() < deadline:
                agent.progress(10)
            outputs.append((fetch.wait(timeout=60), fetch.communicate(timeout=60)[0]))
        while not released and time.monotonic() < deadline:
            agent.progress(10)
        assert outputs[0][0] == 2 and "wrong token" in outputs[0][1], outputs[0]
        assert outputs[1][0] == 0, outputs[1]
        assert released == [7] and threads == {threading.get_ident()}
        assert agent.released() == []
        assert any(line.startswith("side channel: admitted a connection from 127.0.0.1")
                   for line in lines), lines
        assert "request 7: done of rank 0 counted, the last one" in lines, lines
        assert "request 7: released, every consumer reported" in lines, lines
        assert any(line.startswith("request 7: done refused: ") for line in lines), lines
        stats = agent.stats()
        assert stats["served_transfers"] == 2 and stats["served_bytes"] == 2 * 2 * 4096
        with pytest.raises(TypeError):
            agent.set_log_callback("not callable")


def test_log_level_warn_keeps_only_what_went_wrong(tmp_path):
    """log_level="warn": a read that went as it should logs nothing on the prefill side (no
    admission, no counted done, no release), a refused one still does; a level that is not
    one is refused before any agent exists."""
    path = write_layout(tmp_path, SMALL)
    with pytest.raises(ValueError, match="log_level: 'debug' is not"):
        kvx.Agent(kvx.Layout.load(path), insecure=True, log_level="debug").stats()
    memory = np.zeros(65536, dtype=np.uint8)
    with kvx.Agent(kvx.Layout.load(path), {"kv": memory}, log_level="warn") as agent:
        address = agent.listen("127.0.0.1:0")
        token = agent.hold(7, {0: [1]})
        for t in (token.hex(), "01" * 16):
            fetch = subprocess.Popen(
                [str(KVX), "fetch", str(path), "--peer", address, "--blocks", "0:1",
                 "--request", "7", "--token", t], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while fetch.poll() is None and time.monotonic() < deadline:
                agent.progress(10)
            assert fetch.wait(timeout=60) == (0 if t == token.hex() else 2)
        agent.progress(10)
        lines = agent.logs()
        assert agent.released() == [7]
        assert lines == ["request 7: done refused: hold released already: the blocks may "
                         "have been reused"], lines
