#!/usr/bin/env bash
# ci.sh - prove transport/ibverbs on real Linux verbs devices: Soft-RoCE
# (rdma_rxe) and soft-iWARP (siw) in a QEMU guest running Debian's kernel.
#
# Does everything on a clean Debian 12 machine as root: apt-get installs
# the host packages (qemu, rdma-core, perftest, rdmacm-utils, gcc, ...),
# fetches and unpacks the guest kernel, builds siw.ko (build.sh, cached
# under $RDMAVM_CACHE), builds the test binaries on the host with
# -tags ibverbs, boots the guest (run.sh, TCG), runs guest/ci-guest.sh
# there (go tests, rdmakit info/perf, coll-perf over rxe and siw,
# interop) and prints its RESULT lines and the summary
# "N passed, N failed, N skipped". Exit status: 0 only if all passed.
#
#   test/vm/ci.sh              full run (~8 min on 2 cores, ~2 min of it the first build)
#   CI_QUICK=1 test/vm/ci.sh   conformance in one-process mode only
#   CI_RUN='TestQuirk|TestDefect' test/vm/ci.sh
#                              only the go tests matching the pattern (iterating)
#
# Env: RDMAVM_CACHE (default /tmp/rdmakit-vm), CI_VM_TIMEOUT (guest wall
# limit, default 1500 s), CI_KEEP=1 keeps the work dir with all logs.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export RDMAVM_CACHE=${RDMAVM_CACHE:-/tmp/rdmakit-vm}
t0=$(date +%s)
say() { echo "[ci $(( $(date +%s) - t0 ))s] $*" >&2; }

say "build.sh: host packages, guest kernel, siw, initramfs"
bash "$HERE/build.sh"

# The work dir is shared with the guest read-write at the same path. Keep
# it out of the repository: the guest mounts a fresh tmpfs on /tmp, so a
# repository under /tmp would be hidden there, while the shared dir is not.
WORK=$(mktemp -d /tmp/rdmakit-vm-ci.XXXXXX)
[[ ${CI_KEEP:-0} == 1 ]] || trap 'rm -rf "$WORK"' EXIT
cp "$HERE"/guest/*.sh "$WORK/"

say "building test binaries (-tags ibverbs)"
export CGO_ENABLED=1
( cd "$ROOT"
  go test -c -tags ibverbs -o "$WORK/ibverbs.test" ./transport/ibverbs
  go test -c -o "$WORK/deviceplugin.test" ./internal/kube/deviceplugin
  go test -c -tags ibverbs -o "$WORK/roce.test" ./transport/roce
  if ! go build -tags ibverbs -o "$WORK/rdmakit" ./cmd/rdmakit 2> "$WORK/rdmakit-build.txt"; then
    echo "rdmakit did not build with -tags ibverbs:" >&2; cat "$WORK/rdmakit-build.txt" >&2
  fi )

say "booting the guest"
set +e
bash "$HERE/run.sh" -t "${CI_VM_TIMEOUT:-1500}" -m 3G -w "$WORK" -e CI_QUICK="${CI_QUICK:-0}" -e CI_RUN="${CI_RUN:-}" -e CI_COUNT="${CI_COUNT:-}" -e CI_LOG="$WORK/logs" \
  -- bash "$WORK/ci-guest.sh" 2>&1 | tee "$WORK/guest.txt"
rc=${PIPESTATUS[0]}
set -e
[[ ${CI_KEEP:-0} == 1 ]] && say "logs kept in $WORK/logs"
if ! grep -qE '^[0-9]+ passed, [0-9]+ failed' "$WORK/guest.txt"; then
  echo "0 passed, 1 failed: the guest did not finish (rc=$rc)"
  [[ $rc == 0 ]] && rc=1
fi
say "done, exit $rc"
exit "$rc"
