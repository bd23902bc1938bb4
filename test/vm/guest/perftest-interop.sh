#!/bin/bash
# perftest-interop.sh - rdmakit perf --perftest-wire against Debian's
# perftest binaries on rxe (RoCE v2, the IPv4-mapped GID): write_bw and
# send_bw, each with rdmakit as client of ib_*_bw's server and as server
# of ib_*_bw's client. One RESULT line per pair.
#
# Sourced by ci-guest.sh (uses result(), LOG, RXE, RXE_IP); run on its own
# (test/vm/run.sh ... -- bash perftest-interop.sh) it sets up rxe itself
# and ends with the "N passed, N failed, N skipped" summary.
# Env: PI_N (iterations, default 200), PI_SIZE (bytes, default 65536).
PI_STANDALONE=0
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  PI_STANDALONE=1
  HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  PASS=0; FAIL=0; SKIP=0
  LOG=${CI_LOG:-$PWD/logs}; mkdir -p "$LOG"
  result() {  # ok|FAIL|skip label detail
    case $1 in ok) PASS=$((PASS+1)) ;; FAIL) FAIL=$((FAIL+1)) ;; *) SKIP=$((SKIP+1)) ;; esac
    printf 'RESULT %-4s | %s | %s\n' "$1" "$2" "$3"
  }
  "$HERE/rdma-setup.sh" rxe-dummy > "$LOG/setup.txt" 2>&1 || { cat "$LOG/setup.txt"; result FAIL setup "rdma-setup.sh failed"; }
  RXE=rxe_dum; RXE_IP=10.200.0.1
fi
PI_N=${PI_N:-200}; PI_SIZE=${PI_SIZE:-65536}
PI_GIDX=$(awk -v d="name=$RXE" '$0 ~ d {for(i=1;i<=NF;i++) if($i ~ /^gid=/) print substr($i,5)}' "$LOG/setup.txt" | head -1)
PI_GIDX=${PI_GIDX:-1}

pi_line() {  # file: the first result line after the "#bytes" header
  awk '/#bytes/{getline; print; exit}' "$1" | tr -s ' '
}

pi_pair() {  # test server(rdmakit|perftest)
  local test=$1 srv=$2 p=$((18600 + PASS + FAIL + SKIP)) rc src sp
  local base=$LOG/pwire-$test-$srv-server
  local rk=(./rdmakit perf "$test" --perftest-wire -d "$RXE" -s "$PI_SIZE" -n "$PI_N" -p "$p")
  local pt=(ib_"$test" -d "$RXE" -x "$PI_GIDX" -F -s "$PI_SIZE" -n "$PI_N" -p "$p")
  local s c
  if [[ $srv == rdmakit ]]; then s=("${rk[@]}"); c=("${pt[@]}"); else s=("${pt[@]}"); c=("${rk[@]}"); fi
  timeout 120 "${s[@]}" > "$base.server" 2>&1 & sp=$!
  for _ in $(seq 1 100); do ss -Hltn "sport = :$p" 2>/dev/null | grep -q . && break; sleep 0.1; done
  timeout 120 "${c[@]}" "$RXE_IP" > "$base.client" 2>&1; rc=$?
  wait "$sp"; src=$?
  local cl sl; cl=$(pi_line "$base.client"); sl=$(pi_line "$base.server")
  local label="perftest-wire rxe $test ($srv server)"
  if [[ $rc == 0 && $src == 0 && -n $cl && -n $sl ]]; then
    result ok "$label" "client:$cl | server:$sl"
  else
    result FAIL "$label" "rc=$rc/$src | $(tail -q -n 3 "$base.client" "$base.server" | tr '\n' ' ')"
  fi
}

if [[ -x ./rdmakit ]] && command -v ib_write_bw > /dev/null; then
  for t in write_bw send_bw; do
    pi_pair "$t" perftest
    pi_pair "$t" rdmakit
  done
else
  result skip "perftest-wire" "rdmakit or perftest missing"
fi
if [[ $PI_STANDALONE == 1 ]]; then
  echo "$PASS passed, $FAIL failed, $SKIP skipped"
  ((FAIL == 0))
fi
