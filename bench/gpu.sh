#!/usr/bin/env bash
# gpu.sh: kvx bench --memory cuda beside ucx_perftest -m cuda,cuda in the same run (issue 14,
# docs/gpu.md): per block size, kvx's pull and push GB/s over ucx_perftest's get and put of
# one block, medians of RUNS runs, and the transports UCX chose. --memory host runs the same
# comparison on host memory (what a machine without a GPU can check of this script).
# usage: bench/gpu.sh [BUILD_DIR] [--memory cuda|host] [--json]
#   env: SIZES (64K,1M,16M), BATCH (16), ITERS (50 kvx transfers a point), RUNS (3),
#        PERFTEST (the ucx_perftest of the UCX kvx runs on; default the one on PATH)
# Loopback only: UCX_NET_DEVICES=lo.
set -euo pipefail
build=build
memory=cuda
json=
while [ $# -gt 0 ]; do
  case $1 in
  --memory) memory=$2; shift ;;
  --json) json=--json ;;
  -*) echo "gpu.sh: error: unknown option $1" >&2; exit 2 ;;
  *) build=$1 ;;
  esac
  shift
done
case $memory in cuda | host) ;; *) echo "gpu.sh: error: --memory cuda or host" >&2; exit 2 ;; esac
sizes=${SIZES:-64K,1M,16M}
batch=${BATCH:-16}
iters=${ITERS:-50}
runs=${RUNS:-3}
kvx=$build/kvx
perftest_bin=${PERFTEST:-$(command -v ucx_perftest || true)}
tls=sm,cma,tcp
[ "$memory" = cuda ] && tls=sm,cma,tcp,cuda_copy,cuda_ipc # what kvx's agents default to
export UCX_NET_DEVICES=lo                                 # never another interface
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$kvx" ] || { echo "gpu.sh: error: $kvx is not built" >&2; exit 2; }
[ -n "$perftest_bin" ] && [ -x "$perftest_bin" ] ||
  { echo "gpu.sh: error: no ucx_perftest (set PERFTEST)" >&2; exit 2; }

# perftest TEST SIZE RUN: both buffers in $memory; appends {"perftest": ...} to the results.
source "$(dirname "$0")/perftest.sh"
perftest() {
  local test=$1 size=$2 run=$3 line
  line=$(perftest_row "$perftest_bin" "$tls" "$test" "$size" "$memory,$memory")
  if [ -z "$line" ]; then
    echo "gpu.sh: ucx_perftest $test -s $size -m $memory gave nothing: $(head -c 300 "$tmp/perftest.err")" >&2
    echo "{\"perftest\": \"$test\", \"block_size\": $size, \"run\": $run, \"gbps\": null}" >>"$tmp/results"
    return
  fi
  # -f columns: iterations, latency p50/avg/overall (us), bandwidth avg/overall (MiB/s), rate.
  echo "$line" | awk -v test="$test" -v size="$size" -v run="$run" '{
    printf "{\"perftest\": \"%s\", \"block_size\": %d, \"run\": %d, \"gbps\": %.4f}\n", test, size, run, $6 * 1048576 / 1e9 }' >>"$tmp/results"
}

bytes_list=$(echo "$sizes" | tr ',' '\n' | numfmt --from=iec | tr '\n' ' ')
echo "gpu.sh: $memory memory, sizes $sizes, batch $batch, $iters kvx transfers a point," \
  "$runs runs; UCX_TLS $tls; $(nproc) CPUs" >&2
for run in $(seq "$runs"); do
  for mode in pull push; do
    "$kvx" bench --json --memory "$memory" --mode "$mode" --block-sizes "$sizes" --batch "$batch" \
      --iters "$iters" 2>"$tmp/kvx.err" | sed "s/^{/{\"run\": $run, /" >>"$tmp/results" ||
      { echo "gpu.sh: kvx bench --memory $memory --mode $mode failed: $(cat "$tmp/kvx.err")" >&2; exit 1; }
  done
  for size in $bytes_list; do
    perftest ucp_get "$size" "$run"
    perftest ucp_put_bw "$size" "$run"
  done
done

/usr/bin/env python3 - "$tmp/results" "$json" "$memory" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
out = []
for size in sorted({r["block_size"] for r in rows}):
    kvx = {m: [r for r in rows if r.get("mode") == m and r["block_size"] == size]
           for m in ("pull", "push")}
    perf = {t: median([r["gbps"] for r in rows if r.get("perftest") == t and r["block_size"] == size])
            for t in ("ucp_get", "ucp_put_bw")}
    o = {"memory": sys.argv[3], "block_size": size}
    for mode, test in (("pull", "ucp_get"), ("push", "ucp_put_bw")):
        g = median([r["gbps"] for r in kvx[mode]])
        o[mode + "_gbps"] = g
        o[test + "_gbps"] = perf[test]
        o[mode + "_of_perftest"] = g / perf[test] if g and perf[test] else None
        o[mode + "_transports"] = kvx[mode][-1].get("push_transports" if mode == "push" else "transports") if kvx[mode] else None
    out.append(o)
if sys.argv[2] == "--json":
    for o in out:
        print(json.dumps(o))
    sys.exit(0)
fmt = lambda x, f="%7.2f": (f % x) if x is not None else "      -"
print("%-6s %9s %9s %7s %9s %9s %7s  %s" % ("block", "pull GB/s", "get GB/s", "ratio",
      "push GB/s", "put GB/s", "ratio", "transports (pull | push)"))
for o in out:
    b = o["block_size"]
    name = "%dM" % (b >> 20) if b >= 1 << 20 else "%dK" % (b >> 10)
    print("%-6s %9s %9s %7s %9s %9s %7s  %s | %s" % (
        name, fmt(o["pull_gbps"]), fmt(o["ucp_get_gbps"]), fmt(o["pull_of_perftest"]),
        fmt(o["push_gbps"]), fmt(o["ucp_put_bw_gbps"]), fmt(o["push_of_perftest"]),
        o["pull_transports"], o["push_transports"]))
print("medians of %d runs; kvx: %s blocks a transfer, ucx_perftest: one block a message."
      " Ratios are kvx's over ucx_perftest's." % (int(max(r.get("run", 1) for r in rows)),
                                                 max((r.get("batch", 0) for r in rows), default=0)))
EOF
