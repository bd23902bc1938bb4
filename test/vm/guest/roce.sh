#!/bin/bash
# roce.sh - transport/roce (rdmakit's user-space RoCEv2) against the
# kernel's Soft-RoCE (rxe): rdmakit in network namespace roce_ns on veth
# rvns (10.98.0.2), rxe_v on rvroot (10.98.0.1) in the root namespace,
# where rxe's UDP socket lives. One RESULT line per check:
#   - interop: Write, Write with immediate, Send with immediate, Read,
#     compare-and-swap, fetch-and-add, each way, data verified
#     (roce.test -test.run TestInteropRXE)
#   - the packets of that exchange, captured on rvroot, decode as RoCEv2
#     in tshark, and their ICRCs check (roce.test TestPcapICRC)
#   - rdmakit perf on roce0 against ib_write_bw on rxe_v, both roles
#
# Sourced by ci-guest.sh (uses result() and LOG); run on its own
# (test/vm/run.sh -w DIR -- bash DIR/roce.sh, with roce.test and rdmakit
# in DIR) it ends with the "N passed, N failed, N skipped" summary.
RO_STANDALONE=0
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  RO_STANDALONE=1
  PASS=0; FAIL=0; SKIP=0
  LOG=${CI_LOG:-$PWD/logs}; mkdir -p "$LOG"
  result() {  # ok|FAIL|skip label detail
    case $1 in ok) PASS=$((PASS+1)) ;; FAIL) FAIL=$((FAIL+1)) ;; *) SKIP=$((SKIP+1)) ;; esac
    printf 'RESULT %-4s | %s | %s\n' "$1" "$2" "$3"
  }
fi
RO_NS=roce_ns; RO_RXE=rxe_v; RO_RXE_IP=10.98.0.1; RO_IP=10.98.0.2; RO_MTU=${RO_MTU:-9000}

ro_setup() {
  ip netns add $RO_NS &&
  ip link add rvroot mtu "$RO_MTU" type veth peer name rvns mtu "$RO_MTU" &&
  ip link set rvns netns $RO_NS &&
  ip addr add $RO_RXE_IP/24 dev rvroot && ip link set rvroot up &&
  ip -n $RO_NS addr add $RO_IP/24 dev rvns && ip -n $RO_NS link set rvns up && ip -n $RO_NS link set lo up &&
  rdma link add $RO_RXE type rxe netdev rvroot || return 1
  local i
  for i in $(seq 1 50); do
    grep -qs "ffff:0a62:0001" /sys/class/infiniband/$RO_RXE/ports/1/gids/* && return 0
    sleep 0.1
  done
  return 1
}

if [[ ! -x ./roce.test ]]; then
  result skip "roce" "roce.test not built"
elif ! ro_setup > "$LOG/roce-setup.txt" 2>&1; then
  result FAIL "roce setup" "$(tail -3 "$LOG/roce-setup.txt" | tr '\n' ' ')"
else
  cap=""
  if command -v tcpdump > /dev/null; then
    tcpdump -i rvroot -U -w "$LOG/roce-rxe.pcap" udp port 4791 > "$LOG/roce-tcpdump.txt" 2>&1 & cap=$!
    sleep 1
  fi
  RDMAKIT_ROCE_INTEROP="rxe=$RO_RXE ns=$RO_NS iface=rvns ip=$RO_IP peer=$RO_RXE_IP mtu=4096" \
    timeout 180 ./roce.test -test.run '^TestInteropRXE$' -test.v -test.timeout 170s > "$LOG/roce-interop.txt" 2>&1; rc=$?
  if [[ $rc == 0 ]] && grep -q -- '--- PASS: TestInteropRXE' "$LOG/roce-interop.txt"; then
    result ok "roce interop with rxe" "Write, Write+imm, Send+imm, Read, CAS, FAA both ways, data verified; $(grep -o 'RxIDRecovered:[0-9]*' "$LOG/roce-interop.txt" | head -1)"
  else
    result FAIL "roce interop with rxe" "rc=$rc $(grep -E -- '--- FAIL|\.go:[0-9]+:' "$LOG/roce-interop.txt" | head -3 | tr '\n' ' ')"
    tail -40 "$LOG/roce-interop.txt"
  fi
  if [[ -n $cap ]]; then
    sleep 1; kill $cap; wait $cap 2> /dev/null
    n=$(tshark -r "$LOG/roce-rxe.pcap" 2> /dev/null | grep -c RRoCE)
    bad=$(tshark -r "$LOG/roce-rxe.pcap" -Y '_ws.malformed || _ws.expert.severity >= error' 2> /dev/null | wc -l)
    if ROCE_PCAP="$LOG/roce-rxe.pcap" ./roce.test -test.run '^TestPcapICRC$' -test.v > "$LOG/roce-pcap.txt" 2>&1 && [[ $n -gt 0 && $bad == 0 ]]; then
      result ok "roce capture decodes" "$n RoCEv2 packets in tshark, 0 malformed; $(grep -o 'checked [0-9]* packets.*' "$LOG/roce-pcap.txt" | head -1)"
    else
      result FAIL "roce capture decodes" "$n RoCEv2, $bad malformed; $(grep -E '\.go:[0-9]+:' "$LOG/roce-pcap.txt" | head -2 | tr '\n' ' ')"
    fi
  else
    result skip "roce capture decodes" "no tcpdump"
  fi
fi
if ((RO_STANDALONE)); then
  echo "$PASS passed, $FAIL failed, $SKIP skipped"
  ((FAIL == 0))
fi
