# cases.sh — the rxe suite's cases, sourced by guest.sh inside the VM (bash).
# shellcheck shell=bash
#
#   t    NAME TIMEOUT "COMMAND"                 one process, must exit 0
#   pair NAME TIMEOUT "SERVER" "CLIENT" [PORT]  two processes, both must exit 0
#
# A case whose program was not staged is reported SKIP. Every case sees RXE_DEV=rxe0,
# RXE_GID (the RoCE v2 IPv4 GID index), RXE_IP, NETDEV=dummy0, IBNET_PROVIDER=verbs,
# NCCL_SOCKET_IFNAME=dummy0, and $BIN / $LIB / $SHARE (the staged executables, the plugin .so).
# Keep it lean: under TCG a process start costs seconds and rxe moves tens of MB/s.
SO=$LIB/libnccl-net-ibnet.so

# logged NAME PATTERN... — passes when the case's saved output (/tmp/NAME.log) has every
# PATTERN (grep -E), printing each one that is missing.
logged() {
  local f=/tmp/$1.log p rc=0
  shift
  for p in "$@"; do grep -qE -- "$p" "$f" || { echo "expected in the output: $p"; rc=1; }; done
  return $rc
}
export -f logged

# ---- the VM's verbs stack itself, independent of ibnet (proves the harness)
t verbs-probe 60 "$BIN/verbs-probe $RXE_DEV $RXE_GID"
pair rc-pingpong 90 \
  "ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID -n 50 -s 65536 -c" \
  "ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID -n 50 -s 65536 -c $RXE_IP" 18515

# ---- the plugin through ffi's C ABI test (ffi/tests/c/abi_test.c): dlopen like NCCL, v11 + v8
# tables, bad input, two-process data through v11 and through v8 (0 B..16 MiB, 8-way
# multi-receive, byte for byte), a send larger than the posted receive, finalize, dlclose and a
# second load cycle. Its second argument is the number of devices the plugin must report.
# Its log also shows discovery: rxe0 port 1, RoCE, GID auto-selection (NCCL_IB_GID_INDEX unset)
# picking index 1, the RoCE v2 IPv4-mapped GID, and ptrSupport HOST only (0x1), since rxe answers
# the ibv_reg_dmabuf_mr(fd=-1) probe with EOPNOTSUPP (verbs-probe prints the raw answer).
abi="ABI_TEST_VERBOSE=1 $BIN/abi_test $SO"
t abi-default 300 "$abi 1 2>&1 | tee /tmp/abi-default.log && logged abi-default \
  'rxe0:1 using GID index 1: ::ffff:$RXE_IP \(RoCE v2\)' 'Using .*rxe0:1/RoCE' \
  'dev 0: rxe0 speed [0-9]+ Mbps port 1 .*ptr 0x1\$'"

# ---- transport variants: plugin-faults' lean two-process sweep (v11, 0 B..8 MiB twice, 8-way
# multi-receive, byte for byte) under each setting.
faults="$BIN/plugin-faults $SO"
t data-qps1 120 "NCCL_IB_QPS_PER_CONNECTION=1 $faults data"
t data-qps4-split 120 "NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_SPLIT_DATA_ON_QPS=1 $faults data"
t data-ar 120 "NCCL_IB_ADAPTIVE_ROUTING=1 NCCL_IB_AR_THRESHOLD=1024 $faults data"
t data-inline 120 "NCCL_IB_USE_INLINE=1 $faults data"
# IBNET_FAULT_RO_EINVAL=1: the relaxed-ordering registration is refused as an old driver would;
# the plugin must fall back to a plain registration and still move every byte.
t data-ro-fallback 120 "FAULTS_VERBOSE=1 IBNET_FAULT_RO_EINVAL=1 $faults data 2>&1 | \
  tee /tmp/data-ro-fallback.log && logged data-ro-fallback \
  'relaxed-ordering registration refused \(EINVAL\); registering without it'"
t data-no-ro 120 "FAULTS_VERBOSE=1 NCCL_IB_PCI_RELAXED_ORDERING=0 $faults data 2>&1 | \
  tee /tmp/data-no-ro.log && logged data-no-ro 'Using .*rxe0:1/RoCE\$'"

# NCCL_IB_HCA include / exact / exclude / no match (init + devices only)
t hca-include 60 "NCCL_IB_HCA=rxe $faults devices 1"
t hca-exact 60 "NCCL_IB_HCA==rxe0:1 $faults devices 1"
t hca-exclude 60 "NCCL_IB_HCA=^rxe0 $faults devices 0"
t hca-other 60 "NCCL_IB_HCA=mlx5_0 $faults devices 0"

# ---- the tools crate through the verbs provider: what ibnet-info sees, and ibnet-perf's table
# (correctness only: --check verifies every byte; TCG speeds mean nothing).
t ibnet-info 60 "$BIN/ibnet-info --plugin $SO 2>&1 | tee /tmp/ibnet-info.log && \
  logged ibnet-info rxe0 RoCE"
t ibnet-perf 180 "$BIN/ibnet-perf --plugin $SO --loopback --check --min-bytes 8 --max-bytes 1M \
  --iters 10 --warmup 1 --window 4 --timeout 60 2>&1 | cat"

# ---- lifecycle and failure paths (scripts/rxe/plugin-faults.c)
t lifecycle 120 "$faults lifecycle"
# A short retry timeout (67 ms x 3 retries) so the dead peer is detected quickly.
t peer-death 180 "FAULTS_GID=::ffff:$RXE_IP NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 $faults peer-death"
# IBNET_FORCE_FLUSH=1: flush host memory too, so iflush posts its RDMA READ on the loopback QP.
t iflush 120 "IBNET_FORCE_FLUSH=1 $faults flush 2>&1 | tee /tmp/iflush.log && \
  logged iflush 'iflush: completed \(RDMA READ\)' 'flush: ok'"

# ---- Rust test binaries staged from `cargo test --no-run` (see vm-test.sh): each runs whole,
# single-threaded; IBNET_TEST_REQUIRE_VERBS=1 tells verbs tests to fail, not skip, without a device.
for f in "$SHARE"/rust/*; do
  [ -x "$f" ] || continue
  t "rust:${f##*/}" "$IBNET_RXE_CASE_TIMEOUT" \
    "IBNET_TEST_REQUIRE_VERBS=1 $f --test-threads=1 --color never"
done
