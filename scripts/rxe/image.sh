#!/usr/bin/env bash
# image.sh — build (or reuse) the cached Debian VM image that the rxe suite boots.
#
#   scripts/rxe/image.sh            # prints the image directory; builds it first if missing/stale
#   IBNET_RXE_REBUILD=1 scripts/rxe/image.sh
#
# The image is a read-only ext4 disk with a Debian kernel, libibverbs + the rxe provider and a
# tiny PID 1 (`/ibnet-init`) that mounts the host share over 9p and hands over to the share's
# `run.sh`. Everything that changes with the project lives in the share, so the image is only
# rebuilt when this file changes (its hash is the cache key) or the image is missing.
#
#   $IBNET_RXE_CACHE/image/{vmlinuz,initrd.img,rootfs.img,key}   (image-SUITE/ for another suite)
#
# Needs root (debootstrap), debootstrap, e2fsprogs, and a Debian archive (MIRROR).
set -euo pipefail
CACHE=${IBNET_RXE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibnet-rxe-vm}
SUITE=${IBNET_RXE_SUITE:-bookworm}   # must match the host's libc: binaries are built on the host
PACKAGES=linux-image-amd64,initramfs-tools,libibverbs1,ibverbs-providers,ibverbs-utils,iproute2,kmod,procps

# Debian archive: the one this host's apt uses if it is a Debian archive, else deb.debian.org.
if [ -z "${MIRROR:-}" ]; then
  MIRROR=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list |
           grep -oE 'https?://[^ ]*/debian/?( |$)' | head -1 | tr -d ' ' || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

# Cache key: this script's build recipe (everything from the "recipe" marker on) and the suite.
key=$( { sed -n '/^# ---- recipe/,$p' "$0"; echo "$SUITE $PACKAGES"; } | sha256sum | cut -c1-16)
# bookworm (the rxe suite's) keeps the folder `image`; another suite gets `image-SUITE`, so the
# rxe suite's and the cluster suite's images live side by side in one cache.
if [ "$SUITE" = bookworm ]; then img=$CACHE/image; else img=$CACHE/image-$SUITE; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.image.lock"
flock -w 1200 9 || { echo "image.sh: timed out waiting for $CACHE/.image.lock" >&2; exit 1; }

if [ -z "${IBNET_RXE_REBUILD:-}" ] && [ "$(cat "$img/key" 2>/dev/null)" = "$key" ] &&
   [ -s "$img/rootfs.img" ]; then
  echo "$img"; exit 0
fi

# ---- recipe: changing anything below rebuilds the image
[ "$(id -u)" = 0 ] || { echo "image.sh: building the VM image needs root (debootstrap)" >&2; exit 1; }
echo "image.sh: building $SUITE image in $img (debootstrap from $MIRROR, ~2 min)" >&2
build=$CACHE/build.tmp
rm -rf "$build" && mkdir -p "$build"
t0=$SECONDS
timeout 900 debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$build/rootfs" "$MIRROR" \
  >"$build/debootstrap.log" 2>&1 || { tail -30 "$build/debootstrap.log" >&2; exit 1; }
rm -rf "$build"/rootfs/var/cache/apt/archives/*.deb "$build"/rootfs/var/lib/apt/lists/*

# PID 1: mount the basics and the host share, then hand over to the share's run.sh.
# On any failure it powers the VM off, so qemu exits and the host reports what it saw.
cat >"$build/rootfs/ibnet-init" <<'INIT'
#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The initramfs hands /proc, /sys, /dev and /run over already mounted.
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mountpoint -q /run || mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
echo "RXE-GUEST-UP $(cut -d' ' -f1 /proc/uptime)s $(uname -r)"
mkdir -p /run/host
if modprobe 9pnet_virtio && modprobe 9p &&
   mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,ro hostshare /run/host &&
   [ -x /run/host/run.sh ]; then
  /run/host/run.sh
else
  echo "RXE-GUEST-ERROR no host share or no run.sh in it"
fi
echo o >/proc/sysrq-trigger
sleep 60
INIT
chmod 755 "$build/rootfs/ibnet-init"
cp "$build"/rootfs/boot/vmlinuz-* "$build/vmlinuz"
cp "$build"/rootfs/boot/initrd.img-* "$build/initrd.img"
# 2 GiB sparse; mke2fs -d fills it from the directory, no loop mount needed.
truncate -s 2G "$build/rootfs.img"
mke2fs -q -t ext4 -L ibnet-rxe -d "$build/rootfs" "$build/rootfs.img"
rm -rf "$build/rootfs"
echo "$key" >"$build/key"
rm -rf "$img" && mv "$build" "$img"
echo "image.sh: built in $((SECONDS - t0)) s" >&2
echo "$img"
