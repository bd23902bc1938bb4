#!/bin/bash
# bench.sh (guest) - rdmakit perf and perftest side by side on the same rxe
# device in one guest run: write_bw at 4 KiB and 64 KiB, write_lat and
# send_lat at 8 B, 4 KiB and 64 KiB (issue 9's goals). Prints one line per
# (test, size) with both figures and their ratio (rdmakit / perftest; for
# bandwidth below 1 is slower, for latency above 1 is slower).
# Server on vCPU 0, client on vCPU 1 (perftest times with rdtsc).
#
# Each pair runs BENCH_REPS times (default 3), the tools interleaved; the
# table shows each tool's best (highest BW average; lowest latency), and
# for latency both t_typical (the median) and t_avg: the guest's vCPUs
# share the host's cores with whatever else runs there, and a descheduled
# vCPU adds milliseconds to whichever run it hits.
#
# Env: BENCH_N_BW, BENCH_N_LAT (iterations), BENCH_TESTS (default
# "write_bw write_lat send_lat"), BENCH_BW_SIZES, BENCH_LAT_SIZES,
# BENCH_VARIANTS (space-separated; each an ENV=VALUE given to extra
# rdmakit runs, one more column each, e.g. "GOMAXPROCS=1").
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG=${BENCH_LOG:-$PWD/bench-logs}; mkdir -p "$LOG"
N_BW=${BENCH_N_BW:-2000}; N_LAT=${BENCH_N_LAT:-1000}; REPS=${BENCH_REPS:-3}
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
best() {  # hi|lo values... -> the best one (fail if none)
  local dir=$1; shift
  printf '%s\n' "$@" | awk -v d="$dir" '$1+0 > 0 { if (n == 0 || (d == "hi" ? $1 > b : $1 < b)) b = $1; n++ } END { if (n) print b; else print "fail" }'
}
echo "# kernel $(uname -r), perftest $(dpkg-query -W -f='${Version}' perftest), device $DEV (rxe, MTU $(cat /sys/class/net/rxedum0/mtu)), TCG guest, clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
echo "# iterations: bw $N_BW, lat $N_LAT; best of $REPS; variants: ${VARIANTS[*]:-none}"
hdr=$(printf '%-14s %6s %12s %12s %6s' test bytes perftest rdmakit ratio)
for v in "${VARIANTS[@]}"; do hdr+=$(printf ' %12s %6s' "${v:0:12}" ratio); done
echo "$hdr"
TOOLS=(- "${VARIANTS[@]}")
for test in $TESTS; do
  if [[ $test == *_bw ]]; then sizes=$BW_SIZES; n=$N_BW; cols=(4); names=("$test"); dir=hi   # BW average MB/s
  else sizes=$LAT_SIZES; n=$N_LAT; cols=(5 6); names=("$test(typ)" "$test(avg)"); dir=lo; fi   # t_typical, t_avg usec
  for size in $sizes; do
    declare -A got=()
    for ((r = 0; r < REPS; r++)); do
      l=$(pair perftest $test $size $n); for c in "${cols[@]}"; do got[p,$c]+=" $(awk -v c=$c '{print $c}' <<< "$l")"; done
      for t in "${!TOOLS[@]}"; do
        v=${TOOLS[$t]}; [[ $v == - ]] && v=
        l=$(pair rdmakit $test $size $n "$v"); for c in "${cols[@]}"; do got[$t,$c]+=" $(awk -v c=$c '{print $c}' <<< "$l")"; done
      done
    done
    for i in "${!cols[@]}"; do
      c=${cols[$i]}; va=$(best $dir ${got[p,$c]})
      line=$(printf '%-14s %6s %12s' "${names[$i]}" "$size" "$va")
      for t in "${!TOOLS[@]}"; do vb=$(best $dir ${got[$t,$c]}); line+=$(printf ' %12s %6s' "$vb" "$(ratio "$va" "$vb")"); done
      echo "$line"
      echo "# $test $size col $c: perftest${got[p,$c]}; $(for t in "${!TOOLS[@]}"; do printf '[%s]%s ' "${TOOLS[$t]}" "${got[$t,$c]}"; done)" >> "$LOG/raw.txt"
    done
    unset got
  done
done
echo "# every run's figure: $LOG/raw.txt"; cat "$LOG/raw.txt"
