#!/usr/bin/env bash
# coll-vs-mpi.sh: rdmakit coll-perf against Open MPI and Gloo, 2 (RANKS) ranks on
# this host, float32 sum, side by side in one run.
#
#   bench/coll-vs-mpi.sh            # full sweep, writes docs/benchmarks.md
#   SIZES="8 1048576" TRIALS=1 bench/coll-vs-mpi.sh   # quick look
#
# Measured, per collective (allreduce, allgather, reduce_scatter) and
# size: rdmakit coll-perf over shm0 and over tcp0 (--ranks 2), Open MPI
# over shared memory (pml ob1, btl vader,self) and over TCP (btl tcp,self
# on lo), and Gloo over TCP (127.0.0.1). Each cell is the median of
# TRIALS separate launches; before each trial the script waits (up to
# QUIET_WAIT seconds) for the host to be idle, since other work on this
# 2-core machine moves numbers by integer factors. Time per call is the
# maximum over ranks everywhere (coll-perf -a 3); busbw follows
# nccl-tests (allreduce 2(n-1)/n, allgather and reduce_scatter (n-1)/n).
# Iterations scale with size: min(2000, max(10, 256 MiB / size)), warm-up
# a tenth of that.
#
# Environment: SIZES, TRIALS (3), QUIET_WAIT (60), OUT (bench/out/...),
# DOC (docs/benchmarks.md; empty: do not write), NO_APT=1 (skip apt-get),
# COLLS (the collectives), TOOLS (the columns measured), RANKS (2: ranks
# of every tool), RDMAKIT_ENV ("K=V ...", put into rdmakit's environment,
# e.g. RDMAKIT_COLL_ALGO=ring to compare algorithms), BIND (core: the
# ranks of rdmakit-shm are pinned to cores, and mpi-sm's with --bind-to
# core (Open MPI's own default binds to cores only up to 2 ranks); ranks
# that outnumber the CPUs round robin on both sides (rdmakit's k-th rank
# on CPU k mod the CPUs; Open MPI --map-by core:oversubscribe --bind-to
# core:overload-allowed); none: placement left to the OS for both
# (--bind-to none); rdmakit-tcp is not pinned, its
# transport's reader goroutines need room; RDMAKIT_ENV may override it),
# RAW_IN (make the tables from an earlier run's raw.tsv instead of
# measuring), RDMAKIT_BIN (run that rdmakit binary instead of building
# this tree's: an A/B against another commit's build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench/out/coll-$(date +%Y%m%d-%H%M%S)}
DOC=${DOC-docs/benchmarks.md}
TRIALS=${TRIALS:-3}
QUIET_WAIT=${QUIET_WAIT:-60}
SIZES=${SIZES:-"8 64 256 1024 4096 16384 65536 262144 1048576 4194304 16777216 67108864"}
COLLS=${COLLS:-"allreduce allgather reduce_scatter"}
RANKS=${RANKS:-2}
RDMAKIT_ENV=${RDMAKIT_ENV:-}
BIND=${BIND:-core}
mkdir -p "$OUT"
log() { echo "# $*" >&2; }

# --- dependencies -----------------------------------------------------------
if [ -z "${NO_APT:-}" ]; then
  pkgs=()
  command -v mpicc >/dev/null || pkgs+=(openmpi-bin libopenmpi-dev)
  if [ ! -f /usr/include/gloo/allreduce_ring.h ] && apt-cache show libgloo-dev >/dev/null 2>&1; then
    pkgs+=(libgloo-dev)
  fi
  if [ ${#pkgs[@]} -gt 0 ]; then
    log "installing ${pkgs[*]}"
    SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >"$OUT/apt.log" 2>&1 ||
      { $SUDO apt-get update -q >>"$OUT/apt.log" 2>&1 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >>"$OUT/apt.log" 2>&1; } ||
      log "apt-get failed, see $OUT/apt.log"
  fi
fi

# --- build ------------------------------------------------------------------
if [ -n "${RDMAKIT_BIN:-}" ]; then
  cp "$RDMAKIT_BIN" "$OUT/rdmakit"
else
  go build -o "$OUT/rdmakit" ./cmd/rdmakit
fi
HAVE_MPI=no; HAVE_GLOO=no
GLOO_NOTE=""
if command -v mpicc >/dev/null && mpicc -O2 -o "$OUT/mpi_coll_bench" bench/src/mpi_coll_bench.c 2>"$OUT/mpicc.log"; then
  HAVE_MPI=yes
else
  log "Open MPI benchmark not built (see $OUT/mpicc.log)"
fi
if [ -f /usr/include/gloo/allreduce_ring.h ] &&
  g++ -O2 -std=c++17 -o "$OUT/gloo_coll_bench" bench/src/gloo_coll_bench.cc -lgloo -lpthread 2>"$OUT/gloo-build.log"; then
  HAVE_GLOO=yes
else
  GLOO_NOTE="Gloo could not be built here (libgloo-dev missing or the build failed, see gloo-build.log); its columns are empty."
  log "$GLOO_NOTE"
fi

# --- helpers ------------------------------------------------------------------
# cpu_busy: percent of the CPUs busy over half a second.
cpu_busy() {
  local a b
  read -r _ a1 a2 a3 a4 a5 a6 a7 _ </proc/stat
  sleep 0.5
  read -r _ b1 b2 b3 b4 b5 b6 b7 _ </proc/stat
  local busy=$(((b1 + b2 + b3 + b6 + b7) - (a1 + a2 + a3 + a6 + a7)))
  local all=$(((b1 + b2 + b3 + b4 + b5 + b6 + b7) - (a1 + a2 + a3 + a4 + a5 + a6 + a7)))
  echo $((all > 0 ? 100 * busy / all : 0))
}
NOISY=0
wait_quiet() {
  local t=0 b
  while b=$(cpu_busy); [ "$b" -gt 15 ] && [ $t -lt $((QUIET_WAIT * 2)) ]; do t=$((t + 1)); done
  [ "$b" -gt 15 ] && NOISY=$((NOISY + 1))
  return 0
}
iters_for() { local s=$1 i=$((268435456 / $1)); [ $i -gt 2000 ] && i=2000; [ $i -lt 10 ] && i=10; echo $i; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
perfname() { case $1 in allreduce) echo all_reduce ;; allgather) echo all_gather ;; *) echo "$1" ;; esac; }

# run_one TOOL COLL SIZE -> "time_us busbw" (empty on failure)
run_one() {
  local tool=$1 coll=$2 size=$3 it w line
  it=$(iters_for "$size"); w=$(((it + 9) / 10))
  case $tool in
  rdmakit-shm | rdmakit-tcp)
    local bind=none
    [ "$tool" = rdmakit-shm ] && bind=$BIND
    # shellcheck disable=SC2086 # RDMAKIT_ENV is a list of K=V words
    line=$(env RDMAKIT_COLL_BIND="$bind" $RDMAKIT_ENV timeout 300 "$OUT/rdmakit" coll-perf "$(perfname "$coll")" -b "$size" -e "$size" -n "$it" -w "$w" -c 0 -a 3 \
      --ranks "$RANKS" --transport "${tool#rdmakit-}" 2>>"$OUT/errors.log" | awk '!/^#/ && NF >= 12 {print $6; exit}') || true ;;
  mpi-sm)
    [ $HAVE_MPI = yes ] || return 0
    # Pinned as rdmakit's shm ranks are (BIND): Open MPI's own default
    # binds to cores only up to 2 ranks (to sockets above); ranks that
    # outnumber the CPUs round robin, as rdmakit's.
    local mbind=(--bind-to none)
    [ "$BIND" = core ] && mbind=(--bind-to core)
    [ "$BIND" = core ] && [ "$RANKS" -gt "$(nproc)" ] && mbind=(--map-by core:oversubscribe --bind-to core:overload-allowed)
    line=$(timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$RANKS" "${mbind[@]}" --mca oob_tcp_if_include lo --mca pml ob1 --mca btl vader,self \
      "$OUT/mpi_coll_bench" "$coll" "$size" "$it" "$w" 2>>"$OUT/errors.log" | awk '{print $4}') || true ;;
  mpi-tcp)
    [ $HAVE_MPI = yes ] || return 0
    line=$(timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$RANKS" --mca oob_tcp_if_include lo --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include lo "$OUT/mpi_coll_bench" "$coll" "$size" "$it" "$w" 2>>"$OUT/errors.log" | awk '{print $4}') || true ;;
  gloo-tcp)
    [ $HAVE_GLOO = yes ] || return 0
    local store; store=$(mktemp -d)
    local peers=() rk
    for rk in $(seq 1 $((RANKS - 1))); do
      RANK=$rk SIZE=$RANKS STORE=$store PREFIX=p timeout 300 "$OUT/gloo_coll_bench" "$coll" "$size" "$it" "$w" >/dev/null 2>>"$OUT/errors.log" &
      peers+=($!)
    done
    line=$(RANK=0 SIZE=$RANKS STORE=$store PREFIX=p timeout 300 "$OUT/gloo_coll_bench" "$coll" "$size" "$it" "$w" 2>>"$OUT/errors.log" | awk '{print $4}') || true
    # The other ranks end with rank 0, unless Gloo threw: then do not wait for them.
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "${peers[@]}" 2>/dev/null || break; sleep 0.5; done
    kill "${peers[@]}" 2>/dev/null || true
    wait "${peers[@]}" 2>/dev/null || true
    rm -rf "$store" ;;
  esac
  # busbw from the time (GB/s), nccl-tests' byte counts and factors, n = RANKS.
  # A failed run (Gloo throws now and then) prints nothing.
  if [ -n "$line" ]; then
    awk -v t="$line" -v s="$size" -v c="$coll" -v n="$RANKS" 'BEGIN {
      f = (c == "allreduce") ? 2 * (n - 1) / n : (n - 1) / n
      b = (c == "allreduce") ? s : int(s / 4 / n / 4) * 4 * 4 * n
      printf "%s %.6g\n", t, (t > 0 ? b / t / 1e3 * f : 0) }'
  fi
  return 0
}

TOOLS=${TOOLS:-"rdmakit-shm mpi-sm rdmakit-tcp mpi-tcp gloo-tcp"}
RAW="$OUT/raw.tsv"
if [ -n "${RAW_IN:-}" ]; then
  # Tables from an earlier run's raw.tsv (same SIZES, COLLS, RANKS).
  [ "$RAW_IN" -ef "$RAW" ] || cp "$RAW_IN" "$RAW"
  COLLS_RUN=""
else
  echo -e "coll\tsize\ttool\ttrial\ttime_us\tbusbw" >"$RAW"
  COLLS_RUN=$COLLS
fi
log "results in $OUT"
for coll in $COLLS_RUN; do
  for size in $SIZES; do
    # nccl-tests counts allgather/reduce_scatter per rank in 16-byte units:
    # below 32 bytes per rank nothing would move.
    [ "$coll" != allreduce ] && [ "$size" -lt $((32 * RANKS)) ] && continue
    for trial in $(seq "$TRIALS"); do
      for tool in $TOOLS; do
        wait_quiet
        r=$(run_one "$tool" "$coll" "$size") || r=""
        [ -n "$r" ] && printf '%s\t%s\t%s\t%s\t%s\n' "$coll" "$size" "$tool" "$trial" "${r// /$'\t'}" >>"$RAW"
      done
    done
    log "$coll $size done"
  done
done

# --- table ----------------------------------------------------------------------
cell() { awk -F'\t' -v c="$1" -v s="$2" -v t="$3" -v f="$4" '$1==c && $2==s && $3==t {print $f}' "$RAW" | median; }
fmt() { [ -z "$1" ] && { echo "–"; return; }; awk -v v="$1" 'BEGIN{ if (v>=100) printf "%.0f", v; else if (v>=10) printf "%.1f", v; else if (v>=1) printf "%.2f", v; else printf "%.3g", v }'; }
ratio() { [ -z "$1" ] || [ -z "$2" ] && { echo "–"; return; }; awk -v a="$1" -v b="$2" 'BEGIN{ if (b<=0) print "–"; else printf "%.2f×", a/b }'; }
human() { awk -v s="$1" 'BEGIN{ if (s>=1048576) printf "%d MiB", s/1048576; else if (s>=1024) printf "%d KiB", s/1024; else printf "%d B", s }'; }

TABLE="$OUT/table.md"
{
  for coll in $COLLS; do
    echo
    echo "#### $coll (float32 sum, $RANKS ranks; busbw GB/s, time µs in parentheses)"
    echo
    echo "| size | rdmakit shm | Open MPI sm | shm ratio | rdmakit tcp | Open MPI tcp | Gloo tcp | tcp/MPI | tcp/Gloo |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for size in $SIZES; do
      [ "$coll" != allreduce ] && [ "$size" -lt $((32 * RANKS)) ] && continue
      row="| $(human "$size") |"
      declare -A bw=() us=()
      for tool in rdmakit-shm mpi-sm rdmakit-tcp mpi-tcp gloo-tcp; do # all columns; unmeasured ones show –
        bw[$tool]=$(cell "$coll" "$size" "$tool" 6)
        us[$tool]=$(cell "$coll" "$size" "$tool" 5)
      done
      c() { [ -z "${bw[$1]}" ] && echo "–" || echo "$(fmt "${bw[$1]}") ($(fmt "${us[$1]}"))"; }
      # Ratios are of busbw (equivalently, inverse time ratios).
      row+=" $(c rdmakit-shm) | $(c mpi-sm) | $(ratio "${bw[rdmakit-shm]}" "${bw[mpi-sm]}") |"
      row+=" $(c rdmakit-tcp) | $(c mpi-tcp) | $(c gloo-tcp) | $(ratio "${bw[rdmakit-tcp]}" "${bw[mpi-tcp]}") | $(ratio "${bw[rdmakit-tcp]}" "${bw[gloo-tcp]}") |"
      echo "$row"
    done
  done
} >"$TABLE"

CMD="bench/coll-vs-mpi.sh"
[ "$SIZES" != "8 64 256 1024 4096 16384 65536 262144 1048576 4194304 16777216 67108864" ] && CMD="SIZES=\"$SIZES\" $CMD"
[ "$TRIALS" != 3 ] && CMD="TRIALS=$TRIALS $CMD"
[ "$RANKS" != 2 ] && CMD="RANKS=$RANKS $CMD"
[ "$COLLS" != "allreduce allgather reduce_scatter" ] && CMD="COLLS=\"$COLLS\" $CMD"
[ -n "$RDMAKIT_ENV" ] && CMD="RDMAKIT_ENV=\"$RDMAKIT_ENV\" $CMD"
[ "$BIND" != core ] && CMD="BIND=$BIND $CMD"
SECTION="$OUT/section.md"
HEADING="Collectives vs Open MPI and Gloo"
[ "$RANKS" != 2 ] && HEADING="$HEADING, $RANKS ranks"
{
  echo "## $HEADING"
  echo
  echo "Command: \`$CMD\` ($(date -u +%Y-%m-%d), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'),"
  echo "$(uname -r), Go $(go env GOVERSION | sed 's/^go//'), $(mpirun --version 2>/dev/null | head -1 || echo 'no Open MPI'))."
  echo "$RANKS ranks on one host. Each cell: busbw in GB/s (nccl-tests convention: allreduce × 2(n−1)/n, allgather and"
  echo "reduce_scatter × (n−1)/n of algbw, sizes as nccl-tests counts them) and the time per call in µs, the median of $TRIALS launches,"
  echo "time per call = maximum over ranks. Ratios divide rdmakit's busbw by the peer's on the same path"
  echo "(shm: Open MPI vader; tcp: Open MPI btl tcp and Gloo tcp, all on loopback); above 1× rdmakit is faster."
  echo "rdmakit: \`rdmakit coll-perf … -a 3 --ranks $RANKS --transport shm|tcp\`${RDMAKIT_ENV:+ with $RDMAKIT_ENV}, shm ranks with RDMAKIT_COLL_BIND=$BIND"
  echo "(core: pinned, and Open MPI's sm ranks with --bind-to core; ranks that outnumber the CPUs round robin on both sides; default options: auto algorithm, 2 channels and 256 KiB chunks on shm, 1 channel and 256 KiB chunks over tcp);"
  echo "Open MPI: \`bench/src/mpi_coll_bench.c\` (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block); Gloo: \`bench/src/gloo_coll_bench.cc\`"
  echo "(AllreduceRing, allgather, ReduceScatterHalvingDoubling)."
  [ -n "$GLOO_NOTE" ] && { echo; echo "$GLOO_NOTE"; }
  if [ "$NOISY" -gt 0 ]; then
    echo
    echo "The host did not become idle before $NOISY of the trials (other jobs were running): those ran on a busy machine."
  fi
  cat "$TABLE"
  echo
} >"$SECTION"
cat "$SECTION"

# --- docs -----------------------------------------------------------------------
if [ -n "$DOC" ]; then
  mkdir -p "$(dirname "$DOC")"
  [ -f "$DOC" ] || printf '# rdmakit benchmarks\n\n' >"$DOC"
  # Replace our section (up to the next "## " heading) or append it.
  awk -v sec="$SECTION" -v h="## $HEADING" '
    BEGIN { while ((getline l < sec) > 0) body = body l "\n" }
    { t = $0; sub(/[[:space:]]+$/, "", t) }
    t == h { printf "%s", body; skip = 1; done = 1; next }
    skip && /^## / { skip = 0 }
    !skip { print }
    END { if (!done) printf "\n%s", body }
  ' "$DOC" >"$DOC.tmp" && mv "$DOC.tmp" "$DOC"
  log "wrote the section to $DOC"
fi
