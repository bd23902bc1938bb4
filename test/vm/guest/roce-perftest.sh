#!/bin/bash
# roce-perftest.sh - rdmakit perf on roce0 (transport/roce, in network
# namespace roce_ns) against Debian's perftest on the kernel's rxe (rxe_v,
# root namespace), across the veth that roce.sh sets up: write_bw,
# send_bw, read_bw and write_lat, rdmakit as server and as client, with
# no special flag on either side (rdmakit recognises perftest's exchange
# and sends its roce address's IP as the RoCEv2 GID). Each check passes
# when both ends exit 0 and the client prints its result line; perftest
# fails on any completion error, so that is the data path's proof.
#
# Sourced by roce.sh after its setup (uses result(), LOG, RO_* and
# RO_GIDX). Env: RP_N (iterations, default 200).
RP_N=${RP_N:-200}

rp_line() {  # file: the last result line after the "#bytes" header
  awk '/#bytes/{h=1; next} h && /^ *[0-9]/{l=$0} END{print l}' "$1" | tr -s ' '
}

# rp_pair test server(rdmakit|perftest) size
rp_pair() {
  local test=$1 srv=$2 size=$3 p=$((18800 + PASS + FAIL + SKIP)) sp rc src
  local base=$LOG/roce-pt-$test-$srv
  local r=(ip netns exec "$RO_NS" env RDMAKIT_ROCE_IFACES=rvns RDMAKIT_ROCE_ADDR="$RO_IP"
    ./rdmakit perf "$test" -d roce0 -n "$RP_N" -s "$size" -p "$p")
  local q=(ib_"$test" -d "$RO_RXE" -x "$RO_GIDX" -F -n "$RP_N" -s "$size" -p "$p")
  if [[ $srv == rdmakit ]]; then
    timeout 60 "${r[@]}" > "$base.server" 2>&1 & sp=$!
    for _ in $(seq 1 100); do ip netns exec "$RO_NS" ss -Hltn "sport = :$p" 2> /dev/null | grep -q . && break; sleep 0.1; done
    timeout 60 "${q[@]}" "$RO_IP" > "$base.client" 2>&1; rc=$?
  else
    timeout 60 "${q[@]}" > "$base.server" 2>&1 & sp=$!
    for _ in $(seq 1 100); do ss -Hltn "sport = :$p" 2> /dev/null | grep -q . && break; sleep 0.1; done
    timeout 60 "${r[@]}" "$RO_RXE_IP" > "$base.client" 2>&1; rc=$?
  fi
  wait "$sp"; src=$?
  local cl sl label="rdmakit perf roce0 <-> perftest rxe $test -s $size ($srv server)"
  cl=$(rp_line "$base.client"); sl=$(rp_line "$base.server")
  if [[ $rc == 0 && $src == 0 && -n $cl ]]; then
    result ok "$label" "client:$cl${sl:+ | server:$sl}"
  else
    result FAIL "$label" "rc=$rc/$src | $(tail -q -n 3 "$base.client" "$base.server" | tr '\n' ' ')"
  fi
}

if [[ ! -x ./rdmakit ]] || ! command -v ib_write_bw > /dev/null; then
  result skip "rdmakit perf roce0 <-> perftest rxe" "no rdmakit or no ib_write_bw"
elif [[ -z ${RO_GIDX:-} ]]; then
  result FAIL "rdmakit perf roce0 <-> perftest rxe" "rxe_v has no IPv4-mapped GID for $RO_RXE_IP"
else
  for t in write_bw send_bw read_bw write_lat; do
    for srv in perftest rdmakit; do
      rp_pair "$t" "$srv" 1024
    done
  done
fi
