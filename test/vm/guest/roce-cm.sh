#!/bin/bash
# roce-cm.sh - the RDMA CM over RoCE (transport/roce's CM, MADs over UD
# QP 1) against the kernel's: rdmakit in network namespace roce_ns on veth
# rvns (10.98.0.2), rxe_v on rvroot (10.98.0.1) in the root namespace, as
# roce.sh sets them up (set up here if roce.sh did not run first).
#   - rping (rdmacm-utils, rxe) client -> rdmakit ping -s on roce0: 10
#     pings, data verified by both (rping -V, and rdmakit's echo)
#   - rdmakit ping -c on roce0 -> rping -s (rxe): 10 pings, verified
#   - rdmakit perf -d roce0 -R against perftest -R on rxe_v (write_bw,
#     read_bw, send_bw at 64 KiB), rdmakit as server and as client: the
#     exchange and the test QPs connect through the CM; each passes when
#     both ends exit 0 and the client prints its result line
#   - the CM exchange, captured on rvroot, decodes in tshark as InfiniBand
#     CM MADs (ConnectRequest, ConnectReply, ReadyToUse, DisconnectRequest,
#     DisconnectReply) with no malformed packet
#
# Sourced by ci-guest.sh (uses result() and LOG); run on its own
# (test/vm/run.sh -w DIR -- bash DIR/roce-cm.sh, with rdmakit and the
# guest scripts in DIR) it ends with the "N passed, N failed, N skipped"
# summary.
RC_STANDALONE=0
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  RC_STANDALONE=1
  # shellcheck source=standalone.sh
  . "$(dirname "${BASH_SOURCE[0]}")/standalone.sh"
fi
RC_HERE=$(dirname "${BASH_SOURCE[0]}")
# roce.sh's settings and setup (RO_NS, RO_IP, RO_RXE, RO_RXE_IP, ro_setup).
RO_DEFS_ONLY=1 . "$RC_HERE/roce.sh"

rc_wait_cm_listen() {  # port: until an rdma_cm LISTEN id on port (or 2 s)
  local i
  for i in $(seq 1 40); do
    rdma res show cm_id 2> /dev/null | grep -q "state LISTEN.*:$1 " && return 0
    sleep 0.05
  done
  return 1
}

# rc_ping label server(rdmakit|rping)
rc_ping() {
  local label=$1 srv=$2 p=$((7400 + PASS + FAIL + SKIP)) rc src cnt sp
  local base=$LOG/roce-cm-ping-$srv
  local rk=(ip netns exec "$RO_NS" env RDMAKIT_ROCE_IFACES=rvns RDMAKIT_ROCE_ADDR="$RO_IP" ./rdmakit ping --dev roce0 -p "$p" -v -d)
  if [[ $srv == rdmakit ]]; then
    timeout 60 "${rk[@]}" -s -a "$RO_IP" > "$base.server" 2>&1 & sp=$!
    sleep 1 # no socket to wait for: the CM shares the device's UDP socket
    timeout 60 rping -c -a "$RO_IP" -p "$p" -C 10 -v -V > "$base.client" 2>&1; rc=$?
    cnt=$(grep -c 'ping data' "$base.client")
  else
    timeout 60 rping -s -a "$RO_RXE_IP" -p "$p" -C 10 -v -V > "$base.server" 2>&1 & sp=$!
    rc_wait_cm_listen "$p" || sleep 1
    timeout 60 "${rk[@]}" -c -a "$RO_RXE_IP" -C 10 > "$base.client" 2>&1; rc=$?
    cnt=$(grep -c 'ping data' "$base.server")
  fi
  wait "$sp"; src=$?
  if [[ $rc == 0 && $src == 0 && $cnt == 10 ]]; then
    result ok "$label" "10/10 pings, data verified ($srv server)"
  else
    result FAIL "$label" "rc=$rc/$src pings=$cnt | $(tail -q -n 3 "$base.client" "$base.server" | tr '\n' ' ')"
  fi
}

rc_line() {  # file: the last result line after the "#bytes" header
  awk '/#bytes/{h=1; next} h && /^ *[0-9]/{l=$0} END{print l}' "$1" | tr -s ' '
}

# rc_perf test server(rdmakit|perftest)
rc_perf() {
  local test=$1 srv=$2 p=$((18700 + PASS + FAIL + SKIP)) sp rc src
  local base=$LOG/roce-cm-perf-$test-$srv
  local r=(ip netns exec "$RO_NS" env RDMAKIT_ROCE_IFACES=rvns RDMAKIT_ROCE_ADDR="$RO_IP"
    ./rdmakit perf "$test" -d roce0 -R -n 200 -s 65536 -p "$p")
  local q=(ib_"$test" -d "$RO_RXE" -R -F -n 200 -s 65536 -p "$p")
  if [[ $srv == rdmakit ]]; then
    timeout 60 "${r[@]}" > "$base.server" 2>&1 & sp=$!
    sleep 1
    timeout 60 "${q[@]}" "$RO_IP" > "$base.client" 2>&1; rc=$?
  else
    timeout 60 "${q[@]}" > "$base.server" 2>&1 & sp=$!
    rc_wait_cm_listen "$p" || sleep 1
    timeout 60 "${r[@]}" "$RO_RXE_IP" > "$base.client" 2>&1; rc=$?
  fi
  wait "$sp"; src=$?
  local cl label="rdmakit perf roce0 -R <-> perftest -R rxe $test 64K ($srv server)"
  cl=$(rc_line "$base.client")
  if [[ $rc == 0 && $src == 0 && -n $cl ]]; then
    result ok "$label" "client:$cl"
  else
    result FAIL "$label" "rc=$rc/$src $(tail -q -n 2 "$base.client" "$base.server" | tr '\n' ' ')"
  fi
}

if [[ ! -x ./rdmakit ]]; then
  result skip "roce RDMA CM" "rdmakit not built"
elif ! command -v rping > /dev/null; then
  result skip "roce RDMA CM" "no rping (rdmacm-utils)"
elif [[ ! -e /sys/class/infiniband/$RO_RXE ]] && ! ro_setup > "$LOG/roce-cm-setup.txt" 2>&1; then
  result FAIL "roce RDMA CM setup" "$(tail -3 "$LOG/roce-cm-setup.txt" | tr '\n' ' ')"
else
  cap=""
  if command -v tcpdump > /dev/null; then
    tcpdump -i rvroot -U -w "$LOG/roce-cm.pcap" udp port 4791 > "$LOG/roce-cm-tcpdump.txt" 2>&1 & cap=$!
    sleep 1
  fi
  rc_ping "roce CM: rping (rxe) -> rdmakit ping -s (roce0)" rdmakit
  rc_ping "roce CM: rdmakit ping -c (roce0) -> rping -s (rxe)" rping
  if command -v ib_write_bw > /dev/null; then
    for t in write_bw read_bw send_bw; do
      rc_perf "$t" rdmakit
      rc_perf "$t" perftest
    done
  else
    result skip "rdmakit perf -R <-> perftest -R" "no perftest"
  fi
  if [[ -n $cap ]]; then
    sleep 1; kill $cap; wait $cap 2> /dev/null
    msgs=$(tshark -r "$LOG/roce-cm.pcap" -Y 'infiniband.mad.mgmtclass == 0x07' -T fields -e infiniband.mad.attributeid 2> /dev/null | sort | uniq -c | awk '{printf "%s:%s ", $2, $1}')
    # (perftest's messages in RC Sends would be taken for RPC-over-RDMA.)
    bad=$(tshark --disable-protocol rpcordma -r "$LOG/roce-cm.pcap" -Y '_ws.malformed || _ws.expert.severity >= error' 2> /dev/null | wc -l)
    # REQ, REP, RTU, DREQ and DREP (IBTA CM attribute IDs) must all be there.
    missing=""
    for id in 0x0010 0x0013 0x0014 0x0015 0x0016; do
      [[ " $msgs" == *" $id:"* ]] || missing+=" $id"
    done
    if [[ -z $missing && $bad == 0 ]]; then
      result ok "roce CM capture decodes" "CM MADs by attribute ID: $msgs; 0 malformed"
    else
      result FAIL "roce CM capture decodes" "CM MADs: ${msgs:-none}; missing:${missing:- none}; $bad malformed"
    fi
  else
    result skip "roce CM capture decodes" "no tcpdump"
  fi
fi
if ((RC_STANDALONE)); then
  standalone_summary
fi
