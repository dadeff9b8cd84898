"""GPU memory from Python (docs/gpu.md), where there is a GPU and PyTorch sees it: a CUDA
torch.Tensor registered in place through __cuda_array_interface__ receives a pull from a
prefill process, and every byte is compared on the host. Skipped elsewhere (CI has no GPU;
test_kvx.py checks the refusals there)."""
import numpy as np
import pytest

import kvx
from test_kvx import Prefill, VRAM, check_bytes, secret, write_layout  # noqa: F401 (secret: the autouse fixture)

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for PyTorch", allow_module_level=True)


def test_a_cuda_tensor_is_registered_in_place_and_pulled_into(tmp_path):
    path = write_layout(tmp_path, VRAM)
    prefill = Prefill(path, {0: [1, 3]})  # prefill.py keeps a vram layout in host memory
    cache = torch.zeros(65536, dtype=torch.uint8, device="cuda:0")
    with kvx.Agent(kvx.Layout.load(path), {"kv": cache}) as agent:
        peer = agent.connect(prefill.address)
        peer.read({0: [1, 3]}, request_id=7, token=prefill.token)
        check_bytes(cache.cpu().numpy(), path, {0: [1, 3]})
        assert agent.read_storage("kv", 4096, 4096) == cache[4096:8192].cpu().numpy().tobytes()
        agent.write_storage("kv", 0, b"\x07" * 16)
        assert bytes(cache[:16].cpu().numpy()) == b"\x07" * 16
        with pytest.raises(ValueError, match="GPU memory, which the host cannot address"):
            agent.storage("kv")
        peer.close()
    assert prefill.finish()["stats"]["released"] == 1


def test_kvx_allocated_gpu_storage_is_read_and_written_through_the_agent():
    with kvx.Agent(kvx.Layout.from_dict(VRAM), insecure=True) as agent:
        data = np.arange(4096, dtype=np.uint8).tobytes()
        agent.write_storage("kv", 8192, data)
        assert agent.read_storage("kv", 8192, 4096) == data
