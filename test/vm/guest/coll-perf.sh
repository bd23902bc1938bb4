# coll-perf.sh - sourced by ci-guest.sh: collectives (rdmakit coll-perf,
# package coll) over the RDMA devices, forced with --transport ibverbs so
# that ranks of this one guest use rxe/siw instead of shm. Uses result(),
# LOG, RXE/SIW. One RESULT per (device, ranks, collective): exit 0, every
# row's #wrong 0 (out of place and in place), and every rank's header line
# naming the device.
#   Sizes 8 B .. 512 KiB (x16: two above the 256 KiB chunk, so chunks
#   pipeline and stripe over the 2 channels); rooted ones every root.
# Then: without --transport, ranks of one host pick shm0 although RDMA
# devices exist; a rank killed (SIGKILL) during RDMA all-reduces makes the
# others fail at once with "peer rank lost" instead of hanging.
# Env: COLL_SIZES (default "-b 8 -e 512K -f 16"), COLL_ITERS (default 5).

coll_check() {  # label dev nranks test [extra args...]; env for coll-perf via COLL_ENV
  local label=$1 dev=$2 n=$3 test=$4; shift 4
  local base=$LOG/coll-${label// /_} rc t1 t2 rows bad devlines big
  t1=$(cut -d' ' -f1 /proc/uptime)
  # shellcheck disable=SC2086
  env RDMAKIT_COLL_TIMEOUT=60s RDMAKIT_COLL_BOOTSTRAP_TIMEOUT=60s ${COLL_ENV:-} \
    timeout 180 ./rdmakit coll-perf "$test" ${COLL_SIZES:--b 8 -e 512K -f 16} -n "${COLL_ITERS:-5}" -w 1 -c 1 \
    --ranks "$n" "$@" > "$base.txt" 2>&1; rc=$?
  t2=$(cut -d' ' -f1 /proc/uptime)
  rows=$(awk '!/^#/ && NF==13' "$base.txt" | wc -l)
  bad=$(awk '!/^#/ && NF==13 && ($9!="0" || $13!="0")' "$base.txt" | wc -l)
  devlines=$(grep -c "^#  Rank .* device $dev \[${COLL_TR:-ibverbs} port 1\]" "$base.txt")
  big=$(awk '!/^#/ && NF==13 {s=$1; b=$8} END {printf "%sB busbw %s GB/s", s, b}' "$base.txt")
  local secs; secs=$(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1fs", b-a}')
  if [[ $rc == 0 && $rows -gt 0 && $bad == 0 && $devlines == "$n" ]] && grep -q '^# Out of bounds values : 0 OK' "$base.txt"; then
    result ok "coll-perf $label" "rc=0 rows=$rows #wrong=0 device=$dev x$n, $big, $secs"
  else
    result FAIL "coll-perf $label" "rc=$rc rows=$rows wrong-rows=$bad device-lines=$devlines/$n $secs | $(grep -v '^#' "$base.txt" | tail -n 3 | tr '\n' ' ')"
  fi
}

if [[ -x ./rdmakit ]]; then
  for dv in "rxe $RXE" "siw $SIW"; do
    set -- $dv
    for n in 2 3; do
      for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv; do
        extra=()
        [[ $t == broadcast || $t == reduce ]] && extra=(-r -1)
        coll_check "$1 x$n $t" "$2" "$n" "$t" --transport ibverbs --hca "=$2" "${extra[@]}"
      done
      echo "# coll-perf $1 x$n done at $(elapsed)"
    done
  done
  # NCCL's variables: device and port, GID index (1: rxe_dum's IPv4-mapped RoCE v2 GID).
  COLL_ENV="NCCL_IB_HCA==$RXE:1 NCCL_IB_GID_INDEX=1" \
    coll_check "rxe x2 all_reduce NCCL_IB_HCA==$RXE:1 NCCL_IB_GID_INDEX=1" "$RXE" 2 all_reduce --transport ibverbs
  COLL_ENV="RDMAKIT_COLL_TRANSPORT=ibverbs RDMAKIT_COLL_HCA=^$RXE" \
    coll_check "siw x2 all_reduce RDMAKIT_COLL_HCA=^$RXE" "$SIW" 2 all_reduce
fi

coll_kill() {  # label dev: SIGKILL rank 1 of 3 during all-reduces over dev
  local label=$1 dev=$2 base=$LOG/coll-kill-$2 lp victim rc t1 t2 lost left secs
  RDMAKIT_COLL_TIMEOUT=60s timeout 120 ./rdmakit coll-perf all_reduce -b 1M -e 1M -n 100000 -c 0 --ranks 3 \
    --transport ibverbs --hca "=$dev" > "$base.out" 2> "$base.err" & lp=$!
  # Killed once the communicator is up (rank 0 lists the devices after
  # bootstrap) and the all-reduces run: a fixed sleep of 4 s sometimes
  # came during bootstrap on a slow guest, where the survivors fail with
  # "bootstrap failed" instead.
  for _ in $(seq 1 120); do
    grep -q '^# Using devices' "$base.out" 2>/dev/null && break
    sleep 0.5
  done
  sleep 1
  victim=$(pgrep -f "rdmakit coll-perf all_reduce -b 1M" | grep -vx "$lp" | sed -n 2p)
  t1=$(cut -d' ' -f1 /proc/uptime)
  [[ -n $victim ]] && kill -9 "$victim"
  wait "$lp"; rc=$?
  t2=$(cut -d' ' -f1 /proc/uptime)
  secs=$(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1f", b-a}')
  lost=$(grep -c 'peer rank lost' "$base.err")
  left=$(pgrep -fc "rdmakit coll-perf all_reduce -b 1M")
  if [[ -n $victim && $rc == 1 && $lost == 2 && $left == 0 ]] && awk -v s="$secs" 'BEGIN{exit !(s < 15)}'; then
    result ok "coll-perf $label" "rank 1 killed; 2 survivors failed with 'peer rank lost' ${secs}s later, launcher exit 1, no rank left"
  else
    result FAIL "coll-perf $label" "victim=${victim:-none} rc=$rc lost=$lost left=$left after ${secs}s | $(tail -n 3 "$base.err" | tr '\n' ' ')"
  fi
}

if [[ -x ./rdmakit ]]; then
  COLL_TR=shm coll_check "auto x2 all_reduce (same host: shm0 despite RDMA devices)" shm0 2 all_reduce
  coll_kill "rxe x3 rank killed" "$RXE"
  coll_kill "siw x3 rank killed" "$SIW"
fi
