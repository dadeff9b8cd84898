#!/usr/bin/env bash
# test_ctrlc.sh: issue 22 finding 7, a decode worker stopped with Ctrl-C mid-pull must never
# take its prefill process down. For each transport list a kvx serve (P), then 50 kvx
# fetches of 128 MiB over tcp (20 over sm,cma,tcp), each stopped (SIGSTOP) once P has served
# its reads and before it finished, then sent SIGINT and continued, so it dies with the pull
# in flight and P's answers queued towards it. P must be alive after every one, and serve a
# verified pull at the end.  usage: test_ctrlc.sh KVX SOURCE_DIR
#
# "Mid-pull" is decided, not slept into: P's kvx_data_reads_served_total counter rises when
# it starts answering D's reads (TCP in the list: kvx serves reads itself), D is stopped at
# once, and a fetch that printed its "fetched" line had finished first and is not counted;
# it is retried (at most TRIES times a list). Every wait has a deadline.
set -u
kvx=$1
src=$2
ITERATIONS=${KVX_CTRLC_ITERATIONS:-50} # over tcp, the finding's list; the issue asks 50
DEFAULT_ITERATIONS=${KVX_CTRLC_DEFAULT_ITERATIONS:-20} # over sm,cma,tcp, to keep under a minute
# shellcheck source=support/session.sh
source "$src/tests/support/session.sh"
serve_pid=
fetch_pid=
cleanup() {
  [[ -n $fetch_pid ]] && { kill -KILL "$fetch_pid"; } 2>/dev/null
  [[ -n $serve_pid ]] && { kill -CONT "$serve_pid"; kill -TERM "$serve_pid"; } 2>/dev/null
  session_cleanup
}
trap cleanup EXIT

# A Llama-style attn cache scaled to 64 blocks of 64 KiB a layer: 2 MiB a block id, 128 MiB
# for '0:0-63', many times what the loopback socket buffers hold, and a pull long enough
# (about 50 ms here over TCP) that a scrape finds it under way.
layout=$tmp/attn.json
blocks='0:0-63'
sed 's/"num_blocks": 2048/"num_blocks": 64/; s/"size": 134217728/"size": 4194304/' \
  "$src/layouts/models/llama3-8b.json" >"$layout"

now_ms() { date +%s%3N; }

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every 10 ms until it succeeds, or says
# what it waited for and fails at the deadline.
wait_until() {
  local deadline=$(($(now_ms) + $1 * 1000)) what=$2
  shift 2
  until "$@"; do
    if (($(now_ms) > deadline)); then
      echo "no $what within the deadline"
      return 1
    fi
    sleep 0.01
  done
}

# scrape: sets $served to P's kvx_data_reads_served_total, through bash's /dev/tcp and one
# grep (bash reads a socket a byte a call); fails if P does not answer within 2 s.
scrape() {
  local line
  served=
  exec 3<>"/dev/tcp/127.0.0.1/$metrics_port" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  line=$(timeout 2 grep -m1 '^kvx_data_reads_served_total' <&3)
  exec 3<&-
  served=${line##* }
  [[ -n $served ]]
}

# reads_rose_within SECONDS: scrapes P without pausing until its reads served passed $base.
reads_rose_within() {
  local deadline=$(($(now_ms) + $1 * 1000))
  until scrape && ((served > base)); do
    if (($(now_ms) > deadline)); then
      echo "no read served within $1 s"
      return 1
    fi
  done
}

# serve TRANSPORTS: starts P on a free port with the list, and its metrics; sets $serve_pid,
# $serve_log, $addr and $metrics_port.
serve() {
  serve_log=$tmp/serve.$1
  # --malloc: P's own memory, which a same-host D cannot map (UCX-allocated storage it would
  # copy from directly), so every pull goes through the reads P serves.
  "$kvx" serve "$layout" --listen 127.0.0.1:0 --fill 42 --transports "$1" --malloc \
    --metrics 127.0.0.1:0 >"$serve_log" 2>&1 &
  serve_pid=$!
  wait_until 30 "serving line from kvx serve" serving || { cat "$serve_log"; return 1; }
  addr=$(sed -n 's/^serving .* on \([0-9.]*:[0-9]*\): .*/\1/p' "$serve_log")
  metrics_port=$(sed -n 's|^metrics on http://[0-9.]*:\([0-9]*\)/metrics$|\1|p' "$serve_log")
}
serving() { grep -q '^metrics on ' "$serve_log" && grep -q '^serving ' "$serve_log"; }

p_alive() { kill -0 "$serve_pid" 2>/dev/null; }
fetch_gone() { ! kill -0 "$fetch_pid" 2>/dev/null; }

# interrupt_loop TRANSPORTS N: N fetches killed mid-pull (at most 3N tries), P checked after
# each; sets $cut to how many were.
interrupt_loop() {
  local tls=$1 n=$2 tries=0 log
  cut=0
  while ((cut < n && tries < 3 * n)); do
    tries=$((tries + 1))
    scrape || { echo "P's metrics do not answer"; return 1; }
    base=$served
    log=$tmp/fetch.$tries
    # A background job of a script ignores SIGINT; a terminal's Ctrl-C finds the default.
    env --default-signal=INT "$kvx" fetch "$layout" --peer "$addr" --blocks "$blocks" \
      --transports "$tls" --request "$tries" >"$log" 2>&1 &
    fetch_pid=$!
    reads_rose_within 30 || return 1
    { # a fetch that finished first is gone already: not counted below
      kill -STOP "$fetch_pid"
      kill -INT "$fetch_pid"
      kill -CONT "$fetch_pid" # SIGINT stays pending on a stopped process until it continues
    } 2>/dev/null
    wait_until 30 "end of fetch $tries after SIGINT" fetch_gone || return 1
    wait "$fetch_pid"
    fetch_pid=
    grep -q '^fetched ' "$log" || cut=$((cut + 1))
    p_alive || {
      echo "P died after fetch $tries ($tls, $cut cut mid-pull):"
      tail -n 30 "$serve_log"
      return 1
    }
  done
  echo "$tls: $cut of $tries fetches cut mid-pull"
  ((cut == n))
}

fetch_verified() {
  "$kvx" fetch "$layout" --peer "$addr" --blocks "$blocks" --transports "$1" --verify --fill 42 \
    --request "$2" >"$tmp/verified" 2>&1 && tail -n 1 "$tmp/verified" | grep -qx verified ||
    { cat "$tmp/verified"; return 1; }
}

stop_p() {
  kill -TERM "$serve_pid" && wait_until 30 "exit of kvx serve" p_gone && wait "$serve_pid" &&
    grep -q '^stopped: ' "$serve_log" || { tail -n 20 "$serve_log"; false; }
}
p_gone() { ! kill -0 "$serve_pid" 2>/dev/null; }

# The default list too: on one host its wireup and small messages go over shared memory, its
# large answers by rendezvous; TCP in it still makes kvx serve the reads.
for tls in tcp sm,cma,tcp; do
  n=$ITERATIONS
  [[ $tls == tcp ]] || n=$DEFAULT_ITERATIONS
  serve "$tls" || { failed=$((failed + 1)); continue; }
  check "$tls: $n fetches cut by Ctrl-C mid-pull, P alive after each" interrupt_loop "$tls" "$n"
  check "$tls: P still serves a verified pull" fetch_verified "$tls" 1001
  check "$tls: P logged no UCX fatal error or assertion" \
    bash -c "! grep -E 'Assertion|Fatal|Segmentation|backtrace' '$serve_log'"
  check "$tls: P stops cleanly" stop_p
  serve_pid=
done
checks_done
