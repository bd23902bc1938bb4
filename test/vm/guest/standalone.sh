#!/bin/bash
# standalone.sh - what a guest check script needs when it runs on its own
# (test/vm/run.sh -w DIR -- bash DIR/<script>.sh) instead of being sourced
# by ci-guest.sh: the counters, result() and LOG that ci-guest.sh
# provides, and standalone_summary, the "N passed, N failed, N skipped"
# line it ends with (its status is the script's). Sourced, never run.
set -uo pipefail
PASS=0; FAIL=0; SKIP=0
LOG=${CI_LOG:-$PWD/logs}; mkdir -p "$LOG"
result() {  # ok|FAIL|skip label detail
  case $1 in ok) PASS=$((PASS+1)) ;; FAIL) FAIL=$((FAIL+1)) ;; *) SKIP=$((SKIP+1)) ;; esac
  printf 'RESULT %-4s | %s | %s\n' "$1" "$2" "$3"
}
standalone_summary() {
  echo "$PASS passed, $FAIL failed, $SKIP skipped"
  ((FAIL == 0))
}
