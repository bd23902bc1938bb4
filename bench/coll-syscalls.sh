#!/usr/bin/env bash
# coll-syscalls.sh: system calls and context switches per collective call,
# rdmakit coll-perf or Open MPI, on this host.
#
#   bench/coll-syscalls.sh RANKS COLL SIZE CALLS VARIANT
#   bench/coll-syscalls.sh 4 allgather 1048576 7000 /tmp/new
#   bench/coll-syscalls.sh 4 allgather 1048576 7000 /tmp/new:RDMAKIT_COLL_ALGO=ring
#   bench/coll-syscalls.sh 4 allgather 1048576 7000 mpi      # or mpi:N, as coll-ab.sh
#
# Starts one launch of CALLS calls (enough for 3 s or more), counts
# system-wide with `perf stat -a` for 1.5 s from 1.5 s in, and divides by
# the calls in that window (1.5 s over the launch's time per call). All
# ranks together; other work on the host counts too (check uptime, or
# run a window with nothing launched for a baseline). Needs perf with the
# syscalls tracepoints (root). Output: one line of counts per call.
set -euo pipefail
[ $# -eq 5 ] || { sed -n '2,15p' "$0"; exit 2; }
R=$1 COLL=$2 SIZE=$3 N=$4 SPEC=$5
cd "$(dirname "$0")/.."
MPIBENCH=${MPIBENCH:-/tmp/coll-ab-mpi_coll_bench}
EV=context-switches,raw_syscalls:sys_enter
for s in sched_yield read readv write writev sendmsg sendmmsg recvmsg recvmmsg ppoll futex poll epoll_pwait nanosleep; do EV=$EV,syscalls:sys_enter_$s; done
case $COLL in allreduce) pn=all_reduce ;; allgather) pn=all_gather ;; *) pn=$COLL ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ $SPEC == mpi || $SPEC == mpi:* ]]; then
  [ -x "$MPIBENCH" ] || mpicc -O2 -o "$MPIBENCH" bench/src/mpi_coll_bench.c
  forced=()
  mp=$COLL
  [ "$COLL" = reduce_scatter ] && mp=reduce_scatter_block
  [ "$SPEC" != mpi ] && forced=(--mca coll_tuned_use_dynamic_rules 1 --mca "coll_tuned_${mp}_algorithm" "${SPEC#mpi:}")
  mpirun --allow-run-as-root --oversubscribe -np "$R" --mca oob_tcp_if_include lo --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include lo "${forced[@]}" "$MPIBENCH" "$COLL" "$SIZE" "$N" 10 >"$tmp/out" 2>/dev/null &
else
  bin=${SPEC%%:*} envs=${SPEC#*:}
  [ "$envs" = "$SPEC" ] && envs=
  # shellcheck disable=SC2086 # envs is a list of K=V words
  env RDMAKIT_COLL_BIND=none ${envs//,/ } "$bin" coll-perf $pn -b "$SIZE" -e "$SIZE" -n "$N" -w 10 -c 0 -a 3 \
    --ranks "$R" --transport tcp >"$tmp/out" 2>/dev/null &
fi
pid=$!
sleep 1.5
perf stat -a -x, -e "$EV" -- sleep 1.5 2>"$tmp/perf"
wait $pid
if [[ $SPEC == mpi* ]]; then t=$(awk '{print $4}' "$tmp/out"); else t=$(awk '!/^#/ && NF >= 12 {print $6; exit}' "$tmp/out"); fi
[ -n "$t" ] || { echo "no result from the launch" >&2; exit 1; }
awk -F, -v t="$t" -v spec="$SPEC" -v r="$R" -v coll="$COLL" 'BEGIN { c = 1500000 / t; printf "%s %s %s ranks: %.1f us per call, per call:", spec, coll, r, t }
  { n = $3; sub(/.*sys_enter_/, "", n); sub(/raw_syscalls:sys_enter/, "syscalls", n); printf " %s %.1f", n, $1 / c }
  END { print "" }' "$tmp/perf"
