# cases.sh — the rxe suite's cases, sourced by guest.sh inside the VM (bash).
#
#   t    NAME TIMEOUT "COMMAND"                 one process, must exit 0
#   pair NAME TIMEOUT "SERVER" "CLIENT" [PORT]  two processes, both must exit 0
#
# A case whose program was not staged is reported SKIP. Every case sees RXE_DEV=rxe0,
# RXE_GID (the RoCE v2 IPv4 GID index), RXE_IP, NETDEV=dummy0, IBNET_PROVIDER=verbs,
# NCCL_SOCKET_IFNAME=dummy0, and $BIN / $LIB / $SHARE (the staged executables, the plugin .so).
# Keep it lean: under TCG a process start costs seconds and rxe moves tens of MB/s.

# ---- the VM's verbs stack itself, independent of ibnet (proves the harness)
t verbs-probe 60 "$BIN/verbs-probe $RXE_DEV $RXE_GID"
pair rc-pingpong 90 \
  "ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID -n 50 -s 65536 -c" \
  "ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID -n 50 -s 65536 -c $RXE_IP" 18515

# ---- Rust test binaries staged from `cargo test --no-run` (see vm-test.sh): each runs whole,
# single-threaded; IBNET_TEST_REQUIRE_VERBS=1 tells verbs tests to fail, not skip, without a device.
for f in "$SHARE"/rust/*; do
  [ -x "$f" ] || continue
  t "rust:${f##*/}" "$IBNET_RXE_CASE_TIMEOUT" \
    "IBNET_TEST_REQUIRE_VERBS=1 IBNET_PLUGIN=$LIB/libnccl-net-ibnet.so $f --test-threads=1"
done
