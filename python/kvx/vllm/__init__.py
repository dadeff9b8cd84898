"""kvx.vllm: vLLM's prefill/decode disaggregation on kvx (docs/vllm.md).

    --kv-transfer-config '{"kv_connector": "KvxConnector", "kv_connector_module_path": "kvx.vllm",
                           "kv_role": "kv_producer", "kv_buffer_device": "cpu",
                           "kv_connector_extra_config": {"auth_file": "/etc/kvx/auth.key"}}'

`import kvx` does not need vLLM, and neither does the proxy (python -m kvx.vllm.proxy):
KvxConnector, which does, is imported when vLLM asks for it."""

__all__ = ["KvxConnector"]


def __getattr__(name):
    if name == "KvxConnector":
        from .connector import KvxConnector

        return KvxConnector
    raise AttributeError("module 'kvx.vllm' has no attribute %r" % name)
