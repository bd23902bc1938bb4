#!/usr/bin/env bash
# build.sh - build a kernel + initramfs that boots Debian's own kernel under
# QEMU (KVM where it is real VMX/SVM KVM, TCG otherwise; see run.sh) with real
# RDMA verbs devices (Soft-RoCE rdma_rxe, soft-iWARP siw).
#
# Nothing is installed into the host's /boot or /lib/modules: the kernel .deb
# is fetched with `apt-get download` and unpacked under $RDMAVM_CACHE.
# Debian does not build siw (CONFIG_RDMA_SIW is not set), so siw.ko is built
# out-of-tree from Debian's linux-source package against Debian's headers.
#
# Env knobs:
#   RDMAVM_CACHE       work/cache dir            (default /tmp/rdmakit-vm)
#   RDMAVM_KERNEL_META kernel meta package       (default linux-image-amd64 = 6.1 on Debian 12;
#                      linux-image-6.12-amd64 gives Debian 12's 6.12 kernel)
#   RDMAVM_KERNEL_PKG  exact kernel image package (overrides the meta package)
#   RDMAVM_SIW=0       skip building siw          (saves ~140 MB download, ~30 s)
#   RDMAVM_SKIP_APT=1  do not apt-get install host packages
#   RDMAVM_PRUNE=1     afterwards delete downloads and unpacked trees (~750 MB), keep only
#                      what run.sh needs (vmlinuz, vmlinux, initramfs: ~50 MB)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RDMAVM_CACHE:-/tmp/rdmakit-vm}
WITH_SIW=${RDMAVM_SIW:-1}
export DEBIAN_FRONTEND=noninteractive
APT_DL=(apt-get -q -o APT::Sandbox::User=root download)
t0=$(date +%s)
log() { echo "[build $(( $(date +%s) - t0 ))s] $*" >&2; }

# ---------------------------------------------------------------- host packages
HOST_PKGS=(qemu-system-x86 busybox-static cpio kmod xz-utils zstd binutils iproute2 gcc make
           libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils
           perftest rdmacm-utils tcpdump tshark nftables)
if [[ ${RDMAVM_SKIP_APT:-0} != 1 ]]; then
  missing=()
  for p in "${HOST_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  apt-get -q update >/dev/null     # also needed for apt-cache/apt-get download below
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    apt-get -q install -y --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# ---------------------------------------------------------------- kernel package
if [[ -z ${RDMAVM_KERNEL_PKG:-} ]]; then
  META=${RDMAVM_KERNEL_META:-linux-image-amd64}      # or linux-image-6.12-amd64 on Debian 12
  RDMAVM_KERNEL_PKG=$(apt-cache depends "$META" | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
KPKG=$RDMAVM_KERNEL_PKG
KVER=${KPKG#linux-image-}                                   # e.g. 6.1.0-57-amd64
KDEBVER=$(apt-cache show "$KPKG" | awk '/^Version:/{print $2; exit}')   # e.g. 6.1.192-3
[[ -n $KDEBVER ]] || { echo "unknown kernel package $KPKG (run apt-get update?)" >&2; exit 1; }
log "kernel $KPKG ($KDEBVER)"

mkdir -p "$CACHE/dl"
KROOT=$CACHE/kernel-$KVER
if [[ ! -f $KROOT/.done ]]; then
  ( cd "$CACHE/dl" && ls "${KPKG}"_*.deb >/dev/null 2>&1 || "${APT_DL[@]}" "$KPKG=$KDEBVER" >/dev/null )
  rm -rf "$KROOT"; mkdir -p "$KROOT"
  dpkg-deb -x "$CACHE/dl/${KPKG}"_*.deb "$KROOT"
  depmod -b "$KROOT" "$KVER"
  touch "$KROOT/.done"
fi
MODDIR=$KROOT/lib/modules/$KVER

# ---------------------------------------------------------------- siw (out of tree)
SIW_KO=$CACHE/siw-$KVER/siw.ko
if [[ $WITH_SIW == 1 && ! -f $SIW_KO ]]; then
  HPKG=linux-headers-$KVER
  HCOMMON=$(apt-cache depends "$HPKG" | awk '/Depends: linux-headers-.*-common/{print $2; exit}')
  KBUILD=$(apt-cache depends "$HPKG" | awk '/Depends: linux-kbuild-/{print $2; exit}')
  SRCPKG=linux-source-$(echo "$KDEBVER" | cut -d. -f1,2)           # linux-source-6.1
  log "siw: fetching $HPKG $HCOMMON $KBUILD $SRCPKG"
  ( cd "$CACHE/dl"
    for p in "$HPKG" "$HCOMMON" "$KBUILD" "$SRCPKG"; do
      ls "${p}"_*.deb >/dev/null 2>&1 || "${APT_DL[@]}" "$p=$KDEBVER" >/dev/null
    done )
  HROOT=$CACHE/headers-$KVER
  rm -rf "$HROOT"; mkdir -p "$HROOT"
  for p in "$HPKG" "$HCOMMON" "$KBUILD"; do dpkg-deb -x "$CACHE/dl/${p}"_*.deb "$HROOT"; done
  HDIR=$HROOT/usr/src/linux-headers-$KVER
  # The arch Makefile includes the -common one by absolute /usr/src path: repoint it.
  sed -i "s#include /usr/src/#include $HROOT/usr/src/#" "$HDIR/Makefile"
  SB=$CACHE/siw-$KVER; rm -rf "$SB"; mkdir -p "$SB"
  dpkg-deb --fsys-tarfile "$CACHE/dl/${SRCPKG}"_*.deb \
    | tar -xO "./usr/src/${SRCPKG}.tar.xz" \
    | tar -xJ -C "$SB" --strip-components=5 "${SRCPKG}/drivers/infiniband/sw/siw"
  log "siw: compiling"
  make -s -C "$HDIR" M="$SB" CONFIG_RDMA_SIW=m CONFIG_DEBUG_INFO_BTF_MODULES= modules -j"$(nproc)" 2>&1 | grep -v 'Skipping BTF' >&2 || true
  [[ -f $SIW_KO ]] || { echo "siw build failed" >&2; exit 1; }
fi

# ---------------------------------------------------------------- initramfs tree
R=$CACHE/initramfs-$KVER
rm -rf "$R"; mkdir -p "$R"/{bin,proc,sys,dev,tmp,run,newroot,lower,rw,etc}; ln -s bin "$R/sbin"
cp /bin/busybox "$R/bin/busybox"
for a in $(/bin/busybox --list); do [[ -e $R/bin/$a ]] || ln -s busybox "$R/bin/$a"; done

# Modules: 9p root + overlay, RDMA core/CM/uverbs, rxe, veth/dummy, crc32 (rxe ICRC) and crc32c (siw).
MODS=(virtio_pci 9pnet_virtio 9p overlay
      ib_core ib_uverbs ib_umad ib_cm iw_cm rdma_cm rdma_ucm rdma_rxe
      veth dummy sch_netem libcrc32c crc32c_generic crc32c_intel crc32_generic crc32_pclmul)
mkdir -p "$R/lib/modules/$KVER"
for m in "${MODS[@]}"; do
  modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
  rel=${ko#"$MODDIR"/}
  mkdir -p "$R/lib/modules/$KVER/$(dirname "$rel")"
  case $ko in
    *.ko.xz)  xz -dc "$ko"   > "$R/lib/modules/$KVER/${rel%.xz}" ;;
    *.ko.zst) zstd -qdc "$ko" > "$R/lib/modules/$KVER/${rel%.zst}" ;;
    *)        cp "$ko" "$R/lib/modules/$KVER/$rel" ;;
  esac
done
cp "$MODDIR"/modules.builtin* "$MODDIR"/modules.order "$R/lib/modules/$KVER/"
if [[ -f $SIW_KO ]]; then
  mkdir -p "$R/lib/modules/$KVER/extra"; cp "$SIW_KO" "$R/lib/modules/$KVER/extra/"
fi
depmod -b "$R" "$KVER"

install -m 0755 "$HERE/init" "$R/init"
echo "$KVER" > "$R/etc/rdmavm-kver"

# ---------------------------------------------------------------- pack
cp "$KROOT/boot/vmlinuz-$KVER" "$CACHE/vmlinuz-$KVER"
# Uncompressed ELF vmlinux: QEMU boots it through its PVH entry (CONFIG_PVH=y), which
# skips the in-guest xz decompressor (~4 s under TCG emulation).
# Debian 6.1 images are xz-compressed, 6.12 ones zstd-compressed.
rm -f "$CACHE/vmlinux-$KVER.tmp"
off=$(grep -abo $'\xfd7zXZ\x00' "$CACHE/vmlinuz-$KVER" | head -1 | cut -d: -f1 || true)
[[ -n $off ]] && { tail -c +$((off + 1)) "$CACHE/vmlinuz-$KVER" | xz -dc --single-stream > "$CACHE/vmlinux-$KVER.tmp"; } 2>/dev/null || true
if [[ ! -s $CACHE/vmlinux-$KVER.tmp ]]; then
  off=$(grep -abo $'\x28\xb5\x2f\xfd' "$CACHE/vmlinuz-$KVER" | head -1 | cut -d: -f1 || true)
  [[ -n $off ]] && { tail -c +$((off + 1)) "$CACHE/vmlinuz-$KVER" | zstd -qdc > "$CACHE/vmlinux-$KVER.tmp"; } 2>/dev/null || true
fi
if readelf -n "$CACHE/vmlinux-$KVER.tmp" 2>/dev/null | grep -q 'note type: (0x00000012)'; then
  mv "$CACHE/vmlinux-$KVER.tmp" "$CACHE/vmlinux-$KVER"
else
  rm -f "$CACHE/vmlinux-$KVER.tmp" "$CACHE/vmlinux-$KVER"; log "no PVH vmlinux; will boot the bzImage"
fi
( cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1 ) > "$CACHE/initramfs-$KVER.cpio.gz"
echo "$KVER" > "$CACHE/current"
if [[ ${RDMAVM_PRUNE:-0} == 1 ]]; then
  rm -rf "$CACHE/dl" "$KROOT" "$CACHE/headers-$KVER" "$R"
  find "$CACHE/siw-$KVER" -mindepth 1 ! -name siw.ko -delete 2>/dev/null || true
fi
log "done: $CACHE/vmlinuz-$KVER ($(du -h "$CACHE/vmlinuz-$KVER" | cut -f1)), $CACHE/initramfs-$KVER.cpio.gz ($(du -h "$CACHE/initramfs-$KVER.cpio.gz" | cut -f1))"
