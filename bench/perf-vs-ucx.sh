#!/usr/bin/env bash
# perf-vs-ucx.sh: rdmakit perf against UCX's ucx_perftest, side by side in
# one run, on this host (loopback only).
#
#   bench/perf-vs-ucx.sh                # prints a markdown table
#   bench/perf-vs-ucx.sh --write-docs   # and puts it into docs/benchmarks.md
#
# UCX runs with UCX_TLS=sm and then UCX_TLS=tcp (UCX_NET_DEVICES=lo), server
# then client on 127.0.0.1; rdmakit runs the matching perftest test with
# --loopback on shm0 and then tcp0. Both get the same message sizes and the
# same iteration counts (UCX warm-up: a tenth of them):
#
#   size           8 B     4 KiB   64 KiB  1 MiB
#   sm / shm0      1e6     2e5     2e4     2e3
#   tcp / tcp0     2e4     2e4     5e3     1e3     (ucp_get over tcp: 2000)
#
# Pairs: write_bw/ucp_put_bw, write_lat/ucp_put_lat, read_bw/ucp_get,
# send_bw/ucp_am_bw, send_lat/ucp_am_lat, atomic_lat/ucp_fadd and
# atomic_lat -A CMP_AND_SWAP/ucp_cswap (8 B only).
#
# Units: ucx_perftest's "MB/s" is 2^20 bytes per second, like perftest's
# MiB/sec; its latency is one-way (half a round trip) for the ping-pong
# tests (put_lat, am_lat) like perftest's send/write latency, and the
# whole operation for get/fadd/cswap (one outstanding) like read/atomic
# latency. Bandwidth: UCX "overall" vs rdmakit "BW average". Latency: UCX
# median ("50.0%ile") vs rdmakit t_typical (the median). The ratio is
# rdmakit/UCX in both cases: above 1 is better for bandwidth, below 1 is
# better for latency.
#
# Needs: Go, and ucx-utils (installed with apt-get if missing; root).
# Environment: ONLY="sm" or "tcp" runs one transport; SIZES overrides the
# sizes ("8 4096"); SCALE divides every iteration count (quick trials);
# REPS=3 runs every measurement three times (UCX and rdmakit alternating)
# and reports the median of each (default 1); TESTS="write_lat send_lat"
# runs only those rdmakit tests (and their UCX pairs); RDMAKIT_ENV="K=V ..."
# is put into rdmakit's environment (a knob such as RDMAKIT_TCP_BUSY_POLL);
# RDMAKIT_BIN=path runs that rdmakit binary instead of building this tree's
# (A/B runs of two revisions against the same UCX).
set -euo pipefail
cd "$(dirname "$0")/.."

WRITE_DOCS=0
[ "${1:-}" = "--write-docs" ] && WRITE_DOCS=1

OUT=bench/out
mkdir -p "$OUT"
LOG="$OUT/perf-vs-ucx.log"
: > "$LOG"

if ! command -v ucx_perftest >/dev/null; then
	echo "== installing ucx-utils (apt-get)" >&2
	if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
	$SUDO apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq ucx-utils >&2
fi

if [ -n "${RDMAKIT_BIN:-}" ]; then
	RDMAKIT=$RDMAKIT_BIN
else
	echo "== building rdmakit" >&2
	go build -o "$OUT/rdmakit" ./cmd/rdmakit
	RDMAKIT="$OUT/rdmakit"
fi

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
SIZES=${SIZES:-"8 4096 65536 1048576"}
SCALE=${SCALE:-1}
ONLY=${ONLY:-"sm tcp"}
REPS=${REPS:-1}
TESTS=${TESTS:-}
RDMAKIT_ENV=${RDMAKIT_ENV:-}
PORT=${UCX_PORT:-13400}

iters() { # transport size [test]
	local n
	case "$1:$2" in
	sm:8) n=1000000 ;; sm:4096) n=200000 ;; sm:65536) n=20000 ;; sm:1048576) n=2000 ;;
	tcp:8) n=20000 ;; tcp:4096) n=20000 ;; tcp:65536) n=5000 ;; tcp:1048576) n=1000 ;;
	*) n=1000 ;;
	esac
	[ "$1" = tcp ] && [ "${3:-}" = ucp_get ] && n=2000
	n=$((n / SCALE))
	[ "$n" -lt 100 ] && n=100
	echo "$n"
}

# ucx TLS TEST SIZE N → "lat_median bw_overall" (usec, MB/s)
ucx() {
	local tls=$1 test=$2 size=$3 n=$4 w port out
	w=$((n / 10))
	PORT=$((PORT + 1))
	port=$PORT
	UCX_TLS=$tls UCX_NET_DEVICES=lo timeout 600 ucx_perftest -p "$port" >>"$LOG" 2>&1 &
	local srv=$!
	out=""
	for _ in $(seq 50); do
		if out=$(UCX_TLS=$tls UCX_NET_DEVICES=lo timeout 600 ucx_perftest 127.0.0.1 -p "$port" \
			-t "$test" -s "$size" -n "$n" -w "$w" -f -v 2>>"$LOG"); then
			break
		fi
		out=""
		sleep 0.1
	done
	wait "$srv" 2>/dev/null || true
	echo "ucx $tls $test $size n=$n: $out" >>"$LOG"
	# iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
	echo "$out" | tr -d ' ' | awk -F, '/^[0-9]/ { print $2, $6 }' | tail -1
}

# rdmakit DEVICE TEST SIZE N [flags] → the report line's fields
rdmakit() {
	local dev=$1 test=$2 size=$3 n=$4
	shift 4
	local out
	# shellcheck disable=SC2086 # RDMAKIT_ENV is a list of K=V words
	out=$(env $RDMAKIT_ENV timeout 600 "$RDMAKIT" perf "$test" --loopback -d "$dev" -s "$size" -n "$n" "$@" 2>>"$LOG") || true
	echo "rdmakit $dev $test $size n=$n $*:" >>"$LOG"
	echo "$out" >>"$LOG"
	echo "$out" | awk '/^ #bytes/ { getline; print; exit }'
}

ROWS="$OUT/perf-vs-ucx.tsv"
: > "$ROWS"
row() { # transport pair size metric ucx rdmakit
	local ratio
	ratio=$(awk -v a="$5" -v b="$6" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "n/a" }')
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$ratio" >>"$ROWS"
	printf '%-4s %-34s %8s %-13s UCX %10s  rdmakit %10s  ratio %s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$ratio" >&2
}

median() { # values... → the median (0 if none)
	printf '%s\n' "$@" | awk 'NF' | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else print v[int((NR + 1) / 2)] }'
}

want() { # rdmakit-test → whether TESTS selects it
	[ -z "$TESTS" ] || [[ " $TESTS " == *" $1 "* ]]
}

bw_pair() { # tls dev rdmakit-test ucx-test
	local tls=$1 dev=$2 rt=$3 ut=$4 s n i us rs
	want "$rt" || return 0
	for s in $SIZES; do
		n=$(iters "$tls" "$s" "$ut")
		us=() rs=()
		for i in $(seq "$REPS"); do
			us+=("$(ucx "$tls" "$ut" "$s" "$n" | awk '{ print $2 }')")
			rs+=("$(rdmakit "$dev" "$rt" "$s" "$n" | awk '{ print $4 }')")
		done
		row "$tls" "$rt vs $ut" "$s" "BW MiB/s" "$(median "${us[@]}")" "$(median "${rs[@]}")"
	done
}

lat_pair() { # tls dev rdmakit-test ucx-test [sizes] [flags]
	local tls=$1 dev=$2 rt=$3 ut=$4 sizes=${5:-$SIZES} s n i us rs
	shift $(($# < 5 ? $# : 5))
	want "$rt" || return 0
	for s in $sizes; do
		n=$(iters "$tls" "$s" "$ut")
		us=() rs=()
		for i in $(seq "$REPS"); do
			us+=("$(ucx "$tls" "$ut" "$s" "$n" | awk '{ print $1 }')")
			rs+=("$(rdmakit "$dev" "$rt" "$s" "$n" "$@" | awk '{ print $5 }')")
		done
		row "$tls" "$rt${*:+ $*} vs $ut" "$s" "lat usec" "$(median "${us[@]}")" "$(median "${rs[@]}")"
	done
}

for tls in $ONLY; do
	dev=shm0
	[ "$tls" = tcp ] && dev=tcp0
	echo "== UCX_TLS=$tls vs rdmakit $dev" >&2
	bw_pair "$tls" "$dev" write_bw ucp_put_bw
	lat_pair "$tls" "$dev" write_lat ucp_put_lat "$SIZES"
	bw_pair "$tls" "$dev" read_bw ucp_get
	bw_pair "$tls" "$dev" send_bw ucp_am_bw
	lat_pair "$tls" "$dev" send_lat ucp_am_lat "$SIZES"
	lat_pair "$tls" "$dev" atomic_lat ucp_fadd 8
	lat_pair "$tls" "$dev" atomic_lat ucp_cswap 8 -A CMP_AND_SWAP
done

TABLE="$OUT/perf-vs-ucx.md"
{
	echo "| UCX_TLS / device | rdmakit test vs UCX test | size (B) | metric | UCX | rdmakit | rdmakit/UCX |"
	echo "|---|---|---:|---|---:|---:|---:|"
	awk -F'\t' '{ d = ($1 == "sm") ? "sm / shm0" : "tcp / tcp0"; printf "| %s | %s | %s | %s | %s | %s | %s |\n", d, $2, $3, $4, $5, $6, $7 }' "$ROWS"
} >"$TABLE"
cat "$TABLE"

if [ "$WRITE_DOCS" = 1 ]; then
	DOC=docs/benchmarks.md
	{
		echo "<!-- perf-vs-ucx:begin -->"
		echo "Measured $(date -u '+%Y-%m-%d %H:%M') UTC on $(nproc) cores ($(uname -r)), UCX $(ucx_info -v 2>/dev/null | head -1 | awk '{ print $NF }'), $(go version | awk '{ print $3 }'), median of REPS=$REPS; load average at the start: $LOAD0, at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
		echo
		cat "$TABLE"
		echo "<!-- perf-vs-ucx:end -->"
	} >"$OUT/perf-vs-ucx.section"
	if ! grep -q '<!-- perf-vs-ucx:begin -->' "$DOC" 2>/dev/null; then
		printf '\n## perf vs UCX\n\nCommand: `bench/perf-vs-ucx.sh --write-docs`.\n\n<!-- perf-vs-ucx:begin -->\n<!-- perf-vs-ucx:end -->\n' >>"$DOC"
	fi
	awk -v sec="$OUT/perf-vs-ucx.section" '
		/<!-- perf-vs-ucx:begin -->/ { while ((getline l < sec) > 0) print l; skip = 1; next }
		/<!-- perf-vs-ucx:end -->/ { skip = 0; next }
		!skip { print }' "$DOC" >"$DOC.tmp" && mv "$DOC.tmp" "$DOC"
	echo "== wrote the table into $DOC" >&2
fi
