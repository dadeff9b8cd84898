# check.sh: what the shell tests share; source it. `check RULE COMMAND...` counts a pass when
# the command succeeds and prints the rule when it fails; `checks_done` prints the tally and
# fails when any check did.
passed=0
failed=0

check() {
  local rule=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $rule"
  fi
}

checks_done() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
