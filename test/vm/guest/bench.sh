#!/bin/bash
# bench.sh (guest) - rdmakit perf and perftest side by side on the same rxe
# device in one guest run: write_bw and write_lat at 64 B, 4 KiB, 64 KiB.
# Prints one line per (test, size) with both figures and their ratio
# (rdmakit / perftest; for latency lower is better, so ratio > 1 is slower).
# Server on vCPU 0, client on vCPU 1 (perftest times with rdtsc).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG=${BENCH_LOG:-$PWD/bench-logs}; mkdir -p "$LOG"
N_BW=${BENCH_N_BW:-2000}; N_LAT=${BENCH_N_LAT:-1000}
"$HERE/rdma-setup.sh" rxe-dummy > "$LOG/setup.txt" 2>&1
DEV=rxe_dum; IP=10.200.0.1; GIDX=$(awk '/name=rxe_dum/{for(i=1;i<=NF;i++) if($i ~ /^gid=/) print substr($i,5)}' "$LOG/setup.txt")
PORT=19000
pair() {  # tool test size iters -> prints the client's result line
  local tool=$1 test=$2 size=$3 n=$4 p=$((PORT++)) srv cli
  if [[ $tool == perftest ]]; then
    srv=(ib_$test -d $DEV -x "$GIDX" -F -s "$size" -n "$n" -p "$p")
  else
    srv=(./rdmakit perf "$test" -d $DEV -F -s "$size" -n "$n" -p "$p")
  fi
  taskset -c 0 timeout 120 "${srv[@]}" > "$LOG/$tool-$test-$size.server" 2>&1 & local sp=$!
  for _ in $(seq 1 100); do ss -Hltn "sport = :$p" 2>/dev/null | grep -q . && break; sleep 0.1; done
  taskset -c 1 timeout 120 "${srv[@]}" $IP > "$LOG/$tool-$test-$size.client" 2>&1
  wait $sp
  awk '/#bytes/{getline; print; exit}' "$LOG/$tool-$test-$size.client" | tr -s ' '
}
echo "# kernel $(uname -r), perftest $(dpkg-query -W -f='${Version}' perftest), device $DEV (rxe, MTU $(cat /sys/class/net/rxedum0/mtu)), TCG guest"
printf '%-10s %6s %14s %14s %8s\n' test bytes perftest rdmakit ratio
for test in write_bw write_lat; do
  for size in 64 4096 65536; do
    if [[ $test == write_bw ]]; then n=$N_BW; col=4; else n=$N_LAT; col=6; fi   # BW average MB/s; t_avg usec
    a=$(pair perftest $test $size $n); b=$(pair rdmakit $test $size $n)
    va=$(awk -v c=$col '{print $c}' <<< "$a"); vb=$(awk -v c=$col '{print $c}' <<< "$b")
    r=$(awk -v a="$va" -v b="$vb" 'BEGIN{ if (a+0 > 0 && b+0 > 0) printf "%.2f", b/a; else print "n/a" }')
    printf '%-10s %6s %14s %14s %8s\n' "$test" "$size" "${va:-fail}" "${vb:-fail}" "$r"
  done
done
