"""KvxConnector's scheduler half driven by vLLM's own Scheduler (0.32), with the model runner's
outputs made by the test, as vLLM's connector unit tests drive NIXL's (issue 35): the
request lifecycles of P and D step by step, and after each one no request, no block and no
order left behind. No engine process and no kvx transfer: what a worker would report
(finished_sending, finished_recving, invalid blocks) is what the test feeds the scheduler.

The orders the scheduler half gives its workers (KvxMetadata: holds on P, loads, wants,
unwants and aborts on D) are checked at each step, since they are what moves or releases
bytes."""

import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from conftest import auth_file, model
from kvx.vllm import params as transfer_params
from kvx.vllm.config import secret_of, settings_from
from kvx.vllm.metadata import KvxHandshake

BLOCK = 32
BLOCKS = 64
EOS = 2

init_none_hash(sha256)


def scheduler(role, **extra):
    """vLLM's Scheduler with KvxConnector in `role` (kv_producer or kv_consumer), prefix
    caching on, 64 blocks of 32 tokens."""
    config = VllmConfig(
        model_config=ModelConfig(model=model("llama", 0), dtype="bfloat16", seed=0),
        scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1024,
                                         max_model_len=2048, is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvxConnector", kv_connector_module_path="kvx.vllm", kv_role=role,
            kv_connector_extra_config=dict({"auth_file": auth_file()}, **extra),
            kv_load_failure_policy="recompute"),
        device_config=DeviceConfig("cpu"))
    config.cache_config.num_gpu_blocks = BLOCKS
    cache = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=1, dtype=torch.float32))])
    s = Scheduler(vllm_config=config, kv_cache_config=cache, block_size=BLOCK,
                  structured_output_manager=StructuredOutputManager(config), log_stats=True)
    if role == "kv_producer":
        s.connector.set_xfer_handshake_metadata({0: KvxHandshake(address="127.0.0.1:5600")})
    return s


def request(name, tokens, max_tokens=4, params=None):
    sampling = SamplingParams(max_tokens=max_tokens)
    sampling.update_from_generation_config({}, EOS)
    r = Request(request_id=name, prompt_token_ids=list(tokens), sampling_params=sampling,
                pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
    r.kv_transfer_params = params
    return r


def prompt(n, seed):
    return [3 + (seed * 7919 + i * 104729) % 500 for i in range(n)]


def p_params(tokens, block_ids, request_id=41):
    """What a P of this deployment hands over for `tokens` (signed with the tests' key)."""
    key = transfer_params.signing_key(secret_of(settings_from({"auth_file": auth_file()})))
    return transfer_params.make(key, engine_id="p-engine", request_id=request_id,
                                token=bytes(range(1, 17)), block_ids=[block_ids],
                                addresses=["127.0.0.1:5600"], num_tokens=len(tokens),
                                prompt_ids=tokens, transfer_mode="pull")


def step(s, kv=None, token=7, finish=()):
    """One engine step: schedule, then the model runner's output for what was scheduled
    (`token` for each request, EOS for those in `finish`), with the connector's report `kv`.
    Returns (scheduler output, its KvxMetadata)."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    runner = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[EOS if r in finish else token] for r in ids],
        kv_connector_output=kv)
    outputs = s.update_from_output(out, runner)
    s.handed_over = {o.request_id: o.kv_transfer_params for each in outputs.values()
                     for o in each.outputs if o.kv_transfer_params}
    return out, out.kv_connector_metadata


def finish(s, r, steps):
    """`steps` more steps; then `r` has ended and nothing is left (empty)."""
    for _ in range(steps):
        step(s)
    assert r.is_finished()
    empty(s)


def empty(s):
    """No request, no block and nothing of the connector's left (vLLM's own check, plus
    kvx's scheduler state)."""
    assert not s.requests and not s.waiting and not s.running
    pool = s.kv_cache_manager.block_pool
    assert pool.free_block_queue.num_free_blocks == pool.num_gpu_blocks - 1
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    half = s.connector.scheduler
    assert not (half.holds or half.loads or half.wants or half.unwants or half.aborted or
                half.loading)


def test_d_remote_prefill_lifecycle():
    """D: a request with P's params waits for its load (WAITING_FOR_REMOTE_KVS), is loaded
    into the blocks vLLM allocated (one order, P's block ids paired with them), runs once
    the worker reports it received, and ends with nothing left."""
    s = scheduler("kv_consumer")
    tokens = prompt(100, 1)
    r = request("d1", tokens, params=p_params(tokens, [9, 10, 11, 12]))
    s.add_request(r)
    out, meta = step(s)
    assert out.num_scheduled_tokens == {}  # nothing computed: it waits for P's blocks
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    (load,) = meta.loads
    assert load.req_id == "d1" and len(load.local_ids[0]) == 4
    assert load.params["remote_block_ids"] == [[9, 10, 11, 12]]
    _, meta = step(s)
    assert not meta.loads  # ordered once
    step(s, KVConnectorOutput(finished_recving={"d1"}))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"d1": 1}  # only the last prompt token: the rest came
    finish(s, r, 3)


def test_d_refuses_params_not_signed_here_and_computes_the_prompt():
    s = scheduler("kv_consumer")
    tokens = prompt(70, 2)
    forged = dict(p_params(tokens, [1, 2, 3]), remote_block_ids=[[4, 5, 6]])
    r = request("d2", tokens, params=forged)
    s.add_request(r)
    out, meta = step(s)
    assert out.num_scheduled_tokens == {"d2": 70} and not meta.loads and not meta.wants
    finish(s, r, 3)


def test_d_abort_while_waiting_for_its_load_tells_the_worker_and_frees_after_its_report():
    """Aborted while loading: vLLM keeps the blocks (a read may still write them) until the
    worker reports the load over; the scheduler half orders the abort to the worker."""
    s = scheduler("kv_consumer")
    tokens = prompt(64, 3)
    r = request("d3", tokens, params=p_params(tokens, [1, 2]))
    s.add_request(r)
    step(s)
    s.finish_requests("d3", RequestStatus.FINISHED_ABORTED)
    _, meta = step(s)
    assert meta.aborted == {"d3"}
    step(s, KVConnectorOutput(finished_recving={"d3"}))
    step(s)
    empty(s)


def test_d_abort_before_the_load_was_planned_releases_p_at_once():
    """Aborted in D's queue before any block was allocated for it: no load, and an unwant so
    the worker releases P's hold now rather than at its lease."""
    s = scheduler("kv_consumer")
    tokens = prompt(64, 4)
    r = request("d4", tokens, params=p_params(tokens, [1, 2]))
    s.add_request(r)
    s.finish_requests("d4", RequestStatus.FINISHED_ABORTED)
    _, meta = step(s)
    assert meta.unwants == {"d4"} and not meta.loads
    empty(s)


def test_d_prefix_hit_loads_only_the_blocks_it_does_not_have():
    """D computed the same 97-token prompt before: its 3 whole blocks are in D's prefix cache;
    P's params for it load only the 4th block (the 97th token's), into one new block."""
    s = scheduler("kv_consumer")
    tokens = prompt(97, 5)
    first = request("d5a", tokens)
    s.add_request(first)
    for _ in range(4):
        step(s)
    assert first.is_finished()
    r = request("d5b", tokens, params=p_params(tokens, [1, 2, 3, 4]))
    s.add_request(r)
    _, meta = step(s)
    (load,) = meta.loads
    assert len(load.local_ids[0]) == 1  # paired with P's last block by the worker
    step(s, KVConnectorOutput(finished_recving={"d5b"}))
    finish(s, r, 4)


def test_d_failed_load_is_recomputed_under_policy_recompute():
    """The worker reports the load's blocks invalid: vLLM recomputes the prompt into them."""
    s = scheduler("kv_consumer")
    tokens = prompt(64, 6)
    r = request("d6", tokens, params=p_params(tokens, [1, 2]))
    s.add_request(r)
    _, meta = step(s)
    (load,) = meta.loads
    step(s, KVConnectorOutput(finished_recving={"d6"}, invalid_block_ids=set(load.local_ids[0])))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"d6": 64}  # all of it, computed here
    finish(s, r, 3)


def test_p_remote_decode_lifecycle():
    """P: a request for a remote decode runs its prompt, ends at its one token, and hands
    over params naming exactly the prompt's blocks; vLLM keeps the blocks until the worker
    reports the hold released (finished_sending), then frees them."""
    s = scheduler("kv_producer")
    tokens = prompt(100, 7)
    r = request("p1", tokens, max_tokens=1, params={"do_remote_decode": True})
    s.add_request(r)
    _, meta = step(s)
    assert r.is_finished() and not meta.holds
    params = s.handed_over["p1"]
    assert params["remote_num_tokens"] == 100 and params["remote_addresses"] == ["127.0.0.1:5600"]
    out, meta = step(s)
    (hold,) = meta.holds
    assert hold.req_id == "p1" and hold.block_ids == params["remote_block_ids"]
    assert len(hold.block_ids[0]) == 4
    assert s.kv_cache_manager.block_pool.free_block_queue.num_free_blocks < BLOCKS - 1
    step(s, KVConnectorOutput(finished_sending={"p1"}))
    empty(s)


def test_p_hands_over_nothing_for_a_request_aborted_on_p():
    s = scheduler("kv_producer")
    tokens = prompt(40, 8)
    r = request("p2", tokens, max_tokens=1, params={"do_remote_decode": True})
    s.add_request(r)
    s.finish_requests("p2", RequestStatus.FINISHED_ABORTED)
    _, meta = step(s)
    assert not meta.holds
    empty(s)


def test_p_that_generated_past_the_prompt_hands_over_the_prompts_blocks():
    """A router that did not give P max_tokens 1: P ran 8 tokens past a 90-token prompt into
    a 4th block, and hands over the prompt's 3 blocks and its token count, not its last
    blocks (finding 2)."""
    s = scheduler("kv_producer")
    tokens = prompt(90, 9)
    r = request("p3", tokens, max_tokens=8, params={"do_remote_decode": True})
    s.add_request(r)
    for _ in range(7):
        step(s)
    step(s, finish=("p3",))
    assert r.is_finished()
    params = s.handed_over["p3"]
    assert params["remote_num_tokens"] == 90 and len(params["remote_block_ids"][0]) == 3
    _, meta = step(s)
    (hold,) = meta.holds
    assert hold.block_ids == params["remote_block_ids"]
    step(s, KVConnectorOutput(finished_sending={"p3"}))
    empty(s)
