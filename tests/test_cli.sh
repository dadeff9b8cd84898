#!/usr/bin/env bash
# test_cli.sh: the kvx command line end to end: every worked example's --json output against
# its reviewed copy in tests/expected/, exit statuses, the one-line error, help and demo.
# usage: test_cli.sh KVX SOURCE_DIR
set -u
kvx=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo} # kvx bench's processes stay on loopback

# shellcheck source=support/check.sh
source "$src/tests/support/check.sh"

# Every kvx process of this test shares one secret, as a deployment would (kvx serve and
# fetch read KVX_AUTH_FILE when --auth is not given).
"$kvx" auth-key "$tmp/auth.key" >/dev/null || { echo "kvx auth-key failed"; exit 1; }
export KVX_AUTH_FILE=$tmp/auth.key

plan_matches_expected() {
  "$kvx" plan --json "$src/layouts/examples/$1" >"$tmp/out.json" &&
    diff -u "$src/tests/expected/$1" "$tmp/out.json"
}

# status_and_one_error_line EXPECTED_STATUS MESSAGE_PART ARGS...
# Bad input is found before anything waits, so each run gets 10 s (timeout exits 124).
status_and_one_error_line() {
  local want=$1 part=$2
  shift 2
  timeout 10 "$kvx" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
  local got=$?
  [[ $got -eq $want ]] || { echo "status $got, expected $want"; return 1; }
  [[ $(head -n 1 "$tmp/stderr") == "kvx: error: "*"$part"* ]] ||
    { echo "stderr: $(cat "$tmp/stderr")"; return 1; }
  [[ ! -s "$tmp/stdout" ]] || { echo "stdout not empty"; return 1; }
}

for f in "$src"/tests/expected/*.json; do
  name=$(basename "$f")
  check "worked example $name reproduced by kvx plan --json" plan_matches_expected "$name"
done

printf '{"kvx_layout": 1, "storages": [{"name": "kv", "size": 4096}], "views": [
  {"name": "a", "kind": "attn", "storage": "kv", "page": 2048, "stride": 1024, "num_blocks": 1}]}' \
  >"$tmp/bad.json"
check "bad layout exits 2 with one error line" \
  status_and_one_error_line 2 "views[0].stride: 1024 is smaller than page 2048" plan "$tmp/bad.json"
check "bad layout: exactly one stderr line" test "$(wc -l <"$tmp/stderr")" -eq 1
printf '{"kvx_layout": 1, "storages": [{"name": "kv", "size": 1024}], "views": [
  {"name": "a", "kind": "mla", "storage": "kv", "page": 32, "stride": 64, "num_blocks": 4},
  {"name": "b", "kind": "mla", "storage": "kv", "page": 32, "stride": 128, "num_blocks": 4}]}' \
  >"$tmp/uncovered.json"
check "failed coverage proof exits 2" \
  status_and_one_error_line 2 "views[0] (a) is not covered by region 0 (a)" plan "$tmp/uncovered.json"
check "missing file exits 2" \
  status_and_one_error_line 2 "/nonexistent.json: No such file" plan /nonexistent.json
mkfifo "$tmp/fifo.json"
check "a FIFO as LAYOUT exits 2 at once, naming what it is" \
  status_and_one_error_line 2 "$tmp/fifo.json: is a FIFO, not a regular file" plan "$tmp/fifo.json"
# Names are printable UTF-8: a control byte or broken UTF-8 is refused and quoted escaped, so
# neither the terminal nor --json output ever sees it raw; other UTF-8 stays valid JSON.
printf '{"kvx_layout": 1, "storages": [{"name": "kv\\u001b[2J", "size": 64}], "views": [
  {"name": "a", "kind": "attn", "storage": "kv", "page": 64, "stride": 64, "num_blocks": 1}]}' \
  >"$tmp/esc.json"
check "a name with ESC exits 2 naming the field and byte, escaped" \
  status_and_one_error_line 2 'storages[0].name: byte 2 (0x1b) is a control character, in "kv\x1b[2J"' \
  plan --json "$tmp/esc.json"
check "a name with ESC: no raw control byte on stderr" \
  bash -c "! LC_ALL=C grep -q \$'\\x1b' '$tmp/stderr'"
printf '{"kvx_layout": 1, "storages": [{"name": "kv\xff", "size": 64}], "views": [
  {"name": "a", "kind": "attn", "storage": "kv\xff", "page": 64, "stride": 64, "num_blocks": 1}]}' \
  >"$tmp/ff.json"
check "a name with a lone 0xff exits 2" \
  status_and_one_error_line 2 'storages[0].name: byte 2 (0xff) is not valid UTF-8, in "kv\xff"' \
  plan --json "$tmp/ff.json"
printf '{"kvx_layout": 1, "storages": [{"name": "\xc3\xa9", "size": 64}], "views": [
  {"name": "\xe5\xb1\x82.0", "kind": "attn", "storage": "\xc3\xa9", "page": 64, "stride": 64,
   "num_blocks": 1}]}' >"$tmp/utf8.json"
check "UTF-8 names give valid --json" bash -c "'$kvx' plan --json '$tmp/utf8.json' | python3 -c \"import json,sys; d=json.load(sys.stdin); assert d['regions'][0]['name']=='\\u5c42.0' and d['registrations'][0]['storage']=='\\u00e9'\""
# Numbers are weighed by their text: no leading zeros, and nothing above 2^53 rounded in.
printf '{"kvx_layout": 1, "storages": [{"name": "kv", "size": 9007199254740993}], "views": [
  {"name": "a", "kind": "attn", "storage": "kv", "page": 64, "stride": 64, "num_blocks": 1}]}' \
  >"$tmp/big.json"
check "an integer above 2^53 exits 2 naming its path" \
  status_and_one_error_line 2 'storages[0].size: 9007199254740993 is larger than 2^53' plan "$tmp/big.json"
printf '{"kvx_layout": 1, "storages": [{"name": "kv", "size": 4096}], "views": [
  {"name": "a", "kind": "attn", "storage": "kv", "page": 64, "stride": 64, "num_blocks": 0123}]}' \
  >"$tmp/zero.json"
check "a leading zero exits 2 naming its path" \
  status_and_one_error_line 2 'views[0].num_blocks: 0123 has a leading zero' plan "$tmp/zero.json"
check "missing LAYOUT exits 2" status_and_one_error_line 2 "LAYOUT is required" plan
check "unknown option exits 2" status_and_one_error_line 2 "unknown option --jsn" plan --jsn x
check "unknown command exits 2" status_and_one_error_line 2 "unknown command fetchh" fetchh
# Issue 24 item 7: a usage error is its line and one line saying where the usage is, never
# the whole help after it, whichever command took the option.
usage_error_two_lines() {
  local cmd=$1 hint=$2
  shift 2
  status_and_one_error_line 2 "$cmd" "$@" && [[ $(wc -l <"$tmp/stderr") -eq 2 ]] &&
    [[ $(sed -n 2p "$tmp/stderr") == "kvx: see 'kvx help $hint' for "* ]] ||
    { echo "stderr: $(cat "$tmp/stderr")"; return 1; }
}
for cmd in plan compat serve fetch bench demo; do
  check "kvx $cmd --bogus: the error and one line naming kvx help $cmd" \
    usage_error_two_lines "unknown option --bogus" "$cmd" "$cmd" --bogus
done
check "a missing value: the error and one line" \
  usage_error_two_lines "--listen needs a value" serve serve x --listen
check "demo names the option it does not know" \
  usage_error_two_lines "unknown option --p-pt" demo demo --p-pt 2
check "an unknown command: the error and one line naming kvx help" \
  bash -c "'$kvx' fetchh 2>&1 >/dev/null | sed -n 2p | grep -qx \"kvx: see 'kvx help' for the commands\""

# serve --hold and fetch's hold options: bad values are bad input, found before serving.
ex1=$src/layouts/examples/example1-packed-mla-slab.json
serve_ex1=(serve "$ex1" --listen 127.0.0.1:0)
check "serve --hold without ID= exits 2" \
  status_and_one_error_line 2 '--hold: expected ID=BLOCKS, not "0:1"' "${serve_ex1[@]}" --hold 0:1
check "serve --hold with bad block ids exits 2" \
  status_and_one_error_line 2 '--hold: expected a block id' "${serve_ex1[@]}" --hold '7=0:x'
check "serve --hold beyond the table exits 2" \
  status_and_one_error_line 2 'block id 100 of group 0 is out of range' \
  "${serve_ex1[@]}" --hold '7=0:100'
check "serve --consumers 0 exits 2" \
  status_and_one_error_line 2 '--consumers: 0 is less than 1' \
  "${serve_ex1[@]}" --hold '7=0:1' --consumers 0
check "serve takes no --want" \
  status_and_one_error_line 2 'takes no --peer' "${serve_ex1[@]}" --want
check "fetch takes no --hold" \
  status_and_one_error_line 2 'takes no --listen, --hold or --max-push' \
  fetch "$ex1" --peer 127.0.0.1:1 --blocks 0:1 --hold '7=0:1'
check "fetch takes no --max-push (a prefill's bound)" \
  status_and_one_error_line 2 'takes no --listen, --hold or --max-push' \
  fetch "$ex1" --peer 127.0.0.1:1 --blocks 0:1 --max-push 1000
# Issue 24 item 2: a fetch where nothing listens fails at once, not at its --timeout (port 1
# has no listener; status_and_one_error_line gives it 10 s of the 60 asked for).
check "fetch where nothing listens fails at once: connection refused" \
  status_and_one_error_line 2 'peer 127.0.0.1:1: side channel: connection refused: is kvx serve' \
  fetch "$ex1" --peer 127.0.0.1:1 --blocks 0:1 --timeout 60000
check "an IPv6 address without brackets exits 2 saying how to write it" \
  status_and_one_error_line 2 'listen: "::1:0": an IPv6 address goes in brackets: [ADDRESS]:PORT' \
  serve "$ex1" --listen ::1:0
check "a host that does not resolve exits 2 naming it" \
  status_and_one_error_line 2 'listen: "nosuchhost.invalid:0": cannot resolve host "nosuchhost.invalid"' \
  serve "$ex1" --listen nosuchhost.invalid:0
check "serve --max-push 0 exits 2" \
  status_and_one_error_line 2 '--max-push: 0 is less than 1' "${serve_ex1[@]}" --max-push 0

# fetch --blocks is checked against the layout's groups before memory or a connection: port 1
# has no listener, and a fetch that got as far as connecting would wait out its timeout.
printf '{"kvx_layout": 1, "storages": [{"name": "kv", "size": 4096}], "views": [
  {"name": "a", "kind": "attn", "storage": "kv", "page": 64, "stride": 64, "num_blocks": 4},
  {"name": "b", "kind": "attn", "storage": "kv", "offset": 1024, "page": 64, "stride": 64,
   "num_blocks": 4, "group": 1}]}' >"$tmp/two_groups.json"
check "fetch --blocks naming too few groups exits 2 before connecting" \
  status_and_one_error_line 2 'request: names 1 group (0), but the layout needs groups 0-1' \
  fetch "$tmp/two_groups.json" --peer 127.0.0.1:1 --blocks '0:1' --timeout 60000
check "fetch --blocks beyond the table exits 2 before connecting" \
  status_and_one_error_line 2 'block id 4 of group 1 is out of range' \
  fetch "$tmp/two_groups.json" --peer 127.0.0.1:1 --blocks '0:1;1:4' --timeout 60000

check "kvx --help explains the commands" bash -c "'$kvx' --help | grep -q 'plan LAYOUT'"
check "kvx plan --help explains plan" bash -c "'$kvx' plan --help | grep -q -- '--json'"
for cmd in plan compat serve fetch bench demo; do
  check "kvx help $cmd prints $cmd's own usage" \
    bash -c "'$kvx' help $cmd >'$tmp/help' && head -n 1 '$tmp/help' | grep -q '^usage: kvx $cmd '"
done
# Issue 24: the agent's defaults live in kvx.h alone (KVX_DEFAULT_*): the usage text of serve
# and fetch says the header's value for each option that sets one.
help_default_is_header() { # COMMAND OPTION MACRO
  local want
  want=$(sed -n "s/^#define $3  *\([0-9][0-9]*\).*/\1/p" "$src/include/kvx.h")
  [[ -n $want ]] || { echo "no #define $3 in kvx.h"; return 1; }
  "$kvx" help "$1" | awk -v o="  $2 " 'index($0, o) == 1 { on = 1; print; next }
    on && /^  --/ { exit } on { print }' | grep -Eq "default $want([^0-9]|\$)" ||
    { echo "kvx $1 --help: $2 does not say default $want"; return 1; }
}
for spec in "serve --timeout TIMEOUT_MS" "serve --lease LEASE_MS" "serve --max-push MAX_PUSH_MS" \
  "fetch --timeout TIMEOUT_MS" "fetch --heartbeat HEARTBEAT_MS"; do
  read -r cmd option macro <<<"$spec"
  check "kvx $cmd --help: $option's default is kvx.h's KVX_DEFAULT_$macro" \
    help_default_is_header "$cmd" "$option" "KVX_DEFAULT_$macro"
done
check "kvx help nosuch exits 2" status_and_one_error_line 2 "unknown command nosuch" help nosuch
check "kvx --help mentions the metrics" bash -c "'$kvx' --help | grep -q -- '--metrics HOST:PORT'"
check "kvx help serve: the synopsis names --memory and --timeout" \
  bash -c "'$kvx' help serve | sed -n '/^usage:/,/^\$/p' | grep -q -- '--memory host|cuda' && '$kvx' help serve | sed -n '/^usage:/,/^\$/p' | grep -q -- '--timeout MS'"
for option in --remote-blocks --tp-rank --tp-size --transports --malloc --peer --blocks; do
  check "kvx help fetch explains $option" \
    bash -c "'$kvx' help fetch | grep -Eq -- '^  (.*, )?$option( |,|\$)'"
done
check "kvx --help says what demo does" \
  bash -c "'$kvx' --help | grep -A2 '^  demo' | grep -q 'verify every byte'"
version=$(sed -n 's/^project(kvx VERSION \([0-9.]*\) .*/\1/p' "$src/CMakeLists.txt")
check "kvx --version prints CMake's project version and the UCX loaded" \
  bash -c "[[ -n '$version' && \$('$kvx' --version) =~ ^'kvx $version (UCX '1\.[0-9]+\.[0-9]+')'$ ]]"
check "kvx version prints it too" bash -c "[[ \$('$kvx' version) == \$('$kvx' --version) ]]"
check "kvx plan prints a table with totals" \
  bash -c "'$kvx' plan '$src/layouts/examples/example7-capacities.json' | grep -q '^total: 2 regions, 5 descriptors'"
check "kvx demo --tables registers every built-in model" \
  bash -c "'$kvx' demo --tables >'$tmp/demo' && [[ \$(grep -c '^== ' '$tmp/demo') -eq 5 ]] && [[ \$(grep -c '^total: ' '$tmp/demo') -eq 5 ]]"
for f in "$src"/layouts/models/*.json; do
  check "model layout $(basename "$f") registers" bash -c "'$kvx' plan --json '$f' >/dev/null"
done

# kvx plan --peer: one request through a peer plan (docs/plan.md).
v4=$src/layouts/models/deepseek-v4-flash.json
v41=$src/layouts/models/deepseek-v4.1-demo.json
check "peer plan JSON coalesces consecutive whole rows" bash -c "'$kvx' plan '$v4' --peer '$v4' --blocks '0:0-3,7' --json >'$tmp/pairs.json' && grep -q '\"descriptors\": 5,' '$tmp/pairs.json' && grep -q '\"coalesced\": 2,' '$tmp/pairs.json' && grep -q '\\[\"kv_cache\", 0, \"kv_cache\", 0, 6439680\\]' '$tmp/pairs.json'"
check "peer plan JSON parses" python3 -c "import json,sys; d=json.load(open('$tmp/pairs.json')); assert d['kvx_pairs']==1 and d['bytes']==5*1609920"
check "peer plan: id beyond capacity exits 2" \
  status_and_one_error_line 2 "local block id 2048 of group 0 is out of range" plan "$v4" --peer "$v4" --blocks '0:2048'
# Issue 24 item 6: --blocks errors say which groups the layout needs, and what is wrong with
# a range. Issue 23: a group the layout lacks, an id twice and two sources for one byte are
# refused by name.
check "peer plan: too few groups names the groups the layout needs" \
  status_and_one_error_line 2 'request: names 1 group (0), but the layout needs groups 0-1 (of its groups 0, 1 and 2)' \
  plan "$v41" --peer "$v41" --blocks '0:0-3'
check "peer plan: a descending range says so" \
  status_and_one_error_line 2 '--blocks: descending range 3-0 (a range goes up: 0-3)' \
  plan "$v4" --peer "$v4" --blocks '0:3-0'
check "peer plan: a group the layout lacks exits 2 naming it" \
  status_and_one_error_line 2 'request: group 9 has block ids, but the layout has no group 9 (its groups are 0, 1 and 2)' \
  plan "$v41" --peer "$v41" --blocks '9:5'
check "peer plan: an id twice in one group exits 2 naming it" \
  status_and_one_error_line 2 'request: group 0 names block id 0 twice' plan "$v4" --peer "$v4" --blocks '0:0,0'
check "peer plan: two sources for one local byte exit 2 naming both" \
  status_and_one_error_line 2 'would be written twice, from different places: group 0 block 5 reads it from remote block 7 (region 0, layers.0.attn.compressor.state_cache), group 2 block 5 from remote block 9' \
  plan "$v41" --peer "$v41" --blocks '0:5;1:5;2:5' --remote-blocks '0:7;1:7;2:9'
check "peer plan: the full DeepSeek-V4.1 cache moves each byte once, no more than its storage" \
  bash -c "'$kvx' plan '$v41' --peer '$v41' --blocks '0:0-255;1:0-255;2:0-255' --json >'$tmp/full.json' && python3 -c \"import json; d=json.load(open('$tmp/full.json')); assert d['bytes']==412139520 and d['coalesced']==1 and d['descriptors']==11520, d['bytes']\""
check "peer plan: blocks 0-9 of every group plan no more than 0-9 of group 0 and block 0 of the others" \
  bash -c "a=\$('$kvx' plan '$v41' --peer '$v41' --blocks '0:0-9;1:0-9;2:0-9' --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"bytes\"])') && b=\$('$kvx' plan '$v41' --peer '$v41' --blocks '0:0-9;1:0;2:0' --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"bytes\"])') && [[ \$a -eq \$b && \$a -eq 16099200 ]]"
check "peer plan: bad --blocks exits 2" \
  status_and_one_error_line 2 "--blocks: expected a block id" plan "$v4" --peer "$v4" --blocks '0:x'
check "peer plan: larger remote block exits 2" \
  status_and_one_error_line 2 "is larger than the local block" plan "$v4" --peer "$v4" --blocks '0:1' --remote-block-size 128
check "request options need --peer" status_and_one_error_line 2 "need --peer" plan "$v4" --blocks '0:1'

# kvx compat: the handshake's checks, offline (docs/wire.md).
models=$src/layouts/models
check "compat of a layout with itself" bash -c "'$kvx' compat '$models/llama3-8b.json' '$models/llama3-8b.json' | grep -q '^compatible: 32 regions'"
check "compat names every differing factor" \
  status_and_one_error_line 2 'model_id: local "meta-llama/Meta-Llama-3-8B", remote "deepseek-ai/DeepSeek-V3"' \
  compat "$models/llama3-8b.json" "$models/deepseek-v3-mla.json"
sed 's/"page": 65536, "stride": 65536/"page": 32768, "stride": 65536/' "$models/llama3-8b.json" >"$tmp/half.json"
check "compat lists table differences on stdout" bash -c "'$kvx' compat '$models/llama3-8b.json' '$tmp/half.json' >'$tmp/diff' 2>'$tmp/err'; [[ \$? -eq 2 ]] && [[ \$(grep -c '^difference: region .* block_len: local 65536, remote 32768' '$tmp/diff') -eq 32 ]] && grep -q '^kvx: error: 32 differences' '$tmp/err'"
check "compat across TP: local TP 2 reads half blocks from TP 1" bash -c "'$kvx' compat '$tmp/half.json' '$models/llama3-8b.json' --local-tp 2 --local-rank 1 | grep -q '^compatible'"
check "compat push vs pull hash" bash -c "'$kvx' compat '$models/llama3-8b.json' '$models/llama3-8b.json' --mode push | grep -q '^compatible'"

# kvx bench: a smoke test that the sweep and the workload run, not a measurement (STYLE.md 6).
check "bench sweep prints a row for 4K" \
  bash -c "'$kvx' bench --block-sizes 4K --iters 3 --batch 4 >'$tmp/bench' && grep -Eq '^ +4K +4 +4 ' '$tmp/bench'"
check "bench --json prints one object per point" \
  bash -c "'$kvx' bench --block-sizes 4K --iters 3 --batch 4 --json >'$tmp/bench.json' && [[ \$(wc -l <'$tmp/bench.json') -eq 1 ]] && grep -Eq '^\{\"kvx_bench\": 1, .*\"posted\": 4,' '$tmp/bench.json'"
check "bench --mode push runs" \
  bash -c "'$kvx' bench --mode push --block-sizes 4K --iters 3 --batch 4 >'$tmp/bench' && grep -Eq '^ +4K +4 +4 ' '$tmp/bench'"
check "bench --workload rescales a built-in layout and runs" \
  bash -c "'$kvx' bench --workload --layouts llama3-8b --tokens 1K --iters 2 >'$tmp/bench' && grep -Eq '^llama3-8b +1024 +64 ' '$tmp/bench'"
check "bench: unknown mode exits 2" status_and_one_error_line 2 "--mode: pull or push" bench --mode sideways
check "bench: unknown mode: one error line" test "$(grep -c '^kvx: error: ' "$tmp/stderr")" -eq 1
check "bench: bad size suffix exits 2" \
  status_and_one_error_line 2 '--block-sizes: "4X" is not a list' bench --block-sizes 4X
check "bench: bad size suffix: exactly one stderr line" test "$(wc -l <"$tmp/stderr")" -eq 1

# --memory (docs/gpu.md): host or cuda, and GPU memory is kvx's to allocate, never --malloc's.
v41=$src/layouts/models/deepseek-v4.1-demo.json
for command in "serve $v41 --listen 127.0.0.1:0 --insecure" "fetch $v41 --peer 127.0.0.1:1 --blocks 0:1" bench demo; do
  # shellcheck disable=SC2086 # the command's words
  check "${command%% *} --memory gpu exits 2 naming the two kinds" \
    status_and_one_error_line 2 '--memory: "gpu" is neither host nor cuda' $command --memory gpu
done
check "serve --malloc --memory cuda exits 2: GPU memory is kvx's to allocate" \
  status_and_one_error_line 2 "--malloc registers host memory" serve "$v41" --listen 127.0.0.1:0 --insecure --malloc --memory cuda
check "bench --malloc --memory cuda exits 2" \
  status_and_one_error_line 2 "bench: --malloc registers host memory" bench --malloc --memory cuda
check "serve on a vram layout says it keeps the storages in host memory" \
  bash -c "timeout 10 '$kvx' serve '$v41' --listen 127.0.0.1:0 --insecure --hold 1=0:999999 2>&1 | grep -q 'kvx serve: 1 of the layout.s storages say \"vram\"; this run keeps them in host memory'"

checks_done
