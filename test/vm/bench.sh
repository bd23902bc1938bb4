#!/usr/bin/env bash
# bench.sh - rdmakit perf vs perftest on the same rxe device in one guest
# run (write_bw 4 KiB and 64 KiB; write_lat, send_lat 8 B, 4 KiB, 64 KiB);
# prints a table with ratios. TCG is slow: only the ratios mean anything.
# See docs/benchmarks.md. BENCH_* variables (guest/bench.sh) are passed to
# the guest. Boot it under the shared lock:
#   flock /tmp/rdmakit-guest.lock test/vm/bench.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export RDMAVM_CACHE=${RDMAVM_CACHE:-/tmp/rdmakit-vm}
bash "$HERE/build.sh" >&2
WORK=$(mktemp -d /tmp/rdmakit-vm-bench.XXXXXX)
trap 'rm -rf /tmp/rdmakit-bench-logs.last; cp -r "$WORK/bench-logs" /tmp/rdmakit-bench-logs.last 2>/dev/null; rm -rf "$WORK"' EXIT
cp "$HERE"/guest/*.sh "$WORK/"
( cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$WORK/rdmakit" ./cmd/rdmakit )
envs=()
while IFS='=' read -r k v; do envs+=(-e "$k=$v"); done < <(env | grep '^BENCH_' || true)
bash "$HERE/run.sh" -t 1200 -m 3G -w "$WORK" "${envs[@]}" -- bash "$WORK/bench.sh"
