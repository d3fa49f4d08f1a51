#!/bin/sh
# C/C++ tests of the built plugin (call from .ci/run):
#   ffi/tests/run-c-tests.sh [release|debug]
# 1. symbols: ncclNetPlugin_v6..v11 exported, no ibv_* exported, no NEEDED libibverbs;
# 2. abi_test (dlopen RTLD_NOW|RTLD_LOCAL, v11 and v8 tables, bad input, two load cycles;
#    the two-process data test runs when the plugin reports devices, e.g. IBNET_PROVIDER=soft);
# 3. abi_test with libibverbs hidden (unshare -m + bind mount of /dev/null; root only);
# 4. static_test: C++ linked against libibnet.a.
set -eu
profile="${1:-release}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
scripts/ffi-artifacts.sh "$profile" >/dev/null
dir="${CARGO_TARGET_DIR:-target}/$profile"
so="$dir/libnccl-net-ibnet.so"
out="$dir/ctest"
mkdir -p "$out"

echo "== symbols"
syms="$(nm -D --defined-only "$so" | awk '{print $3}')"
for v in 6 7 8 9 10 11; do echo "$syms" | grep -qx "ncclNetPlugin_v$v" || { echo "missing ncclNetPlugin_v$v"; exit 1; }; done
if echo "$syms" | grep -q '^ibv_'; then echo "exports ibv_* symbols"; exit 1; fi
if readelf -d "$so" | grep NEEDED | grep -q ibverbs; then echo "NEEDED libibverbs"; exit 1; fi
echo "$syms" | tr '\n' ' '; echo; echo "no ibv_* exports, no NEEDED libibverbs: ok"

echo "== abi_test (libibverbs present)"
cc -O2 -Wall -Wextra -o "$out/abi_test" ffi/tests/c/abi_test.c -ldl
"$out/abi_test" "$so"

echo "== abi_test (libibverbs absent)"
lib="$(ldconfig -p | awk '/libibverbs.so.1 /{print $NF; exit}')"
if [ -n "$lib" ] && [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  unshare -m sh -c "mount --bind /dev/null '$lib' && IBNET_PROVIDER=auto '$out/abi_test' '$so' 0"
else
  echo "SKIP: needs root, unshare and an installed libibverbs.so.1 to hide"
fi

echo "== static_test (C++ + libibnet.a)"
c++ -O2 -Wall -I include -o "$out/static_test" ffi/tests/c/static_test.cpp "$dir/libibnet.a" -lpthread -ldl -lm
"$out/static_test"
