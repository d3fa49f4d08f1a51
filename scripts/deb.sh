#!/bin/sh
# Builds the Debian package `ibnet` with cargo-deb ([package.metadata.deb] in ffi/Cargo.toml):
#   usr/lib/<multiarch>/libnccl-net-ibnet.so      (NCCL_NET_PLUGIN=ibnet loads it by name)
#   usr/lib/<multiarch>/librccl-net-ibnet.so      -> libnccl-net-ibnet.so (RCCL)
#   usr/lib/<multiarch>/libibnet.a, pkgconfig/ibnet.pc, cmake/ibnet/ibnetConfig*.cmake
#   usr/include/ibnet.h, usr/share/doc/ibnet/{README.md,copyright}
# Needs cargo-deb (cargo install --locked cargo-deb --version 3.7.0) and dpkg-dev (Depends).
# Prints the .deb's path. Usage: scripts/deb.sh
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if ! cargo deb --version >/dev/null 2>&1; then
  echo "deb.sh: cargo-deb missing: cargo install --locked cargo-deb --version 3.7.0" >&2; exit 1
fi
tuple="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"
cargo build -p ibnet-ffi --release >&2
# The non-cargo assets, with the package's paths in ibnet.pc and ibnetConfig.cmake.
stage=ffi/target/ibnet-deb/root
rm -rf "$stage"
scripts/install.sh --no-build --strip --prefix /usr --libdir "/usr/lib/$tuple" --destdir "$stage" >/dev/null
out="${CARGO_TARGET_DIR:-$root/target}/debian"
mkdir -p "$out"
deb="$(cargo deb -p ibnet-ffi --no-build --multiarch=same --strip -o "$out/" | tail -n 1)"
# cargo-deb puts usr/lib assets under its own multiarch tuple: it must be install.sh's.
dpkg-deb -c "$deb" | grep "usr/lib/$tuple/pkgconfig/ibnet.pc" >/dev/null ||
  { echo "deb.sh: $deb has no usr/lib/$tuple/pkgconfig/ibnet.pc" >&2; exit 1; }
echo "$deb"
