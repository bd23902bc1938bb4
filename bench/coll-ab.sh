#!/usr/bin/env bash
# coll-ab.sh: alternating A/B launches of coll-perf builds (and Open MPI)
# on this host, one collective and size, for comparing two builds in one
# run on a noisy machine.
#
#   bench/coll-ab.sh RANKS COLL SIZE TRIALS VARIANT...
#   go build -o /tmp/base ./cmd/rdmakit   # (from the other commit)
#   go build -o /tmp/new ./cmd/rdmakit
#   bench/coll-ab.sh 8 allreduce 1048576 3 base=/tmp/base new=/tmp/new ring=/tmp/new:RDMAKIT_COLL_ALGO=ring mpi=mpi
#
# VARIANT is NAME=BINARY[:K=V,K=V...] (rdmakit coll-perf with those
# environment variables), NAME=mpi (bench/src/mpi_coll_bench.c under
# mpirun: btl tcp,self on lo, or with TRANSPORT=shm vader,self (shared
# memory) and --bind-to none, as rdmakit's ranks here) or NAME=mpi:N (Open
# MPI's tuned algorithm N for COLL forced: coll_tuned_use_dynamic_rules 1,
# coll_tuned_<COLL>_algorithm N, reduce_scatter_block's for reduce_scatter;
# ompi_info --param coll tuned --level 9 lists them). COLL: allreduce,
# allgather, reduce_scatter.
# Each trial runs every variant once, in the order given; the output is,
# per variant, the time per call (µs, maximum over ranks) of every trial,
# sorted. rdmakit runs over tcp (TRANSPORT=shm for shm), not pinned
# (BIND=core: rdmakit's ranks with RDMAKIT_COLL_BIND=core, round robin
# where they outnumber the CPUs, and Open MPI's on shm likewise).
# Iterations as bench/coll-vs-mpi.sh (at most 500 from 8 ranks).
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,24p' "$0"; exit 2; }
R=$1 COLL=$2 SIZE=$3 T=$4
shift 4
TRANSPORT=${TRANSPORT:-tcp}
BIND=${BIND:-none}
cd "$(dirname "$0")/.."
MPIBENCH=${MPIBENCH:-/tmp/coll-ab-mpi_coll_bench}
it=$((268435456 / SIZE))
[ $it -gt 2000 ] && it=2000
[ $it -lt 10 ] && it=10
[ "$R" -ge 8 ] && [ $it -gt 500 ] && it=500
w=$(((it + 9) / 10))
case $COLL in allreduce) pn=all_reduce ;; allgather) pn=all_gather ;; *) pn=$COLL ;; esac
for v in "$@"; do
  if [[ ${v#*=} == mpi* ]] && [ ! -x "$MPIBENCH" ]; then mpicc -O2 -o "$MPIBENCH" bench/src/mpi_coll_bench.c; fi
done
declare -A res
mpiopt=(--mca btl tcp,self)
[ "$TRANSPORT" = shm ] && mpiopt=(--bind-to none --mca btl vader,self)
[ "$TRANSPORT" = shm ] && [ "$BIND" = core ] && mpiopt=(--map-by core:oversubscribe --bind-to core:overload-allowed --mca btl vader,self)
for _ in $(seq "$T"); do
  for v in "$@"; do
    name=${v%%=*} spec=${v#*=} x=
    if [[ $spec == mpi || $spec == mpi:* ]]; then
      forced=()
      mp=$COLL
      [ "$COLL" = reduce_scatter ] && mp=reduce_scatter_block
      [ "$spec" != mpi ] && forced=(--mca coll_tuned_use_dynamic_rules 1 --mca "coll_tuned_${mp}_algorithm" "${spec#mpi:}")
      x=$(timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$R" --mca oob_tcp_if_include lo --mca pml ob1 "${mpiopt[@]}" \
        --mca btl_tcp_if_include lo "${forced[@]}" "$MPIBENCH" "$COLL" "$SIZE" $it $w 2>/dev/null | awk '{print $4}') || true
    else
      bin=${spec%%:*} envs=${spec#*:}
      [ "$envs" = "$spec" ] && envs=
      # shellcheck disable=SC2086 # envs is a list of K=V words
      x=$(env RDMAKIT_COLL_BIND="$BIND" ${envs//,/ } timeout 300 "$bin" coll-perf $pn -b "$SIZE" -e "$SIZE" -n $it -w $w -c 0 -a 3 \
        --ranks "$R" --transport "$TRANSPORT" 2>/dev/null | awk '!/^#/ && NF >= 12 {print $6; exit}') || true
    fi
    res[$name]="${res[$name]:-} $x"
  done
done
for v in "$@"; do
  name=${v%%=*}
  echo "$R $COLL $SIZE $name: $(echo ${res[$name]} | tr ' ' '\n' | sort -g | tr '\n' ' ')"
done
