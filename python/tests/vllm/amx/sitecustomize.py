"""Run first by every Python process of the vLLM engines the tests start (this directory is on
their PYTHONPATH, conftest.py): asks Linux for the AMX tile state, and installs
vllm_cpu_dsv4 (DeepSeek-V4 on the CPU wheel; Python runs only one sitecustomize module).

vLLM's CPU attention takes its AMX kernel wherever the CPU has AMX (bf16 with blocks of 32:
vllm/v1/attention/backends/cpu_attn.py) without asking for the state first, and a process
that did not ask dies of SIGILL at its first tile load: every engine did, at its first
request, on this project's 2026-12-02 machine (flags amx_tile, amx_bf16). Elsewhere the
request fails and nothing changes. Not kvx's to fix: vLLM crashes there whatever its
connector."""

import ctypes
import platform

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

if platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        pass

# vLLM 0.32's CPU wheel cannot serve DeepSeek-V4 as shipped: vllm_cpu_dsv4.py says why and
# what it patches, lazily (nothing until the modules concerned are imported).
try:
    import vllm_cpu_dsv4

    vllm_cpu_dsv4.install()
except Exception as e:  # a broken workaround must not break other engines' start
    import sys

    print("sitecustomize: vllm_cpu_dsv4 not installed: %r" % (e,), file=sys.stderr)
