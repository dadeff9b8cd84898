# perftest.sh: sourced by bench/limits.sh and bench/gpu.sh. One ucx_perftest server and client
# on loopback, on a free port; the server is stopped when the client is done, or failed. The
# caller has a scratch directory $tmp.
# perftest_row BIN TLS TEST SIZE MEM: prints the last row of ucx_perftest -f (iterations,
# latency p50/avg/overall in us, bandwidth avg/overall in MiB/s, message rate), or nothing when
# it failed (its stderr is in $tmp/perftest.err). About 256 MiB a test, 100 to 5000 messages.
perftest_row() {
  local bin=$1 tls=$2 test=$3 size=$4 mem=$5 n port pid=
  n=$(((1 << 28) / size))
  [ "$n" -gt 5000 ] && n=5000
  [ "$n" -lt 100 ] && n=100
  for _ in $(seq 20); do # a port is free when a server stays up on it
    port=$((20000 + RANDOM % 40000))
    UCX_TLS=$tls "$bin" -p "$port" >"$tmp/perftest.server" 2>&1 &
    pid=$!
    sleep 0.3
    kill -0 "$pid" 2>/dev/null && break
    pid=
  done
  [ -n "$pid" ] || { echo "no free port for ucx_perftest" >"$tmp/perftest.err"; return 0; }
  UCX_TLS=$tls timeout 300 "$bin" 127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$n" \
    -w $((n / 10 + 1)) -m "$mem" -f 2>"$tmp/perftest.err" |
    awk '$1 ~ /^[0-9]+$/ && NF >= 8' | tail -n 1 || true
  kill "$pid" 2>/dev/null || true # a client that failed leaves it waiting for one
  wait "$pid" 2>/dev/null || true
}
