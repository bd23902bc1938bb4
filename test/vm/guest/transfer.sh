# transfer.sh - sourced by ci-guest.sh: the transfer engine and the KV store
# (rdmakit transfer bench, rdmakit kv bench) over the RDMA devices, forced
# with --device so that nodes of this one guest use rxe/siw instead of shm0.
# Uses result(), LOG, RXE/SIW. One RESULT per (device, check): exit 0 and
# the result line (GB/s; GET and PUT ops/s).

transfer_check() {  # label dev args...
  local label=$1 dev=$2; shift 2
  local base=$LOG/transfer-${label// /_} rc
  timeout 120 ./rdmakit "$@" --device "$dev" > "$base.txt" 2>&1; rc=$?
  local line; line=$(grep -E '^(Test completed|GET:)' "$base.txt" | tr '\n' ' ')
  if [[ $rc == 0 && -n $line ]] && { [[ $1 != kv ]] || grep -q '^PUT:' "$base.txt"; }; then
    result ok "$label" "$line"
  else
    result FAIL "$label" "rc=$rc $(tail -n 3 "$base.txt" | tr '\n' ' ')"
  fi
}

if [[ -x ./rdmakit ]]; then
  for dv in "rxe $RXE" "siw $SIW"; do
    set -- $dv
    transfer_check "transfer bench read $1" "$2" transfer bench --op read --block-size 65536 --batch-size 16 --threads 2 --duration 2s
    transfer_check "transfer bench write $1" "$2" transfer bench --op write --block-size 1048576 --batch-size 4 --threads 1 --duration 2s
    transfer_check "kv bench $1" "$2" kv bench --size 262144 --clients 2 --ops 200
  done
fi
