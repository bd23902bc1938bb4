#!/usr/bin/env bash
# kv-vs-redis.sh: rdmakit kv bench against redis-server + redis-benchmark
# and memcached + bench/src/mcbench (a Go client of memcached's text
# protocol doing what redis-benchmark does) on this host, side by side in
# one run.
#
#   bench/kv-vs-redis.sh                          # full sweep
#   SIZES="262144" CLIENTS="1" TRIALS=1 bench/kv-vs-redis.sh   # quick look
#
# Measured per value size and client count: redis-benchmark SET and GET
# (-P 1, -r 100: 100 random keys, redis-server without persistence),
# mcbench SET and GET (100 random keys; memcached -t 4 -m 2048 -I 8m, so
# that 4 MiB values fit), and
# rdmakit kv bench PUT and GET (100 keys, a store node started by the
# bench in its own process, clients each their own node) over shm0 and
# over tcp0, in registered memory (zero-copy, the store's own API) and,
# for GET, with the []byte API (--copy: one more copy per value); and, as
# the ceiling of a GET over tcp0, rdmakit transfer bench's bare Read of one
# value per client at a time over tcp0 (last column: its ops/s over
# Redis's GET; kv tcp0 GET adds the master's RPC or the version check to
# it). Each cell
# is the median of TRIALS runs, with the range; the ratio is rdmakit's
# median over Redis's. Operations per run: min(50000, max(1000, 512 MiB /
# size)). The machine is shared with other work: numbers move between
# runs; compare within a run.
#
# Environment: SIZES, CLIENTS, TRIALS (3), OUT (bench/out/...), NO_APT=1
# (skip apt-get), PORT (6390), MCPORT (11390), RDMAKIT_BIN (run that
# rdmakit binary instead of building this tree's: an old build against a
# new one); without memcached (not installed, apt-get failing) its
# columns say n/a.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench/out/kv-$(date +%Y%m%d-%H%M%S)}
TRIALS=${TRIALS:-3}
SIZES=${SIZES:-"4096 65536 262144 1048576 4194304"}
CLIENTS=${CLIENTS:-"1 8"}
PORT=${PORT:-6390}
MCPORT=${MCPORT:-11390}
mkdir -p "$OUT"
log() { echo "# $*" >&2; }

if [ -z "${NO_APT:-}" ] && ! command -v redis-benchmark >/dev/null; then
  SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools >"$OUT/apt.log" 2>&1 ||
    log "apt-get failed, see $OUT/apt.log"
fi
command -v redis-server >/dev/null || { log "redis-server not installed"; exit 1; }
if [ -z "${NO_APT:-}" ] && ! command -v memcached >/dev/null; then
  SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q memcached >>"$OUT/apt.log" 2>&1 ||
    log "apt-get memcached failed, see $OUT/apt.log"
fi

if [ -n "${RDMAKIT_BIN:-}" ]; then
  cp "$RDMAKIT_BIN" "$OUT/rdmakit"
else
  go build -o "$OUT/rdmakit" ./cmd/rdmakit
fi
redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no --daemonize no >"$OUT/redis.log" 2>&1 &
RPID=$!
MPID=
trap 'kill $RPID $MPID 2>/dev/null; wait $RPID $MPID 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
if command -v memcached >/dev/null && (cd bench/src/mcbench && go build -o "$OUT/mcbench" .) 2>>"$OUT/mcbench-build.log"; then
  U=; [ "$(id -u)" -eq 0 ] && U="-u root"
  # shellcheck disable=SC2086
  memcached -l 127.0.0.1 -p "$MCPORT" -U 0 -t 4 -m 2048 -I 8m $U >"$OUT/memcached.log" 2>&1 &
  MPID=$!
  sleep 0.3
else
  log "memcached or mcbench unavailable: no memcached columns (see $OUT/mcbench-build.log)"
fi

RAW=$OUT/raw.tsv   # size clients tool test trial ops/s
: >"$RAW"
for size in $SIZES; do
  ops=$(( 512 * 1048576 / size )); ops=$(( ops > 50000 ? 50000 : ops )); ops=$(( ops < 1000 ? 1000 : ops ))
  for c in $CLIENTS; do
    for t in $(seq "$TRIALS"); do
      log "size $size clients $c trial $t"
      redis-cli -p "$PORT" flushall >/dev/null
      redis-benchmark -h 127.0.0.1 -p "$PORT" -t set,get -d "$size" -n "$ops" -c "$c" -P 1 -r 100 --csv 2>/dev/null |
        tr -d '"' | awk -F, -v s="$size" -v c="$c" -v t="$t" '$1=="SET"||$1=="GET"{print s"\t"c"\tredis\t"$1"\t"t"\t"$2}' >>"$RAW"
      if [ -n "$MPID" ]; then
        "$OUT/mcbench" --server "127.0.0.1:$MCPORT" --size "$size" --clients "$c" --ops "$ops" --keys 100 >"$OUT/mc-$size-$c-$t.txt" ||
          log "mcbench failed (size $size clients $c)"
        awk -v s="$size" -v c="$c" -v t="$t" '/^(SET|GET):/{sub(":","",$1); print s"\t"c"\tmemcached\t"$1"\t"t"\t"$2}' "$OUT/mc-$size-$c-$t.txt" >>"$RAW"
      fi
      for dev in shm0 tcp0; do
        "$OUT/rdmakit" kv bench --device "$dev" --size "$size" --clients "$c" --ops "$ops" --keys 100 >"$OUT/kv-$dev-$size-$c-$t.txt"
        awk -v s="$size" -v c="$c" -v t="$t" -v d="$dev" '/^(PUT|GET):/{sub(":","",$1); print s"\t"c"\tkv-"d"\t"$1"\t"t"\t"$2}' "$OUT/kv-$dev-$size-$c-$t.txt" >>"$RAW"
      done
      "$OUT/rdmakit" kv bench --device shm0 --size "$size" --clients "$c" --ops "$ops" --keys 100 --copy --tests get >"$OUT/kvcopy-$size-$c-$t.txt"
      # The ceiling of a GET over tcp0: the engine's bare one-sided Read
      # of the same size, one at a time per client (no master, no version
      # check), between two nodes of one process as in kv bench, over 100
      # values' worth of memory in turn (as cold in the caches as 100 keys).
      "$OUT/rdmakit" transfer bench --device tcp0 --threads "$c" --batch-size 1 --block-size "$size" --buffer-size $((100 * size)) --duration 1s >"$OUT/read-$size-$c-$t.txt"
      awk -v s="$size" -v c="$c" -v t="$t" '/^Test completed/{d=$4; n=$8; sub(",", "", n); print s"\t"c"\tread-tcp0\tGET\t"t"\t"n/d}' "$OUT/read-$size-$c-$t.txt" >>"$RAW"
      awk -v s="$size" -v c="$c" -v t="$t" '/^GET:/{print s"\t"c"\tkv-shm0-copy\tGET\t"t"\t"$2}' "$OUT/kvcopy-$size-$c-$t.txt" >>"$RAW"
    done
  done
done

python3 - "$RAW" >"$OUT/table.md" <<'EOF'
import sys, statistics
from collections import defaultdict
v = defaultdict(list)
for line in open(sys.argv[1]):
    s, c, tool, test, _, ops = line.split("\t")
    test = {"SET": "PUT"}.get(test, test)
    v[(int(s), int(c), tool, test)].append(float(ops))
def cell(k):
    x = v.get(k)
    if not x: return None, "n/a"
    m = statistics.median(x)
    return m, f"{m:,.0f} ({min(x):,.0f}–{max(x):,.0f})"
def gbs(k):
    x = v.get(k)
    return f"{statistics.median(x)*k[0]/1e9:.2f}" if x else "n/a"
print("| value | clients | op | Redis ops/s | memcached ops/s | kv shm0 ops/s | kv tcp0 ops/s | kv shm0 []byte ops/s | shm0/Redis | tcp0/Redis | shm0/memcached | tcp0/memcached | shm0 GB/s | tcp0 Read/Redis |")
print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (s, c) in sorted({(k[0], k[1]) for k in v}):
    for test in ("GET", "PUT"):
        r, rs = cell((s, c, "redis", test))
        a, as_ = cell((s, c, "kv-shm0", test))
        b, bs = cell((s, c, "kv-tcp0", test))
        _, cs = cell((s, c, "kv-shm0-copy", test))
        mc, ms = cell((s, c, "memcached", test))
        ratio = lambda x, y: f"{x/y:.2f}x" if x and y else "n/a"
        size = f"{s//1048576} MiB" if s >= 1048576 else f"{s//1024} KiB"
        print(f"| {size} | {c} | {test} | {rs} | {ms} | {as_} | {bs} | {cs if test=='GET' else ''} | {ratio(a, r)} | {ratio(b, r)} | {ratio(a, mc)} | {ratio(b, mc)} | {gbs((s, c, 'kv-shm0', test))} | {ratio(cell((s, c, 'read-tcp0', test))[0], r) if test == 'GET' else ''} |")
EOF
cat "$OUT/table.md"
log "raw results in $RAW"
