"""nixl_probe.py: does NIXL's PyPI wheel (nixl-cu12) move DRAM to DRAM on a machine without
a GPU? Two NIXL agents in this process, UCX backend, 64 reads of 1 MiB each, every byte
compared; prints the median GB/s of 10 transfers. Groundwork for issue 13's side-by-side
benchmark, not that benchmark: one process, NIXL's own progress, no kvx in the same run.

usage (a virtual environment of its own: nixl-cu12 pulls torch, about 5.8 GB in all):
  python3 -m venv /tmp/nixl && /tmp/nixl/bin/pip install nixl-cu12
  UCX_NET_DEVICES=lo /tmp/nixl/bin/python bench/nixl_probe.py"""
import time, numpy as np
from nixl_cu12._api import nixl_agent, nixl_agent_config
cfg = nixl_agent_config(backends=["UCX"])
a = nixl_agent("a", cfg); b = nixl_agent("b", cfg)
block = 1 << 20; n = 64
src = np.arange(block * n // 8, dtype=np.uint64).view(np.uint8)
dst = np.zeros_like(src)
ra = a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM"); rb = b.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
a.add_remote_agent(b.get_agent_metadata())
local = a.get_xfer_descs([(dst.ctypes.data + i * block, block, 0) for i in range(n)], "DRAM")
remote = b.get_xfer_descs([(src.ctypes.data + i * block, block, 0) for i in range(n)], "DRAM")
times = []
for it in range(10):
    h = a.initialize_xfer("READ", local, remote, "b", b"x")
    t = time.perf_counter()
    st = a.transfer(h)
    while a.check_xfer_state(h) == "PROC":
        pass
    times.append(time.perf_counter() - t)
    a.release_xfer_handle(h)
print("state ok, equal:", np.array_equal(src, dst), "GB/s median:", block * n / sorted(times)[5] / 1e9)
