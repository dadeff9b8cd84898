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
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.utils import create_metric_per_engine

try:  # vLLM counts prefix-cache hits by where they came from (0.32 on)
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:
    CacheHitSource = None

from .config import settings_from
from .metadata import KvxHandshake, KvxMetadata


@dataclasses.dataclass
class KvxStats(KVConnectorStats):
    """Per interval and summed over workers: bytes and transfers loaded, failed loads, and
    seconds from post to completion; and lists of samples (PROM_HISTOGRAMS), joined."""

    def aggregate(self, other):
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, [] if isinstance(value, list) else 0) + value
        return self

    def reduce(self):
        out = {k: v for k, v in self.data.items() if not isinstance(v, list)}
        if out.get("transfers"):
            out["avg_transfer_ms"] = round(1000 * out.get("seconds", 0) / out["transfers"], 3)
        for key in PROM_HISTOGRAMS:  # logged as the median and the worst, in ms
            samples = sorted(self.data.get(key) or ())
            if samples:
                out[key.replace("seconds", "ms_p50")] = round(1e3 * samples[len(samples) // 2], 3)
                out[key.replace("seconds", "ms_max")] = round(1e3 * samples[-1], 3)
        return out

    def is_empty(self):
        return not any(self.data.values())

    def reset(self):
        self.data = {}


# Prometheus counters through vLLM's own /metrics: each KvxStats key, summed over workers
PROM_COUNTERS = {
    "bytes": ("vllm:kvx_loaded_bytes", "Bytes of KV cache D loaded with kvx"),
    "transfers": ("vllm:kvx_loads", "KV loads (pull or push) D completed with kvx"),
    "failures": ("vllm:kvx_failed_loads", "KV loads that failed, left to "
                 "kv_load_failure_policy"),
    "seconds": ("vllm:kvx_load_seconds", "Seconds of kvx loads, post to completion, summed"),
    "holds_released": ("vllm:kvx_holds_released", "Requests whose blocks P freed after kvx "
                       "released their hold (done or lease)"),
    "leases_expired": ("vllm:kvx_leases_expired", "Holds P released at their lease: nobody "
                       "read them in time"),
    "handshake_failures": ("vllm:kvx_handshake_failures", "Probes and handshakes with a P that "
                           "failed (nothing listening, no answer, incompatible)"),
}
# Prometheus histograms: each a KvxStats key whose value is a list of samples, in seconds
PROM_HISTOGRAMS = {
    "load_seconds": ("vllm:kvx_load_time_seconds", "KV load time on D, post to completion"),
    "post_seconds": ("vllm:kvx_post_time_seconds", "Time from D's load order to its post "
                     "(a probe and handshake with a new P included)"),
    "handshake_seconds": ("vllm:kvx_handshake_time_seconds", "kvx handshakes with a P: the "
                          "connect after its probe"),
}
BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0]


class KvxPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            key: create_metric_per_engine(
                self._counter_cls(name=name, documentation=doc, labelnames=labelnames),
                per_engine_labelvalues)
            for key, (name, doc) in PROM_COUNTERS.items()}
        self.histograms = {
            key: create_metric_per_engine(
                self._histogram_cls(name=name, documentation=doc, buckets=BUCKETS,
                                    labelnames=labelnames), per_engine_labelvalues)
            for key, (name, doc) in PROM_HISTOGRAMS.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        for key, value in transfer_stats_data.items():
            if key in self.counters and value:
                self.counters[key][engine_idx].inc(value)
            elif key in self.histograms:
                for sample in value:
                    self.histograms[key][engine_idx].observe(sample)


def refuse_unsupported(parallel_config):
    """Context parallelism splits a request's tokens over ranks in a way the connector does
    not map yet: refused at start-up, by name, rather than moving the wrong rows."""
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        size = getattr(parallel_config, name, 1)
        if size > 1:
            raise ValueError("kvx: %s %d is not supported (docs/vllm.md, \"Limits\")"
                             % (name, size))


class KvxConnector(KVConnectorBase_V1, SupportsHMA):
    _cache_hit_source = getattr(CacheHitSource, "P2P", None)  # loaded tokens came from a peer

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        refuse_unsupported(vllm_config.parallel_config)
        self.settings = settings_from(vllm_config.kv_transfer_config.kv_connector_extra_config)
        self.scheduler = self.worker = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import KvxScheduler

            self.scheduler = KvxScheduler(vllm_config, kv_cache_config, self.settings)
        else:
            from .worker import KvxWorker

            self.worker = KvxWorker(vllm_config, kv_cache_config, self.settings)

    @classmethod
    def kv_cache_access(cls, kv_transfer_config):
        """vLLM 0.34 asks how a connector reaches the cache: kvx registers it in place with
        UCX (host or device memory alike), so each segment must be one physical allocation."""
        from vllm.config.kv_transfer import KVCacheAccess

        return KVCacheAccess.REGISTERS

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config):
        """vLLM 0.34: sleep mode remaps the cache, and kvx's registrations (its regions' keys,
        which peers hold) would then name memory that moved: not followed, so refused."""
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """Heads outermost inside a block (vLLM's LBHNC; the CPU backend's only one): a
        TP-mismatched load splits each block's bytes by head ranges, right only in that order.
        MLA has one latent head that every rank keeps whole: any order."""
        model_config = getattr(vllm_config, "model_config", None)
        if model_config is None or getattr(model_config, "use_mla", False):
            return None
        return "LBHNC"

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

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvxPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

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
        sending, recving, _ = self.worker.take_results(as_block_errors=True)
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
