#!/usr/bin/env bash
# test_uct_tcp_overflow.sh: issue 36 finding 1, as anyone who can reach a prefill's TCP ports
# does it, with no secret: connect to each TCP port kvx serve listens on besides its side
# channel, send UCT's magic number and one active message whose header claims 1,000,000 bytes
# (UCT received it into a buffer of twice its 256 KiB receive segment, checked only by an
# assertion: the 1.22 wheel corrupted its heap, 1.13 aborted), then ask for a verified fetch.
# Since kvx gives UCX no TCP, the only such port is kvx's own link listener, which reads a
# fixed-size hello and closes on anything else: the prefill lives and serves the fetch.
# usage: test_uct_tcp_overflow.sh KVX SOURCE_DIR
set -u
kvx=$1
src=$2
# shellcheck source=support/session.sh
source "$src/tests/support/session.sh"
layout=$src/layouts/examples/example1-packed-mla-slab.json

"$kvx" serve "$layout" --listen 127.0.0.1:0 --transports tcp --fill 42 >"$tmp/serve" 2>&1 &
serve_pid=$!
servers+=("$serve_pid")
for _ in $(seq 100); do
  addr=$(sed -n 's/^serving .* on \([0-9.]*:[0-9]*\): .*/\1/p' "$tmp/serve")
  [ -n "$addr" ] && break
  sleep 0.1
done
check "kvx serve started" test -n "$addr"
side_port=${addr##*:}
# every TCP port the prefill process listens on, its side channel's aside
ports=$(ss -Hltnp | awk -v pid="pid=$serve_pid," '$0 ~ pid {n = split($4, a, ":"); print a[n]}' |
  grep -vx "$side_port" | sort -u)
check "the prefill listens on a TCP port besides its side channel ($(echo $ports))" test -n "$ports"
for port in $ports; do
  python3 - "$port" <<'PY'
import socket, struct, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
try:
    s.sendall(struct.pack("<Q", 0xCAFEBABE12345678) + struct.pack("<BI", 0, 1000000) +
              b"\xa5" * 1000000)
except OSError:
    pass  # the prefill closed it: what it should do
s.close()
PY
done
sleep 1
check "the prefill lives" kill -0 "$serve_pid"
# A link's hello with a wrong proof is closed, and 100 connections that say nothing hold
# nothing of an honest peer's (the oldest of the address with the most go first).
for port in $ports; do
  check "a wrong proof is refused on port $port" python3 - "$port" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(b"kvxlink1" + b"\x01" * 16 + b"\x02" * 16)
answer = b""
while len(answer) < 40:
    chunk = s.recv(40 - len(answer))
    if not chunk:
        sys.exit("closed before its answer")
    answer += chunk
s.sendall(b"\x00" * 16)  # not the proof
sys.exit(0 if s.recv(1) == b"" else "still open after a wrong proof")
PY
done
python3 - $ports <<'PY' &
import socket, sys, time
held = [socket.create_connection(("127.0.0.1", int(p)), timeout=5)
        for p in sys.argv[1:] for _ in range(100)]
time.sleep(30)
PY
silent_pid=$!
sleep 1
"$kvx" fetch "$layout" --peer "$addr" --blocks '0:0-3' --transports tcp --fill 42 --verify \
  >"$tmp/fetch" 2>&1
check "a verified fetch follows" bash -c "tail -n 1 '$tmp/fetch' | grep -qx verified"
check "the prefill lives after it" kill -0 "$serve_pid"
kill "$silent_pid" 2>/dev/null
wait "$silent_pid" 2>/dev/null
kill -TERM "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null
checks_done
