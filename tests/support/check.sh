# check.sh: what the shell tests share; source it. `check RULE COMMAND...` counts a pass when
# the command succeeds and prints the rule when it fails; `says` checks what a command said;
# `checks_done` prints the tally and fails when any check did.
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

# says PATTERN COMMAND...: the command's output (both streams) has a line matching the
# extended regular expression; when it does not, the output is printed, so that a failure in
# CI says what was said instead.
says() {
  local pattern=$1 output
  shift
  output=$("$@" 2>&1)
  grep -qE -- "$pattern" <<<"$output" || { printf '%s\n' "$output"; return 1; }
}

checks_done() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
