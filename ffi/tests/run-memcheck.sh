#!/bin/sh
# The two-process C ABI test under valgrind memcheck (call from .ci/run):
#   ffi/tests/run-memcheck.sh
# abi_test --server and --client (ffi/tests/c/abi_test.c) with IBNET_PROVIDER=soft, each under
# memcheck: the plugin's full C surface (bad input, two load cycles, the proxy logger) and the
# data test through the v11 and v8 tables at a few sizes (0 B .. 64 KiB and an 8-way
# multi-receive, verified). Fails unless both processes pass and memcheck reports 0 errors in
# each, definite and possible leaks included; ffi/tests/valgrind.supp lists the std/libc noise.
# Costs ~10 s on 2 cores (the release plugin is already built by run-c-tests.sh).
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
command -v valgrind >/dev/null || { echo "FAIL: valgrind is not installed"; exit 1; }
scripts/ffi-artifacts.sh release >/dev/null
dir="${CARGO_TARGET_DIR:-target}/release"
so="$root/$dir/libnccl-net-ibnet.so"
out="$dir/memcheck"
mkdir -p "$out"
cc -O1 -g -Wall -Wextra -o "$out/abi_test" ffi/tests/c/abi_test.c -ldl
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
vg() {
  who="$1"; shift
  valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
    --show-leak-kinds=definite,possible --errors-for-leak-kinds=definite,possible \
    --suppressions=ffi/tests/valgrind.supp --gen-suppressions=all --num-callers=40 \
    --log-file="$out/$who.vg" "$out/abi_test" "$so" 1 "$@" >"$out/$who.out" 2>&1
}
export IBNET_PROVIDER=soft ABI_TEST_TABLES=11,8 ABI_TEST_MAX_BYTES=65536 ABI_TEST_BW_ITERS=2 ABI_TEST_ALARM_S=300
vg server --server "$port" &
spid=$!
sleep 1
crc=0; vg client --client "127.0.0.1:$port" || crc=$?
src=0; wait "$spid" || src=$?
for who in server client; do
  echo "== $who: $(grep -E 'ERROR SUMMARY' "$out/$who.vg" | sed 's/^==[0-9]*== //')"
  grep -E 'definitely lost|possibly lost|still reachable|suppressed: [0-9,]+ bytes' "$out/$who.vg" | sed 's/^==[0-9]*== /   /'
  grep -q 'unhandled amd64-linux syscall: 434' "$out/$who.vg" &&
    echo "   (valgrind has no pidfd_open: the soft provider's ENOSYS fallback ran)"
done
if grep -q "cross-memory attach is NOT PERMITTED" "$out/server.out" "$out/client.out"; then
  echo "!!!!!!!! WARNING: cross-memory attach refused: the memcheck data test did NOT run !!!!!!!!" >&2
  [ "${IBNET_ALLOW_NO_CMA:-0}" = 1 ] || { echo "FAIL (set IBNET_ALLOW_NO_CMA=1 to accept)"; exit 1; }
  exit 0
fi
if [ "$src" != 0 ] || [ "$crc" != 0 ]; then
  echo "FAIL: server exit $src, client exit $crc (99: memcheck errors); logs in $out"
  for who in server client; do echo "--- $who.out"; tail -20 "$out/$who.out"; echo "--- $who.vg"; tail -80 "$out/$who.vg"; done
  exit 1
fi
for t in v11 v8; do
  grep -q "$t two-host receiver: verified" "$out/server.out" && grep -q "$t two-host sender: verified" "$out/client.out" ||
    { echo "FAIL: the $t data test did not run under memcheck"; exit 1; }
done
echo "run-memcheck: OK (0 memcheck errors in both processes)"
