#!/bin/bash
# perftest-interop.sh - rdmakit perf against Debian's perftest binaries on
# rxe (RoCE v2, the IPv4-mapped GID), with no special flag: rdmakit tells
# perftest's exchange from its own. All eight tests in both roles, small
# and 64 KiB sizes, -q 2, -a sweeps, -S/-T, a write_bw size mismatch
# (which must fail on rdmakit's side with a message naming -s), -R (the
# exchange over rdma_cm) on rxe and siw, write_bw and send_bw both roles,
# -z (the exchange over rdma_cm, regular QPs) the same on rxe, and a
# perftest -R server facing a client without -R (told to add it).
# One RESULT line per check.
#
# Sourced by ci-guest.sh (uses result(), LOG, RXE, RXE_IP); run on its own
# (test/vm/run.sh ... -- bash perftest-interop.sh) it sets up rxe itself
# and ends with the "N passed, N failed, N skipped" summary.
# Env: PI_N (iterations, default 50).
PI_STANDALONE=0
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  PI_STANDALONE=1
  HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  # shellcheck source=standalone.sh
  . "$(dirname "${BASH_SOURCE[0]}")/standalone.sh"
  "$HERE/rdma-setup.sh" rxe-dummy siw-dummy > "$LOG/setup.txt" 2>&1 || { cat "$LOG/setup.txt"; result FAIL setup "rdma-setup.sh failed"; }
  RXE=rxe_dum; RXE_IP=10.200.0.1; SIW=siw_dum; SIW_IP=10.201.0.1
fi
PI_N=${PI_N:-50}
PI_GIDX=$(awk -v d="name=$RXE" '$0 ~ d {for(i=1;i<=NF;i++) if($i ~ /^gid=/) print substr($i,5)}' "$LOG/setup.txt" | head -1)
PI_GIDX=${PI_GIDX:-1}
pi_t0=$(cut -d' ' -f1 /proc/uptime)

pi_line() {  # file: the last result line after the "#bytes" header
  awk '/#bytes/{h=1; next} h && /^ *[0-9]/{l=$0} END{print l}' "$1" | tr -s ' '
}

# pi_run test server(rdmakit|perftest) expect(ok|fail) rdmakit-args -- perftest-args
# Starts the server, then the client; sets pi_rc/pi_src/pi_base.
pi_run() {
  local test=$1 srv=$2; shift 2
  local p=$((18600 + PASS + FAIL + SKIP)) rk=() pt=() sp
  while [[ $# -gt 0 && $1 != -- ]]; do rk+=("$1"); shift; done
  shift
  pt=("$@")
  pi_base=$LOG/pi-$test-$srv-$p
  local r=(./rdmakit perf "$test" -d "$RXE" -n "$PI_N" -p "$p" "${rk[@]}")
  local q=(ib_"$test" -d "$RXE" -x "$PI_GIDX" -F -n "$PI_N" -p "$p" "${pt[@]}")
  local s c
  if [[ $srv == rdmakit ]]; then s=("${r[@]}"); c=("${q[@]}"); else s=("${q[@]}"); c=("${r[@]}"); fi
  timeout 60 "${s[@]}" > "$pi_base.server" 2>&1 & sp=$!
  for _ in $(seq 1 100); do ss -Hltn "sport = :$p" 2>/dev/null | grep -q . && break; sleep 0.1; done
  timeout 60 "${c[@]}" "$RXE_IP" > "$pi_base.client" 2>&1; pi_rc=$?
  wait "$sp"; pi_src=$?
}

# pi_pair label test server args...: both exit 0 and the client reports.
pi_pair() {
  local label=$1 test=$2 srv=$3; shift 3
  pi_run "$test" "$srv" "$@"
  local cl sl; cl=$(pi_line "$pi_base.client"); sl=$(pi_line "$pi_base.server")
  label="perftest rxe $test $label ($srv server)"
  if [[ $pi_rc == 0 && $pi_src == 0 && -n $cl ]]; then
    result ok "$label" "client:$cl${sl:+ | server:$sl}"
  else
    result FAIL "$label" "rc=$pi_rc/$pi_src | $(tail -q -n 3 "$pi_base.client" "$pi_base.server" | tr '\n' ' ')"
  fi
}

pi_cm_listen() {  # port: until an rdma_cm LISTEN id on port (or 4 s)
  local i
  for i in $(seq 1 80); do
    rdma res show cm_id 2> /dev/null | grep -q "state LISTEN.*:$1 " && return 0
    sleep 0.05
  done
  return 1
}

# pi_rcm flag(-R|-z) test server(rdmakit|perftest) dev ip: the flag on
# both sides, -s 1024 (-z: perftest connects its QPs itself, by -x's GID).
pi_rcm() {
  local f=$1 test=$2 srv=$3 dev=$4 ip=$5 p=$((18600 + PASS + FAIL + SKIP)) sp s c cl sl x=()
  pi_base=$LOG/pi$f-$test-$dev-$srv-$p
  [[ $f == -z ]] && x=(-x "$PI_GIDX")
  local r=(./rdmakit perf "$test" "$f" -d "$dev" -n "$PI_N" -s 1024 -p "$p")
  local q=(ib_"$test" "$f" "${x[@]}" -d "$dev" -F -n "$PI_N" -s 1024 -p "$p")
  if [[ $srv == rdmakit ]]; then s=("${r[@]}"); c=("${q[@]}"); else s=("${q[@]}"); c=("${r[@]}"); fi
  timeout 60 "${s[@]}" > "$pi_base.server" 2>&1 & sp=$!
  pi_cm_listen "$p"
  timeout 60 "${c[@]}" "$ip" > "$pi_base.client" 2>&1; pi_rc=$?
  wait "$sp"; pi_src=$?
  cl=$(pi_line "$pi_base.client"); sl=$(pi_line "$pi_base.server")
  local label="perftest $f $dev $test -s 1024 ($srv server)"
  if [[ $pi_rc == 0 && $pi_src == 0 && -n $cl ]]; then
    result ok "$label" "client:$cl${sl:+ | server:$sl}"
  else
    result FAIL "$label" "rc=$pi_rc/$pi_src | $(tail -q -n 3 "$pi_base.client" "$pi_base.server" | tr '\n' ' ')"
  fi
}

if [[ -x ./rdmakit ]] && command -v ib_write_bw > /dev/null; then
  for t in write_bw read_bw send_bw write_lat read_lat send_lat; do
    for srv in perftest rdmakit; do
      pi_pair "-s 64" "$t" "$srv" -s 64 -- -s 64
    done
  done
  for t in atomic_bw atomic_lat; do
    for srv in perftest rdmakit; do
      pi_pair "" "$t" "$srv" --
    done
  done
  pi_pair "-s 65536 -q 2" write_bw rdmakit -s 65536 -q 2 -- -s 65536 -q 2
  pi_pair "-s 4096 -q 2" send_bw perftest -s 4096 -q 2 -- -s 4096 -q 2
  # Service level and traffic class in the address handle (perftest: --tclass).
  pi_pair "-S 1 -T 96" write_bw rdmakit -S 1 -T 96 -- -S 1 --tclass=96
  # -a: every size from 2 bytes to 8 MiB (few iterations)
  PI_N_SAVE=$PI_N; PI_N=5
  pi_pair "-a" write_bw rdmakit -a -- -a
  pi_pair "-a" send_bw perftest -a -- -a
  PI_N=$PI_N_SAVE
  # A size mismatch fails on rdmakit's side, naming -s.
  pi_run write_bw rdmakit -s 64 -- -s 1024
  if [[ $pi_src != 0 ]] && grep -q -- "same -s" "$pi_base.server"; then
    result ok "perftest rxe write_bw size mismatch (rdmakit server)" "rc=$pi_rc/$pi_src: $(grep -h -- 'same -s' "$pi_base.server" | head -1)"
  else
    result FAIL "perftest rxe write_bw size mismatch (rdmakit server)" "rc=$pi_rc/$pi_src | $(tail -q -n 3 "$pi_base.client" "$pi_base.server" | tr '\n' ' ')"
  fi
  pi_run write_bw perftest -s 65536 -- -s 1024
  if [[ $pi_rc != 0 ]] && grep -q -- "same -s" "$pi_base.client"; then
    result ok "perftest rxe write_bw size mismatch (perftest server)" "rc=$pi_rc/$pi_src: $(grep -h -- 'same -s' "$pi_base.client" | head -1)"
  else
    result FAIL "perftest rxe write_bw size mismatch (perftest server)" "rc=$pi_rc/$pi_src | $(tail -q -n 3 "$pi_base.client" "$pi_base.server" | tr '\n' ' ')"
  fi
  # perftest -R: the whole exchange over rdma_cm, and the test QPs
  # connected through it; rdmakit perf -R speaks it (rxe, and siw, where
  # perftest needs -R). Both roles, write_bw and send_bw.
  for dv in "$RXE:$RXE_IP" "${SIW:-}:${SIW_IP:-}"; do
    dev=${dv%%:*} ip=${dv#*:}
    [[ -n $dev && -e /sys/class/infiniband/$dev ]] || continue
    for t in write_bw send_bw; do
      for srv in perftest rdmakit; do
        pi_rcm -R "$t" "$srv" "$dev" "$ip"
      done
    done
  done
  # perftest -z: the exchange over rdma_cm, the test QPs regular ones
  # connected with the exchanged keys (rxe). Both roles, write_bw, send_bw.
  for t in write_bw send_bw; do
    for srv in perftest rdmakit; do
      pi_rcm -z "$t" "$srv" "$RXE" "$RXE_IP"
    done
  done
  # Without -R, an rdmakit client facing a perftest -R server is told to
  # add -R (no TCP server on the port).
  p=$((18600 + PASS + FAIL + SKIP)); pi_base=$LOG/pi-R-$p
  timeout 60 ib_write_bw -d "$RXE" -x "$PI_GIDX" -F -R -p "$p" > "$pi_base.server" 2>&1 & sp=$!
  pi_cm_listen "$p"
  timeout 30 ./rdmakit perf write_bw -d "$RXE" -p "$p" "$RXE_IP" > "$pi_base.client" 2>&1; pi_rc=$?
  kill "$sp" 2> /dev/null; wait "$sp"; pi_src=$?
  if [[ $pi_rc != 0 ]] && grep -q -- "listens through rdma_cm" "$pi_base.client"; then
    result ok "perftest rxe write_bw -R server, rdmakit client without -R: told to add -R" "rc=$pi_rc/$pi_src"
  else
    result FAIL "perftest rxe write_bw -R server, rdmakit client without -R: told to add -R" "rc=$pi_rc/$pi_src | $(tail -q -n 3 "$pi_base.client" "$pi_base.server" | tr '\n' ' ')"
  fi
else
  result skip "perftest interop" "rdmakit or perftest missing"
fi
echo "# perftest interop took $(awk -v a="$pi_t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.0fs", b-a}')"
if [[ $PI_STANDALONE == 1 ]]; then
  standalone_summary
fi
