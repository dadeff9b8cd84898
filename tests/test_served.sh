#!/usr/bin/env bash
# test_served.sh: what the prefill side says about what it served (issue 24 items 5 and 9),
# with the commands a user types: kvx serve counts the reads it served from the decode side's
# dones, also over one-sided transports (sm,cma) where no byte passes through it; a done with
# a wrong hold token fails the fetch with a line naming it, and kvx serve logs the refusal
# without --verbose; --verbose adds admissions, counted dones and releases; a fetch without
# --verify ends with a line that reads as the success it is; a layout with a JSON error is
# named by file, line and column.  usage: test_served.sh KVX SOURCE_DIR
set -u
kvx=$1
src=$2
# shellcheck source=support/session.sh
source "$src/tests/support/session.sh"
layout=$src/layouts/examples/example1-packed-mla-slab.json
token=00112233445566778899aabbccddeeff
wrong=00112233445566778899aabbccddee00

# serve NAME [OPTIONS...]: kvx serve on a free port, its output in $tmp/NAME; sets $addr and
# $metrics once it serves.
serve() {
  local name=$1
  shift
  "$kvx" serve "$layout" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 "$@" >"$tmp/$name" 2>&1 &
  servers+=($!)
  for _ in $(seq 100); do
    addr=$(sed -n 's/^serving .* on \([0-9.]*:[0-9]*\): .*/\1/p' "$tmp/$name")
    metrics=$(sed -n 's|^metrics on \(http://[0-9.]*:[0-9]*/metrics\)$|\1|p' "$tmp/$name")
    [ -n "$addr" ] && [ -n "$metrics" ] && return 0
    sleep 0.1
  done
  echo "server did not start: $(cat "$tmp/$name")"
  exit 1
}

# metric NAME: its value in kvx serve's Prometheus text.
metric() {
  curl -sf "$metrics" | sed -n "s/^kvx_$1{agent=\"kvx serve\"} \([0-9]*\)$/\1/p"
}

# stop NAME: SIGTERM to the last server started; its last line is the "stopped" summary.
stop() {
  kill -TERM "${servers[-1]}" && wait "${servers[-1]}"
  unset 'servers[-1]'
}

# One-sided transports only: the reads never pass through kvx serve's code.
serve quiet --transports sm,cma --hold "5=0:0-1" --token $token
"$kvx" fetch "$layout" --peer "$addr" --blocks '0:0-3' --transports sm,cma >"$tmp/fetch1" 2>&1
fetched=$(sed -n 's/^fetched \([0-9]*\) bytes .*/\1/p' "$tmp/fetch1")
check "fetch without --verify ends with a line that reads as a success" \
  bash -c "tail -n 1 '$tmp/fetch1' | grep -qx 'done (bytes not checked: --verify compares them)'"
check "serve over sm,cma: kvx_served_transfers_total counts the read" test "$(metric served_transfers_total)" = 1
check "serve over sm,cma: kvx_served_bytes_total is the bytes fetch read" \
  test "$(metric served_bytes_total)" = "$fetched"

"$kvx" fetch "$layout" --peer "$addr" --blocks '0:0-1' --request 5 --token $wrong --want \
  --transports sm,cma >"$tmp/fetch2" 2>&1
status=$?
check "fetch with a wrong token: exit status 2" test $status = 2
check "fetch with a wrong token: a line names the refusal and the blocks not loaded" \
  bash -c "grep -qx 'kvx: error: read 5: remote rank 0: wrong token: the request is held with another' '$tmp/fetch2' && grep -qx 'kvx: not loaded: 0:0-1' '$tmp/fetch2'"
check "serve without --verbose: the refused done is logged" \
  grep -qx 'kvx serve: request 5: done refused: wrong token: the request is held with another' "$tmp/quiet"
check "serve without --verbose: the wanted request's heartbeat with the wrong token is logged" \
  grep -qx 'kvx serve: request 5: heartbeat refused: wrong token: the request is held with another' "$tmp/quiet"
check "serve without --verbose: no admission or counted done is logged" \
  bash -c "! grep -Eq 'admitted|counted' '$tmp/quiet'"
check "serve: the refused read was served all the same" test "$(metric served_transfers_total)" = 2
check "serve: the hold stays after the refused done" test "$(metric held_requests)" = 1
stop
check "serve's stopped line counts the reads it served" \
  grep -Eqx "stopped: 2 reads served \([0-9]+ bytes\), .*" "$tmp/quiet"

# --verbose: admissions, the counted done, the release.
serve verbose --hold "6=0:0-1" --token $token --verbose
"$kvx" fetch "$layout" --peer "$addr" --blocks '0:0-1' --request 6 --token $token >"$tmp/fetch3" 2>&1
check "fetch with the token: loaded" grep -q '^fetched ' "$tmp/fetch3"
check "serve --verbose: the connection is admitted, named by address" \
  grep -q '^kvx serve: side channel: admitted a connection from 127.0.0.1' "$tmp/verbose"
check "serve --verbose: the done is counted" \
  grep -qx 'kvx serve: request 6: done of rank 0 counted, the last one' "$tmp/verbose"
check "serve --verbose: the hold is released, logged and printed" \
  bash -c "grep -qx 'kvx serve: request 6: released, every consumer reported' '$tmp/verbose' && grep -qx 'released request 6: 0:0-1' '$tmp/verbose'"
stop

# A JSON error names the file, the line and the column.
printf '{\n  "kvx_layout": 1,\n  "storages": [,]\n}\n' >"$tmp/bad.json"
check "kvx plan on bad JSON: the file, line 3, column 16" \
  bash -c "'$kvx' plan '$tmp/bad.json' 2>&1 >/dev/null | grep -qx 'kvx: error: $tmp/bad.json: layout: not valid JSON at line 3, column 16 (near byte 36)'"

checks_done
