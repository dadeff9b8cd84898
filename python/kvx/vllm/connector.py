"""KvxConnector: vLLM's KV connector interface (KVConnectorBase_V1, SupportsHMA) over kvx.

One instance per role: the SCHEDULER half (scheduler.py) in vLLM's EngineCore process decides,
the WORKER half (worker.py) in each worker process moves bytes. This class only routes vLLM's
calls to the half that exists in this process."""

import dataclasses

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from .config import settings_from
from .metadata import KvxHandshake, KvxMetadata


@dataclasses.dataclass
class KvxStats(KVConnectorStats):
    """Per interval and summed over workers: bytes and transfers loaded, failed loads, and
    seconds from post to completion."""

    def aggregate(self, other):
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self):
        out = dict(self.data)
        if out.get("transfers"):
            out["avg_transfer_ms"] = round(1000 * out.get("seconds", 0) / out["transfers"], 3)
        return out

    def is_empty(self):
        return not any(self.data.values())

    def reset(self):
        self.data = {}


class KvxConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.settings = settings_from(vllm_config.kv_transfer_config.kv_connector_extra_config)
        self.scheduler = self.worker = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import KvxScheduler

            self.scheduler = KvxScheduler(vllm_config, kv_cache_config, self.settings)
        else:
            from .worker import KvxWorker

            self.worker = KvxWorker(vllm_config, kv_cache_config, self.settings)

    # ---- scheduler side ---------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.scheduler.build_connector_meta(scheduler_output)

    def on_new_request(self, request):
        self.scheduler.on_new_request(request)

    def update_connector_output(self, connector_output):
        self.scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self.scheduler.request_finished(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):
        return self.scheduler.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata):
        self.scheduler.set_addresses(metadata)

    def get_loaded_kv_cache_group_ids(self, request):
        return self._kv_cache_config.transfer_group_ids

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvxStats(data=dict(data or {}))

    # ---- worker side ------------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        self.worker.register_kv_caches(kv_caches)

    def get_handshake_metadata(self):
        if self.worker.address is None:
            return None
        return KvxHandshake(address=self.worker.address)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._connector_metadata
        if isinstance(meta, KvxMetadata):
            self.worker.handle(meta)

    def wait_for_layer_load(self, layer_name):
        return  # loads complete between steps: vLLM schedules a request once they did

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return  # P's blocks stay where vLLM wrote them; D reads them (or P writes D's)

    def wait_for_save(self):
        return

    def get_finished(self, finished_req_ids):
        sending, recving, _ = self.worker.take_results()
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids):
        sending, recving, failed = self.worker.take_results()
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving,
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self):
        return self.worker.take_load_errors()

    def get_kv_connector_stats(self):
        if self.worker is None:
            return None  # vLLM asks the scheduler half too
        stats = self.worker.take_stats()
        return KvxStats(data=stats) if stats else None

    def shutdown(self):
        if self.worker is not None:
            self.worker.shutdown()
