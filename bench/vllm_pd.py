"""vLLM P/D with NixlConnector and with KvxConnector in one run (bench/vllm_pd.sh runs it).

Per prompt length, one request at a time, each connector's P and D engines on their own core
(P on core 0, D on core 1; each pair started, measured and stopped before the other):
  - D's time to first token: D's generate of 1 token with P's kv_transfer_params (the load
    from P, then the first decode step), measured inside D's process;
  - the KV transfer time: post to completion as each connector's own telemetry says it
    (kvx's transfer_us, NIXL's xferDuration), per request;
  - P's time until the blocks are freed: from P's answer to the moment P's worker holds
    nothing for a D any more (it includes D's load and the done's way back).
Medians of --runs runs, kvx's ratio to NIXL (below 1: kvx faster), the KV each connector
moved per request (its own count), and a check that both connectors' D outputs equal one
instance's. A benchmark, not a test: nothing is asserted but equal outputs.

--model llama-bench (default): 8 layers, 16 KiB of KV per token, block size --block-size.
--model deepseek_v4: the tiny DeepSeek-V4 of the tests (six KV cache groups in one 47,808-byte
row), vLLM's block size (256) and cache size (1 GiB), prompts up to 500 tokens."""

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests", "vllm"))
from conftest import Engine, model  # noqa: E402
import models  # noqa: E402


MODELS = {
    "llama-bench": lambda block_size: dict(served="bench-llama", block_size=block_size,
                                           num_blocks=1024),
    "deepseek_v4": lambda block_size: dict(served="bench-deepseek-v4", block_size=None,
                                           num_blocks=None, tokenizer_mode="hf",
                                           max_model_len=512),
}


def measure(connector, path, lengths, runs, engine_spec):
    common = dict(model=path, connector=connector,
                  extra={"insecure": True} if connector == "kvx" else {}, **engine_spec)
    p = Engine("bench-%s-p" % connector, 0, role="kv_producer", **common)
    d = Engine("bench-%s-d" % connector, 1, role="kv_consumer", **common)
    rows = {}
    try:
        p.wait_ready()
        d.wait_ready()
        warm = models.prompts_ids([64], seed=99)
        d.generate(warm, max_tokens=1, params=p.generate(warm, 1, remote_decode=True)["params"])
        p.call("wait_freed")
        for n in lengths:
            ttft, xfer, freed, moved, outputs = [], [], [], [], []
            for run in range(runs):
                prompt = models.prompts_ids([n], seed=1000 * n + run)
                before = d.call("transfer_seconds")
                prefilled = p.generate(prompt, max_tokens=1, remote_decode=True)
                pending = p.send("wait_freed")
                out = d.generate(prompt, max_tokens=1, params=prefilled["params"])
                freed_at = p.result(pending)
                after = d.call("transfer_seconds")
                if out.get("tokens") is None or freed_at["held"] != 0:
                    raise SystemExit("%s: a request failed: %s" % (connector, out))
                ttft.append(out["seconds"])
                xfer.append((after["seconds"] - before["seconds"]) /
                            max(1, after["count"] - before["count"]))
                moved.append(after["bytes"] - before["bytes"])
                freed.append(freed_at["end"] - prefilled["end"])
                outputs.append(out["tokens"][0])
            rows[n] = {"ttft": statistics.median(ttft), "xfer": statistics.median(xfer),
                       "freed": statistics.median(freed), "bytes": statistics.median(moved),
                       "outputs": outputs}
    finally:
        p.stop()
        d.stop()
    return rows


def reference(path, lengths, runs, engine_spec):
    one = Engine("bench-one", 0, model=path, connector=None, **engine_spec)
    try:
        return {n: [one.generate(models.prompts_ids([n], seed=1000 * n + run), 1)["tokens"][0]
                    for run in range(runs)] for n in lengths}
    finally:
        one.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-bench", choices=sorted(MODELS))
    parser.add_argument("--lengths", help="prompt tokens (default 256,512,1024,2048; "
                        "deepseek_v4: 100,200,300,500)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    lengths = [int(x) for x in (args.lengths or ("100,200,300,500" if args.model ==
                                                 "deepseek_v4" else "256,512,1024,2048")
                                 ).split(",")]
    if args.model == "deepseek_v4" and models.deepseek_v4_missing():
        sys.exit("vllm_pd: %s" % models.deepseek_v4_missing())
    path = model(args.model, 0)
    spec = MODELS[args.model](args.block_size)
    one = reference(path, lengths, args.runs, spec)
    results = {c: measure(c, path, lengths, args.runs, spec) for c in ("nixl", "kvx")}
    print("vLLM CPU build P/D, %s, medians of %d runs, one request at a time; 2 noisy cores: "
          "P on core 0, D on core 1" % (
              "bench-llama (8 layers, 16 KiB of KV per token), block size %d" % args.block_size
              if args.model == "llama-bench" else
              "tiny DeepSeek-V4 (47,808-byte rows, six groups), vLLM's block size and cache",
              args.runs))
    print("| prompt tokens | KV MiB NIXL | kvx | D TTFT ms NIXL | kvx | ratio | KV transfer ms "
          "NIXL | kvx | ratio | P blocks freed ms NIXL | kvx | ratio | outputs = one instance |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in lengths:
        a, b = results["nixl"][n], results["kvx"][n]
        same = "yes" if a["outputs"] == one[n] and b["outputs"] == one[n] else "NO"
        print("| %d | %.2f | %.2f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.2f "
              "| %s |" % (
            n, a["bytes"] / 2**20, b["bytes"] / 2**20,
            1e3 * a["ttft"], 1e3 * b["ttft"], b["ttft"] / a["ttft"],
            1e3 * a["xfer"], 1e3 * b["xfer"], b["xfer"] / a["xfer"] if a["xfer"] else 0,
            1e3 * a["freed"], 1e3 * b["freed"], b["freed"] / a["freed"], same))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"one": one, **results}, f)


if __name__ == "__main__":
    main()
