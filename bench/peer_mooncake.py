"""peer_mooncake.py: the Mooncake peer of bench/peers.sh: the same blocks kvx moves, moved by
two Mooncake Transfer Engines ("prefill", "decode") in two processes over its TCP transport
on 127.0.0.1 (no RDMA device here). The contract, pattern, checks and figures are
bench/peer_common.py's; this file only drives Mooncake.

One timed transfer is one batch_transfer_sync_read/_write call: Mooncake submits the batch
of `batch` descriptors and returns when all are done, so posting and waiting are one call.
Its Python API takes plain address lists; they are built once per point and op, not timed.

usage (the wheel's own dependencies aiohttp, requests and msgpack serve its store, not the
engine, and are left out; the engine links libibverbs1 libnuma1 libcurl4 from Debian):
  apt-get install libibverbs1 libnuma1 libcurl4
  python3 -m venv /tmp/venv-peers
  /tmp/venv-peers/bin/pip install --no-deps mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy
  /tmp/venv-peers/bin/python bench/peer_mooncake.py --blocks 4096,1048576 --iters 50"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

# Peers name each other by this address, so every connection is loopback. 0.3.13.post1
# still listens on the wildcard address for both its handshake and its data port.
HOST = "127.0.0.1"


def wheel_version():
    from importlib import metadata
    for name in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return "?"


class MooncakeSide(pc.Side):
    def __init__(self, role):
        super().__init__(role)
        from mooncake.engine import TransferEngine
        self.engine = TransferEngine()
        # P2PHANDSHAKE: no metadata server; peers find each other by "host:rpc_port".
        rc = self.engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError("TransferEngine.initialize(%r, 'P2PHANDSHAKE', 'tcp', '') "
                               "returned %d" % (HOST, rc))
        self.session = "%s:%d" % (HOST, self.engine.get_rpc_port())
        self.version = wheel_version()
        self.addr = None
        self.remote = None
        self.call = None

    def register(self, cache):
        rc = self.engine.register_memory(cache.addr, cache.nbytes)
        if rc != 0:
            raise RuntimeError("register_memory returned %d" % rc)
        self.addr = cache.addr
        return self.session

    def connect(self, remote_session):
        self.remote = remote_session  # the engine connects on the first transfer (warm-up)

    def prepare(self, op, local_addrs, remote_addrs, block):
        submit = (self.engine.batch_transfer_sync_read if op == "read"
                  else self.engine.batch_transfer_sync_write)
        lengths = [block] * len(local_addrs)
        self.call = (submit, self.remote, local_addrs, remote_addrs, lengths)

    def transfer(self):
        # Blocks inside Mooncake, bounded by MC_TRANSFER_TIMEOUT; should that fail, the
        # supervisor's reply deadline kills this process.
        submit, *args = self.call
        rc = submit(*args)
        if rc != 0:
            raise RuntimeError("%s returned %d" % (submit.__name__, rc))

    def transport(self, op):
        return "mooncake %s TcpTransport %s" % (self.version, HOST)

    def release(self):
        if self.addr is not None:
            self.engine.unregister_memory(self.addr)
            self.addr = None
        self.call = None


if __name__ == "__main__":
    # MC_TRANSFER_TIMEOUT (seconds) bounds one sync transfer inside the engine.
    os.environ.setdefault("MC_TRANSFER_TIMEOUT", "%d" % pc.TRANSFER_DEADLINE_S)
    sys.exit(pc.main("mooncake", MooncakeSide))
