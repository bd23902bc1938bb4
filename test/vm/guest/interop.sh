# interop.sh - sourced by ci-guest.sh: rdmakit against the Debian tools on
# the same devices. Uses result(), LOG, RXE/SIW and their addresses.
#   rping (rdmacm-utils) <-> rdmakit ping, both roles, on rxe and siw.

wait_cm_listen() {  # port: until an rdma_cm LISTEN id on port (or 2 s)
  local i
  for i in $(seq 1 40); do
    rdma res show cm_id 2>/dev/null | grep -q "state LISTEN.*:$1 " && return 0
    sleep 0.05
  done
  return 1
}

ping_interop() {  # label addr server(rdmakit|rping)
  local label=$1 addr=$2 srv=$3 p=$((7300 + PASS + FAIL + SKIP)) rc src cnt sp
  local base=$LOG/ping-$label
  if [[ $srv == rdmakit ]]; then
    timeout 90 ./rdmakit ping -s -a "$addr" -p "$p" -v > "$base.server" 2>&1 & sp=$!
    wait_cm_listen "$p" || sleep 1
    timeout 90 rping -c -a "$addr" -p "$p" -C 10 -v -V > "$base.client" 2>&1; rc=$?
  else
    timeout 90 rping -s -a "$addr" -p "$p" -C 10 -v -V > "$base.server" 2>&1 & sp=$!
    wait_cm_listen "$p" || sleep 1
    timeout 90 ./rdmakit ping -c -a "$addr" -p "$p" -C 10 -v > "$base.client" 2>&1; rc=$?
  fi
  wait "$sp"; src=$?
  cnt=$(grep -c 'ping data' "$base.client")
  if [[ $rc == 0 && $src == 0 && $cnt == 10 ]]; then
    result ok "ping $label" "$cnt/10 pings ($srv server)"
  else
    result FAIL "ping $label" "rc=$rc/$src pings=$cnt | $(tail -q -n 2 "$base.client" "$base.server" | tr '\n' ' ')"
  fi
}

ping_interop "rxe rping->rdmakit" "$RXE_IP" rdmakit
ping_interop "rxe rdmakit->rping" "$RXE_IP" rping
ping_interop "siw rping->rdmakit" "$SIW_IP" rdmakit
ping_interop "siw rdmakit->rping" "$SIW_IP" rping
echo "# interop done at $(elapsed)"
