#!/usr/bin/env bash
# roce-vs-tcp.sh: rdmakit perf over the roce transport (RoCEv2 on a UDP
# socket, loopback) against the tcp transport, same host, same binary,
# interleaved in one run: write_bw at 64 KiB and write_lat at 8 bytes.
#
#   bench/roce-vs-tcp.sh                 # TRIALS=5
#   TRIALS=1 N=500 bench/roce-vs-tcp.sh  # quick look
#
# Each trial runs `rdmakit perf TEST --loopback` (server as a child
# process) once on roce0 and once on tcp0, alternating which goes first.
# roce uses the loopback interface with a port of the kernel's choice per
# process (RDMAKIT_ROCE_IFACES=lo RDMAKIT_ROCE_ADDR=127.0.0.1:0), so the
# two processes do not both need 4791. Prints per-trial numbers, the
# median of each and the roce/tcp ratio of the medians.
# Environment: TRIALS (5), N (iterations, 2000), SIZE_BW (65536), SIZE_LAT (8).
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${TRIALS:-5}; N=${N:-2000}; SIZE_BW=${SIZE_BW:-65536}; SIZE_LAT=${SIZE_LAT:-8}
BIN=$(mktemp -d)/rdmakit
trap 'rm -rf "$(dirname "$BIN")"' EXIT
go build -o "$BIN" ./cmd/rdmakit
export RDMAKIT_ROCE_IFACES=lo RDMAKIT_ROCE_ADDR=127.0.0.1:0
run() {  # dev test size -> the number (MiB/s average, or usec typical)
  local out; out=$("$BIN" perf "$2" --loopback -d "$1" -s "$3" -n "$N" 2>&1)
  if [[ $2 == write_bw ]]; then awk '/#bytes/{getline; print $4; exit}' <<< "$out"
  else awk '/#bytes/{getline; print $5; exit}' <<< "$out"; fi
}
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A R
for t in $(seq 1 "$TRIALS"); do
  devs="roce0 tcp0"; ((t % 2 == 0)) && devs="tcp0 roce0"
  for d in $devs; do
    R[$d/bw]+="$(run "$d" write_bw "$SIZE_BW") "
    R[$d/lat]+="$(run "$d" write_lat "$SIZE_LAT") "
  done
  echo "trial $t done" >&2
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for k in bw lat; do
  r=$(tr ' ' '\n' <<< "${R[roce0/$k]}" | grep . | median)
  c=$(tr ' ' '\n' <<< "${R[tcp0/$k]}" | grep . | median)
  unit="MiB/s (write_bw $SIZE_BW B, average)"; [[ $k == lat ]] && unit="usec (write_lat $SIZE_LAT B, typical)"
  echo "$k: roce0 [${R[roce0/$k]% }] median $r; tcp0 [${R[tcp0/$k]% }] median $c; roce/tcp $(awk -v a="$r" -v b="$c" 'BEGIN{printf "%.2f", a/b}') $unit"
done
