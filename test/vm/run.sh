#!/usr/bin/env bash
# run.sh - boot the rdmavm guest (built by build.sh), run one command in it,
# print its output, power off, and exit with the command's exit code.
#
#   run.sh [options] -- CMD [ARGS...]      run CMD (with bash) inside the guest
#   run.sh --shell                         interactive shell on the serial console
#
# Options:
#   -t SECS      wall-clock limit for the whole VM (default 600); exit 124 on timeout
#   -m MEM       guest memory (default 2G)
#   -c N         guest vCPUs (default: host nproc)
#   -w DIR       host dir shared read-write at the same path and used as cwd (default: $PWD)
#   -W           share no work dir (cwd in guest = /root)
#   -e VAR=VAL   extra environment variable for CMD (repeatable)
#   -k KVER      kernel version to boot (default: last one built)
#   -l FILE      keep the kernel console log (ttyS0) in FILE
#   -v           print the kernel console log after the run
#
# Env: RDMAVM_ACCEL=auto|kvm|tcg (auto: kvm only if /dev/kvm is writable and not kvm_pvm),
#      RDMAVM_CACHE (default /tmp/rdmakit-vm), RDMAVM_BZIMAGE=1 (boot vmlinuz instead of PVH vmlinux)
# Exit codes: CMD's own code; 124 = timeout; 125 = guest died before reporting a code.
# Inside the guest the host's / is visible read-only (with a tmpfs overlay on top,
# so writes succeed but vanish), the work dir is shared read-write, /tmp is a
# fresh tmpfs, the RDMA modules are already loaded, and there is no network
# device except lo (-nic none).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RDMAVM_CACHE:-/tmp/rdmakit-vm}
TMO=600; MEM=2G; CPUS=$(nproc); WORK=$PWD; KVER=; CONLOG=; VERBOSE=0; SHELLMODE=0
ENVS=()
while (($#)); do
  case $1 in
    -t) TMO=$2; shift 2 ;;
    -m) MEM=$2; shift 2 ;;
    -c) CPUS=$2; shift 2 ;;
    -w) WORK=$(cd "$2" && pwd); shift 2 ;;
    -W) WORK=; shift ;;
    -e) ENVS+=("$2"); shift 2 ;;
    -k) KVER=$2; shift 2 ;;
    -l) CONLOG=$2; shift 2 ;;
    -v) VERBOSE=1; shift ;;
    --shell) SHELLMODE=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[[ $SHELLMODE == 1 || $# -gt 0 ]] || { echo "usage: $0 [opts] -- CMD [ARGS...] | --shell" >&2; exit 2; }
KVER=${KVER:-$(cat "$CACHE/current" 2>/dev/null || true)}
KERNEL=$CACHE/vmlinuz-$KVER; INITRD=$CACHE/initramfs-$KVER.cpio.gz
[[ -f $CACHE/vmlinux-$KVER && ${RDMAVM_BZIMAGE:-0} != 1 ]] && KERNEL=$CACHE/vmlinux-$KVER   # PVH boot, no decompressor
[[ -n $KVER && -f $KERNEL && -f $INITRD ]] || { echo "no image in $CACHE; run $HERE/build.sh first" >&2; exit 2; }

RUN=$(mktemp -d /tmp/rdmakit-vm-run.XXXXXX)
trap 'rm -rf "$RUN"' EXIT
{
  printf 'RDMAVM_CWD=%q\n' "${WORK:-/root}"
  for e in "${ENVS[@]}"; do printf '%s=%q\n' "${e%%=*}" "${e#*=}"; done
} > "$RUN/env"
if [[ $SHELLMODE == 0 ]]; then
  if [[ $# -eq 1 && $1 == *' '* ]]; then printf '%s\n' "$1" > "$RUN/cmd"   # one string = shell script
  else printf '%q ' "$@" > "$RUN/cmd"; echo >> "$RUN/cmd"; fi
fi

# Accelerator: KVM only where it is real VMX/SVM KVM. A /dev/kvm served by kvm_pvm
# (PVM, nested without VMX/SVM) only runs PVM-enlightened guest kernels: a stock
# Debian kernel hangs in its decompressor there, so use TCG (multi-threaded).
ACCEL_MODE=${RDMAVM_ACCEL:-auto}
if [[ $ACCEL_MODE == auto ]]; then
  if [[ -w /dev/kvm && ! -d /sys/module/kvm_pvm ]]; then ACCEL_MODE=kvm; else ACCEL_MODE=tcg; fi
fi
case $ACCEL_MODE in
  kvm) ACCEL=(-accel kvm -cpu host,-arch-capabilities) ;;
  tcg) ACCEL=(-accel tcg,thread=multi,tb-size=512 -cpu max) ;;
  *) echo "RDMAVM_ACCEL must be auto, kvm or tcg" >&2; exit 2 ;;
esac
APPEND="console=ttyS0 quiet loglevel=4 panic=-1 oops=panic rdmavm.accel=$ACCEL_MODE rdmavm.work=${WORK}"
[[ $SHELLMODE == 1 ]] && APPEND+=" rdmavm.shell=1"
QEMU=(qemu-system-x86_64 "${ACCEL[@]}" -m "$MEM" -smp "$CPUS" -no-reboot -nodefaults
      -display none -nic none
      -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND"
      -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
      -virtfs local,path="$RUN",mount_tag=rdmavm_run,security_model=none)
[[ -n $WORK ]] && QEMU+=(-virtfs local,path="$WORK",mount_tag=rdmavm_work,security_model=none,multidevs=remap)

if [[ $SHELLMODE == 1 ]]; then
  "${QEMU[@]}" -serial mon:stdio; exit $?     # not exec: the EXIT trap removes $RUN
fi
CON=${CONLOG:-$RUN/console.log}
set +e
timeout -k 5 "$TMO" "${QEMU[@]}" -serial file:"$CON" -serial stdio < /dev/null
qrc=$?
set -e
if [[ -f $RUN/rc ]]; then rc=$(cat "$RUN/rc")
elif [[ $qrc == 124 || $qrc == 137 ]]; then echo "rdmavm: timeout after ${TMO}s" >&2; rc=124
else echo "rdmavm: guest gave no exit code (qemu rc=$qrc)" >&2; rc=125; fi
if [[ $VERBOSE == 1 || $rc == 125 ]]; then echo "----- guest kernel console -----" >&2; tr -d '\r' < "$CON" >&2; fi
exit "$rc"
