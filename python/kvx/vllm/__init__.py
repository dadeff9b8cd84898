"""kvx.vllm: vLLM's prefill/decode disaggregation on kvx (docs/vllm.md).

    --kv-transfer-config '{"kv_connector": "KvxConnector", "kv_connector_module_path": "kvx.vllm",
                           "kv_role": "kv_producer", "kv_buffer_device": "cpu",
                           "kv_connector_extra_config": {"auth_file": "/etc/kvx/auth.key"}}'

Importing it needs vLLM; `import kvx` does not."""

from .connector import KvxConnector  # noqa: F401

__all__ = ["KvxConnector"]
