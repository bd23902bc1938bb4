#!/usr/bin/env bash
# compare-revs.sh: rdmakit perf at two git revisions, side by side in one
# run on this host, to show what a change did to the numbers (a refactor
# must not regress them). Each binary is built from a clean worktree of its
# revision; every measurement alternates old and new, REPS times, and the
# median is reported with the spread (min..max) of the ratio.
#
#   bench/compare-revs.sh OLD [NEW]          # NEW defaults to the working tree
#   REPS=5 bench/compare-revs.sh f1f70a8 HEAD
#
# Cells: shm0 and tcp0 (--loopback, two processes) at 8 B and 64 KiB (1 MiB
# for tcp0 bandwidth): write_bw, read_bw, send_bw (BW average, MiB/s; ratio
# new/old above 1 is better) and write_lat, send_lat, read_lat, atomic_lat
# (t_typical, usec; ratio new/old below 1 is better).
# Environment: REPS (default 3), ONLY=shm0|tcp0, SCALE divides iteration
# counts. Needs Go and git. Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: compare-revs.sh OLD [NEW]}
NEW=${2:-}
REPS=${REPS:-3}
SCALE=${SCALE:-1}
ONLY=${ONLY:-"shm0 tcp0"}
OUT=bench/out/compare; mkdir -p "$OUT"
build() { # rev dest
	if [ -z "$1" ]; then go build -o "$2" ./cmd/rdmakit; return; fi
	local wt; wt=$(mktemp -d)
	git worktree add -q --detach "$wt" "$1"
	(cd "$wt" && go build -o "$2" ./cmd/rdmakit)
	git worktree remove --force "$wt"
}
echo "== building $OLD and ${NEW:-the working tree}" >&2
build "$OLD" "$PWD/$OUT/old"
build "$NEW" "$PWD/$OUT/new"

# run BIN DEV TEST SIZE ITERS -> the figure (BW average or t_typical)
run() {
	local out
	out=$("$1" perf "$3" --loopback -d "$2" -s "$4" -n "$5" 2>&1) || { echo "fail"; return; }
	awk -v lat="$( [[ $3 == *_lat ]] && echo 1 || echo 0 )" '
		/#bytes/ { getline; if (lat) print $5; else print $4; exit }' <<< "$out"
}
median() { sort -g | awk '{a[NR]=$1} END { if (NR==0) print "n/a"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'; }

echo "# $(date -u +%F) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); old=$OLD new=${NEW:-worktree}; REPS=$REPS" >&2
printf '| device | test | bytes | old | new | new/old (median) | new/old (min..max) |\n|---|---|---:|---:|---:|---:|---|\n'
for dev in $ONLY; do
	for cell in "write_bw 8" "write_bw 65536" "read_bw 65536" "send_bw 8" "write_lat 8" "send_lat 8" "read_lat 8" "atomic_lat 8" "write_bw 1048576"; do
		set -- $cell; test=$1 size=$2
		[[ $dev == shm0 && $size == 1048576 ]] && continue
		[[ $dev == tcp0 && $test == write_bw && $size == 8 ]] && continue
		if [[ $dev == shm0 ]]; then n=$(( (size <= 8 ? 200000 : 20000) / SCALE )); else n=$(( (size <= 8 ? 10000 : 2000) / SCALE )); fi
		[[ $test == *_lat ]] && n=$(( n / 4 ))
		olds=() news=() ratios=()
		for ((r = 0; r < REPS; r++)); do
			o=$(run "$OUT/old" "$dev" "$test" "$size" "$n"); nw=$(run "$OUT/new" "$dev" "$test" "$size" "$n")
			olds+=("$o") news+=("$nw")
			ratios+=("$(awk -v a="$o" -v b="$nw" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", b/a; else print "n/a" }')")
		done
		mo=$(printf '%s\n' "${olds[@]}" | grep -v fail | median); mn=$(printf '%s\n' "${news[@]}" | grep -v fail | median)
		mr=$(awk -v a="$mo" -v b="$mn" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", b/a; else print "n/a" }')
		sp=$(printf '%s\n' "${ratios[@]}" | grep -v n/a | sort -g | awk 'NR==1{lo=$1} {hi=$1} END {print lo ".." hi}')
		unit=MiB/s; [[ $test == *_lat ]] && unit=usec
		printf '| %s | %s | %s | %s %s | %s %s | %s | %s |\n' "$dev" "$test" "$size" "$mo" "$unit" "$mn" "$unit" "$mr" "$sp"
	done
done
