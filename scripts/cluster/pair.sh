# pair.sh — the cluster suite's case machinery, sourced by test.sh (after its own job/jwait/on/
# case_begin/case_end/vm_down helpers) and before the cases file (cases.sh, or IBNET_CLUSTER_CASES):
# pair runs one server/client case across the two VMs, stall_watch and rxe_wedge collect the
# evidence of a stalled transfer, a VM that goes down during a case is rebooted and the case run
# once more.
# shellcheck shell=bash

PORT=18600
A_MGMT=10.20.0.1
NOTES=() # lines for the closing report: netem throughputs, detection times
WEDGES=() # cases run a second time: the soft-RoCE transport wedged (rxe_wedge), a VM went down
# (crashed or hung, vm_down), or a fault case's transfer failed before its fault was injected (a
# spurious retry timeout under load)

# pair NAME TIMEOUT "SERVER on A" "CLIENT on B" [CHECK] — starts the server, then the client once
# the server listens on $PORT (this case's TCP port, exported to both), waits for both. PASS when
# both exit 0 and CHECK (a function, given the server's and the client's log) passes. With
# PAIR_RC=any the exit statuses are left to CHECK ($SRC, $CRC; 124 means still running).
# PAIR_SETUP / PAIR_TEARDOWN (commands) put the links into the case's state before the jobs start
# and back afterwards (run again when the case runs a second time on rebooted VMs).
# A VM that crashes or hangs during the case (vm_down) ends the case at once: both VMs are
# rebooted and the case runs once more (reported); a second crash fails it.
pair() {
  local name=$1 to=$2 srv=$3 cli=$4 check=${5:-} port=$((PORT++)) sid why= down
  selected "$name" || return 0
  case_begin "$name"
  CASE_T0=${PAIR_T0:-$CASE_T0}
  if [ $((SECONDS - t_cases0)) -ge "$DEADLINE" ]; then
    case_end FAIL "not run: the suite's deadline (IBNET_CLUSTER_DEADLINE=${DEADLINE}s) has passed"; return
  fi
  if ! vms_ready; then case_end FAIL "the VMs are down and did not come back: $(vms_down | tr '\n' ' ')"; return; fi
  case_begin "$name" # a reboot started new consoles
  CASE_T0=${PAIR_T0:-$CASE_T0}
  SRC=0 CRC=0 WEDGE=
  ${PAIR_SETUP:-:}
  job a "export PORT=$port; timeout -k 5 $to bash -o pipefail -c $(printf %q "$srv")"; sid=$JID
  job a "for i in \$(seq 300); do ss -Hltn 'sport = :$port' | grep -q . && exit 0; sleep 0.2; done; exit 1"
  jwait a "$JID" 90 || true
  SID=$sid LOG_A=$(jlog a "$sid") CID=none LOG_B=$run/none.log
  if ! vms_down >/dev/null; then
    job b "export PORT=$port; timeout -k 5 $to bash -o pipefail -c $(printf %q "$cli")"; CID=$JID
    LOG_B=$(jlog b "$CID")
    if [ -n "${PAIR_DURING:-}" ]; then $PAIR_DURING; else stall_watch "$to"; fi
    jwait b "$CID" $((to + 30)) || CRC=$?
    jwait a "$sid" 40 || SRC=$?
  fi
  down=$(vms_down) || down=
  if [ -n "$down" ]; then
    echo "    $name: $(tr '\n' ' ' <<<"$down")"
    crash_evidence
    if [ -z "${PAIR_RERUN:-}" ]; then
      echo "    $name: a VM went down during the case: both VMs are rebooted and the case runs once more"
      WEDGES+=("$name: $(tr '\n' ' ' <<<"$down")")
      PAIR_RERUN=1 PAIR_T0=$CASE_T0 pair "$@"
      return
    fi
    # A guest kernel that crashed (panic/Oops on its console) is the emulated host failing, never
    # the user-space code under test: reported as a known skip with the evidence above. A VM
    # that went down any other way (hung, qemu gone without a crash report) fails the case.
    if grep -q 'kernel crashed' <<<"$down"; then
      case_end SKIP "KNOWN: the guest kernel crashed in both runs of the case (rdma_rxe under TCG, not ibnet; see scripts/cluster/README.md): $(tr '\n' ' ' <<<"$down")"
    else
      case_end FAIL "a VM went down in both runs of the case: $(tr '\n' ' ' <<<"$down")"
    fi
    return
  fi
  # A side still running after its peer is done never leaves its port to the next case.
  if [ "$CRC" = 124 ]; then kill_case b; fi
  if [ "$SRC" = 124 ]; then kill_case a; fi
  ${PAIR_TEARDOWN:-:}
  if [ "${PAIR_RC:-0}" = 0 ] && { [ $SRC != 0 ] || [ $CRC != 0 ]; }; then why="server rc=$SRC, client rc=$CRC"; fi
  if [ -z "$why" ] && [ -n "$check" ]; then why=$($check "$LOG_A" "$LOG_B") || why=${why:-check failed}; fi
  if [ -n "$WEDGE" ] && [ -z "${PAIR_RERUN:-}" ]; then
    echo "    $name: $WEDGE: the case runs once more"
    WEDGES+=("$name: $WEDGE")
    PAIR_RERUN=1 PAIR_T0=$CASE_T0 pair "$@"
    return
  fi
  if [[ $why == KNOWN:* ]]; then case_end SKIP "$why"; else
    case_end "$([ -z "$why" ] && echo PASS || echo FAIL)" "${why:-}${PAIR_RERUN:+${why:+; }second run (see above)}"
  fi
}
# crash_evidence — the console lines of a crashed VM from its kernel's first report on (at most
# 40, the call trace's unreliable "? " frames left out), kept in the run log.
crash_evidence() {
  local v
  for v in a b; do
    grep -qaE 'Kernel panic|Oops: |BUG: ' "$run/$v.console" 2>/dev/null || continue
    echo "    ==== VM ${v^^} console from its kernel's report:"
    sed -n '/\(Oops: \|BUG: \|Kernel panic\|traps: \)/,$p' "$run/$v.console" | tr -d '\r' |
      grep -v '^\[ *[0-9.]*\]  ? ' | head -40 | sed 's/^/    /'
  done
}

# stall_watch SECONDS — while the client runs: the first time either side's plugin WARNs that a
# wait is stalled (IBNET_STALL_WARN), prints both VMs' RDMA and link state (QPs with their PSNs,
# rxe counters, rail qdiscs and NIC counters, where the processes' threads sleep), prints it
# again 20 s later and ends both sides, so a stalled transfer fails in minutes with the evidence
# in the report instead of running into its timeout. When the two snapshots show the soft-RoCE
# transport itself wedged (see rxe_wedge) WEDGE says how, and pair runs the case once more.
stall_watch() {
  local end=$((SECONDS + $1)) s1a s1b s2a s2b
  while [ $SECONDS -lt $end ] && [ ! -e "${LOG_B%.log}.rc" ]; do
    vms_down >/dev/null && return # pair reports it and reboots
    if grep -qE 'WARN.*has waited [0-9]+s' "$LOG_A" "$LOG_B" 2>/dev/null; then
      echo "    stalled: $(grep -hE 'WARN.*has waited' "$LOG_A" "$LOG_B" | head -2 | cut -d' ' -f2- | tr '\n' ' ')"
      s1a=$(rdma_state a) s1b=$(rdma_state b)
      sed 's/^/    [a] /' <<<"$s1a"; sed 's/^/    [b] /' <<<"$s1b"
      sleep 20
      echo "    20 s later (then both sides are ended):"
      s2a=$(rdma_state a) s2b=$(rdma_state b)
      sed 's/^/    [a] /' <<<"$s2a"; sed 's/^/    [b] /' <<<"$s2b"
      WEDGE=$(rxe_wedge "$s1a" "$s1b" "$s2a" "$s2b")
      WEDGE=${WEDGE:+the soft-RoCE transport wedged below ibnet ($WEDGE)}
      kill_case a; kill_case b
      return
    fi
    sleep 1
  done
}
# rxe_wedge A1 B1 A2 B2 — given two rdma_state snapshots of each VM taken 20 s apart, prints the
# evidence that the RC transport itself is wedged: no rxe counter of either VM moved in between
# (no packet sent, received or retransmitted), yet a QP's send PSN differs from the PSN its peer
# QP expects next. A live RC connection with a gap retransmits; an idle healthy one has the two
# equal (20 s is over 4 retransmission timeouts at NCCL_IB_TIMEOUT 20). Prints nothing otherwise.
rxe_wedge() {
  [ "$(grep '^rxe' <<<"$1")" = "$(grep '^rxe' <<<"$3")" ] &&
    [ "$(grep '^rxe' <<<"$2")" = "$(grep '^rxe' <<<"$4")" ] || return 0
  { sed 's/^/a /' <<<"$3"; sed 's/^/b /' <<<"$4"; } | awk '
    $2 == "link" && / type RC / {
      for (i = 3; i < NF; i++) v[$i] = $(i + 1)
      q = $1 " " v["lqpn"]; peer[q] = v["rqpn"]; rq[q] = v["rq-psn"]; sq[q] = v["sq-psn"]
    }
    END {
      for (q in sq) {
        split(q, k, " "); o = (k[1] == "a" ? "b" : "a") " " peer[q]
        if ((o in rq) && sq[q] != rq[o])
          printf "VM %s QP %s sends next PSN %s, VM %s QP %s expects PSN %s; ", toupper(k[1]), k[2], sq[q], toupper(substr(o, 1, 1)), peer[q], rq[o]
      }
    }' | sed 's/; $/; no rxe counter moved for 20 s on either VM/'
}
# rdma_state VM — the VM's QPs (state, PSNs), rxe0/rxe1 counters that are not 0, rail qdiscs
# and NIC counters, and where this case's processes' threads sleep.
rdma_state() {
  local script
  script=$(cat <<'GUEST'
rdma res show qp | grep -v ' GSI '
for d in rxe0 rxe1; do
  echo "$d: $(cd /sys/class/infiniband/$d/ports/1/hw_counters && grep -H . * | grep -v ':0$' | tr '\n' ' ')"
done
for r in rail0 rail1; do
  tc -s qdisc show dev $r | grep -E 'qdisc|Sent|backlog'
  ip -s -o link show $r | tr -s ' ' | cut -d' ' -f2,17-30
done
for p in $(pgrep -f -- "(abi_test|ibnet-perf) .*$CASE_PORT"); do
  echo "pid $p: $(grep -H . /proc/$p/task/*/wchan | sed 's|/proc/[0-9]*/task/||' | tr '\n' ' ')"
done
GUEST
)
  on "$1" 30 "CASE_PORT=$((PORT - 1)); $script" 2>&1 || true
}
# kill_case VM — SIGKILLs this case's processes on VM (found by the case's port).
kill_case() { job "$1" "pkill -9 -f -- '(abi_test|ibnet-perf) .*$((PORT - 1))' || true"; }

# has LOG REGEX... — every REGEX (grep -E) is in LOG, else prints the first missing one.
has() {
  local f=$1 p
  shift
  for p in "$@"; do grep -qE -- "$p" "$f" || { echo "not in the ${f##*/mbox-} log: $p"; return 1; }; done
}
now() { date +%s.%N; }
since() { echo "$(now) $1" | awk '{printf "%.2f", $1 - $2}'; }
