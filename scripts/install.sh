#!/bin/sh
# Installs ibnet like a system library under a prefix (the files, then their list on stdout):
#   LIBDIR/libnccl-net-ibnet.so        the NCCL plugin: NCCL_NET_PLUGIN=ibnet loads it by name
#                                      when LIBDIR is on the dynamic loader's path
#   LIBDIR/librccl-net-ibnet.so        RCCL's name for it (a symlink)
#   LIBDIR/libibnet.a                  the static library (plugin tables + ibnet_proxy_* API)
#   INCLUDEDIR/ibnet.h                 its header
#   LIBDIR/pkgconfig/ibnet.pc          pkg-config --cflags --libs ibnet
#   LIBDIR/cmake/ibnet/ibnetConfig.cmake, ibnetConfigVersion.cmake
#                                      find_package(ibnet) -> imported target ibnet::ibnet
#
# Usage: scripts/install.sh [--prefix DIR] [--libdir DIR] [--includedir DIR] [--destdir DIR]
#                           [--strip] [--no-build] [--debug]
#   --prefix      default /usr/local
#   --libdir      default PREFIX/lib (relative: under PREFIX); Debian: /usr/lib/$(gcc -print-multiarch)
#   --includedir  default PREFIX/include (relative: under PREFIX)
#   --destdir     stage under DIR (default $DESTDIR); the files still name the final paths
#   --strip       strip debug info (the release profile keeps line tables)
#   --no-build    install what cargo built last instead of running cargo build (e.g. under sudo)
#   --debug       the debug profile instead of release
# The .so and .a are cargo's libnccl_net_ibnet.{so,a} (cargo cannot emit dashes in names).
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix=/usr/local libdir= includedir= destdir="${DESTDIR:-}" strip=0 build=1 profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --libdir) libdir="$2"; shift 2 ;;
    --includedir) includedir="$2"; shift 2 ;;
    --destdir) destdir="$2"; shift 2 ;;
    --strip) strip=1; shift ;;
    --no-build) build=0; shift ;;
    --debug) profile=debug; shift ;;
    -h|--help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be absolute" >&2; exit 2 ;; esac
under_prefix() { case "$1" in /*) echo "$1" ;; *) echo "$prefix/$1" ;; esac; }
libdir="$(under_prefix "${libdir:-lib}")"
includedir="$(under_prefix "${includedir:-include}")"

cd "$root"
if [ "$build" = 1 ]; then
  if [ "$profile" = release ]; then cargo build -p ibnet-ffi --release >&2; else cargo build -p ibnet-ffi >&2; fi
fi
out="${CARGO_TARGET_DIR:-$root/target}/$profile"
for f in libnccl_net_ibnet.so libnccl_net_ibnet.a; do
  [ -f "$out/$f" ] || { echo "install.sh: $out/$f missing (build first, or drop --no-build)" >&2; exit 1; }
done
# The workspace's version, read without cargo (which may be off root's PATH under sudo).
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
[ -n "$version" ] || { echo "install.sh: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }

d="$destdir"
install -d "$d$libdir/pkgconfig" "$d$libdir/cmake/ibnet" "$d$includedir"
install -m 0755 "$out/libnccl_net_ibnet.so" "$d$libdir/libnccl-net-ibnet.so"
ln -sf libnccl-net-ibnet.so "$d$libdir/librccl-net-ibnet.so"
install -m 0644 "$out/libnccl_net_ibnet.a" "$d$libdir/libibnet.a"
if [ "$strip" = 1 ]; then
  strip --strip-unneeded "$d$libdir/libnccl-net-ibnet.so"
  strip --strip-debug "$d$libdir/libibnet.a"
fi
install -m 0644 include/ibnet.h "$d$includedir/ibnet.h"
# Templates: @PREFIX@, @LIBDIR@, @INCLUDEDIR@, @VERSION@ (paths contain no '|').
subst() {
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@LIBDIR@|$libdir|g" -e "s|@INCLUDEDIR@|$includedir|g" \
      -e "s|@VERSION@|$version|g" "packaging/$1.in" >"$2"
  chmod 0644 "$2"
}
subst ibnet.pc "$d$libdir/pkgconfig/ibnet.pc"
subst ibnetConfig.cmake "$d$libdir/cmake/ibnet/ibnetConfig.cmake"
subst ibnetConfigVersion.cmake "$d$libdir/cmake/ibnet/ibnetConfigVersion.cmake"

for f in libnccl-net-ibnet.so librccl-net-ibnet.so libibnet.a pkgconfig/ibnet.pc \
         cmake/ibnet/ibnetConfig.cmake cmake/ibnet/ibnetConfigVersion.cmake; do
  echo "$libdir/$f"
done
echo "$includedir/ibnet.h"
