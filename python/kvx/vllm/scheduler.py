"""The connector's scheduler half, in vLLM's EngineCore process: which blocks P holds for D
and under which token, which blocks D loads from where, and what the workers are told each
step. It owns no kvx agent: the workers do (worker.py); this half only decides.

P: request_finished -> a hold (kvx request id, token, block ids) for the worker, and the
kv_transfer_params that carry the same to D. D: get_num_new_matched_tokens and
update_state_after_alloc -> a load for the worker. docs/vllm.md has the flow."""

import logging
import secrets

from . import params as transfer_params
from .config import consumers_per_rank, secret_of
from .metadata import Hold, KvxMetadata, Load, Want
from .params import prompt_digest
from .specs import group_mamba_scratch, group_tokens_per_block, group_window_blocks

logger = logging.getLogger("vllm.kvx")  # under vLLM's own handlers


class KvxScheduler:
    def __init__(self, vllm_config, kv_cache_config, settings):
        self.settings = settings
        self.key = transfer_params.signing_key(secret_of(settings))
        self.kv_cache_config = kv_cache_config
        self.block_size = vllm_config.cache_config.block_size
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.consumers = consumers_per_rank(settings, self.tp_size)  # P: dones per hold
        self.engine_id = vllm_config.kv_transfer_config.engine_id
        self.is_producer = vllm_config.kv_transfer_config.is_kv_producer
        # transferred blocks per group: a sliding window keeps only its window's blocks,
        # counted in the group's own block size (DeepSeek-V4's windows have 64-, 4- and
        # 8-token blocks beside the engine's 256)
        self.window_blocks = [group_window_blocks(g) for g in kv_cache_config.transfer_groups]
        # a mamba group's blocks: [superseded states..., the running state, scratch slots for
        # speculative tokens]; only the running state moves. None for other groups.
        self.scratch_blocks = [group_mamba_scratch(g) for g in kv_cache_config.transfer_groups]
        # tokens per block where a block list indexes token positions (None elsewhere): a P
        # that generated past the prompt hands over the prompt's blocks only where known
        self.tokens_per_block = [group_tokens_per_block(g)
                                 for g in kv_cache_config.transfer_groups]
        # Prompt tokens P leaves to D: a recurrent (mamba) state cannot take the last token
        # twice, and D computes it to sample its first token, so P stops one token short.
        self.backoff = 1 if kv_cache_config.has_mamba_layers else 0
        self.addresses = {}  # P: tp rank -> "HOST:PORT" of that worker's kvx agent
        # P: kvx request ids, unique per engine: a random 40-bit base, then a counter
        self.next_id = secrets.randbits(40) << 20
        self.holds = []        # P: holds for the workers' next step
        self.loads = []        # D: loads for the workers' next step
        self.wants = []        # D: requests waiting for their load: heartbeat P meanwhile
        self.unwants = set()   # D: requests that ended before their load
        self.aborted = set()   # D: loads whose request ended while in flight
        self.loading = set()   # D: requests whose load was handed to the workers

    # ---- P ---------------------------------------------------------------------------
    def set_addresses(self, metadata):
        """The workers' handshake metadata: {tp_rank: KvxHandshake}."""
        for tp_rank, meta in metadata.items():
            self.addresses[int(tp_rank)] = meta.address

    def transfer_ids(self, block_ids, tokens=None):
        """The block ids kvx moves: the transfer groups', a window's last blocks only, a mamba
        group's running state only; with `tokens`, only the blocks of the first `tokens`."""
        groups = self.kv_cache_config.select_transfer_block_ids(block_ids)
        out = []
        for ids, window, scratch, size in zip(groups, self.window_blocks, self.scratch_blocks,
                                              self.tokens_per_block):
            ids = list(ids)
            if tokens is not None:
                ids = ids[:-(-tokens // size)]
            if scratch is not None and ids:
                ids = ids[:len(ids) - min(scratch, len(ids) - 1)][-1:]
            elif window:
                ids = ids[-window:]
            out.append(ids)
        return out

    def request_finished(self, request, block_ids):
        params = request.kv_transfer_params
        if not params:
            return False, None
        if params.get("do_remote_prefill"):
            params["do_remote_prefill"] = False  # D: ended before its load was planned
            self.unwants.add(request.request_id)
            return False, None
        if request.request_id in self.loading:
            self.aborted.add(request.request_id)  # vLLM keeps its blocks until we report
            return False, None
        if not params.get("do_remote_decode") or not self.is_producer:
            return False, None
        from vllm.v1.request import RequestStatus

        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted or failed on P: nothing to hand over
        tokens = request.num_prompt_tokens
        if request.num_computed_tokens < tokens:
            return False, None  # P did not compute the whole prompt: nothing to hand over
        past = request.num_computed_tokens > tokens
        if past and None in self.tokens_per_block:
            # P generated past the prompt (a router that did not give it max_tokens 1), and
            # a group's blocks (a compressed cache, a mamba state) cannot be cut back to the
            # prompt's: D computes the prompt itself
            return False, None
        ids = self.transfer_ids(block_ids, tokens if past else None)
        if not any(ids) or tokens <= self.backoff:
            return False, None  # nothing D would load: it computes the prompt itself
        if self.backoff and request.num_prompt_tokens > self.block_size:
            # a mamba hybrid's state past its first block does not give D one instance's
            # output yet (docs/vllm.md): D computes such a prompt itself, correctly
            return False, None
        if len(self.addresses) != self.tp_size:
            logger.error("kvx: request %s: no kvx address for %d of %d workers; not handed "
                         "over", request.request_id, self.tp_size - len(self.addresses),
                         self.tp_size)
            return False, None
        self.next_id += 1
        token = secrets.token_bytes(16)
        self.holds.append(Hold(request.request_id, self.next_id, token, ids))
        return True, transfer_params.make(
            self.key, engine_id=self.engine_id, request_id=self.next_id, token=token,
            block_ids=ids, addresses=[self.addresses[r] for r in range(self.tp_size)],
            num_tokens=tokens, prompt_ids=request.prompt_token_ids,
            transfer_mode=self.settings.transfer_mode, consumers=self.consumers)

    def on_new_request(self, request):
        params = request.kv_transfer_params
        if not params:
            return
        if params.get("do_remote_decode") and self.is_producer:
            self.truncate_for_prefill(request)
        elif params.get("do_remote_prefill") and self.accepted(request):
            self.wants.append(Want(request.request_id, params))

    def truncate_for_prefill(self, request):
        """P: drops the `backoff` last prompt tokens (once, a preempted request comes back),
        so that P's state ends where D's own computation starts."""
        params = request.kv_transfer_params
        ids = request.prompt_token_ids
        if not self.backoff or params.get("_kvx_truncated") or ids is None or \
                request.num_prompt_tokens <= self.backoff:
            return
        del ids[-self.backoff:]
        del request._all_token_ids[-self.backoff:]
        request.num_prompt_tokens -= self.backoff
        request.max_tokens = 1
        params["_kvx_truncated"] = True

    # ---- D ---------------------------------------------------------------------------
    def loaded_prompt(self, request):
        """The prompt tokens D loads: all but the `backoff` last, which D computes."""
        ids = list(request.prompt_token_ids or ())
        return ids[:len(ids) - self.backoff]

    def accepted(self, request):
        """Whether D may load with the request's kv_transfer_params (params.refusal); if not,
        they are dropped, said once, and D computes the prompt itself: nothing is connected
        to, read or held for params that a P of this deployment did not hand over for this
        prompt (a client's own, a router's, another prompt's)."""
        params = request.kv_transfer_params
        if getattr(request, "_kvx_accepted", False):
            return True  # judged once: vLLM asks for a waiting request at every step
        loaded = self.loaded_prompt(request)
        why = transfer_params.refusal(self.key, params, prompt_digest(loaded), len(loaded),
                                      decode_tp=self.tp_size)
        if why is None:
            # on vLLM's Request, never in the params: those are the client's to write
            request._kvx_accepted = True
            return True
        logger.warning("kvx: request %s: kv_transfer_params refused (%s); the prompt is "
                       "computed here", request.request_id, why)
        params["do_remote_prefill"] = False
        return False

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill") or not self.accepted(request):
            return 0, False
        count = len(self.loaded_prompt(request)) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return
        params["do_remote_prefill"] = False
        if num_external_tokens == 0:
            self.unwants.add(request.request_id)  # all local: D releases P's hold
            return
        local = self.transfer_ids(blocks.get_unhashed_block_ids_all_groups())
        self.loads.append(Load(request.request_id, params, local))
        self.loading.add(request.request_id)

    def update_connector_output(self, output):
        for req_id in output.finished_recving or ():
            self.loading.discard(req_id)

    # ---- both ------------------------------------------------------------------------
    def build_connector_meta(self, scheduler_output):
        meta = KvxMetadata(holds=self.holds, loads=self.loads, wants=self.wants,
                           unwants=self.unwants, aborted=self.aborted)
        self.holds, self.loads, self.wants, self.unwants, self.aborted = [], [], [], set(), set()
        return meta
