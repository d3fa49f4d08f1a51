# cases.sh — the cluster suite's cases, sourced by test.sh on the host (bash). The host drives
# both VMs: `job VM SCRIPT` queues a script in a VM's mailbox, `jwait`/`jlog` wait for it and
# read its output, `on VM SECONDS SCRIPT` runs one and waits, `qmp VM CMD` talks to a VM's qemu.
# Server on VM A (10.20.0.1 on mgmt), client on VM B; both through the plugin with
# IBNET_PROVIDER=verbs and NCCL_SOCKET_IFNAME=mgmt.
# Keep it lean: under TCG a process start costs seconds and rxe moves ~10 MB/s between the VMs.
# The machinery (pair, stall_watch, has, ...) is pair.sh's, sourced by test.sh before this file.
# shellcheck shell=bash

# ---- the links themselves: plain libibverbs RC ping-pong across each rail (no ibnet)
for r in 0 1; do
  pair "link-rxe$r" 90 \
    "ibv_rc_pingpong -d rxe$r -g \$(gidx rxe$r ffff:0a1$((r + 5))) -p \$PORT -n 20 -s 65536 -c" \
    "ibv_rc_pingpong -d rxe$r -g \$(gidx rxe$r ffff:0a1$((r + 5))) -p \$PORT -n 20 -s 65536 -c $A_MGMT"
done

# ---- ibnet-perf across the two hosts: 8 B..4 MiB, every byte verified (--check), the table
PERF="\$BIN/ibnet-perf --plugin \$SO"
perf_args="--check --window 4 --iters 4 --warmup 1 --budget 8M --timeout 120 -v"
perf() { # perf NAME TIMEOUT "ENV on A" "ENV on B" "client args" [CHECK]
  pair "$1" "$2" "$3 $PERF --server --port \$PORT --timeout 120 -v" \
    "$4 $PERF --client $A_MGMT:\$PORT $5" "${6:-perf_ok}"
}
perf_ok() { has "$2" ' ok +│' && ! grep -q ' FAIL' "$2"; }
perf_rail1_ok() { perf_ok "$@" && has "$2" 'device 0 rxe1' 'rxe1:1 QP .* connected'; }
perf_qps4_ok() { # four QPs per connection: 4 data QPs connected on each side
  perf_ok "$@" && [ "$(grep -c 'rxe0:1 QP .* connected' "$2")" -ge 4 ] ||
    { echo "fewer than 4 QPs connected on B"; return 1; }
}
perf perf 400 "" "" "--min-bytes 8 --max-bytes 4M $perf_args"
perf perf-rail1 400 "NCCL_IB_HCA=rxe1" "NCCL_IB_HCA=rxe1" "--min-bytes 8 --max-bytes 4M $perf_args" perf_rail1_ok
perf perf-qps4 400 "NCCL_IB_QPS_PER_CONNECTION=4" "NCCL_IB_QPS_PER_CONNECTION=4" \
  "--min-bytes 8 --max-bytes 4M $perf_args" perf_qps4_ok

# ---- ffi's C ABI test across the hosts through every exported table, v6 .. v11: each table
# loaded, inited, data 0 B..4 MiB + 8-way multi-receive verified byte for byte, the oversized
# send refused, finalize (v11) and dlclose; both sides on rxe0.
abi_ok() {
  local v
  for v in 6 7 8 9 10 11 12; do
    has "$1" "v$v two-host receiver: verified" && has "$2" "v$v two-host sender: verified" || return 1
  done
  has "$1" 'abi_test: OK' && has "$2" 'abi_test: OK'
}
ABI="ABI_TEST_TABLES=6,7,8,9,10,11,12 ABI_TEST_MAX_BYTES=4M ABI_TEST_BW_ITERS=2 NCCL_IB_HCA=rxe0 \$BIN/abi_test \$SO 1"
pair abi-all-tables 900 "$ABI --server \$PORT" "$ABI --client $A_MGMT:\$PORT" abi_ok

# ---- GID selection on a real link: each side's chosen GID and the peer's, data verified
GPERF="--min-bytes 8 --max-bytes 64K $perf_args"
gid_case() { # gid_case NAME "ENV" GID_A GID_B
  eval "gid_check_$1() { perf_ok \"\$@\" && has \"\$1\" 'rxe0:1 using GID index [0-9]+: $3 ' 'connected to peer gid $4 ' &&
    has \"\$2\" 'rxe0:1 using GID index [0-9]+: $4 ' 'connected to peer gid $3 '; }"
  perf "$1" 300 "NCCL_IB_HCA=rxe0 $2" "NCCL_IB_HCA=rxe0 $2" "$GPERF" "gid_check_$1"
}
gid_case gid-default "" '::ffff:10\.21\.0\.1' '::ffff:10\.21\.0\.2'
gid_case gid-inet6 "NCCL_IB_ADDR_FAMILY=AF_INET6" 'fd21::1' 'fd21::2'
gid_case gid-range "NCCL_IB_ADDR_RANGE=10.31.0.0/24" '::ffff:10\.31\.0\.1' '::ffff:10\.31\.0\.2'
gid_case gid-index "NCCL_IB_GID_INDEX=\$(gidx rxe0 ^fd21:)" 'fd21::1' 'fd21::2'
# A IPv4, B IPv6: both must fail (not hang) with a WARN naming both GIDs. Short retry values
# (NCCL_IB_TIMEOUT=14: 67 ms, 3 retries) keep the failure quick.
gid_mismatch_ok() {
  [ "$SRC" != 0 ] && [ "$SRC" != 124 ] && [ "$CRC" != 0 ] && [ "$CRC" != 124 ] ||
    { echo "want both to fail in time: server rc=$SRC client rc=$CRC"; return 1; }
  cat "$1" "$2" | grep -E 'WARN' | grep -E '::ffff:10\.21\.0\.1' | grep -qE 'fd21::2' ||
    { echo "no WARN naming both ::ffff:10.21.0.1 and fd21::2"; return 1; }
  grep -hE 'WARN.*fd21::2|error' "$1" "$2" | cut -d' ' -f2- | head -4 >&2
}
PAIR_RC=any perf gid-mismatch 240 "NCCL_IB_HCA=rxe0 NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3" \
  "NCCL_IB_HCA=rxe0 NCCL_IB_TIMEOUT=14 NCCL_IB_RETRY_CNT=3 NCCL_IB_ADDR_FAMILY=AF_INET6" \
  "$GPERF" gid_mismatch_ok

# ---- MTU mismatch: rail0 MTU 1500 on A (rxe active MTU 1024), 9000 on B (4096)
mtu_ok() {
  perf_ok "$@" && has "$1" 'rxe0:1 QP .* path MTU 1024 ' && has "$2" 'rxe0:1 QP .* path MTU 1024 '
}
mtu_on() {
  on a 30 "ip link set rail0 mtu 1500; ibv_devinfo -d rxe0 | grep -E 'max_mtu|active_mtu'" || true
  on b 30 "ip link set rail0 mtu 9000; for i in \$(seq 50); do ibv_devinfo -d rxe0 | grep -q 'active_mtu:.*4096' && break; sleep 0.2; done
           ibv_devinfo -d rxe0 | grep -E 'max_mtu|active_mtu'" || true
}
mtu_off() { on b 30 "ip link set rail0 mtu 1500" || true; }
PAIR_SETUP=mtu_on PAIR_TEARDOWN=mtu_off perf mtu 300 "NCCL_IB_HCA=rxe0" "NCCL_IB_HCA=rxe0" "$GPERF" mtu_ok

# ---- lossy and slow links: netem on rail0 of both VMs (both directions), every byte verified,
# throughput of the largest size next to the clean link's. NCCL_IB_TIMEOUT=14 (67 ms per
# retransmission timeout instead of 4.3 s) keeps a lost tail packet from stalling CI.
# Sized from measured runs (2-core host, TCG): 64 KiB..1 MiB moves about 29 MiB in all, 8-25 s on
# the clean, 1 % and 5 ms links. At 5 % loss and with reordering one 1 MiB message takes 2.8-3.6 s
# (p50; go-back-N retransmissions), so those two move 1 MiB messages only, 3 measured + 1 warm-up
# per phase (12 MiB: about 40 s instead of 85-98 s). Each single wait may take 120 s (30 times
# the slowest p50), the whole case 300 s; a stall is ended by stall_watch long before.
NPERF="--check --window 4 --warmup 1 --budget 4M --timeout 120 -v"
NPERF_ALL="--min-bytes 64K --max-bytes 1M --iters 4 $NPERF"
NPERF_LOSSY="--min-bytes 1M --max-bytes 1M --iters 3 $NPERF"
netem_bw() { # the 1 MiB row: streaming bandwidth, and one message's p50 latency as MB/s
  grep -E '│ 1MiB' "$2" | awk -F'│' '{print $2}' |
    awk '{printf "stream %s GB/s, p50 %.0f ms per 1 MiB (%.2f MB/s)", $4, $2 / 1000, 1048576 / $2}'
}
# netem_on / netem_off — the case's netem qdisc on rail0 of both VMs (PAIR_SETUP / PAIR_TEARDOWN).
netem_on() {
  [ -n "$NETEM" ] || return 0
  on a 20 "tc qdisc replace dev rail0 root netem $NETEM && tc qdisc show dev rail0" >/dev/null || true
  on b 20 "tc qdisc replace dev rail0 root netem $NETEM && tc qdisc show dev rail0" >/dev/null || true
}
netem_off() {
  [ -n "$NETEM" ] || return 0
  on a 20 "tc qdisc del dev rail0 root" >/dev/null || true
  on b 20 "tc qdisc del dev rail0 root" >/dev/null || true
}
netem_case() { # netem_case NAME "netem args" (empty: the clean link) [ibnet-perf args]
  local bw
  selected "$1" || return 0
  NETEM=$2 PAIR_SETUP=netem_on PAIR_TEARDOWN=netem_off \
    perf "$1" 300 "NCCL_IB_HCA=rxe0 NCCL_IB_TIMEOUT=14" "NCCL_IB_HCA=rxe0 NCCL_IB_TIMEOUT=14" "${3:-$NPERF_ALL}"
  bw=$(netem_bw "$LOG_A" "$LOG_B" || true) # a failed run has no 1 MiB row
  NOTES+=("netem ${2:-none (clean link)}: 1 MiB ${bw:-n/a}")
  echo "    1 MiB: ${bw:-n/a}"
}
netem_case netem-clean ""
netem_case netem-loss1 "loss 1%"
netem_case netem-loss5 "loss 5%" "$NPERF_LOSSY"
netem_case netem-delay5ms "delay 5ms"
netem_case netem-reorder "delay 5ms reorder 25% 50%" "$NPERF_LOSSY"

# ---- faults during a 64 MiB transfer: abi_test through v11, B sends 64 MiB messages to A, one
# after the other (ABI_TEST_FAULT=1: a failing test() ends the run with close, finalize, dlclose
# and exit status 3). The transport bound: an RC QP gives up after (retry_cnt + 1) attempts of
# 4.096 us * 2^timeout each: NCCL_IB_TIMEOUT=20, NCCL_IB_RETRY_CNT=7 (NCCL's defaults):
# 8 * 4.295 s = 34.4 s; NCCL_IB_TIMEOUT=14, NCCL_IB_RETRY_CNT=3: 4 * 67.1 ms = 0.27 s. Detection
# is measured on the host, from issuing the fault to the survivor's exit status appearing in its
# mailbox (error, close, finalize, dlclose, exit, then up to 0.2 s of mailbox polling): an upper
# bound of the detection time. rxe (soft-RoCE) treats retry_cnt 7 as "retry forever"
# (rxe_comp.c: `if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--;`), unlike the InfiniBand
# spec and real NICs, so with NCCL's default retry count the transport never gives up on rxe:
# that case runs with a bounded wait and is reported as a known limitation (SKIP).
FABI="ABI_TEST_VERBOSE=1 ABI_TEST_FAULT=1 ABI_TEST_TABLES=11 ABI_TEST_MIN_BYTES=64M ABI_TEST_MAX_BYTES=64M ABI_TEST_BW_ITERS=1000 \$BIN/abi_test \$SO 1"
bound() { awk -v t="$1" -v r="$2" 'BEGIN { printf "%.2f", (r + 1) * 4.096e-6 * 2 ^ t }'; }
# streaming: true once B's QPs are connected (then 4 s more: the first 64 MiB are in flight).
streaming() {
  local i
  for i in $(seq 300); do
    grep -q 'connected to peer' "$LOG_B" 2>/dev/null && { sleep "${STREAM_S:-4}"; return 0; }
    [ -e "${LOG_B%.log}.rc" ] && break
    if ((i % 5 == 0)) && vms_down >/dev/null; then break; fi
    sleep 0.2
  done
  return 1
}
fault_ok() { # the survivor failed in time, named the peer and the QP, finalized and dlclosed
  local log=$1 rc=$SRC
  if [ "$SURVIVOR" = b ]; then log=$2 rc=$CRC; fi
  case $FAULT_T1 in
    nostream) echo "the transfer never started"; return 1 ;;
    early) echo "the transfer had failed before the fault was injected"; return 1 ;;
    nofault) echo "the fault was never injected (its job did not report it)"; return 1 ;;
    none)
      [ -n "$FAULT_KNOWN" ] && { echo "KNOWN: $FAULT_KNOWN"; return 1; }
      echo "survivor ($SURVIVOR) did not fail within ${FAULT_WAIT}s"; return 1 ;;
  esac
  [ "$rc" = 3 ] || { echo "survivor ($SURVIVOR) rc=$rc: want 3 (error seen, then finalize + dlclose)"; return 1; }
  has "$log" 'survivor: .*finalize and dlclose ok' || return 1
  # A completion error ("got completion from peer ADDR gid …") or a peer seen gone through its
  # bootstrap socket ("peer ADDR gid … is gone"): either names the peer's address, GID and QP.
  grep -E 'WARN' "$log" | grep -qE "$PEER_NAMED" ||
    { echo "no WARN naming the peer GID and QP in $SURVIVOR's log"; return 1; }
  grep -hE 'WARN.*peer gid|survivor:' "$log" | cut -d' ' -f2- | head -3 >&2
}
# How the survivor's WARN names the dead peer: socket address (when known), GID, LID and QP.
PEER_NAMED='peer ([0-9a-f.:]+ )?gid [0-9a-f:.]+ lid [0-9]+ qpn 0x[0-9a-f]+'
# fault_case NAME TIMEOUT RETRY SURVIVOR(a|b) ACTION [WAIT_S] [KNOWN] — ACTION (a function)
# injects the fault once the transfer streams; the survivor must fail within WAIT_S (default
# 60). KNOWN: the reason reported (as SKIP) when it does not.
fault_case() {
  local name=$1 t=$2 r=$3 env="NCCL_IB_HCA=rxe0" b
  selected "$name" || return 0
  [ -n "$t" ] && env="$env NCCL_IB_TIMEOUT=$t"
  [ -n "$r" ] && env="$env NCCL_IB_RETRY_CNT=$r"
  SURVIVOR=$4 FAULT_ACTION=$5 FAULT_WAIT=${6:-60} FAULT_KNOWN=${7:-} FAULT_T1=
  PAIR_RC=any PAIR_DURING=fault_during pair "$name" 300 "$env $FABI --server \$PORT" \
    "$env $FABI --client $A_MGMT:\$PORT" fault_ok
  b=$(bound "${t:-20}" "${r:-7}")
  local by="" f=$LOG_A
  [ "$SURVIVOR" = b ] && f=$LOG_B
  # Which one found it: the survivor's first error WARN (only when it failed in time; a case
  # ended by the harness has the other side's exit in its log).
  case $(grep -oE 'WARN.*(is gone|got completion)' "$f" 2>/dev/null | head -1 | grep -oE 'is gone|got completion') in
    "is gone") [[ $FAULT_T1 =~ ^[0-9] ]] && by=" (seen by the bootstrap-socket watch: closed socket, probed every 0.1 s)" ;;
    "got completion") [[ $FAULT_T1 =~ ^[0-9] ]] && by=" (seen by the transport: $(grep -oE 'status=[A-Z_]+' "$f" | head -1))" ;;
  esac
  NOTES+=("$name (NCCL_IB_TIMEOUT=${t:-20 (default)}, NCCL_IB_RETRY_CNT=${r:-7 (default)}): survivor $SURVIVOR: error WARN ${FAULT_T1} s after the fault$by, process done (close, finalize, dlclose, exit) ${FAULT_T2:-none} s; transport bound $b s ('none': nothing within ${FAULT_WAIT} s)")
  echo "    survivor $SURVIVOR: error ${FAULT_T1} s, done ${FAULT_T2:-none} s after the fault (transport bound $b s)"
}
# kill_test VM — SIGKILLs this case's abi_test on VM (found by its unique port).
kill_test() { FAULT_VM=$1; job "$1" "pid=\$(pgrep -n -f -- 'abi_test .*(--server |:)$((PORT - 1))\$'); [ -n \"\$pid\" ] && kill -9 \$pid && echo \"abi_test \$pid killed: fault injected\""; }
# fault_during — PAIR_DURING of a fault case: waits for the stream, injects the fault, times
# the survivor. Times are taken on the host from the two VMs' job logs as they arrive through the
# mailboxes (polled every 0.1 s): T0 when the fault job's line saying it acted appears (or the
# QMP command returned), T1 when the survivor's WARN of the failed completion appears, T2 when
# its exit status appears (after close, finalize, dlclose and exit).
fault_during() {
  local i f other=a oid=$SID fjob=
  [ "$SURVIVOR" = a ] && other=b oid=$CID
  streaming || { FAULT_T1=nostream; kill_test a; kill_test b; return; }
  # Under heavy host load a small NCCL_IB_TIMEOUT can expire with no fault at all: a transfer
  # that already failed proves nothing about the fault; the case runs once more (pair).
  if [ -e "${LOG_A%.log}.rc" ] || [ -e "${LOG_B%.log}.rc" ] ||
     grep -qE 'WARN.*(got completion|is gone)' "$LOG_A" "$LOG_B" 2>/dev/null; then
    FAULT_T1=early
    WEDGE="the transfer failed before the fault was injected: $(grep -hE 'WARN.*(got completion|is gone)' "$LOG_A" "$LOG_B" | head -1 | cut -d' ' -f2- | cut -c1-160)"
    kill_test a; kill_test b
    return
  fi
  JID=
  FAULT_T0=$(now)
  $FAULT_ACTION
  if [ -n "$JID" ]; then # a job acted: T0 is when its "done" line shows up
    fjob=$(jlog "$FAULT_VM" "$JID")
    for ((i = 0; i < 300; i++)); do grep -q 'fault injected' "$fjob" 2>/dev/null && break; sleep 0.1; done
    if ! grep -q 'fault injected' "$fjob" 2>/dev/null; then
      FAULT_T1=nofault
      kill_test a; kill_test b
      return
    fi
    FAULT_T0=$(now)
  fi
  f=$(jlog "$SURVIVOR" "$([ "$SURVIVOR" = a ] && echo "$SID" || echo "$CID")")
  FAULT_T1=none FAULT_T2=none
  for ((i = 0; i < FAULT_WAIT * 10; i++)); do
    if [ "$FAULT_T1" = none ] && grep -E 'WARN' "$f" 2>/dev/null | grep -qE "$PEER_NAMED"; then FAULT_T1=$(since "$FAULT_T0"); fi
    if [ -e "${f%.log}.rc" ]; then FAULT_T2=$(since "$FAULT_T0"); break; fi
    if ((i % 10 == 9)) && vms_down >/dev/null; then break; fi
    sleep 0.1
  done
  if [ "$FAULT_T2" != none ] && [ "$FAULT_T1" = none ]; then FAULT_T1="(no WARN)"; fi
  if [ "$FAULT_T2" = none ]; then # say where it waits (threads' wchan), then end both sides
    FAULT_T1=none
    on "$SURVIVOR" 20 "p=\$(pgrep -n -f -- 'abi_test .*(--server |:)$((PORT - 1))\$'); grep -H . /proc/\$p/task/*/wchan" || true
    $FAULT_UNDO
    kill_test a; kill_test b
  else # the other side: 15 s to end on its own (its log says how), then it is ended
    $FAULT_UNDO
    jwait "$other" "$oid" 15 || kill_test "$other"
  fi
}
# Link down on A's rail0 during the transfer: B (sending) must see its retries run out.
link_down() { FAULT_VM=a; job a "ip link set rail0 down && echo 'rail0 down: fault injected'"; }
link_up() {
  on a 60 "ip link set rail0 up; for i in \$(seq 100); do grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && break; sleep 0.2; done; cat /sys/class/infiniband/rxe0/ports/1/state" || true
}
FAULT_UNDO=link_up
fault_case linkdown-small 14 3 b link_down
# NCCL's default timeout (20: 4.3 s per attempt) with 6 retries: a finite bound on rxe too.
fault_case linkdown-t20 "" 6 b link_down 90
# 45 s: the 34.4 s bound and a third more (linkdown-t20 errors 0.3-1.0 s after its bound under TCG).
fault_case linkdown-default "" "" b link_down 45 \
  "on rxe NCCL_IB_RETRY_CNT=7 means retry forever (rxe_comp.c never decrements 7): no completion error within 45 s (bound on a spec-conforming NIC: 34.4 s); the sender stays in test() with its send outstanding"
FAULT_UNDO=:
# The receiving process on A SIGKILLed: B's plugin sees A's bootstrap socket close (ffi watch,
# probed every 0.1 s) long before its retries could run out (NCCL_IB_TIMEOUT 20, 6 retries: 30 s).
kill_a() { kill_test a; }
fault_case peer-kill "" 6 b kill_a
# The sending process on B SIGKILLed: the receiver A has nothing on the wire toward B, but its
# plugin sees B's bootstrap socket close.
kill_b() { kill_test b; }
fault_case peer-kill-sender "" 6 a kill_b 60
# VM A frozen (QMP stop): B's retries run out; then A runs again.
stop_a() { VM_STOPPED=a; qmp a stop; JID=; }
cont_a() { qmp a cont; VM_STOPPED=; }
FAULT_UNDO=cont_a
fault_case peer-vm-stop 14 3 b stop_a
FAULT_UNDO=:


# ---- A fused virtual NIC across the two hosts: `ibnet-perf --fuse 0,1` makes one vNIC of rxe0
# (rail0) and rxe1 (rail1) with the plugin's makeVDevice on each side (the server fuses what the
# client asks for); each message is striped over both rails. Each side prints its rxe devices'
# sent_pkts before and after (FUSED-PKTS), and with -v the plugin's close line per comm: the
# bytes each rail carried, which rail failed, the bytes written again.
FPKTS='for d in rxe0 rxe1; do echo "FUSED-PKTS $1 $d $(cat /sys/class/infiniband/$d/ports/1/hw_counters/sent_pkts)"; done'
fused_cmd() { # fused_cmd "ENV" "ibnet-perf args": counters, the run, counters, the run's status
  echo "fpkts() { $FPKTS; }; fpkts before; $1 $PERF $2; rc=\$?; fpkts after; exit \$rc"
}
# fused_pkts LOG — "rxe0 +N rxe1 +M": each device's sent_pkts during the run on that VM.
fused_pkts() {
  awk '$2 == "FUSED-PKTS" { v[$3 " " $4] = $5 }
    END { for (d = 0; d < 2; d++) printf "rxe%d +%d ", d, v["after rxe" d] - v["before rxe" d] }' "$1" 2>/dev/null || true
}
fused_ok() { # every row ok, both rails carried traffic on both VMs, no rail failed
  local a b p
  perf_ok "$@" || return 1
  cat "$1" "$2" | grep -qE 'fused: rails 0 rxe0 [0-9]+ Gb/s, 1 rxe1' || { echo "no 'fused: rails 0 rxe0 …, 1 rxe1' line"; return 1; }
  has "$2" 'rail 0 \(rxe0\) up [1-9][0-9]* bytes; rail 1 \(rxe1\) up [1-9][0-9]* bytes; 0 bytes re-sent' || return 1
  a=$(fused_pkts "$1") b=$(fused_pkts "$2")
  for p in "$a" "$b"; do
    [[ $p =~ rxe0\ \+[1-9].*rxe1\ \+[1-9] ]] || { echo "a rail carried no packets: A sent $a, B sent $b"; return 1; }
  done
  ! grep -qE 'of the virtual NIC failed' "$1" "$2" || { echo "a rail failed on a clean link"; return 1; }
}
fused_note() {
  local a b c
  a=$(fused_pkts "$LOG_A") b=$(fused_pkts "$LOG_B")
  c=$(grep -oE 'rail 0 \(rxe0\) [^;]*; rail 1 \(rxe1\) [^;]*; [0-9]+ bytes re-sent' "$LOG_B" 2>/dev/null | head -1 || true)
  NOTES+=("$1: sent_pkts per rail: A (receiver) $a, B (sender) $b; B's close: ${c:-none}")
  echo "    sent_pkts per rail: A $a, B $b"
  grep -hE 'closed: virtual NIC' "$LOG_B" 2>/dev/null | cut -d' ' -f2- | head -2 | sed 's/^/    B: /' || true
}
if selected fused; then
  pair fused 400 "$(fused_cmd "" "--server --port \$PORT --fuse 0,1 --timeout 120 -v")" \
    "$(fused_cmd "" "--client $A_MGMT:\$PORT --fuse 0,1 --min-bytes 8 --max-bytes 4M $perf_args")" fused_ok
  fused_note fused
fi

# ---- The link-down fault's fused form: rail0 goes down on A during a byte-verified stream of
# 256 KiB messages (B sends) with NCCL_IB_TIMEOUT=16 NCCL_IB_RETRY_CNT=6 (bound 7 x 268 ms =
# 1.88 s; with linkdown-small's 14 and 3 (0.27 s) a 256 KiB stream under TCG timed a healthy rail
# out now and then: the receiver VM takes longer than 67 ms to acknowledge a burst): the
# failed rail's unacknowledged chunks are written again on rail 1 and the transfer completes,
# every byte verified, both sides exit 0; a WARN names the failed rail. Timed like the fault
# cases: T0 when A's "fault injected" line appears, T1 when the first WARN of the failed rail
# appears in either side's log.
FENV="NCCL_IB_TIMEOUT=16 NCCL_IB_RETRY_CNT=6"
FFAIL='rail 0 \(rxe0\) of the virtual NIC failed .*moved to rail 1 \(rxe1\)'
# fused_down — the fused fault's start: waits for the stream, then takes rail0 down on A. False
# (FAULT_T1 says why) when the stream never started, had failed already, or the job did not act;
# else FAULT_T0 is when A's "fault injected" line appeared and FAULT_JOB is that job's log.
fused_down() {
  local i fjob
  FAULT_T1=nostream FAULT_T2=
  streaming || return 1
  if [ -e "${LOG_B%.log}.rc" ] || grep -qE 'of the virtual NIC failed' "$LOG_A" "$LOG_B" 2>/dev/null; then
    FAULT_T1=early
    WEDGE="the transfer failed before the fault was injected: $(grep -hE 'WARN.*of the virtual NIC failed' "$LOG_A" "$LOG_B" 2>/dev/null | head -1 | cut -d' ' -f2- | cut -c1-160 || true)"
    kill_case a; kill_case b
    return 1
  fi
  FAULT_VM=a
  job a "echo 'rail0: going down'; ip link set rail0 down && echo 'rail0 down: fault injected'"
  fjob=$(jlog a "$JID")
  for ((i = 0; i < 300; i++)); do grep -q 'fault injected' "$fjob" 2>/dev/null && break; sleep 0.1; done
  grep -q 'fault injected' "$fjob" 2>/dev/null || { FAULT_T1=nofault; return 1; }
  FAULT_T0=$(now) FAULT_T1=none FAULT_TB=none FAULT_JOB=$fjob
}
fused_fault_during() {
  local i
  fused_down || return
  for ((i = 0; i < 600; i++)); do
    if [ "$FAULT_T1" = none ] && grep -qE "WARN.*$FFAIL" "$LOG_A" "$LOG_B" 2>/dev/null; then FAULT_T1=$(since "$FAULT_T0"); fi
    if [ "$FAULT_TB" = none ] && grep -qE "WARN.*$FFAIL" "$LOG_B" 2>/dev/null; then FAULT_TB=$(since "$FAULT_T0"); fi
    if [ -e "${LOG_B%.log}.rc" ]; then FAULT_T2=$(since "$FAULT_T0"); break; fi
    if ((i % 10 == 9)) && vms_down >/dev/null; then break; fi
    sleep 0.1
  done
  # rail 1 failing too, with its link up, is no fault of the case's: the loaded host starved a
  # VM past the retries' bound (see "Fault cases under load" in README.md): the case
  # runs once more (reported), as a fault case whose transfer failed before its fault does.
  if grep -qE 'WARN.*rail 1 \(rxe1\) of the virtual NIC failed' "$LOG_A" "$LOG_B" 2>/dev/null; then
    WEDGE="rail 1 timed out too with its link up (a VM starved past the retries' bound under host load): $(grep -hE 'WARN.*rail 1 \(rxe1\) of the virtual NIC failed' "$LOG_A" "$LOG_B" | head -1 | cut -d' ' -f2- | cut -c1-200)"
  fi
}
fused_failover_ok() {
  case $FAULT_T1 in
    nostream) echo "the transfer never started"; return 1 ;;
    early) echo "the transfer had ended or a rail had failed before the fault was injected"; return 1 ;;
    nofault) echo "the fault was never injected (its job did not report it)"; return 1 ;;
    none) echo "no WARN naming rail 0 as failed"; return 1 ;;
  esac
  # (the close line's "FAILED" is no failed row: only a check column of FAIL is)
  has "$2" '256KiB .* ok +│' || return 1
  ! grep -qE ' FAIL +│' "$2" || { echo "a row failed its check"; return 1; }
  grep -hE "WARN.*$FFAIL" "$1" "$2" | grep -q . || { echo "no WARN: $FFAIL"; return 1; }
  has "$2" 'rail 0 \(rxe0\) FAILED .*; rail 1 \(rxe1\) up [1-9][0-9]* bytes; [0-9]+ bytes re-sent' || return 1
  # Only the chunks in flight on rail 0 when B learned of the failure go twice (later messages
  # are striped over rail 1 alone): at most --window 4 messages' rail-0 parts of 128 KiB (0 when
  # they had all been acknowledged before the link went down). B's close lines: its send comm's
  # count and its receive comm's 0.
  local rs
  rs=$(grep -hoE '[0-9]+ bytes re-sent' "$2" | awk '{ s += $1 } END { print s + 0 }')
  ((rs <= 4 * 131072)) || { echo "$rs bytes re-sent: more than the 4 messages in flight (4 x 128 KiB)"; return 1; }
  grep -hE "WARN.*$FFAIL" "$1" "$2" | cut -d' ' -f2- | head -2 >&2
}
if selected fused-failover; then
  PAIR_RC=0 PAIR_DURING=fused_fault_during PAIR_TEARDOWN=link_up STREAM_S=3 pair fused-failover 300 \
    "$(fused_cmd "$FENV" "--server --port \$PORT --fuse 0,1 --timeout 120 -v")" \
    "$(fused_cmd "$FENV" "--client $A_MGMT:\$PORT --fuse 0,1 --check --bw-only --min-bytes 256K --max-bytes 256K --iters 400 --window 4 --warmup 1 --timeout 120 -v")" \
    fused_failover_ok
  fused_note fused-failover
  # On A's own clock (the fault job and A's plugin stamp their lines with it): `ip link set
  # rail0 down` started -> A's first WARN of the failed rail (the port-down flushes A's rail-0
  # QPs while the command runs). On the host: the fault job's "fault injected" line seen -> B's
  # (the sender's) WARN seen, through the mailboxes (polled every 0.1 s).
  ta=$(awk '/going down/ && !n++ { print $1 }' "${FAULT_JOB:-/dev/null}" 2>/dev/null || true)
  ta=$(awk -v t0="$ta" -v re="WARN.*$FFAIL" '$0 ~ re && !n++ && t0 != "" { printf "%.2f", $1 - t0 }' "$LOG_A" 2>/dev/null || true)
  rs=$(grep -hoE '[0-9]+ bytes re-sent' "$LOG_B" 2>/dev/null | head -1 || true)
  NOTES+=("fused-failover ($FENV, transport bound 7 x 268 ms = 1.88 s): rail 0 declared failed on A ${ta:-n/a} s after \`ip link set rail0 down\` started (A's clock), B's WARN seen ${FAULT_TB:-n/a} s after (host), transfer done ${FAULT_T2:-n/a} s after the fault, every byte verified; B's close: ${rs:-none}")
  echo "    rail 0 failed: A's WARN ${ta:-n/a} s after the fault (A's clock), B's WARN ${FAULT_TB:-n/a} s (host), transfer done ${FAULT_T2:-n/a} s; B: ${rs:-none}"
fi

# ---- Failback across the two hosts (NCCL_IB_RESILIENCY_PORT_RECOVERY=1): fused-failover's
# fault, then the link comes back. rail0 goes down on A during a byte-verified stream of 256 KiB
# messages (B sends); FB_DOWN_S (2 s) after the first WARN of the failed rail it is brought up
# again (`ip link set rail0 up`, then rxe0 ACTIVE). Both sides must bring rail 0 back (each
# plugin's INFO "rail 0 (rxe0) of the virtual NIC is healthy again"), the transfer completes with
# every byte verified, B's close line shows both rails up, and B's rxe0 sent_pkts grows after
# the return (sampled when B's INFO appears, against its count after the run): rail 0 carries
# traffic again. _START_DELAY 500 ms between attempts (an attempt while the link is still down
# fails: the probe READ over rail 0 times out), _ATTEMPTS_MAX high enough never to give up here,
# _ACK_TIMEOUT 3 s (a VM under TCG can take over a second to answer). 800 messages (210 MB) keep
# the stream going well past the return (measured: see README.md).
FBENV="$FENV NCCL_IB_RESILIENCY_PORT_RECOVERY=1 NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY=500 NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX=1000 NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT=3000"
FBACK='rail 0 \(rxe0\) of the virtual NIC is healthy again'
RXE0_PKTS=/sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts
fused_failback_during() {
  local i
  FB_TA=none FB_TB=none FB_PKTS= FB_JOB=
  fused_down || return
  for ((i = 0; i < 600; i++)); do # the rail's failure WARN, on either side
    if grep -qE "WARN.*$FFAIL" "$LOG_A" "$LOG_B" 2>/dev/null; then FAULT_T1=$(since "$FAULT_T0"); break; fi
    [ -e "${LOG_B%.log}.rc" ] && return
    if ((i % 10 == 9)) && vms_down >/dev/null; then return; fi
    sleep 0.1
  done
  [ "$FAULT_T1" != none ] || return
  sleep "${FB_DOWN_S:-2}"
  job a "echo 'rail0: going up'; ip link set rail0 up && for i in \$(seq 100); do grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && break; sleep 0.1; done; echo \"rail0 up: rxe0 \$(cat /sys/class/infiniband/rxe0/ports/1/state)\""
  FB_JOB=$(jlog a "$JID") FB_T0=$(now)
  for ((i = 0; i < 900; i++)); do # both sides' INFO of the returned rail (host times)
    if [ "$FB_TA" = none ] && grep -qE "$FBACK" "$LOG_A" 2>/dev/null; then FB_TA=$(since "$FB_T0"); fi
    if [ "$FB_TB" = none ] && grep -qE "$FBACK" "$LOG_B" 2>/dev/null; then FB_TB=$(since "$FB_T0"); fi
    [ "$FB_TA" != none ] && [ "$FB_TB" != none ] && break
    [ -e "${LOG_B%.log}.rc" ] && break
    if ((i % 10 == 9)) && vms_down >/dev/null; then return; fi
    sleep 0.1
  done
  # B's rxe0 packets when it saw the rail return: the run's final count must be above it.
  if [ "$FB_TB" != none ] && [ ! -e "${LOG_B%.log}.rc" ]; then
    FB_PKTS=$(on b 20 "cat $RXE0_PKTS" | tail -1) || FB_PKTS=
  fi
  for ((i = 0; i < 1200; i++)); do # the rest of the stream (B's job ends it)
    [ -e "${LOG_B%.log}.rc" ] && break
    if ((i % 10 == 9)) && vms_down >/dev/null; then return; fi
    sleep 0.1
  done
  # (after the stream, so a starved VM at any point of it is seen)
  if grep -qE 'WARN.*rail 1 \(rxe1\) of the virtual NIC failed' "$LOG_A" "$LOG_B" 2>/dev/null; then
    WEDGE="rail 1 timed out too with its link up (a VM starved past the retries' bound under host load): $(grep -hE 'WARN.*rail 1 \(rxe1\) of the virtual NIC failed' "$LOG_A" "$LOG_B" | head -1 | cut -d' ' -f2- | cut -c1-200)"
  fi
}
fused_failback_ok() {
  local after
  case $FAULT_T1 in
    nostream) echo "the transfer never started"; return 1 ;;
    early) echo "the transfer had ended or a rail had failed before the fault was injected"; return 1 ;;
    nofault) echo "the fault was never injected (its job did not report it)"; return 1 ;;
    none) echo "no WARN naming rail 0 as failed"; return 1 ;;
  esac
  has "$2" '256KiB .* ok +│' || return 1
  ! grep -qE ' FAIL +│' "$2" || { echo "a row failed its check"; return 1; }
  [ "$FB_TA" != none ] && [ "$FB_TB" != none ] ||
    { echo "rail 0 did not return on both sides (INFO '$FBACK': A ${FB_TA}, B ${FB_TB})"; return 1; }
  has "$2" 'rail 0 \(rxe0\) up [1-9][0-9]* bytes; rail 1 \(rxe1\) up [1-9][0-9]* bytes; [0-9]+ bytes re-sent' || return 1
  after=$(awk '$2 == "FUSED-PKTS" && $3 == "after" && $4 == "rxe0" { print $5 }' "$2")
  [[ $FB_PKTS =~ ^[0-9]+$ ]] && [[ $after =~ ^[0-9]+$ ]] && ((after > FB_PKTS)) ||
    { echo "B's rxe0 sent_pkts did not grow after the return (at the return: ${FB_PKTS:-n/a}, after the run: ${after:-n/a})"; return 1; }
  # A failback attempt while the link is still down fails (RTR cannot resolve the peer): an
  # INFO each, never a WARN per attempt.
  ! grep -qE 'WARN.*cannot connect to peer' "$1" "$2" ||
    { echo "a WARN per failed failback attempt: $(grep -chE 'WARN.*cannot connect to peer' "$1" "$2" | tr '\n' ' ')"; return 1; }
  grep -hE "WARN.*$FFAIL|$FBACK" "$1" "$2" | cut -d' ' -f2- | head -4 >&2
}
if selected fused-failback; then
  PAIR_RC=0 PAIR_DURING=fused_failback_during PAIR_TEARDOWN=link_up STREAM_S=3 pair fused-failback 400 \
    "$(fused_cmd "$FBENV" "--server --port \$PORT --fuse 0,1 --timeout 120 -v")" \
    "$(fused_cmd "$FBENV" "--client $A_MGMT:\$PORT --fuse 0,1 --check --bw-only --min-bytes 256K --max-bytes 256K --iters 800 --window 4 --warmup 1 --timeout 120 -v")" \
    fused_failback_ok
  fused_note fused-failback
  # On A's own clock: `ip link set rail0 down` started -> A's first WARN of the failed rail, and
  # `ip link set rail0 up` started -> A's INFO of the returned rail; B's INFO seen on the host.
  ta=$(awk '/going down/ && !n++ { print $1 }' "${FAULT_JOB:-/dev/null}" 2>/dev/null || true)
  ta=$(awk -v t0="$ta" -v re="WARN.*$FFAIL" '$0 ~ re && !n++ && t0 != "" { printf "%.2f", $1 - t0 }' "$LOG_A" 2>/dev/null || true)
  tu=$(awk '/going up/ && !n++ { print $1 }' "${FB_JOB:-/dev/null}" 2>/dev/null || true)
  tu=$(awk -v t0="$tu" -v re="$FBACK" '$0 ~ re && !n++ && t0 != "" { printf "%.2f", $1 - t0 }' "$LOG_A" 2>/dev/null || true)
  rs=$(grep -hoE '[0-9]+ bytes re-sent' "$LOG_B" 2>/dev/null | head -1 || true)
  NOTES+=("fused-failback ($FBENV): rail 0 failed on A ${ta:-n/a} s after \`ip link set rail0 down\` started (A's clock); returned on A ${tu:-n/a} s after \`ip link set rail0 up\` started (A's clock), B's INFO seen ${FB_TB:-n/a} s after (host); B's rxe0 sent_pkts at the return ${FB_PKTS:-n/a}, after the run $(awk '$2 == "FUSED-PKTS" && $3 == "after" && $4 == "rxe0" { print $5 }' "$LOG_B" 2>/dev/null); B's close: ${rs:-none}")
  echo "    rail 0 failed: A's WARN ${ta:-n/a} s after the fault (A's clock); returned: A's INFO ${tu:-n/a} s after link up (A's clock), B's ${FB_TB:-n/a} s (host); B: ${rs:-none}"
fi
