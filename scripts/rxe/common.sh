# common.sh — what the single-VM rxe suite (vm-test.sh) and the two-VM cluster suite
# (../cluster/test.sh) share: the host packages, and staging the share (building the plugin, the
# tools and the C test programs on the host, then copying them into bin/, lib/ and rust/).
# shellcheck shell=bash
#
# Source it with `here` (scripts/rxe) and `repo` set. Reads IBNET_RXE_BUILD, IBNET_RXE_PROFILE,
# IBNET_RXE_TEST_PKGS, IBNET_RXE_RUST_TESTS, IBNET_RXE_EXTRA and CARGO_TARGET_DIR (see README.md).

# rxe_host_packages [PKG...] — installs (apt, as root) the host packages that are missing.
rxe_host_packages() {
  local need=() p
  for p in qemu-system-x86 debootstrap e2fsprogs gcc libibverbs-dev "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || { echo "missing host packages (run as root to install): ${need[*]}"; return 1; }
  DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# rxe_stage SHARE — builds (unless IBNET_RXE_BUILD=0) and copies into SHARE: lib/ the plugin as
# libnccl-net-ibnet.so, bin/ verbs-probe, abi_test, plugin-faults, ibnet-info, ibnet-perf and
# IBNET_RXE_EXTRA, rust/ the `cargo test --no-run` executables of IBNET_RXE_TEST_PKGS whose
# target name matches IBNET_RXE_RUST_TESTS.
rxe_stage() {
  local share=$1 target=${CARGO_TARGET_DIR:-$repo/target} profile=${IBNET_RXE_PROFILE:-release}
  local pkgs p pflag=() so f tools=()
  mkdir -p "$share/bin" "$share/lib" "$share/rust"
  gcc -O2 -Wall -Wextra -Werror -o "$share/bin/verbs-probe" "$here/verbs-probe.c" -libverbs
  pkgs=$(cargo metadata --no-deps --format-version 1 --manifest-path "$repo/Cargo.toml" 2>/dev/null |
         grep -o '"name":"ibnet-[a-z-]*","version"' | cut -d'"' -f4 || true)
  has_pkg() { grep -qx "$1" <<<"$pkgs"; }
  if [ "${IBNET_RXE_BUILD:-1}" != 0 ]; then
    [ "$profile" = release ] && pflag=(--release)
    if has_pkg ibnet-ffi; then (cd "$repo" && cargo build -q -p ibnet-ffi "${pflag[@]}"); fi
    # Tools in debug: `cargo test --workspace` has built them already.
    if has_pkg ibnet-tools; then (cd "$repo" && cargo build -q -p ibnet-tools --bins); fi
    # Test executables (debug, as `cargo test` builds them) whose target name matches the regex.
    for p in ${IBNET_RXE_TEST_PKGS-ibnet-ffi}; do
      has_pkg "$p" || continue
      (cd "$repo" && cargo test -q -p "$p" --no-run --message-format=json) |
        sed -n 's/.*"target":{[^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2/p' |
        while read -r name exe; do
          if [[ $name =~ ${IBNET_RXE_RUST_TESTS:-^verbs} ]]; then install -m755 "$exe" "$share/rust/$name"; fi
        done
    done
  fi
  # The plugin under the name NCCL loads, and the C ABI test that dlopens it like NCCL does.
  so=$target/$profile/libnccl_net_ibnet.so
  if has_pkg ibnet-ffi && [ -f "$so" ]; then install -m755 "$so" "$share/lib/libnccl-net-ibnet.so"; fi
  if [ -f "$repo/ffi/tests/c/abi_test.c" ]; then
    cc -O2 -Wall -Wextra -o "$share/bin/abi_test" "$repo/ffi/tests/c/abi_test.c" -ldl
  fi
  # Our own fault/lifecycle program (plugin-faults.c) needs the plugin's C header.
  if [ -f "$repo/include/ibnet.h" ]; then
    cc -O2 -Wall -Wextra -Werror -I"$repo/include" -o "$share/bin/plugin-faults" \
      "$here/plugin-faults.c" -ldl
  fi
  has_pkg ibnet-tools && tools=("$target/debug/ibnet-info" "$target/debug/ibnet-perf")
  for f in "${tools[@]}" ${IBNET_RXE_EXTRA:-}; do
    if [ -f "$f" ]; then install -m755 "$f" "$share/bin/"; fi
  done
  echo "staged: $(cd "$share" && find bin lib rust -type f | sort | tr '\n' ' ')"
}
