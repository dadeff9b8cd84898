# session.sh: how a test script of kvx commands begins (sourced, with $kvx and $src set):
# loopback only; a temporary directory, $tmp, removed at exit with the servers whose pids the
# script put in $servers; check.sh; and one secret in KVX_AUTH_FILE for every kvx process, as
# a deployment shares one (kvx serve and fetch read it when --auth is not given). A script
# with processes of its own to end first sets its own EXIT trap and calls session_cleanup.
export UCX_NET_DEVICES=lo # never another interface
tmp=$(mktemp -d)
servers=()
session_cleanup() {
  for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap session_cleanup EXIT

# shellcheck source=check.sh
source "$src/tests/support/check.sh"

"$kvx" auth-key "$tmp/auth.key" >/dev/null || { echo "kvx auth-key failed"; exit 1; }
export KVX_AUTH_FILE=$tmp/auth.key
