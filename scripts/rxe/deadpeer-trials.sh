#!/usr/bin/env bash
# deadpeer-trials.sh — dead-peer detection over the verbs provider, in the rxe VM (not in CI:
# at TRIALS=50 it runs for tens of minutes under TCG).
#
#   scripts/rxe/deadpeer-trials.sh [TRIALS]      # default 50 per state
#
# Runs ffi/tests/faults/dead_peer.rs (the same trials CI runs over the soft provider) with
# IBNET_DEADPEER_PROVIDER=verbs on soft-RoCE: per state (handshake, mid-transfer, waiting for
# clear-to-send, idle with a receive posted) TRIALS times, the peer process is killed and the
# survivor calls until one fails; the worst time from the kill to that error is printed per
# state, and every state must produce a WARN naming the peer's address. NCCL_IB_TIMEOUT and
# NCCL_IB_RETRY_CNT keep NCCL's defaults, so the dead peer is seen through its bootstrap socket.
# Environment: as vm-test.sh (IBNET_RXE_CACHE for a private image cache, IBNET_RXE_TIMEOUT).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
n=${1:-50}
CACHE=${IBNET_RXE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibnet-rxe-vm}
cases=$(mktemp)
trap 'rm -f "$cases"' EXIT
# $SHARE and $RXE_IP are the guest's (expanded when the guest sources this file).
# The test runs in a child process of the faults binary (ffi/tests/util/isolate.rs), whose own
# time limit is raised to the case's.
cat >"$cases" <<CASES
t deadpeer-verbs $((n * 60 + 300)) "IBNET_DEADPEER_PROVIDER=verbs IBNET_DEADPEER_PEER_IP=\$RXE_IP \
  IBNET_DEADPEER_TRIALS=$n IBNET_TEST_ISOLATED_TIMEOUT=$((n * 60 + 300)) \$SHARE/rust/faults \
  --exact dead_peer::survivor_errors_when_the_peer_dies --test-threads=1 --nocapture --color never"
CASES
rc=0
IBNET_RXE_CASES=$cases IBNET_RXE_RUST_TESTS='^faults$' \
  IBNET_RXE_TIMEOUT=${IBNET_RXE_TIMEOUT:-$((n * 60 + 900))} "$here/vm-test.sh" || rc=$?
echo "==== dead-peer trials over verbs (rxe), $n per state:"
grep -ao 'dead peer, .*' "$CACHE/console.log" || echo "(no per-state line: see $CACHE/console.log)"
exit $rc
