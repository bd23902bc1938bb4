#!/bin/bash
# bench.sh (guest) - rdmakit perf and perftest side by side on the same rxe
# device in one guest run: write_bw at 4 KiB and 64 KiB, write_lat and
# send_lat at 8 B, 4 KiB and 64 KiB (issue 9's goals). Prints one line per
# (test, size) with both figures and their ratio (rdmakit / perftest; for
# bandwidth below 1 is slower, for latency above 1 is slower).
# Server on vCPU 0, client on vCPU 1 (perftest times with rdtsc).
#
# Env: BENCH_N_BW, BENCH_N_LAT (iterations), BENCH_TESTS (default
# "write_bw write_lat send_lat"), BENCH_BW_SIZES, BENCH_LAT_SIZES,
# BENCH_VARIANTS (space-separated; each an ENV=VALUE given to extra
# rdmakit runs, one more column each, e.g. "GOMAXPROCS=1").
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG=${BENCH_LOG:-$PWD/bench-logs}; mkdir -p "$LOG"
N_BW=${BENCH_N_BW:-2000}; N_LAT=${BENCH_N_LAT:-1000}
TESTS=${BENCH_TESTS:-write_bw write_lat send_lat}
BW_SIZES=${BENCH_BW_SIZES:-4096 65536}; LAT_SIZES=${BENCH_LAT_SIZES:-8 4096 65536}
read -r -a VARIANTS <<< "${BENCH_VARIANTS:-}"
"$HERE/rdma-setup.sh" rxe-dummy > "$LOG/setup.txt" 2>&1
DEV=rxe_dum; IP=10.200.0.1; GIDX=$(awk '/name=rxe_dum/{for(i=1;i<=NF;i++) if($i ~ /^gid=/) print substr($i,5)}' "$LOG/setup.txt")
PORT=19000
pair() {  # tool test size iters [ENV=VAL] -> prints the client's result line
  local tool=$1 test=$2 size=$3 n=$4 envv=${5:-} p=$((PORT++)) srv tag
  tag=$tool${envv:+-$envv}
  if [[ $tool == perftest ]]; then
    srv=(ib_$test -d $DEV -x "$GIDX" -F -s "$size" -n "$n" -p "$p")
  else
    srv=(env ${envv:+"$envv"} ./rdmakit perf "$test" -d $DEV -F -s "$size" -n "$n" -p "$p")
  fi
  taskset -c 0 timeout 120 "${srv[@]}" > "$LOG/$tag-$test-$size.server" 2>&1 & local sp=$!
  for _ in $(seq 1 100); do ss -Hltn "sport = :$p" 2>/dev/null | grep -q . && break; sleep 0.1; done
  taskset -c 1 timeout 120 "${srv[@]}" $IP > "$LOG/$tag-$test-$size.client" 2>&1
  wait $sp
  awk '/#bytes/{getline; print; exit}' "$LOG/$tag-$test-$size.client" | tr -s ' '
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a+0 > 0 && b+0 > 0) printf "%.2f", b/a; else print "n/a" }'; }
echo "# kernel $(uname -r), perftest $(dpkg-query -W -f='${Version}' perftest), device $DEV (rxe, MTU $(cat /sys/class/net/rxedum0/mtu)), TCG guest, clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
echo "# iterations: bw $N_BW, lat $N_LAT; variants: ${VARIANTS[*]:-none}"
hdr=$(printf '%-10s %6s %12s %12s %6s' test bytes perftest rdmakit ratio)
for v in "${VARIANTS[@]}"; do hdr+=$(printf ' %12s %6s' "${v:0:12}" ratio); done
echo "$hdr"
for test in $TESTS; do
  if [[ $test == *_bw ]]; then sizes=$BW_SIZES; n=$N_BW; col=4; else sizes=$LAT_SIZES; n=$N_LAT; col=6; fi   # BW average MB/s; t_avg usec
  for size in $sizes; do
    a=$(pair perftest $test $size $n); va=$(awk -v c=$col '{print $c}' <<< "$a")
    b=$(pair rdmakit $test $size $n); vb=$(awk -v c=$col '{print $c}' <<< "$b")
    line=$(printf '%-10s %6s %12s %12s %6s' "$test" "$size" "${va:-fail}" "${vb:-fail}" "$(ratio "$va" "$vb")")
    for v in "${VARIANTS[@]}"; do
      c=$(pair rdmakit $test $size $n "$v"); vc=$(awk -v c=$col '{print $c}' <<< "$c")
      line+=$(printf ' %12s %6s' "${vc:-fail}" "$(ratio "$va" "$vc")")
    done
    echo "$line"
  done
done
