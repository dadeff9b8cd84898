#!/usr/bin/env bash
# limits.sh: kvx bench's figures as ratios of what this machine does without kvx, all measured
# in the same run: memcpy and process_vm_readv (bench/limits_probe), and ucx_perftest's get and
# put over the same transports and block sizes (docs/performance.md "Transfers").
# usage: bench/limits.sh [BUILD_DIR] [--json]
#   env: SIZES (4K,64K,1M,16M), BATCH (16), ITERS (30 kvx transfers per point),
#        TLS_LIST ("sm,cma,tcp cma,tcp": the ucx_perftest transports; add posix,tcp)
# Loopback only: UCX_NET_DEVICES=lo.
set -euo pipefail
build=${1:-build}
json=${2:-}
sizes=${SIZES:-4K,64K,1M,16M}
batch=${BATCH:-16}
iters=${ITERS:-30}
kvx=$build/kvx
probe=$build/bench/limits_probe
export UCX_NET_DEVICES=lo # never another interface
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for tool in "$kvx" "$probe"; do
  [ -x "$tool" ] || { echo "limits.sh: error: $tool is not built (cmake --build $build)" >&2; exit 2; }
done
command -v ucx_perftest >/dev/null ||
  { echo "limits.sh: error: ucx_perftest not found (Debian package ucx-utils)" >&2; exit 2; }

# perftest TLS TEST SIZE: appends {"perftest": ...} with bandwidth (GB/s), message rate and
# median latency to results.
source "$(dirname "$0")/perftest.sh"
perftest() {
  local tls=$1 test=$2 size=$3 line
  line=$(perftest_row ucx_perftest "$tls" "$test" "$size" host)
  [ -n "$line" ] || { echo "limits.sh: error: ucx_perftest $test -s $size over $tls gave nothing: $(cat "$tmp/perftest.err")" >&2; exit 1; }
  # -f columns: iterations, latency p50/avg/overall (us), bandwidth avg/overall (MiB/s), rate.
  echo "$line" | awk -v tls="$tls" -v test="$test" -v size="$size" '{
    printf "{\"perftest\": \"%s\", \"tls\": \"%s\", \"block_size\": %d, \"gbps\": %.4f, ", test, tls, size, $6 * 1048576 / 1e9
    printf "\"msg_per_s\": %.1f, \"latency_us_p50\": %.3f}\n", $8, $2 }' >>"$tmp/results"
}

bytes_list=$(echo "$sizes" | tr ',' '\n' | numfmt --from=iec | tr '\n' ' ')
echo "limits.sh: sizes $sizes, batch $batch, $iters kvx transfers per point; $(nproc) CPUs" \
  "(noisy machines: run several times and take medians)" >&2
"$probe" --block-sizes "$sizes" --batch "$batch" --iters $((iters * 3)) >>"$tmp/results"
for tls in ${TLS_LIST:-sm,cma,tcp cma,tcp}; do
  for size in $bytes_list; do
    perftest "$tls" ucp_get "$size"
    perftest "$tls" ucp_put_bw "$size"
  done
done
# kvx: name, then the options of the run.
kvx_run() {
  local name=$1
  shift # later options win: a run may set its own --batch
  "$kvx" bench --json --block-sizes "$sizes" --batch "$batch" --iters "$iters" "$@" |
    sed "s/^{/{\"run\": \"$name\", /" >>"$tmp/results"
}
kvx_run pull-kvx-sm --transports sm,cma,tcp
kvx_run pull-malloc-sm --transports sm,cma,tcp --malloc
kvx_run pull-kvx-cma --transports cma,tcp
kvx_run pull-malloc-cma --transports cma,tcp --malloc
# Like ucx_perftest, which moves one buffer again and again: one block, always block 0.
kvx_run pull-kvx-one-sm --transports sm,cma,tcp --batch 1 --contiguous
kvx_run pull-malloc-one-sm --transports sm,cma,tcp --batch 1 --contiguous --malloc
kvx_run push-kvx-sm --transports sm,cma,tcp --mode push

/usr/bin/python3 - "$tmp/results" "$json" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
probe = {(r["probe"], r["block_size"]): r for r in rows if "probe" in r}
perf = {(r["perftest"], r["tls"], r["block_size"]): r for r in rows if "perftest" in r}
kvx = [r for r in rows if "run" in r]
# Per kvx run: which ucx_perftest test over which transports is its like-for-like limit.
limit_of = {"pull": "ucp_get", "push": "ucp_put_bw"}
tls_of = {"sm": "sm,cma,tcp", "cma": "cma,tcp", "posix": "posix,tcp"}
out = []
for r in kvx:
    size = r["block_size"]
    tls = tls_of[r["run"].rsplit("-", 1)[1]]
    p = perf.get((limit_of[r["mode"]], tls, size))
    mem = probe.get(("memcpy", size))
    pvr = probe.get(("pvr_batch", size))
    pvr1 = probe.get(("pvr_per_block", size))
    out.append({
        "run": r["run"], "block_size": size, "batch": r["batch"], "kvx_gbps": r["gbps"],
        "kvx_desc_per_s": r["descriptors_per_s"], "transports": r["transports"],
        "perftest": p and p["perftest"], "perftest_gbps": p and p["gbps"],
        "perftest_msg_per_s": p and p["msg_per_s"],
        "memcpy_gbps": mem and mem["gbps"], "pvr_gbps": pvr and pvr["gbps"],
        "pvr_per_block_gbps": pvr1 and pvr1["gbps"],
        "of_perftest": p and r["gbps"] / p["gbps"],
        "rate_of_perftest": p and r["descriptors_per_s"] / p["msg_per_s"],
        "of_memcpy": mem and r["gbps"] / mem["gbps"],
        "of_pvr": pvr and r["gbps"] / pvr["gbps"],
    })
if sys.argv[2] == "--json":
    for o in out:
        print(json.dumps(o))
    for r in rows:
        if "run" not in r:
            print(json.dumps(r))
    sys.exit(0)
def size_text(b):
    for unit, shift in (("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, unit)
    return str(b)
print("%-16s %5s %8s %9s %10s %8s %8s %8s %8s %8s" % ("kvx run", "block", "kvx GB/s", "Mdesc/s",
      "perftest", "of perf", "rate of", "of mcpy", "of pvr", "limit"))
for o in out:
    ratio = lambda x: "%7.0f%%" % (100 * x) if x is not None else "       -"
    print("%-16s %5s %8.2f %9.3f %10.2f %s %s %s %s %8s" % (
        o["run"], size_text(o["block_size"]), o["kvx_gbps"], o["kvx_desc_per_s"] / 1e6,
        o["perftest_gbps"] or 0, ratio(o["of_perftest"]), ratio(o["rate_of_perftest"]),
        ratio(o["of_memcpy"]), ratio(o["of_pvr"]), o["perftest"] or "-"))
print()
print("limits: %-10s %s" % ("block", "memcpy GB/s   pvr batch GB/s   pvr per block GB/s"))
for (name, size), r in sorted(probe.items(), key=lambda kv: kv[0][1]):
    if name == "memcpy":
        print("        %-10s %8.2f %16.2f %20.2f" % (size_text(size), r["gbps"],
              probe[("pvr_batch", size)]["gbps"], probe[("pvr_per_block", size)]["gbps"]))
print("perftest (GB/s | Mmsg/s): " + "; ".join(
    "%s %s %s: %.2f | %.3f" % (t, tls, size_text(s), r["gbps"], r["msg_per_s"] / 1e6)
    for (t, tls, s), r in sorted(perf.items())))
print("\nof perf: kvx GB/s / ucx_perftest GB/s (ucp_get for pull, ucp_put_bw for push, same"
      " transports and size);\nrate of: kvx descriptors/s / perftest messages/s; of mcpy, of pvr:"
      " kvx GB/s / memcpy, / process_vm_readv\n(one call per transfer).")
EOF
