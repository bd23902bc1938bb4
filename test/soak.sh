#!/bin/sh
# Fault and soak suite (internal/soak) for as long as asked:
#
#   test/soak.sh [duration] [peers] [devices] [seed]
#   test/soak.sh 2h 4 tcp0,shm0 0      # two hours per device, 4 peers, fresh seed
#
# Defaults: 2m, 3 peers, tcp0,shm0, seed 1 (seed 0 picks one from the clock
# and prints it, so a failure can be replayed with the same schedule).
# Extra `go test` flags go in GOFLAGS (e.g. GOFLAGS=-race).
set -eu
dur=${1:-2m}
peers=${2:-3}
devices=${3:-tcp0,shm0}
seed=${4:-1}
cd "$(dirname "$0")/.."
# No go test timeout: each device's run has its own watchdog (the duration
# plus 3 minutes) that dumps every goroutine, kills the peers and panics.
exec go test ./internal/soak -run '^TestSoak$' -count=1 -v -timeout 0 \
	-soak.duration="$dur" -soak.peers="$peers" -soak.device="$devices" -soak.seed="$seed"
