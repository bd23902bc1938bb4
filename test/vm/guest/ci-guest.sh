#!/bin/bash
# ci-guest.sh - runs inside the rdmakit test VM (see ../ci.sh): creates a
# Soft-RoCE (rxe) and a soft-iWARP (siw) device, runs the host-built test
# binaries and tools on them, prints one RESULT line per check and closes
# with "N passed, N failed, N skipped". Exit status 1 if anything failed.
#
# Expects in the current directory (the shared work dir): ibverbs.test, and
# optionally rdmakit (built with -tags ibverbs), coll-perf.sh, interop.sh
# and perftest-interop.sh.
# Env: CI_QUICK=1 runs the conformance suite on one-process mode only;
# CI_RUN=PATTERN runs only the go tests matching PATTERN, nothing else;
# CI_COUNT=N runs each N times (hunting a flaky case).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PASS=0; FAIL=0; SKIP=0
LOG=${CI_LOG:-$PWD/logs}; mkdir -p "$LOG"
result() {  # ok|FAIL|skip label detail
  case $1 in ok) PASS=$((PASS+1)) ;; FAIL) FAIL=$((FAIL+1)) ;; *) SKIP=$((SKIP+1)) ;; esac
  printf 'RESULT %-4s | %s | %s\n' "$1" "$2" "$3"
}
t0=$(cut -d' ' -f1 /proc/uptime)
elapsed() { awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.0fs", b-a}'; }

"$HERE/rdma-setup.sh" rxe-dummy siw-dummy > "$LOG/setup.txt" 2>&1 || { cat "$LOG/setup.txt"; result FAIL setup "rdma-setup.sh failed"; }
cat "$LOG/setup.txt"
RXE=rxe_dum; SIW=siw_dum; RXE_IP=10.200.0.1; SIW_IP=10.201.0.1

# ---------------------------------------------------------------- go tests
if [[ -x ./ibverbs.test ]]; then
  run=""
  [[ ${CI_QUICK:-0} == 1 ]] && run='-test.run=TestDevices|TestBadInput|TestNoAllocs|TestConformance/.*/one-process'
  [[ -n ${CI_RUN:-} ]] && run="-test.run=$CI_RUN"
  ./ibverbs.test -test.v -test.timeout 720s ${run:+"$run"} ${CI_COUNT:+-test.count=$CI_COUNT} > "$LOG/ibverbs-test.txt" 2>&1; rc=$?
  # one RESULT per top-level test and per device of TestConformance
  while read -r st name rest; do
    case $st in PASS) result ok "go test $name" "$rest" ;; FAIL) result FAIL "go test $name" "$rest" ;; SKIP) result skip "go test $name" "$rest" ;; esac
  done < <(sed -nE 's/^(    )?--- (PASS|FAIL|SKIP): (Test[A-Za-z0-9]+(\/[A-Za-z0-9_]+)?) (.*)$/\2 \3 \5/p' "$LOG/ibverbs-test.txt")
  skipped=$(grep -c -- '--- SKIP' "$LOG/ibverbs-test.txt")
  echo "# conformance cases skipped by device capability: $skipped (see $LOG/ibverbs-test.txt)"
  if [[ $rc != 0 ]]; then
    result FAIL "go test ibverbs.test" "exit $rc"
    grep -E -- '--- FAIL|\.go:[0-9]+:' "$LOG/ibverbs-test.txt" | head -40
  fi
else
  result FAIL "go test" "ibverbs.test missing"
fi
echo "# go tests done at $(elapsed)"

# ---------------------------------------------------------------- rdmakit info / perf
if [[ -n ${CI_RUN:-} ]]; then
  result skip "rdmakit, coll-perf, interop" "CI_RUN=$CI_RUN: go tests only"
elif [[ -x ./rdmakit ]]; then
  if ./rdmakit info > "$LOG/info.txt" 2>&1 && grep -q "$RXE" "$LOG/info.txt" && grep -q "$SIW" "$LOG/info.txt"; then
    result ok "rdmakit info" "lists $RXE and $SIW"
  else
    result FAIL "rdmakit info" "$(tail -3 "$LOG/info.txt" | tr '\n' ' ')"
  fi
  sed -n '1,60p' "$LOG/info.txt"
  perf_pair() {  # label dev addr test args...
    local label=$1 dev=$2 addr=$3; shift 3
    local p=$((18700 + PASS + FAIL + SKIP))
    timeout 120 ./rdmakit perf "$@" -d "$dev" -p "$p" > "$LOG/perf-$label.server" 2>&1 & local sp=$!
    for _ in $(seq 1 100); do ss -Hltn "sport = :$p" 2>/dev/null | grep -q . && break; sleep 0.1; done
    timeout 120 ./rdmakit perf "$@" -d "$dev" -p "$p" "$addr" > "$LOG/perf-$label.client" 2>&1; local rc=$?
    wait $sp; local src=$?
    local line; line=$(awk '/#bytes/{getline; print; exit}' "$LOG/perf-$label.client" | tr -s ' ')
    if [[ $rc == 0 && $src == 0 && -n $line ]]; then result ok "rdmakit perf $label" "$line"
    else result FAIL "rdmakit perf $label" "rc=$rc/$src $(tail -q -n 2 "$LOG/perf-$label.client" "$LOG/perf-$label.server" | tr '\n' ' ')"; fi
  }
  perf_pair "rxe write_bw 64K" $RXE $RXE_IP write_bw -s 65536 -n 500
  perf_pair "rxe send_lat 64" $RXE $RXE_IP send_lat -s 64 -n 500
  perf_pair "rxe read_bw 4K" $RXE $RXE_IP read_bw -s 4096 -n 500
  perf_pair "rxe atomic_lat" $RXE $RXE_IP atomic_lat -n 500
  perf_pair "siw write_bw 64K" $SIW $SIW_IP write_bw -s 65536 -n 500
  perf_pair "siw write_lat 64" $SIW $SIW_IP write_lat -s 64 -n 500
else
  result skip "rdmakit" "binary not built"
fi
echo "# rdmakit done at $(elapsed)"

# ---------------------------------------------------------------- collectives over rxe and siw
if [[ -z ${CI_RUN:-} && -x ./rdmakit && -f "$HERE/coll-perf.sh" ]]; then
  # shellcheck source=coll-perf.sh
  . "$HERE/coll-perf.sh"
  echo "# coll-perf done at $(elapsed)"
fi

# ---------------------------------------------------------------- interop with perftest and rping
if [[ -z ${CI_RUN:-} && -x ./rdmakit && -f "$HERE/interop.sh" ]]; then
  # shellcheck source=interop.sh
  . "$HERE/interop.sh"
fi
if [[ -z ${CI_RUN:-} && -x ./rdmakit && -f "$HERE/perftest-interop.sh" ]]; then
  # shellcheck source=perftest-interop.sh
  . "$HERE/perftest-interop.sh"
  echo "# perftest interop done at $(elapsed)"
fi

if [[ -z ${CI_RUN:-} && -x ./rdmakit && -f "$HERE/kube.sh" ]]; then
  # shellcheck source=kube.sh
  . "$HERE/kube.sh"
  echo "# kube, doctor, exporter done at $(elapsed)"
fi

if [[ -z ${CI_RUN:-} && -x ./rdmakit && -f "$HERE/transfer.sh" ]]; then
  # shellcheck source=transfer.sh
  . "$HERE/transfer.sh"
  echo "# transfer done at $(elapsed)"
fi

if [[ -z ${CI_RUN:-} && -f "$HERE/roce.sh" ]]; then
  # shellcheck source=roce.sh
  . "$HERE/roce.sh"
  echo "# roce done at $(elapsed)"
fi

if [[ -z ${CI_RUN:-} && -x ./rdmakit && -f "$HERE/roce-cm.sh" ]]; then
  # shellcheck source=roce-cm.sh
  . "$HERE/roce-cm.sh"
  echo "# roce RDMA CM done at $(elapsed)"
fi

echo "# total $(elapsed)"
echo "$PASS passed, $FAIL failed, $SKIP skipped"
((FAIL == 0))
