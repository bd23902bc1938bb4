# kube.sh - sourced by ci-guest.sh: the operations commands on the guest's
# real rxe and siw devices. Uses result(), LOG, RXE/SIW, ./rdmakit and,
# when built, ./deviceplugin.test (the device plugin against a fake
# kubelet). RESULT lines:
#   device-plugin discovery   rdmakit device-plugin --check selects both devices,
#                             with their uverbs nodes and rdma_cm in Allocate
#   device-plugin kubelet     register / ListAndWatch / Allocate on the real devices
#   doctor                    ports ACTIVE, a RoCE v2 GID index for rxe, no FAIL
#   exporter                  port state and rxe's hw counters; tcp0 counters of a
#                             perf run with RDMAKIT_STATS_DIR
#   cni                       exclusive netns mode; ADD of rxe and siw into a pod netns
#                             (the kernel refuses: neither driver can change namespace),
#                             DEL idempotent; the mode set back to shared

kube_dp_check() {
  local cfg=$LOG/kube-dp.json out=$LOG/kube-dp-check.txt
  cat > "$cfg" <<JSON
{"configList":[{"resourceName":"soft","rdmaHcaMax":4,"selectors":{"drivers":["rdma_rxe","siw"]}},
 {"resourceName":"rxe","mode":"exclusive","selectors":{"ifNames":["$RXE"]}}]}
JSON
  ./rdmakit device-plugin --check --config "$cfg" > "$out" 2>&1; local rc=$?
  if [[ $rc == 0 ]] && grep -q "^resource rdma/soft mode=shared devices=4 .*$RXE" "$out" && grep -q "^resource rdma/soft .*$SIW" "$out" \
     && grep -q "allocate shared-0: device /dev/infiniband/uverbs" "$out" && grep -q "allocate shared-0: device /dev/infiniband/rdma_cm" "$out" \
     && grep -q "^resource rdma/rxe mode=exclusive devices=1 $RXE" "$out"; then
    result ok "device-plugin discovery" "$(grep -E "^device ($RXE|$SIW) " "$out" | cut -d' ' -f2,3,9- | tr '\n' ';')"
  else
    result FAIL "device-plugin discovery" "rc=$rc $(tr '\n' ' ' < "$out" | cut -c1-400)"
  fi
}

kube_dp_kubelet() {
  if [[ ! -x ./deviceplugin.test ]]; then result skip "device-plugin kubelet" "deviceplugin.test not built"; return; fi
  RDMAKIT_DP_REAL=1 timeout 60 ./deviceplugin.test -test.run 'TestRealDevices' -test.v > "$LOG/kube-dp-test.txt" 2>&1; local rc=$?
  if [[ $rc == 0 ]] && grep -q -- '--- PASS: TestRealDevices' "$LOG/kube-dp-test.txt"; then
    result ok "device-plugin kubelet" "$(grep -o 'rdma/[a-z]*: ids.*' "$LOG/kube-dp-test.txt" | tr '\n' ';')"
  else
    result FAIL "device-plugin kubelet" "rc=$rc $(grep -E -- '--- FAIL|_test.go:[0-9]+' "$LOG/kube-dp-test.txt" | head -5 | tr '\n' ' ')"
  fi
}

kube_doctor() {
  ./rdmakit doctor > "$LOG/kube-doctor.txt" 2>&1; local rc=$?
  cat "$LOG/kube-doctor.txt"
  if grep -q "^PASS  port $RXE/1 ACTIVE" "$LOG/kube-doctor.txt" && grep -q "^PASS  port $SIW/1 ACTIVE" "$LOG/kube-doctor.txt" \
     && grep -q "^PASS  RoCE v2 GID index [0-9]* .* on $RXE/1" "$LOG/kube-doctor.txt"; then
    result ok "doctor" "rc=$rc $(tail -1 "$LOG/kube-doctor.txt"); FAIL lines: $(grep -c '^FAIL' "$LOG/kube-doctor.txt")"
  else
    result FAIL "doctor" "rc=$rc $(grep -E '^(FAIL|WARN)' "$LOG/kube-doctor.txt" | head -4 | tr '\n' ' ')"
  fi
}

kube_scrape() {  # port -> stdout: the /metrics body
  exec 5<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&5
  timeout 10 cat <&5
  exec 5<&-
}

kube_exporter() {
  local sd=$LOG/kube-stats port=19879 m=$LOG/kube-metrics.txt
  mkdir -p "$sd"
  RDMAKIT_STATS_DIR=$sd timeout 30 ./rdmakit perf send_bw --loopback -D 2 -d tcp0 > "$LOG/kube-perf-stats.txt" 2>&1
  ./rdmakit exporter --listen 127.0.0.1:$port --stats-dir "$sd" 2> "$LOG/kube-exporter.txt" & local ep=$!
  for _ in $(seq 1 50); do grep -q serving "$LOG/kube-exporter.txt" && break; sleep 0.1; done
  kube_scrape $port > "$m" 2>&1
  kill -TERM $ep; wait $ep; local erc=$?
  local st hw tx
  st=$(grep -c "^rdma_port_state{device=\"\($RXE\|$SIW\)\",port=\"1\"} 4" "$m")
  hw=$(grep -m1 "^rdma_hw_sent_pkts_total{device=\"$RXE\"" "$m")
  tx=$(grep -m1 '^rdmakit_transport_tx_bytes_total{device="tcp0"' "$m")
  if [[ $st == 2 && -n $hw && -n $tx && $erc == 143 ]]; then
    result ok "exporter" "port state 4 for $RXE and $SIW; $hw; $tx"
  else
    result FAIL "exporter" "states=$st hw='$hw' tx='$tx' exit=$erc $(head -c 300 "$m" | tr '\n' ' ')"
  fi
}

kube_cni() {
  local mode out ns=kubepod st=$LOG/kube-cni-state
  mode=$(rdma system show 2>&1 | grep -o 'netns [a-z]*' | cut -d' ' -f2)
  if ! out=$(rdma system set netns exclusive 2>&1); then
    result skip "cni" "rdma system set netns exclusive: $out (the kernel refuses while other network namespaces exist)"
    return
  fi
  ip netns add $ns
  local conf='{"cniVersion":"1.0.0","name":"rdma","type":"rdmakit-cni","stateDir":"'$st'","rdmaDevice":"DEV","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"net1","sandbox":"/run/netns/'$ns'"}]}}'
  local d res="" ok=1
  ln -sf "$PWD/rdmakit" "$LOG/rdmakit-cni"
  for d in $RXE $SIW; do
    out=$(echo "${conf/DEV/$d}" | RDMAKIT_CNI_STATE_ROOT=$LOG CNI_COMMAND=ADD CNI_CONTAINERID=c-$d CNI_NETNS=/run/netns/$ns CNI_IFNAME=net1 CNI_PATH=/opt/cni/bin "$LOG/rdmakit-cni" 2>&1); local arc=$?
    echo "cni ADD $d: rc=$arc $out"
    local drc=0
    for _ in 1 2; do
      echo "${conf/DEV/$d}" | RDMAKIT_CNI_STATE_ROOT=$LOG CNI_COMMAND=DEL CNI_CONTAINERID=c-$d CNI_NETNS=/run/netns/$ns CNI_IFNAME=net1 CNI_PATH=/opt/cni/bin "$LOG/rdmakit-cni" > /dev/null 2>&1 || drc=$?
    done
    if [[ $arc == 0 ]]; then
      res+="$d moved into the pod netns and back (DEL rc=$drc); "
      [[ $drc == 0 ]] && rdma dev show "$d" > /dev/null 2>&1 || ok=0
    elif grep -q "driver $( [[ $d == "$RXE" ]] && echo rdma_rxe || echo siw)" <<<"$out"; then
      res+="$d refused, kernel says: $(grep -o 'moving RDMA device[^(]*' <<<"$out" | head -1); "
      [[ $drc == 0 ]] || ok=0
    else
      res+="$d: unexpected rc=$arc $out; "; ok=0
    fi
  done
  ip netns del $ns
  local back=""
  for _ in $(seq 1 50); do back=$(rdma system set netns "${mode:-shared}" 2>&1) && break; sleep 0.2; done
  if [[ $ok == 1 ]]; then result ok "cni" "$res mode back to ${mode:-shared} $back"
  else result FAIL "cni" "$res $back"; fi
}

kube_dp_check
kube_dp_kubelet
kube_doctor
kube_exporter
kube_cni
