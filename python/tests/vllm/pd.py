"""One vLLM engine of a P/D test, offline, in its own process (vLLM's CPU platform spawns).

    python pd.py ROLE SPEC.json
ROLE: single (greedy outputs of one instance), prefill (max_tokens=1 with do_remote_decode;
writes each output's kv_transfer_params, then keeps its engine alive until SPEC's "stop_file"
exists, so that D can read), decode (starts its engine, waits for P's params_file, then runs
each prompt with the kv_transfer_params P gave for it).
SPEC: {"model", "prompts" (token id lists), "max_tokens", "connector" (kvx or nixl),
"mode" (pull or push), "extra" (kv_connector_extra_config), "params_file", "out_file",
"stop_file", "block_size", "policy" (kv_load_failure_policy)}. Output: JSON in out_file.
"""

import json
import os
import sys
import time


def transfer_config(spec, role):
    connector = spec.get("connector", "kvx")
    if connector == "kvx":
        cfg = {"kv_connector": "KvxConnector", "kv_connector_module_path": "kvx.vllm",
               "kv_role": role, "kv_buffer_device": "cpu",
               "kv_connector_extra_config": dict(spec.get("extra", {}))}
        if spec.get("mode", "pull") != "pull":
            cfg["kv_connector_extra_config"]["transfer_mode"] = spec["mode"]
    else:
        name = "NixlConnector" if spec.get("mode", "pull") == "pull" else "NixlPushConnector"
        cfg = {"kv_connector": name, "kv_role": role, "kv_buffer_device": "cpu"}
    if spec.get("policy"):
        cfg["kv_load_failure_policy"] = spec["policy"]
    return cfg


def engine(spec, role):
    from vllm import LLM

    kwargs = dict(model=spec["model"], dtype="bfloat16", block_size=spec.get("block_size", 32),
                  max_model_len=spec.get("max_model_len", 4096), enforce_eager=True,
                  seed=0, enable_prefix_caching=spec.get("prefix_caching", False),
                  max_num_seqs=spec.get("max_num_seqs", 16))
    if role is not None:
        kwargs["kv_transfer_config"] = transfer_config(spec, role)
    return LLM(**kwargs)


def generate(llm, prompts, params):
    from vllm import TokensPrompt

    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                           use_tqdm=False)
    return outputs


def main():
    role, spec_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    from vllm import SamplingParams

    prompts = spec["prompts"]
    result = {}
    if role == "single":
        llm = engine(spec, None)
        outs = generate(llm, prompts, SamplingParams(temperature=0, max_tokens=spec["max_tokens"]))
        result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
    elif role == "prefill":
        llm = engine(spec, "kv_producer")
        sp = SamplingParams(temperature=0, max_tokens=1,
                            extra_args={"kv_transfer_params": {"do_remote_decode": True}})
        t0 = time.monotonic()
        outs = generate(llm, prompts, sp)
        result["prefill_seconds"] = time.monotonic() - t0
        result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
        result["params"] = [o.kv_transfer_params for o in outs]
        with open(spec["params_file"] + ".tmp", "w") as f:
            json.dump(result["params"], f)
        os.rename(spec["params_file"] + ".tmp", spec["params_file"])
        deadline = time.monotonic() + spec.get("stay_s", 300)
        while not os.path.exists(spec["stop_file"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    elif role == "decode":
        llm = engine(spec, "kv_consumer")  # started beside P: P's holds wait for no start-up
        deadline = time.monotonic() + spec.get("stay_s", 300)
        while not os.path.exists(spec["params_file"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(spec["params_file"]) as f:
            params = json.load(f)
        sps = [SamplingParams(temperature=0, max_tokens=spec["max_tokens"],
                              extra_args={"kv_transfer_params": p}) for p in params]
        t0 = time.monotonic()
        try:
            outs = generate(llm, prompts, sps)
            result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
            result["finish"] = [o.outputs[0].finish_reason for o in outs]
        except Exception as e:  # policy fail: the request's error, reported
            result["error"] = "%s: %s" % (type(e).__name__, e)
        result["decode_seconds"] = time.monotonic() - t0
    else:
        raise SystemExit("role: single, prefill or decode")
    with open(spec["out_file"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
