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
#   - the same exchange, 2 rounds, then 256 MiB of Writes and Reads (each
#     side 128 MiB, every chunk read back and checked), with netem losing
#     5%, duplicating 2% and reordering 2% of the datagrams on both veth
#     ends (where the guest kernel has no netem: nftables dropping 5%
#     each way, 8 rounds)
#   - ECN: rdmakit roce on both ends of the veth, netem marking 2% of the
#     datagrams CE: CNPs come back and DCQCN cuts the rate (TestInteropECN)
#   - side by side, write_bw 64 KiB: rdmakit perf roce0 <-> roce0 across
#     the veth, and ib_write_bw on rxe_v (both ends on rxe)
#   - rdmakit perf on roce0 against perftest on rxe_v, both roles
#     (roce-perftest.sh)
#
# Sourced by ci-guest.sh (uses result() and LOG); run on its own
# (test/vm/run.sh -w DIR -- bash DIR/roce.sh, with roce.test and rdmakit
# in DIR) it ends with the "N passed, N failed, N skipped" summary.
RO_STANDALONE=0
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  RO_STANDALONE=1
  # shellcheck source=standalone.sh
  . "$(dirname "${BASH_SOURCE[0]}")/standalone.sh"
fi
RO_NS=roce_ns; RO_RXE=rxe_v; RO_RXE_IP=10.98.0.1; RO_IP=10.98.0.2; RO_MTU=${RO_MTU:-9000}

# wait_port PORT [NETNS]: until a TCP listener is on PORT (up to 20 s).
wait_port() {
  local i ns=()
  [[ -n ${2:-} ]] && ns=(ip netns exec "$2")
  for i in $(seq 1 200); do
    "${ns[@]}" ss -ltnH 2> /dev/null | awk '{print $4}' | grep -q ":$1\$" && return 0
    sleep 0.1
  done
  return 1
}

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

# RO_DEFS_ONLY=1: only the settings and ro_setup (roce-cm.sh on its own).
[[ -n ${RO_DEFS_ONLY:-} ]] && return 0
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
ro_interop() {  # label rounds [ip peer [extra]]
  RDMAKIT_ROCE_INTEROP="rxe=$RO_RXE ns=$RO_NS iface=rvns ip=${3:-$RO_IP} peer=${4:-$RO_RXE_IP} mtu=4096 rounds=$2 ${5:-}" \
    timeout "${RO_TIMEOUT:-300}" ./roce.test -test.run '^TestInteropRXE$' -test.v -test.timeout "$((${RO_TIMEOUT:-300} - 10))s" > "$LOG/roce-interop-$1.txt" 2>&1
}
# The same exchange over IPv6 (RoCEv2 GIDs fd00:98::1 and fd00:98::2).
if [[ -x ./roce.test && -e /sys/class/infiniband/$RO_RXE ]]; then
  ip -6 addr add fd00:98::1/64 dev rvroot nodad 2> "$LOG/roce-v6.txt" &&
    ip -n $RO_NS -6 addr add fd00:98::2/64 dev rvns nodad 2>> "$LOG/roce-v6.txt"
  for i in $(seq 1 50); do grep -qs "fd00:0098:0000:0000:0000:0000:0000:0001" /sys/class/infiniband/$RO_RXE/ports/1/gids/* && break; sleep 0.1; done
  ro_interop v6 1 fd00:98::2 fd00:98::1; rc=$?
  f=$LOG/roce-interop-v6.txt
  if [[ $rc == 0 ]] && grep -q -- '--- PASS: TestInteropRXE' "$f"; then
    result ok "roce interop with rxe over IPv6" "Write, Write+imm, Send+imm, Read, CAS, FAA both ways, data verified; $(grep -o 'RxIDRecovered:[0-9]*' "$f" | head -1)"
  else
    result FAIL "roce interop with rxe over IPv6" "rc=$rc $(grep -E -- '--- FAIL|\.go:[0-9]+:' "$f" | head -3 | tr '\n' ' ')"
    tail -20 "$f"
  fi
fi
if [[ -x ./roce.test && -e /sys/class/infiniband/$RO_RXE ]]; then
  if modprobe sch_netem > "$LOG/roce-netem.txt" 2>&1 &&
     tc qdisc add dev rvroot root netem loss 5% duplicate 2% reorder 2% delay 1ms 2>> "$LOG/roce-netem.txt" &&
     ip netns exec $RO_NS tc qdisc add dev rvns root netem loss 5% duplicate 2% reorder 2% delay 1ms 2>> "$LOG/roce-netem.txt"; then
    rxe_hw=/sys/class/infiniband/$RO_RXE/ports/1/hw_counters
    rxe_ctr() { local c v out=""; for c in completer_retry_err rcvd_seq_err duplicate_request out_of_seq_request; do v=$(cat "$rxe_hw/$c" 2> /dev/null) && out+="$c:$v "; done; echo "$out"; }
    before=$(rxe_ctr)
    # A 17 ms ACK timeout (12) instead of perftest's 67 ms: a lost last
    # packet of a chunk costs one timeout, and there are hundreds.
    RO_TIMEOUT=900 ro_interop netem 2 "$RO_IP" "$RO_RXE_IP" "bulk=256 timeout=12"; rc=$?
    f=$LOG/roce-interop-netem.txt
    drops="netem dropped $(tc -s qdisc show dev rvroot | grep -o 'dropped [0-9]*' | head -1 | cut -d' ' -f2) toward rdmakit, $(ip netns exec $RO_NS tc -s qdisc show dev rvns | grep -o 'dropped [0-9]*' | head -1 | cut -d' ' -f2) toward rxe"
    if [[ $rc == 0 ]] && grep -q -- '--- PASS: TestInteropRXE' "$f"; then
      result ok "roce interop with rxe, netem loss 5% dup 2% reorder 2%, 256 MiB" "$(grep -o 'bulk: .*' "$f" | head -1 | cut -c1-140); $drops; roce $(grep -o 'Retransmits:[0-9]*' "$f" | head -1); rxe before: $before after: $(rxe_ctr)"
    else
      result FAIL "roce interop with rxe, netem loss 5% dup 2% reorder 2%, 256 MiB" "rc=$rc $drops $(grep -E -- '--- FAIL|\.go:[0-9]+:' "$f" | head -3 | tr '\n' ' ')"
      tail -20 "$f"
    fi
    # ECN: rdmakit on both ends of the veth (its root end on port 4792),
    # the link toward the namespace marking 2% of the datagrams CE.
    ip netns exec $RO_NS tc qdisc del dev rvns root 2> /dev/null
    tc qdisc replace dev rvroot root netem loss 2% ecn 2>> "$LOG/roce-netem.txt"
    RDMAKIT_ROCE_ECN="ns=$RO_NS iface=rvns ip=$RO_IP rootiface=rvroot rootip=$RO_RXE_IP mib=32" \
      timeout 300 ./roce.test -test.run '^TestInteropECN$' -test.v -test.timeout 290s > "$LOG/roce-ecn.txt" 2>&1; rc=$?
    marked=$(tc -s qdisc show dev rvroot | grep -o 'ecn_mark [0-9]*' | head -1)
    if [[ $rc == 0 ]] && grep -q -- '--- PASS: TestInteropECN' "$LOG/roce-ecn.txt"; then
      result ok "roce ECN: netem marks CE, DCQCN cuts" "${marked:-} $(grep -o 'wrote and read back.*' "$LOG/roce-ecn.txt" | head -1)"
    else
      result FAIL "roce ECN: netem marks CE, DCQCN cuts" "rc=$rc ${marked:-} $(grep -E -- '--- FAIL|\.go:[0-9]+:' "$LOG/roce-ecn.txt" | head -3 | tr '\n' ' ')"
      tail -20 "$LOG/roce-ecn.txt"
    fi
    tc qdisc del dev rvroot root 2> /dev/null; ip netns exec $RO_NS tc qdisc del dev rvns root 2> /dev/null
  elif command -v nft > /dev/null && modprobe nft_numgen >> "$LOG/roce-netem.txt" 2>&1 &&
       nft -f - >> "$LOG/roce-netem.txt" 2>&1 <<'NFT' &&
table inet roce_lossy {
  chain out { type filter hook output priority 0; udp dport 4791 numgen random mod 20 == 0 counter drop; }
}
NFT
       ip netns exec $RO_NS nft -f - >> "$LOG/roce-netem.txt" 2>&1 <<'NFT'
table inet roce_lossy {
  chain out { type filter hook output priority 0; udp dport 4791 numgen random mod 20 == 0 counter drop; }
}
NFT
  then
    # No netem in this kernel: nftables drops 5% of the RoCEv2 datagrams
    # each way instead (loss only, no duplication or reordering).
    ro_interop nft 8; rc=$?
    f=$LOG/roce-interop-nft.txt
    drops="rxe side dropped $(nft list table inet roce_lossy 2> /dev/null | grep -o 'packets [0-9]*' | head -1), roce side dropped $(ip netns exec $RO_NS nft list table inet roce_lossy 2> /dev/null | grep -o 'packets [0-9]*' | head -1)"
    if [[ $rc == 0 ]] && grep -q -- '--- PASS: TestInteropRXE' "$f"; then
      result ok "roce interop with rxe, 5% loss each way (nftables)" "8 rounds both ways, data verified; $drops; $(grep -o 'Retransmits:[0-9]*' "$f" | head -1)"
    else
      result FAIL "roce interop with rxe, 5% loss each way (nftables)" "rc=$rc $drops $(grep -E -- '--- FAIL|\.go:[0-9]+:' "$f" | head -3 | tr '\n' ' ')"
      tail -20 "$f"
    fi
    nft delete table inet roce_lossy 2> /dev/null; ip netns exec $RO_NS nft delete table inet roce_lossy 2> /dev/null
  else
    result skip "roce interop with rxe, netem" "no netem nor nftables in this guest: $(tr '\n' ' ' < "$LOG/roce-netem.txt" | cut -c1-160)"
  fi
  # Loss at the roce side's socket instead (a test double: 5% of what it
  # sends and of what arrives dropped, 2% of what it sends duplicated,
  # 2% reordered), so that rxe's retransmissions are exercised too.
  ro_interop lossy 8 "$RO_IP" "$RO_RXE_IP" lossy=1; rc=$?
  f=$LOG/roce-interop-lossy.txt
  if [[ $rc == 0 ]] && grep -q -- '--- PASS: TestInteropRXE' "$f"; then
    result ok "roce interop with rxe, lossy socket (5% loss each way, 2% dup, 2% reorder)" "8 rounds both ways, data verified; $(grep -o 'sent [0-9]* dropped.*' "$f" | head -1); $(grep -o 'Retransmits:[0-9]*' "$f" | head -1)"
  else
    result FAIL "roce interop with rxe, lossy socket" "rc=$rc $(grep -E -- '--- FAIL|\.go:[0-9]+:' "$f" | head -3 | tr '\n' ' ')"
    tail -20 "$f"
  fi
fi
if [[ -x ./rdmakit && -e /sys/class/infiniband/$RO_RXE ]]; then
  p=18790
  ip netns exec $RO_NS env RDMAKIT_ROCE_IFACES=rvns RDMAKIT_ROCE_ADDR=$RO_IP \
    timeout 120 ./rdmakit perf write_bw -d roce0 -s 65536 -n 1000 -p $p > "$LOG/roce-perf.server" 2>&1 & sp=$!
  wait_port $p $RO_NS
  RDMAKIT_ROCE_IFACES=rvroot RDMAKIT_ROCE_ADDR=$RO_RXE_IP:4792 \
    timeout 120 ./rdmakit perf write_bw -d roce0 -s 65536 -n 1000 -p $p $RO_IP > "$LOG/roce-perf.client" 2>&1; rc=$?
  wait $sp; src=$?
  rk=$(awk '/#bytes/{getline; print $4; exit}' "$LOG/roce-perf.client")
  if [[ $rc == 0 && $src == 0 && -n $rk ]]; then result ok "rdmakit perf write_bw 64K roce0<->roce0 over veth" "$rk MiB/s"
  else result FAIL "rdmakit perf write_bw 64K roce0<->roce0 over veth" "rc=$rc/$src $(tail -q -n 2 "$LOG/roce-perf.client" "$LOG/roce-perf.server" | tr '\n' ' ')"; fi
  gidx=$(grep -l "ffff:0a62:0001" /sys/class/infiniband/$RO_RXE/ports/1/gids/* 2> /dev/null | head -1 | xargs -r basename)
  RO_GIDX=$gidx
  if command -v ib_write_bw > /dev/null && [[ -n $gidx ]]; then
    taskset -c 0 timeout 120 ib_write_bw -d $RO_RXE -x "$gidx" -F -s 65536 -n 1000 -p 18791 > "$LOG/roce-rxe-perf.server" 2>&1 & sp=$!
    wait_port 18791
    taskset -c 1 timeout 120 ib_write_bw -d $RO_RXE -x "$gidx" -F -s 65536 -n 1000 -p 18791 127.0.0.1 > "$LOG/roce-rxe-perf.client" 2>&1; rc=$?
    wait $sp
    px=$(awk '/#bytes/{getline; print $4; exit}' "$LOG/roce-rxe-perf.client")
    if [[ $rc == 0 && -n $px ]]; then
      result ok "ib_write_bw 64K on rxe_v (both ends)" "$px MiB/s; rdmakit roce / rxe = $(awk -v a="${rk:-0}" -v b="$px" 'BEGIN{printf "%.2f", a/b}')"
    else
      result FAIL "ib_write_bw 64K on rxe_v (both ends)" "rc=$rc $(tail -n 2 "$LOG/roce-rxe-perf.client" | tr '\n' ' ')"
    fi
  else
    result skip "ib_write_bw 64K on rxe_v" "no ib_write_bw or no GID"
  fi
fi
if [[ -e /sys/class/infiniband/$RO_RXE && -f "$(dirname "${BASH_SOURCE[0]}")/roce-perftest.sh" ]]; then
  # shellcheck source=roce-perftest.sh
  . "$(dirname "${BASH_SOURCE[0]}")/roce-perftest.sh"
fi
if ((RO_STANDALONE)); then
  standalone_summary
fi
