#!/usr/bin/env bash
# peers.sh: kvx against NIXL and Mooncake in one run, on the same blocks and transports
# (bench/peers.py does the work; bench/peer_common.py has the peers' contract).
# usage: bench/peers.sh BUILD_DIR [--json] [--quick] [--blocks 4096,...] [--batches 1,64]
#        [--ops read,write] [--repeats R] [--iters N] [--transports SET]... [--timeout S]
# Makes the git-ignored venv .venv-peers at the repo root once (about 132 MB from PyPI); if
# that fails, kvx still runs and each peer prints one line saying why. Loopback only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: bench/peers.sh BUILD_DIR [--json] [--quick] [peers.py options]}
shift
venv=$root/.venv-peers
export UCX_NET_DEVICES=lo # never another interface, for kvx and NIXL alike
if [ ! -x "$build/kvx" ]; then
  echo "peers.sh: error: $build/kvx is not built (cmake --build $build)" >&2
  exit 2
fi

# The marker is written only after pip succeeded, so a failed install is retried next run.
setup_error=()
if [ ! -e "$venv/.peers-installed" ]; then
  echo "peers.sh: making $venv (nixl-cu12, mooncake-transfer-engine-non-cuda, numpy)" >&2
  log=$(mktemp)
  if /usr/bin/python3 -m venv "$venv" >"$log" 2>&1 &&
    timeout 900 "$venv/bin/pip" install --no-deps nixl-cu12==1.5.1 \
      mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy >>"$log" 2>&1; then
    touch "$venv/.peers-installed"
  else
    reason=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 || true)
    tail -n 5 "$log" >&2
    setup_error=(--peer-setup-error "could not make $venv: ${reason:-no message}")
  fi
  rm -f "$log"
fi
exec /usr/bin/python3 "$root/bench/peers.py" --kvx "$build/kvx" --python "$venv/bin/python" \
  "${setup_error[@]}" "$@"
