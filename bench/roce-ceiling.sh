#!/usr/bin/env bash
# roce-ceiling.sh: what this host allows for 64 KiB messages between two
# processes on loopback, by the means each transport uses, next to what
# rdmakit's tcp0 and roce0 reach, all in one run (bench/ceiling/ceil.c
# says what each variant does):
#
#   tcp       one TCP stream, writev of headers + payloads, readv in place
#   udp       4112-byte datagrams, UDP GSO + sendmmsg, UDP GRO + recvmmsg,
#             a 1024-datagram window acknowledged every 256
#   udpcopy   udp + the receiver's copy of each payload into place
#   udpcrc    udpcopy + a CRC-32 over every datagram on both sides (the
#             ICRC's work), by AVX-512 VPCLMULQDQ folding where the CPU has
#             it (bench/ceiling/crcfold.h: ~45 GB/s on a 4 KiB datagram
#             here, against ~25 for Go's hash/crc32), else libdeflate's
#             or zlib's
#   tcp0      rdmakit perf write_bw --loopback -d tcp0 -s 65536 -n N
#   roce0     rdmakit perf write_bw --loopback -d roce0 -s 65536 -n N
#
#   bench/roce-ceiling.sh                    # TRIALS=5 N=4000
#   TRIALS=1 N=1000 bench/roce-ceiling.sh    # quick look
#   CEIL_SPIN=sr bench/roce-ceiling.sh       # the C programs spin rather than sleep
#
# Each trial runs every variant once, the order reversed every other
# trial. Prints per-trial MiB/s, then each variant's median [min-max] and
# its ratio to tcp0's median. If udpcrc (or even udpcopy, which stands for
# a CRC that costs nothing) stays below tcp0, no implementation of the
# roce transport on this host can reach tcp0's bandwidth: it has to do
# at least that much work. Needs gcc and zlib's headers (zlib1g-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${TRIALS:-5}; N=${N:-4000}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
gcc -O2 -Wall -o "$DIR/ceil" bench/ceiling/ceil.c -lz -ldl
go build -o "$DIR/rdmakit" ./cmd/rdmakit
export RDMAKIT_ROCE_IFACES=lo RDMAKIT_ROCE_ADDR=127.0.0.1:0
run() {  # variant -> MiB/s, or "-" (and the output on stderr) if it failed
  local out
  case $1 in
    tcp0|roce0) out=$("$DIR/rdmakit" perf write_bw --loopback -d "$1" -s 65536 -n "$N" 2>&1) || true
      out=$(awk '/#bytes/{getline; print $4; exit}' <<< "$out") ;;
    *) out=$("$DIR/ceil" "$1" "$N" 2>&1) || true
      [[ $out == *cpu_us_per_64KiB* ]] && awk -v v="$1" '{print v, $6 "/" $8}' <<< "$out" >> "$DIR/cpu"
      out=$(awk '{print $2}' <<< "$out") ;;
  esac
  if [[ $out =~ ^[0-9.]+$ ]]; then echo "$out"; else echo "$1 failed: $out" >&2; echo -; fi
}
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
VARS="tcp udp udpcopy udpcrc tcp0 roce0"
echo "CRC-32 alone: $("$DIR/ceil" crc "$N") (one core, ${N} x 64 KiB)"
declare -A R
for t in $(seq 1 "$TRIALS"); do
  order=$VARS; ((t % 2 == 0)) && order=$(tr ' ' '\n' <<< "$VARS" | tac | tr '\n' ' ')
  for v in $order; do x=$(run "$v"); R[$v]+="$x "; done
  echo "trial $t: $(for v in $VARS; do printf '%s %s  ' "$v" "$(awk -v t="$t" '{print $t}' <<< "${R[$v]}")"; done)"
done
for v in tcp udp udpcopy udpcrc; do
  echo "CPU µs per 64 KiB (user+system), sender/receiver, $v: $(awk -v v="$v" '$1 == v {printf "%s ", $2}' "$DIR/cpu" 2>/dev/null)"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
base=$(tr ' ' '\n' <<< "${R[tcp0]}" | grep '^[0-9]' | median)
for v in $VARS; do
  vals=$(tr ' ' '\n' <<< "${R[$v]}" | grep '^[0-9]')
  m=$(median <<< "$vals")
  printf '%-8s median %8.0f MiB/s [%s-%s]  /tcp0 %.2f\n' "$v" "$m" \
    "$(sort -g <<< "$vals" | head -1)" "$(sort -g <<< "$vals" | tail -1)" \
    "$(awk -v a="$m" -v b="$base" 'BEGIN{print a/b}')"
done
