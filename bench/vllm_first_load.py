"""vLLM P/D with DeepSeek-V4 (or --model llama-bench): what D's first request from a prefill
it has never seen costs, as the KV cache grows, with NixlConnector and with KvxConnector in
one run (bench/vllm_pd.sh --first-load runs it).

Per connector and cache size (vLLM's cache: 64 MiB, 1 GiB, 8 GiB, on P and D alike), D stays
up and each run starts a new P, so every run is a first sight (the connector's handshake,
its metadata and remote keys, then the transfer): D's time to first token for the new P's
first request, and for three requests after it (the steady state). The difference is what
the first contact costs D's user. Also printed: start-up to ready (the engine, its cache and
the connector's registration). With --loaded, busy processes hold both cores for the whole
measurement (started once the engines are ready: start-up is not what is measured).
Medians of --runs runs, 2 noisy cores (P on core 0, D on core 1). The engines keep vLLM's
default kv_load_failure_policy ("fail"): a load that fails fails its request, counted. A
benchmark: nothing is asserted; every served output must equal one instance's."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests", "vllm"))
from conftest import Engine, auth_file, model  # noqa: E402
import models  # noqa: E402

# per model: the engine's settings, and the bytes of one block (of all layers)
MODELS = {
    "deepseek_v4": (dict(served="bench-deepseek-v4", tokenizer_mode="hf", max_model_len=512,
                         block_size=None), 47808),  # one row, six groups overlaid
    "llama-bench": (dict(served="bench-llama", block_size=32, max_model_len=2048),
                    32 * 16384),  # 16 KiB a token
}
SPEC, ROW = MODELS["deepseek_v4"]


def cache_spec(size):
    """vLLM's cache of about `size` bytes: whole GiB through VLLM_CPU_KVCACHE_SPACE, less
    through a block count (the variable takes integers)."""
    if size >= 1 << 30:
        return {"kv_space_gib": size >> 30, "num_blocks": None}
    return {"num_blocks": size // ROW}


def engine(connector, role, name, core, path, size, extra):
    spec = dict(SPEC, **cache_spec(size))
    if connector == "kvx":
        spec["extra"] = extra
    return Engine(name, core, model=path, role=role, connector=connector, **spec)


def hogs(loaded):
    return [subprocess.Popen(["taskset", "-c", str(i % 2), sys.executable, "-c",
                              "while True: pass"]) for i in range(4 if loaded else 0)]


def measure(connector, size, runs, loaded, path, prompt_len):
    extra = {"auth_file": auth_file()}
    d = engine(connector, "kv_consumer", "first-%s-d" % connector, 1, path, size, extra)
    rows = {"first": [], "steady": [], "start_p": [], "outputs": [], "failed": 0}
    try:
        t0 = time.monotonic()
        d.wait_ready()
        start_d = time.monotonic() - t0
        for run in range(runs):
            p = engine(connector, "kv_producer", "first-%s-p%d" % (connector, run), 0, path,
                       size, extra)
            t0 = time.monotonic()
            p.wait_ready()
            rows["start_p"].append(time.monotonic() - t0)
            busy = hogs(loaded)
            try:
                ttft = []
                for i in range(4):
                    prompt = models.prompts_ids([prompt_len], seed=1000 * run + i)
                    params = p.generate(prompt, 1, remote_decode=True)["params"]
                    out = d.generate(prompt, max_tokens=1, params=params)
                    tokens = (out.get("tokens") or [[]])[0]
                    if not tokens:  # kv_load_failure_policy "fail": the request failed
                        rows["failed"] += 1
                    ttft.append(out["seconds"])
                    rows["outputs"].append((run, i, tokens))
                rows["first"].append(ttft[0])
                rows["steady"].append(statistics.median(ttft[1:]))
            finally:
                for hog in busy:
                    hog.kill()
                p.stop()
    finally:
        d.stop()
    return {"first": statistics.median(rows["first"]), "worst": max(rows["first"]),
            "steady": statistics.median(rows["steady"]),
            "start_p": statistics.median(rows["start_p"]), "start_d": start_d,
            "outputs": rows["outputs"], "failed": rows["failed"]}


def reference(path, runs, prompt_len):
    one = Engine("first-one", 0, model=path, connector=None, **dict(SPEC, num_blocks=1024))
    try:
        return [(run, i, one.generate(models.prompts_ids([prompt_len], seed=1000 * run + i),
                                      1)["tokens"][0]) for run in range(runs) for i in range(4)]
    finally:
        one.stop()


def parse_size(text):
    units = {"M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64M,1G,8G")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=130, help="prompt tokens")
    parser.add_argument("--loaded", action="store_true")
    parser.add_argument("--connectors", default="nixl,kvx")
    parser.add_argument("--model", default="deepseek_v4", choices=sorted(MODELS))
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.model == "deepseek_v4" and models.deepseek_v4_missing():
        sys.exit("vllm_first_load: %s" % models.deepseek_v4_missing())
    global SPEC, ROW
    SPEC, ROW = MODELS[args.model]
    path = model(args.model, 0)
    one = reference(path, args.runs, args.prompt)
    results = {}
    for text in args.sizes.split(","):
        for connector in args.connectors.split(","):
            results[(text, connector)] = measure(connector, parse_size(text), args.runs,
                                                 args.loaded, path, args.prompt)
    print("vLLM CPU build P/D, %s, %d-token prompts, a new P "
          "per run, D kept; medians of %d runs, ms; %s; 2 noisy cores (P core 0, D core 1)"
          % ("tiny DeepSeek-V4 (47,808-byte rows)" if args.model == "deepseek_v4" else
             "bench-llama (8 layers, 512 KiB blocks)", args.prompt, args.runs,
             "both cores busy with 4 other processes" if args.loaded
             else "quiet"))
    print("| cache | connector | D first TTFT | worst | D steady TTFT | first contact | "
          "P start s | D start s | failed requests | outputs = one instance |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (text, connector), r in results.items():
        served = [o for o in r["outputs"] if o[2]]
        print("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d | %s |" % (
            text, connector, 1e3 * r["first"], 1e3 * r["worst"], 1e3 * r["steady"],
            1e3 * (r["first"] - r["steady"]), r["start_p"], r["start_d"], r["failed"],
            "yes" if all(o in one for o in served) else "NO"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"%s/%s" % k: v for k, v in results.items()}, f)


if __name__ == "__main__":
    main()
