#!/bin/sh
# Builds ibnet-ffi and gives its artifacts the names NCCL, RCCL and C/C++ users expect:
#   target/<profile>/libnccl-net-ibnet.so   (NCCL_NET_PLUGIN=ibnet or an absolute path)
#   target/<profile>/librccl-net-ibnet.so   (RCCL's librccl-net-<name>.so)
#   target/<profile>/libibnet.a             (static link, with include/ibnet.h)
# cargo cannot emit dashes in library names, so the files are copies of libnccl_net_ibnet.*.
# Usage: scripts/ffi-artifacts.sh [release|debug]   (default: release)
set -eu
profile="${1:-release}"
cd "$(dirname "$0")/.."
if [ "$profile" = release ]; then cargo build -p ibnet-ffi --release; else cargo build -p ibnet-ffi; fi
dir="${CARGO_TARGET_DIR:-target}/$profile"
cp -f "$dir/libnccl_net_ibnet.so" "$dir/libnccl-net-ibnet.so"
cp -f "$dir/libnccl_net_ibnet.so" "$dir/librccl-net-ibnet.so"
cp -f "$dir/libnccl_net_ibnet.a" "$dir/libibnet.a"
echo "$dir/libnccl-net-ibnet.so $dir/librccl-net-ibnet.so $dir/libibnet.a"
