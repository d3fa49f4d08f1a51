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

# ---- the plugin through ffi's C ABI test (ffi/tests/c/abi_test.c): dlopen like NCCL, v12 + v8
# tables (ABI_TEST_TABLES=12,8: the newest table and the oldest layout this case always had;
# abi_test's default 12,11,8 took 437 s here under load, pushing the VM run past its limit; v11
# moves data in sizes-fifo below, and the cluster suite's abi-all-tables drives v6..v12 across
# two hosts), bad input, two-process data through v12 and through v8 (0 B..16 MiB, 8-way
# multi-receive, byte for byte), a send larger than the posted receive (truncated to the posted
# size, one WARN), finalize, dlclose and a second load cycle. Its second argument is the number
# of devices the plugin must report.
# Its log also shows discovery: rxe0 port 1, RoCE, GID auto-selection (NCCL_IB_GID_INDEX unset)
# picking index 1, the RoCE v2 IPv4-mapped GID, and ptrSupport HOST only (0x1), since rxe answers
# the ibv_reg_dmabuf_mr(fd=-1) probe with EOPNOTSUPP (verbs-probe prints the raw answer).
abi="ABI_TEST_VERBOSE=1 $BIN/abi_test $SO"
t abi-default 600 "ABI_TEST_TABLES=12,8 $abi 1 2>&1 | tee /tmp/abi-default.log && logged abi-default \
  'rxe0:1 using GID index 1: ::ffff:$RXE_IP \(RoCE v2\)' 'Using .*rxe0:1/RoCE' \
  'v12 two-process multi-recv 8-way .*: verified' 'v8 two-process multi-recv 8-way .*: verified' \
  'v12: send of 4096 B into a posted 16 B receive: truncated to 16 B' \
  'dev 0: rxe0 speed [0-9]+ Mbps port 1 .*ptr 0x1\$'"

# ---- sizes FIFO and profiler events over real verbs: a v11 two-process run of the C ABI test
# (small sizes, no timed messages) whose 8-way multi-receive of 8 different sizes must report
# each receive's bytes as sent, and whose counting profiler callback (init's profFunction)
# must see QP events started and every one stopped, on both sides.
t sizes-fifo 300 "ABI_TEST_TABLES=11 ABI_TEST_MAX_BYTES=65536 ABI_TEST_BW_ITERS=0 $abi 1 2>&1 | \
  tee /tmp/sizes-fifo.log && logged sizes-fifo \
  'v11 two-process multi-recv 8-way sizes reported as sent: 0 4107 8214 12288 16395 20502 24576 28683' \
  'v11 receiver: profiler: [1-9][0-9]* QP events started, [1-9][0-9]* stopped' \
  'v11 sender: profiler: [1-9][0-9]* QP events started, [1-9][0-9]* stopped'"

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

# ECE: rxe has no ECE (ibv_query_ece answers EOPNOTSUPP): logged once (by the requester, whose
# query fails; the responder, offered nothing, asks nothing), not fatal, every byte still
# moves; NCCL_IB_ECE_ENABLE=0 does not even ask.
t ece-unsupported 120 "FAULTS_VERBOSE=1 $faults data 2>&1 | tee /tmp/ece-unsupported.log && \
  logged ece-unsupported 'rxe0: ECE not available \(ibv_query_ece: EOPNOTSUPP\)' \
  'receiver: .* verified' && test \$(grep -c 'ECE not available' /tmp/ece-unsupported.log) -eq 1"
t ece-off 120 "FAULTS_VERBOSE=1 NCCL_IB_ECE_ENABLE=0 $faults data 2>&1 | tee /tmp/ece-off.log && \
  ! grep -q 'ECE not available' /tmp/ece-off.log"
# ibv_modify_qp retry (IBNET_FAULT_MQP_ETIMEDOUT: the first N calls of each process fail with
# ETIMEDOUT before reaching the driver): retried after 1 ms, 2 ms, data verified; with too few
# retries (NCCL_IB_MQP_RETRY_CNT=1) the connect fails with errno 110, naming the transition.
t mqp-retry 120 "FAULTS_VERBOSE=1 IBNET_FAULT_MQP_ETIMEDOUT=2 NCCL_IB_MQP_RETRY_SLEEP_MSEC=1 \
  $faults data 2>&1 | tee /tmp/mqp-retry.log && logged mqp-retry \
  'rxe0: ibv_modify_qp\(INIT\) failed with errno 110 .*retrying 1/34 after 1 ms' \
  'rxe0: ibv_modify_qp\(INIT\) failed with errno 110 .*retrying 2/34 after 2 ms' \
  'receiver: .* verified'"
t mqp-retry-exhausted 120 "FAULTS_DEADLINE_S=20 IBNET_FAULT_MQP_ETIMEDOUT=4 NCCL_IB_MQP_RETRY_CNT=1 \
  NCCL_IB_MQP_RETRY_SLEEP_MSEC=1 $faults data >/tmp/mqp-retry-exhausted.log 2>&1; \
  test \$? -ne 0 && logged mqp-retry-exhausted 'ibv_modify_qp\(INIT\) (with [^ ]+ )?failed (in state [A-Za-z]+ )?\(errno 110'"
# NCCL_IB_FIFO_TC: the receiver's QPs (they post the clear-to-send writes) carry traffic class
# 96, the sender's (data) NCCL_IB_TC=40: read back from the QPs with ibv_query_qp.
t fifo-tc 120 "FAULTS_VERBOSE=1 NCCL_IB_TC=40 NCCL_IB_FIFO_TC=96 $faults data 2>&1 | \
  tee /tmp/fifo-tc.log && logged fifo-tc \
  'rxe0: qpn 0x[0-9a-f]+ -> qpn 0x[0-9a-f]+ state 3 .*global 1 traffic_class 96' \
  'rxe0: qpn 0x[0-9a-f]+ -> qpn 0x[0-9a-f]+ state 3 .*global 1 traffic_class 40'"
# GID chosen per connection: NCCL_IB_ADDR_RANGE=10.12.0.0/24 matches 10.12.0.1 at init; after
# init the address moves to 10.12.0.2 (added first, then 10.12.0.1 removed, so one address in the
# range exists at every moment: a GID outside NCCL_IB_ADDR_RANGE is never a fallback, a port with
# none is not used). promote_secondaries=1 keeps that true: without it, removing the primary
# 10.12.0.1 also removes the secondary 10.12.0.2 of its subnet, and the case passed only when the
# other process's hook added 10.12.0.2 again after that (a race both processes' hooks ran). The new GID is the one the connections then use (logged), every byte still
# moves. (Before GID selection moved to core, nothing in range at init fell back to index 1.)
gid_wait='for i in $(seq 50); do grep -q "$1" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null && break; sleep 0.1; done'
t gid-per-connection 120 "echo 1 > /proc/sys/net/ipv4/conf/$NETDEV/promote_secondaries && \
  ip addr replace 10.12.0.1/24 dev $NETDEV && bash -c '$gid_wait' _ ffff:0a0c:0001 && \
  FAULTS_VERBOSE=1 NCCL_IB_ADDR_RANGE=10.12.0.0/24 \
  env 'FAULTS_AFTER_INIT=ip addr replace 10.12.0.2/24 dev $NETDEV; ip addr del 10.12.0.1/24 dev $NETDEV 2>/dev/null; sleep 2' \
  $faults data 2>&1 | tee /tmp/gid-per-connection.log; rc=\$?; \
  ip addr del 10.12.0.1/24 dev $NETDEV 2>/dev/null; ip addr del 10.12.0.2/24 dev $NETDEV 2>/dev/null; test \$rc -eq 0 && \
  logged gid-per-connection 'rxe0:1 using GID index [0-9]+: ::ffff:10.12.0.1' \
  'rxe0:1 GID for new connections: index [0-9]+ ::ffff:10.12.0.2 \(was index [0-9]+ ::ffff:10.12.0.1\)' \
  'receiver: .* verified'"
# Nothing in NCCL_IB_ADDR_RANGE: the port is not used (no fallback to a GID outside the range),
# one WARN naming the device, port, family, range and the variables to change; 0 devices.
t gid-range-none 60 "NCCL_IB_ADDR_RANGE=10.13.0.0/24 $faults devices 0 2>&1 | tee /tmp/gid-range-none.log; \
  logged gid-range-none 'rxe0:1: no valid GID of NCCL_IB_ADDR_FAMILY=AF_INET inside NCCL_IB_ADDR_RANGE=10.13.0.0/24 .*the port is not used'"
# NCCL_IB_SOCK_CLIENT_PORT_REUSE and NCCL_IB_SOCK_SERVER_PORT_REUSE together: data verified over
# verbs, neither refused (the server variant shares one listening socket per thread).
t sock-reuse 120 "FAULTS_VERBOSE=1 NCCL_IB_SOCK_CLIENT_PORT_REUSE=1 NCCL_IB_SOCK_SERVER_PORT_REUSE=1 \
  $faults data 2>&1 | tee /tmp/sock-reuse.log && logged sock-reuse 'receiver: .* verified' && \
  ! grep -q 'PORT_REUSE=1 is not supported' /tmp/sock-reuse.log"
# No IP interface for the bootstrap sockets: init fails (NCCL then falls back), no device.
t no-ip-interface 60 "NCCL_SOCKET_IFNAME==no-such-if $faults devices 0 2>&1 | \
  tee /tmp/no-ip-interface.log; logged no-ip-interface 'No IP interface found' \
  'init: init called in state no IP interface found'"

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
# The dead receiver is seen either through its closed bootstrap socket ("peer ADDR gid GID ...
# is gone") or, if the QP's retries run out first, as a completion error, which names (as NCCL
# 2.28, and more) the status and opcode by name, the request size, the HCA, the local QP and the
# peer's socket address as well as its GID.
t peer-death 180 "FAULTS_GID=::ffff:$RXE_IP NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 $faults peer-death \
  2>&1 | tee /tmp/peer-death.log && { ! grep -q 'got completion from peer' /tmp/peer-death.log && \
  logged peer-death 'peer $RXE_IP:[0-9]+ gid ::ffff:$RXE_IP lid 0 qpn 0x[0-9a-f]+ is gone' || \
  logged peer-death 'got completion from peer $RXE_IP:[0-9]+ gid ::ffff:$RXE_IP' \
  'status=IBV_WC_[A-Z_]+\([0-9]+\) opcode=[A-Z_]+\(-?[0-9]+\) reqSize=1048576' \
  'req_type=Send localGid ::ffff:$RXE_IP hca rxe0 qpn 0x[0-9a-f]+'; }"
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

# ---- Fused comms over two rails (ffi/tests/verbs/verbs_fused.rs): a second soft-RoCE device, rxe1 on
# dummy1, exists only during these cases (every other case sees rxe0 alone). Each rail's two ends
# share its device. The failover case takes dummy1 down while messages are in flight;
# NCCL_IB_TIMEOUT=14 (67 ms x 8 tries) bounds how long a rail takes to declare itself failed.
# (`rdma link delete rxe1` is no fault to test with: it waits for the process that holds the
# device open, which waits for it.)
rail2_up() {
  ip link add dummy1 type dummy 2>/dev/null; ip addr add 10.11.1.1/24 dev dummy1 2>/dev/null
  ip link set dummy1 up || return 1
  rdma link show rxe1/1 >/dev/null 2>&1 || rdma link add rxe1 type rxe netdev dummy1 || return 1
  for _ in $(seq 50); do
    grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}
rail2_down() { rdma link delete rxe1 2>/dev/null; ip link delete dummy1 2>/dev/null; true; }
export -f rail2_up rail2_down
fused="IBNET_FUSED_REQUIRE=1 $SHARE/rust/verbs --test-threads=1 --nocapture --color never --exact"
t fused-rails "$IBNET_RXE_CASE_TIMEOUT" "rail2_up && { $fused verbs_fused::verbs_fused_two_rails_stripe_every_message; \
  rc=\$?; rail2_down; exit \$rc; }"
t fused-failover-linkdown "$IBNET_RXE_CASE_TIMEOUT" "rail2_up && { NCCL_IB_TIMEOUT=14 \
  IBNET_FUSED_FAULT_CMD='ip link set dummy1 down' $fused verbs_fused::verbs_fused_failover_keeps_every_byte; \
  rc=\$?; rail2_down; exit \$rc; }"

# ---- The same two rails through the plugin's C API: ibnet-perf --fuse 0,1 makes the virtual
# NIC with makeVDevice (rxe0+rxe1) and sweeps it with --check (every byte verified). Each case
# prints every device's packet counters (rxe hw_counters) before and after, and with -v the
# plugin's close line per comm: the bytes each rail carried, which rail failed, the bytes
# written again. fused_perf NAME [S] [ARGS]: with S, dummy1 goes down S seconds after both
# comms are connected (the time is stamped, as is every output line, so the log shows how long
# the rail took to be declared failed: NCCL_IB_TIMEOUT=14, NCCL_IB_RETRY_CNT=3).
rxe_counters() {
  local d
  for d in rxe0 rxe1; do
    printf '%s %s %s\n' "$d" "$(cat /sys/class/infiniband/$d/ports/1/hw_counters/sent_pkts)" \
      "$(cat /sys/class/infiniband/$d/ports/1/hw_counters/rcvd_pkts)"
  done
}
fused_perf() {
  local name=$1 down=${2:-} log=/tmp/$1.log rc d s0 r0 s1 r1
  rail2_up || return 1
  rxe_counters >"/tmp/$name.c0"
  rm -f "$log"
  if [ -n "$down" ]; then
    # S seconds after both comms are up (both accepts logged), whatever the VM's speed.
    ( for _ in $(seq 1200); do
        [ "$(grep -c 'handshaken' "$log" 2>/dev/null)" -ge 2 ] && break; sleep 0.1
      done
      sleep "$down"; echo "$EPOCHREALTIME" >"/tmp/$name.down"; ip link set dummy1 down ) &
  fi
  NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 "$BIN/ibnet-perf" --plugin "$LIB/libnccl-net-ibnet.so" \
    --fuse 0,1 --check -v \
    --timeout 60 --window 4 --warmup 1 "${@:3}" 2>&1 |
    while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done | tee "$log"
  rc=${PIPESTATUS[0]}
  wait
  rxe_counters >"/tmp/$name.c1"
  rail2_down
  while read -r d s0 r0 && read -r _ s1 r1 <&3; do
    echo "FUSED-COUNTERS $d: sent_pkts +$((s1 - s0)) rcvd_pkts +$((r1 - r0))"
  done <"/tmp/$name.c0" 3<"/tmp/$name.c1" | tee -a "$log"
  if [ -n "$down" ]; then
    awk -v t0="$(cat "/tmp/$name.down")" '/of the virtual NIC failed/ && !n++ {
      printf "FUSED-FAILOVER detected %.3f s after dummy1 went down\n", $1 - t0 }' "$log" |
      tee -a "$log"
    # Only what was in flight on rail 1 when the sender learned of its failure goes twice:
    # at most --window 4 messages per send comm, each with a rail-1 part of 128 KiB (the only
    # caller streams 256 KiB messages; 0 when they had all been acknowledged before the link
    # went down); later messages are striped over rail 0 alone.
    awk '/closed: virtual NIC/ && /send comm/ { s += $(NF - 2); n++ } END {
      b = n * 4 * 131072
      printf "FUSED-RESENT %d bytes (%s the in-flight bound of %d B: %d send comm(s) x 4 x 128 KiB)\n",
        s, (s <= b ? "within" : "OVER"), b, n }' "$log" | tee -a "$log"
  fi
  return "$rc"
}
export -f rxe_counters fused_perf
t fused-rails-plugin "$IBNET_RXE_CASE_TIMEOUT" "fused_perf fused-rails-plugin '' --min-bytes 8 \
  --max-bytes 512K --iters 5 && logged fused-rails-plugin 'fused: rails 0 rxe0 [0-9]+ Gb/s, 1 rxe1' \
  'rail 0 \(rxe0\) up [1-9][0-9]* bytes; rail 1 \(rxe1\) up [1-9][0-9]* bytes; 0 bytes re-sent' \
  'FUSED-COUNTERS rxe0: sent_pkts \+[1-9]' 'FUSED-COUNTERS rxe1: sent_pkts \+[1-9]' && \
  ! grep -q 'of the virtual NIC failed' /tmp/fused-rails-plugin.log"
t fused-failover-linkdown-plugin 300 "fused_perf fused-failover-linkdown-plugin 3 --bw-only \
  --min-bytes 256K --max-bytes 256K --iters 400 && \
  logged fused-failover-linkdown-plugin 'rail 1 \(rxe1\) of the virtual NIC failed .*its traffic moved to rail 0 \(rxe0\)' \
  'rail 1 \(rxe1\) FAILED' 'FUSED-FAILOVER detected' 'FUSED-RESENT [0-9]+ bytes \(within' \
  '262144,.*,ok\$|256KiB .* ok'"
