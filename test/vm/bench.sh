#!/usr/bin/env bash
# bench.sh - rdmakit perf vs perftest on the same rxe device in one guest
# run (write_bw, write_lat at 64 B, 4 KiB, 64 KiB); prints a table with
# ratios. TCG is slow: only the ratios mean anything. See docs/benchmarks.md.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export RDMAVM_CACHE=${RDMAVM_CACHE:-/tmp/rdmakit-vm}
bash "$HERE/build.sh" >&2
WORK=$(mktemp -d /tmp/rdmakit-vm-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cp "$HERE"/guest/*.sh "$WORK/"
( cd "$ROOT" && CGO_ENABLED=1 go build -tags ibverbs -o "$WORK/rdmakit" ./cmd/rdmakit )
bash "$HERE/run.sh" -t 900 -m 3G -w "$WORK" -- bash "$WORK/bench.sh"
