#!/usr/bin/env bash
# transfer-vs-perf.sh: rdmakit transfer bench (the engine: batches,
# slicing, metadata, connections) against rdmakit perf read_bw (raw verbs)
# on the same device, side by side in one run.
#
#   bench/transfer-vs-perf.sh                  # shm0 and tcp0, 3 trials
#   DEVICES=shm0 TRIALS=1 bench/transfer-vs-perf.sh
#
# Measured per device: perf read_bw --loopback with 64 MiB messages (-s
# 64M, a 64 MiB buffer each side, -D seconds), and transfer bench reading
# batches of one 64 MiB request (--block-size 67108864 --batch-size 1
# --threads 1, a 64 MiB segment into a 64 MiB buffer, --duration). Both
# move the same bytes between two 64 MiB regions, memory-bound. GB/s is
# 10^9 bytes per second (perf prints MiB/s, converted). Each cell is the
# median of TRIALS runs with the range. The machine is shared with other
# work: compare within a run.
#
# Environment: DEVICES ("shm0 tcp0"), TRIALS (3), SECONDS_EACH (3), OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench/out/transfer-$(date +%Y%m%d-%H%M%S)}
TRIALS=${TRIALS:-3}
DEVICES=${DEVICES:-"shm0 tcp0"}
SECS=${SECONDS_EACH:-3}
mkdir -p "$OUT"
log() { echo "# $*" >&2; }
go build -o "$OUT/rdmakit" ./cmd/rdmakit
RAW=$OUT/raw.tsv
: >"$RAW"
for dev in $DEVICES; do
  for t in $(seq "$TRIALS"); do
    log "$dev trial $t"
    "$OUT/rdmakit" perf read_bw --loopback -d "$dev" -s 64M -D "$SECS" >"$OUT/perf-$dev-$t.txt" 2>&1
    awk -v d="$dev" '$1=="67108864"{printf "%s\tperf\t%.3f\n", d, $4*1048576/1e9}' "$OUT/perf-$dev-$t.txt" >>"$RAW"
    "$OUT/rdmakit" transfer bench --device "$dev" --block-size 67108864 --batch-size 1 --threads 1 --duration "${SECS}s" >"$OUT/transfer-$dev-$t.txt"
    awk -v d="$dev" '/^Test completed/{for(i=1;i<=NF;i++) if($i=="throughput") print d"\ttransfer\t"$(i+1)}' "$OUT/transfer-$dev-$t.txt" >>"$RAW"
  done
done
python3 - "$RAW" >"$OUT/table.md" <<'PY'
import sys, statistics
from collections import defaultdict
v = defaultdict(list)
for line in open(sys.argv[1]):
    d, tool, g = line.split("\t")
    v[(d, tool)].append(float(g))
print("| device | perf read_bw 64 MiB GB/s | transfer bench 64 MiB GB/s | ratio |")
print("|---|---:|---:|---:|")
for d in sorted({k[0] for k in v}):
    p, t = v.get((d, "perf"), []), v.get((d, "transfer"), [])
    fmt = lambda x: f"{statistics.median(x):.2f} ({min(x):.2f}–{max(x):.2f})" if x else "n/a"
    r = f"{statistics.median(t)/statistics.median(p):.2f}x" if p and t else "n/a"
    print(f"| {d} | {fmt(p)} | {fmt(t)} | {r} |")
PY
cat "$OUT/table.md"
log "raw results in $RAW"
