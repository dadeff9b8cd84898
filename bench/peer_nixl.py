"""peer_nixl.py: the NIXL peer of bench/peers.sh: the same blocks kvx moves, moved by two NIXL
agents ("prefill", "decode") in two processes over NIXL's UCX backend, DRAM to DRAM. The
contract, pattern, checks and figures are bench/peer_common.py's; this file only drives NIXL.

One timed transfer is transfer() on a handle made once per point and op from prepared
descriptor lists (make_prepped_xfer), then check_xfer_state() polled until DONE: posting
and completing `batch` descriptors, no handle creation, no notification to the target.

usage (NIXL's wheel bundles UCX; torch, which its metadata requires, is never imported):
  python3 -m venv /tmp/venv-peers
  /tmp/venv-peers/bin/pip install --no-deps nixl-cu12==1.5.1 numpy
  /tmp/venv-peers/bin/python bench/peer_nixl.py --blocks 4096,1048576 --iters 50
UCX_TLS passes through to UCX; UCX_NET_DEVICES defaults to lo and UCX_PROTO_INFO to y, so
the transport UCX chose can be read from its protocol table (see transport())."""
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402


def ucx_version():
    """The version of the libucp this process loaded (NIXL's own copy, not the system's)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libucp" in line}
    for path in paths:
        lib = ctypes.CDLL(path)
        lib.ucp_get_version_string.restype = ctypes.c_char_p
        return lib.ucp_get_version_string().decode()
    return "?"


def proto_table(text, op):
    """Rows of UCX_PROTO_INFO's tables for remote get (read) or put (write) between host
    memories on an endpoint to the other process (not the agent's loopback "self" one),
    as unique "range description config" strings; [] if UCX printed none."""
    verb = "ucp_get" if op == "read" else "ucp_put"
    rows, state, endpoint = [], "seek", ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if state == "seek":
            if len(cells) == 1 and verb in cells[0] and "host memory" in cells[0]:
                state = "seek" if " self " in endpoint + " " else "head"
            elif len(cells) == 1:
                endpoint = cells[0]  # "decode intra-node cfg#1": the line above the title
        elif state == "head" and cells[:1] == ["Range"]:
            state = "rows"
        elif state == "rows":
            if len(cells) >= 3:
                row = " ".join(cells[:3])
                rows += [row] if row not in rows else []
            elif line.rstrip().endswith("+") and rows:
                state = "seek"
    return rows


class NixlSide(pc.Side):
    def __init__(self, role):
        super().__init__(role)
        from nixl_cu12._api import nixl_agent, nixl_agent_config
        try:
            self.agent = nixl_agent(role, nixl_agent_config(backends=["UCX"]))
        except Exception as e:  # NIXL says only NIXL_ERR_BACKEND; UCX's reason is on stderr
            raise RuntimeError("NIXL could not create its UCX backend (UCX_TLS=%s, "
                               "UCX_NET_DEVICES=%s): %s" % (
                                   os.environ.get("UCX_TLS", "unset"),
                                   os.environ.get("UCX_NET_DEVICES"), e)) from None
        if "UCX" not in self.agent.backends:
            raise RuntimeError("NIXL has no UCX backend; plugins found: %s"
                               % self.agent.get_plugin_list())
        self.ucx = ucx_version()
        self.remote = None
        self.reg = None
        self.lists = []
        self.handle = None
        self.transports = {}  # op -> text; UCX prints a protocol only on its first use

    def register(self, cache):
        self.reg = self.agent.register_memory([(cache.addr, cache.nbytes, 0, "")], "DRAM")
        return self.agent.get_agent_metadata()  # carries the new region's remote key

    def connect(self, metadata):
        self.remote = self.agent.add_remote_agent(metadata)

    def prepare(self, op, local_addrs, remote_addrs, block):
        self._release_xfer()
        local = self.agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", [(a, block, 0) for a in local_addrs], "DRAM")
        remote = self.agent.prep_xfer_dlist(
            self.remote, [(a, block, 0) for a in remote_addrs], "DRAM")
        self.lists = [local, remote]
        index = list(range(len(local_addrs)))
        self.handle = self.agent.make_prepped_xfer(op.upper(), local, index, remote, index)

    def transfer(self):
        # Reposting a completed handle is allowed; NIXL's progress thread (on by default)
        # also progresses this worker, and the target's does the passive side.
        agent, handle = self.agent, self.handle
        state = agent.transfer(handle)
        deadline = time.monotonic() + pc.TRANSFER_DEADLINE_S
        while state == "PROC":
            state = agent.check_xfer_state(handle)
            if time.monotonic() > deadline:
                raise TimeoutError("transfer not done after %.0f s" % pc.TRANSFER_DEADLINE_S)
        if state != "DONE":
            raise RuntimeError("NIXL transfer state %s" % state)

    def transport(self, op):
        if op not in self.transports:
            rows = proto_table(pc.drain_captured_stdout(), op)
            if rows:
                self.transports[op] = "UCX %s %s: %s" % (
                    self.ucx, "get" if op == "read" else "put", "; ".join(rows))
        return self.transports.get(op, "UCX %s (no UCX_PROTO_INFO table)" % self.ucx)

    def _release_xfer(self):
        if self.handle is not None:
            self.agent.release_xfer_handle(self.handle)
        for dlist in self.lists:
            self.agent.release_dlist_handle(dlist)
        self.handle, self.lists = None, []

    def release(self):
        self._release_xfer()
        if self.remote is not None:
            self.agent.remove_remote_agent(self.remote)  # next point brings new metadata
            self.remote = None
        if self.reg is not None:
            self.agent.deregister_memory(self.reg)
            self.reg = None


if __name__ == "__main__":
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("UCX_PROTO_INFO", "y")
    pc.log("[nixl] UCX_TLS=%s UCX_NET_DEVICES=%s" % (
        os.environ.get("UCX_TLS", "(UCX default)"), os.environ["UCX_NET_DEVICES"]))
    sys.exit(pc.main("nixl", NixlSide))
