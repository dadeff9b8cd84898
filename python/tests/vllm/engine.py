"""One vLLM engine of a P/D test, offline, in its own process (vLLM's CPU platform spawns
its engine and worker processes), driven by the test one command at a time.

    python engine.py SPEC_JSON
SPEC: {"model", "served", "connector" ("kvx", "nixl" or null: no connector), "role"
(kv_producer, kv_consumer), "mode" (pull or push), "extra" (kv_connector_extra_config),
"policy" (kv_load_failure_policy), "block_size", "max_model_len", "num_blocks" (the KV
cache's, default 512: several engines share one small machine), "tp" (tensor parallel size,
default 1)}.
Each stdin line is a command; its answer (JSON) is written to the command's "out" path,
atomically, so the driver never reads half of one:
  {"op": "generate", "prompts": [[ids]], "max_tokens": N, "params": [dict] | null,
   "remote_decode": bool}  -> {"tokens", "finish", "params", "seconds"}
  {"op": "kvx_stats"}     -> {"stats": [the kvx agent's stats() of each worker]}
  {"op": "wait_freed"}    -> once P holds no request's blocks: {"held", "end"}
  {"op": "transfer_seconds"} -> D's transfers so far: {"seconds", "count"} (kvx or NIXL)
  {"op": "abort"}         -> requests added and aborted before a step: {"aborted": n}
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
    """Runs in each worker: seconds D's transfers took so far (post to completion), and how
    many. NIXL's telemetry is drained by vLLM each step, so its stats class's recorder is
    wrapped once to keep a running sum (a benchmark's instrument, nothing else; on the class,
    so that the stats objects vLLM pickles stay as they were)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    connector = get_kv_transfer_group()
    if hasattr(connector, "connector_worker"):
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
            NixlKVConnectorStats as stats_class,
        )

        if not hasattr(stats_class, "kvx_bench_total"):
            stats_class.kvx_bench_total = [0.0, 0]
            record = stats_class.record_transfer

            def recording(self, res):
                if res is not None:
                    stats_class.kvx_bench_total[0] += res.xferDuration / 1e6
                    stats_class.kvx_bench_total[1] += 1
                record(self, res)

            stats_class.record_transfer = recording
        return tuple(stats_class.kvx_bench_total)
    stats = connector.worker.agent.stats()
    return stats["transfer_us_sum"] / 1e6, stats["transfer_us_count"]


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=spec["model"], served_model_name=spec.get("served"), dtype="bfloat16",
              block_size=spec.get("block_size", 32),
              max_model_len=spec.get("max_model_len", 4096), enforce_eager=True, seed=0,
              enable_prefix_caching=False, max_num_seqs=16,
              num_gpu_blocks_override=spec.get("num_blocks", 512),
              tensor_parallel_size=spec.get("tp", 1),
              kv_transfer_config=transfer_config(spec))
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
            out["seconds"], out["count"] = map(sum, zip(*llm.collective_rpc(transfer_seconds)))
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
        elif cmd["op"] == "quit":
            break
        with open(cmd["out"] + ".tmp", "w") as f:
            json.dump(out, f)
        os.rename(cmd["out"] + ".tmp", cmd["out"])


if __name__ == "__main__":
    main()
