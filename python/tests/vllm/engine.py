"""One vLLM engine of a P/D test, offline, in its own process (vLLM's CPU platform spawns
its engine and worker processes), driven by the test one command at a time.

    python engine.py SPEC_JSON
SPEC: {"model", "served", "connector" ("kvx", "nixl" or null: no connector), "role"
(kv_producer, kv_consumer), "mode" (pull or push), "extra" (kv_connector_extra_config),
"policy" (kv_load_failure_policy), "block_size" (default 32; null: vLLM's choice),
"max_model_len" (default 4096), "num_blocks" (the KV cache's, default 512: several engines
share one small machine; null: vLLM's size, VLLM_CPU_KVCACHE_SPACE), "tp" (tensor parallel
size, default 1), "tokenizer_mode", "max_num_batched_tokens" and
"disable_hybrid_kv_cache_manager" (default: vLLM's), "prefix_caching" (default off)}.
Each stdin line is a command; its answer (JSON) is written to the command's "out" path,
atomically, so the driver never reads half of one:
  {"op": "generate", "prompts": [[ids]], "max_tokens": N, "params": [dict] | null,
   "remote_decode": bool}  -> {"tokens", "finish", "params", "seconds"}
  {"op": "kvx_stats"}     -> {"stats": [the kvx agent's stats() of each worker]}
  {"op": "wait_freed"}    -> once P holds no request's blocks: {"held", "end"}
  {"op": "transfer_seconds"} -> D's transfers so far: {"seconds", "count", "bytes"} (kvx or
                             NIXL)
  {"op": "abort"}         -> requests added and aborted before a step: {"aborted": n}
  {"op": "abort_some", "prompts", "params", "max_tokens", "steps", "abort": [indices], "tag"}
                          -> all added, `steps` steps, those aborted, the rest run to the end:
                             {"tokens": [ids or None], "finish": [reason or None]}
  {"op": "kv_caches"}     -> what each worker's KV connector is (or would be) given:
                             [kv_cache_dump() of each worker]
"""

import json
import os
import sys
import time


def transfer_config(spec):
    connector = spec.get("connector")
    if connector is None:
        return None
    if connector == "kvx":
        extra = dict(spec.get("extra", {}))
        if spec.get("mode", "pull") != "pull":
            extra["transfer_mode"] = spec["mode"]
        cfg = {"kv_connector": "KvxConnector", "kv_connector_module_path": "kvx.vllm",
               "kv_connector_extra_config": extra}
    else:
        cfg = {"kv_connector": "NixlConnector" if spec.get("mode", "pull") == "pull"
               else "NixlPushConnector"}
    cfg.update(kv_role=spec["role"], kv_buffer_device="cpu")
    if spec.get("policy"):
        cfg["kv_load_failure_policy"] = spec["policy"]
    return cfg


def kvx_stats(worker):
    """Runs in each worker process (collective_rpc): its kvx agent's counters."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group().worker.agent.stats()


def held(worker):
    """Runs in each worker: requests whose blocks P still holds for a D."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    connector = get_kv_transfer_group()
    if hasattr(connector, "connector_worker"):  # vLLM's NIXL connector
        return len(connector.connector_worker._reqs_to_send)
    return connector.worker.agent.stats()["held"]


def transfer_seconds(worker):
    """Runs in each worker: seconds D's transfers took so far (post to completion), how many,
    and the bytes they moved. NIXL's telemetry is drained by vLLM each step, so its stats class's recorder is
    wrapped once to keep a running sum (a benchmark's instrument, nothing else; on the class,
    so that the stats objects vLLM pickles stay as they were)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    connector = get_kv_transfer_group()
    if hasattr(connector, "connector_worker"):
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
            NixlKVConnectorStats as stats_class,
        )

        if not hasattr(stats_class, "kvx_bench_total"):
            stats_class.kvx_bench_total = [0.0, 0, 0]
            record = stats_class.record_transfer

            def recording(self, res):
                if res is not None:
                    stats_class.kvx_bench_total[0] += res.xferDuration / 1e6
                    stats_class.kvx_bench_total[1] += 1
                    stats_class.kvx_bench_total[2] += res.totalBytes
                record(self, res)

            stats_class.record_transfer = recording
        return tuple(stats_class.kvx_bench_total)
    stats = connector.worker.agent.stats()
    return stats["transfer_us_sum"] / 1e6, stats["transfer_us_count"], stats["bytes"]


def _spec_fields(spec):
    """A KV cache spec's fields, JSON-able (dtypes as names, nested specs recursively)."""
    import dataclasses

    import torch

    def value(v):
        if isinstance(v, torch.dtype):
            return str(v).replace("torch.", "")
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return _spec_fields(v)
        if isinstance(v, dict):
            return {str(k): value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [value(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return repr(v)

    out = {"class": type(spec).__name__}
    if dataclasses.is_dataclass(spec):
        for f in dataclasses.fields(spec):
            out[f.name] = value(getattr(spec, f.name))
    for name in ("block_size", "page_size_bytes", "real_page_size_bytes"):
        try:
            out[name] = value(getattr(spec, name))
        except Exception:  # a property a spec class does not have, or cannot compute
            pass
    return out


def kv_cache_dump(worker):
    """Runs in each worker (collective_rpc): the KV cache as a KV connector's
    register_kv_caches sees it, and the KVCacheConfig it comes from. The runner keeps the
    tensors it handed to register_kv_caches, without their names: model_runner.kv_caches
    (bind_kv_cache) lists that dict's values in layer-index order, and the dict's own order
    is kv_cache_config.kv_cache_tensors' layers (allocate_kv_cache), which names them; the
    names are checked against the memory each layer of the forward context is bound to."""
    from vllm.model_executor.models.utils import extract_layer_index

    runner = worker.model_runner
    config = runner.kv_cache_config
    context = runner.compilation_config.static_forward_context
    names = [n for t in config.kv_cache_tensors for n in t.layers]
    names = sorted(names, key=extract_layer_index)  # stable, as bind_kv_cache's order
    assert len(names) == len(runner.kv_caches), (names, len(runner.kv_caches))
    views = []
    base = runner.kv_caches[0].untyped_storage().data_ptr() if runner.kv_caches else 0
    for name, t in zip(names, runner.kv_caches):
        bound = context[name].kv_cache
        assert bound.data_ptr() == t.data_ptr() and bound.numel() == t.numel(), name
        storage = t.untyped_storage()
        views.append({
            "name": name, "shape": list(t.shape), "stride": list(t.stride()),
            "dtype": str(t.dtype).replace("torch.", ""), "element_size": t.element_size(),
            "offset_bytes": t.storage_offset() * t.element_size(),
            "data_ptr_minus_storage_ptr": t.data_ptr() - storage.data_ptr(),
            "storage_nbytes": storage.nbytes(), "storage_base_delta": storage.data_ptr() - base,
            "is_contiguous": t.is_contiguous(), "bound_shape": list(bound.shape),
            "bound_stride": list(bound.stride())})
    groups = []
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        g = {"layer_names": list(group.layer_names), "spec": _spec_fields(spec),
             "enable_kv_transfer": group.enable_kv_transfer, "role": str(group.role.value)}
        if hasattr(spec, "kv_cache_specs"):  # UniformTypeKVCacheSpecs: the layers' own
            g["spec"].pop("kv_cache_specs", None)
            g["layer_specs"] = {n: _spec_fields(s) for n, s in spec.kv_cache_specs.items()}
        groups.append(g)
    cache_config = runner.cache_config
    return {
        "num_blocks": config.num_blocks,
        "cache_config_block_size": cache_config.block_size,
        "cache_dtype": str(cache_config.cache_dtype),
        "kv_cache_layout": cache_config.get_resolved_kv_cache_layout().name,
        "kv_cache_layout_value": list(cache_config.get_resolved_kv_cache_layout().value),
        "kv_cache_config_layout": config.kv_cache_layout,
        "kv_cache_tensors": [_spec_fields(t) for t in config.kv_cache_tensors],
        "groups": groups,
        "views": views,
    }


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    from vllm import LLM, SamplingParams, TokensPrompt

    # null block_size: vLLM's choice (the CPU platform's; 256 for DeepSeek-V4, whatever is
    # asked); null num_blocks: vLLM's cache size (VLLM_CPU_KVCACHE_SPACE, conftest.py)
    options = {key: spec[key] for key in ("tokenizer_mode", "max_num_batched_tokens",
                                          "disable_hybrid_kv_cache_manager")
               if spec.get(key) is not None}
    llm = LLM(model=spec["model"], served_model_name=spec.get("served"), dtype="bfloat16",
              block_size=spec.get("block_size", 32),
              max_model_len=spec.get("max_model_len", 4096), enforce_eager=True, seed=0,
              enable_prefix_caching=bool(spec.get("prefix_caching")), max_num_seqs=16,
              num_gpu_blocks_override=spec.get("num_blocks", 512),
              tensor_parallel_size=spec.get("tp", 1),
              kv_transfer_config=transfer_config(spec), **options)
    with open(spec["ready_file"], "w"):
        pass  # the driver waits for this file; stdout and stderr are vLLM's log
    for line in sys.stdin:
        cmd = json.loads(line)
        out = {}
        if cmd["op"] == "generate":
            prompts = [TokensPrompt(prompt_token_ids=p) for p in cmd["prompts"]]
            n = len(prompts)
            params = cmd.get("params") or [None] * n
            if cmd.get("remote_decode"):
                params = [{"do_remote_decode": True}] * n
            sps = [SamplingParams(temperature=0, max_tokens=cmd["max_tokens"],
                                  extra_args={"kv_transfer_params": p} if p else None)
                   for p in params]
            t0 = time.monotonic()
            try:
                outs = llm.generate(prompts, sps, use_tqdm=False)
                out["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
                out["finish"] = [o.outputs[0].finish_reason for o in outs]
                out["params"] = [o.kv_transfer_params for o in outs]
            except Exception as e:  # policy "fail" fails the request: say how
                out["error"] = "%s: %s" % (type(e).__name__, e)
            out["seconds"] = time.monotonic() - t0
            out["end"] = time.monotonic()  # system-wide clock: comparable across processes
        elif cmd["op"] == "kvx_stats":
            out["stats"] = llm.collective_rpc(kvx_stats)
        elif cmd["op"] == "wait_freed":  # until P holds nothing for a D; when that was
            deadline = time.monotonic() + cmd.get("timeout_s", 120)
            while sum(llm.collective_rpc(held)) > 0 and time.monotonic() < deadline:
                time.sleep(0.0005)
            out["held"] = sum(llm.collective_rpc(held))
            out["end"] = time.monotonic()
        elif cmd["op"] == "transfer_seconds":
            out["seconds"], out["count"], out["bytes"] = map(
                sum, zip(*llm.collective_rpc(transfer_seconds)))
        elif cmd["op"] == "abort":
            engine = llm.llm_engine
            ids = ["abort-%d-%d" % (os.getpid(), i) for i in range(len(cmd["prompts"]))]
            for req_id, p, kv in zip(ids, cmd["prompts"], cmd["params"]):
                engine.add_request(req_id, TokensPrompt(prompt_token_ids=p),
                                   SamplingParams(temperature=0, max_tokens=4,
                                                  extra_args={"kv_transfer_params": kv}))
            engine.abort_request(ids)
            while engine.has_unfinished_requests():
                engine.step()
            out["aborted"] = len(ids)
        elif cmd["op"] == "abort_some":  # all added, `steps` steps, some aborted, the rest run
            engine = llm.llm_engine
            ids = ["some-%d-%d-%d" % (os.getpid(), cmd["tag"], i)
                   for i in range(len(cmd["prompts"]))]
            for req_id, p, kv in zip(ids, cmd["prompts"], cmd["params"]):
                engine.add_request(req_id, TokensPrompt(prompt_token_ids=p),
                                   SamplingParams(temperature=0, max_tokens=cmd["max_tokens"],
                                                  extra_args={"kv_transfer_params": kv}))
            done = {}
            for _ in range(cmd["steps"]):
                done.update((o.request_id, o) for o in engine.step() if o.finished)
            engine.abort_request([ids[i] for i in cmd["abort"]])
            while engine.has_unfinished_requests():
                done.update((o.request_id, o) for o in engine.step() if o.finished)
            out["tokens"] = [list(done[r].outputs[0].token_ids) if r in done else None
                             for r in ids]
            out["finish"] = [done[r].outputs[0].finish_reason if r in done else None
                             for r in ids]
        elif cmd["op"] == "kv_caches":
            out["workers"] = llm.collective_rpc(kv_cache_dump)
        elif cmd["op"] == "quit":
            break
        with open(cmd["out"] + ".tmp", "w") as f:
            json.dump(out, f)
        os.rename(cmd["out"] + ".tmp", cmd["out"])


if __name__ == "__main__":
    main()
