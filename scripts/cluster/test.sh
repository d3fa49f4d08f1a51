#!/usr/bin/env bash
# test.sh — ibnet across two hosts: two qemu VMs (two kernels) of the rxe suite's image, joined
# by three virtual L2 links carried over 127.0.0.1 TCP sockets, soft-RoCE on two rails, and the
# cases of cases.sh between them (server on VM A, client on VM B), faults included.
#
#   sudo scripts/cluster/test.sh        # what .ci/run calls; exit 0 only if no case failed
#   IBNET_CLUSTER_ONLY='perf|abi' scripts/cluster/test.sh
#
# 1. host packages and the image: scripts/rxe (common.sh, image.sh; the same cached image),
# 2. the share: what scripts/rxe stages (plugin, abi_test, ibnet-perf, ...) plus guest.sh as
#    run.sh; one read-only share for both VMs, and one read-write mailbox folder per VM,
# 3. boots VM A and VM B (TCG) with a hard timeout; each has NICs mgmt, rail0, rail1, each an L2
#    link to the other VM (qemu `-netdev stream` over a TCP connection on 127.0.0.1: lossless,
#    flow-controlled; nothing leaves 127.0.0.1),
# 4. runs the cases (cases.sh, sourced here: the host drives both VMs through their mailboxes
#    and qemu's QMP socket), 5. prints PASS/FAIL/SKIP per case, the console section of both VMs
#    for each failed case, the timings and the summary line:
#    CLUSTER-TEST-SUMMARY: N passed, N failed, N skipped | name=RESULT ...
#
# Environment: IBNET_CLUSTER_ONLY (case regex), IBNET_CLUSTER_SUITE (guest Debian release, default
# trixie), IBNET_CLUSTER_CASES (a cases file instead of cases.sh), IBNET_CLUSTER_DEADLINE (s from
# the first case on, default 1800: a case due later is not run but reported FAIL),
# IBNET_CLUSTER_TIMEOUT (most seconds one VM boot may live, default 2700: the backstop of .ci/run), IBNET_CLUSTER_HUNG
# (s without the guest agent's heartbeat before a VM counts as hung, default 120),
# IBNET_CLUSTER_REBOOTS (most reboots of the VMs after a crash or hang, default 5),
# IBNET_CLUSTER_CPU (qemu -cpu model, default max), IBNET_CLUSTER_MEM / IBNET_CLUSTER_SMP (per VM,
# 1G / 1), IBNET_CLUSTER_KEEP=1 (keep the run folder), IBNET_RXE_CACHE (the image cache, shared
# with scripts/rxe), IBNET_RXE_BUILD=0 (stage what target/ holds).
#
# Nothing waits unbounded: every job runs under `timeout` in the guest, every wait on the host is
# bounded and ends at once when a VM is down (qemu exited, kernel panic/Oops on its console, or
# no heartbeat); such a case is rerun once on rebooted VMs, and the whole run has a deadline.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rxe=$repo/scripts/rxe
CACHE=${IBNET_RXE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibnet-rxe-vm}
TIMEOUT=${IBNET_CLUSTER_TIMEOUT:-2700}
DEADLINE=${IBNET_CLUSTER_DEADLINE:-1800}
trap 'echo "cluster: FAILED at test.sh line $LINENO: $BASH_COMMAND" >&2' ERR
step() { printf '\n---- cluster: %s (%s)\n' "$*" "$(date +%T)"; }
t_start=$SECONDS

# shellcheck source=../rxe/common.sh
here=$rxe . "$rxe/common.sh"

step "host packages"
rxe_host_packages python3
# The guest kernel: Debian trixie's (6.12). Bookworm's 6.1 soft-RoCE wedges RC connections
# between the two VMs after a retransmission (see README.md, "The soft-RoCE wedge").
export IBNET_RXE_SUITE=${IBNET_CLUSTER_SUITE:-trixie}
step "VM image (scripts/rxe/image.sh, Debian $IBNET_RXE_SUITE)"
t0=$SECONDS
img=$("$rxe/image.sh")
t_image=$((SECONDS - t0))

step "stage the share"
t0=$SECONDS
mkdir -p "$CACHE"
run=$(mktemp -d "$CACHE/cluster.XXXXXX")
share=$run/share
cleanup() {
  local v
  for v in a b; do
    if [ -n "${QPID[$v]:-}" ]; then kill "${QPID[$v]}" 2>/dev/null || true; fi
  done
  if [ "${IBNET_CLUSTER_KEEP:-}" != 1 ]; then rm -rf "$run"; else echo "kept $run"; fi
}
declare -A QPID=()
trap cleanup EXIT
mkdir -p "$share" "$run/mbox-a/jobs" "$run/mbox-b/jobs"
# The cluster needs no Rust test executables; tools and C programs come from scripts/rxe.
here=$rxe IBNET_RXE_TEST_PKGS='' rxe_stage "$share"
install -m755 "$here/guest.sh" "$share/run.sh"
t_stage=$((SECONDS - t0))

# Three free TCP ports on 127.0.0.1, one per link: VM A listens, VM B connects.
free_ports() {
  local base p ok
  for _ in $(seq 50); do
    base=$((20000 + RANDOM % 30000)) ok=1
    for p in $(seq "$base" $((base + 2))); do
      ss -Hltn "sport = :$p" | grep -q . && ok=0
    done
    [ $ok = 1 ] && { echo "$base"; return; }
  done
  return 1
}
base=$(free_ports)

# boot VM (a|b): index 1|2 in MACs; A listens on the links' ports, B connects to them. Each boot
# has its own console file and mailbox (a reboot keeps the old ones as *.<boot>, for evidence).
boot() {
  local v=$1 n i srv args=()
  if [ "$v" = a ]; then n=1 srv=on; else n=2 srv=off; fi
  for i in 0 1 2; do
    args+=(-netdev "stream,id=n$i,server=$srv,addr.type=inet,addr.host=127.0.0.1,addr.port=$((base + i))"
           -device "virtio-net-pci,netdev=n$i,mac=52:54:00:c1:0$i:0$n")
  done
  mkdir -p "$run/mbox-$v/jobs"
  timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu "${IBNET_CLUSTER_CPU:-max}" \
    -m "${IBNET_CLUSTER_MEM:-1G}" -smp "${IBNET_CLUSTER_SMP:-1}" -display none -monitor none \
    -serial "file:$run/$v.console" -no-reboot -nic none "${args[@]}" \
    -qmp "unix:$run/$v.qmp,server=on,wait=off" \
    -kernel "$img/vmlinuz" -initrd "$img/initrd.img" \
    -append "console=ttyS0 root=/dev/vda ro init=/ibnet-init panic=-1 quiet loglevel=4 fsck.mode=skip no_timer_check ibnet_role=$v" \
    -drive "file=$img/rootfs.img,format=raw,if=virtio,readonly=on,snapshot=off" \
    -virtfs "local,path=$share,mount_tag=hostshare,security_model=none,readonly=on" \
    -virtfs "local,path=$run/mbox-$v,mount_tag=mbox,security_model=none" \
    </dev/null >>"$run/$v.qemu.log" 2>&1 &
  QPID[$v]=$!
}

# boot_vms — boots VM A, then VM B, and waits (at most 180 s) until both guests report ready.
# Sets ready=1 when both are up and their setup passed.
BOOTS=0
boot_vms() {
  local i
  BOOTS=$((BOOTS + 1)) ready=
  base=$(free_ports)
  echo "    boot $BOOTS: VM A and VM B (qemu TCG, links on 127.0.0.1 TCP ports $base..$((base + 2)), timeout ${TIMEOUT}s)"
  boot a
  for _ in $(seq 150); do # B connects to A's three ports: wait until A's qemu listens on them
    [ "$(ss -Hltn "sport >= :$base and sport <= :$((base + 2))" | wc -l)" -ge 3 ] && break
    sleep 0.2
  done
  boot b
  for _ in $(seq 900); do
    if [ -e "$run/mbox-a/ready" ] && [ -e "$run/mbox-b/ready" ]; then ready=1; break; fi
    kill -0 "${QPID[a]}" 2>/dev/null && kill -0 "${QPID[b]}" 2>/dev/null || break
    sleep 0.2
  done
  if [ -n "$ready" ] && { [ "$(cat "$run/mbox-a/ready")" != ok ] || [ "$(cat "$run/mbox-b/ready")" != ok ]; }; then
    ready=
  fi
  return 0
}

# kill_vms — ends both qemus (SIGTERM, then SIGKILL after 10 s) and waits for them.
kill_vms() {
  local v
  for v in a b; do
    if [ -n "${QPID[$v]:-}" ]; then kill "${QPID[$v]}" 2>/dev/null || true; fi
  done
  for v in a b; do
    [ -n "${QPID[$v]:-}" ] || continue
    for _ in $(seq 50); do kill -0 "${QPID[$v]}" 2>/dev/null || break; sleep 0.2; done
    kill -9 "${QPID[$v]}" 2>/dev/null || true
    wait "${QPID[$v]}" 2>/dev/null || true
  done
}

# reboot_vms — a VM crashed or hung: both qemus are ended and booted afresh (new link ports, so
# no half-open link survives), the old consoles and mailboxes kept as *.<boot>.
reboot_vms() {
  local v
  kill_vms
  for v in a b; do
    mv "$run/$v.console" "$run/$v.console.$BOOTS"
    mv "$run/mbox-$v" "$run/mbox-$v.$BOOTS"
    rm -f "$run/$v.qmp"
  done
  boot_vms
  echo "    boot $BOOTS: $([ -n "$ready" ] && echo ready || echo 'NOT ready') after a reboot"
}

# vm_down VM — true (and prints why) when VM is gone: its qemu has exited, its kernel reported a
# panic or an Oops on the console, or its guest agent's heartbeat (mbox alive, rewritten about
# every 2 s) is older than IBNET_CLUSTER_HUNG seconds (default 120; a VM stopped through QMP
# by a case is not hung).
vm_down() {
  local v=$1 age why=
  if ! kill -0 "${QPID[$v]:-0}" 2>/dev/null; then why="its qemu has exited"; fi
  if grep -qaE '^\[ *[0-9.]+\] (Kernel panic|Oops: )' "$run/$v.console" 2>/dev/null; then
    why="${why:+$why; }its kernel crashed: $(grep -aE 'Kernel panic|Oops: |RIP: |Workqueue: ' "$run/$v.console" | head -4 | tr -d '\r' | sed 's/^\[ *[0-9.]*\] //' | tr '\n' '|')"
  fi
  if [ -z "$why" ] && [ "${VM_STOPPED:-}" != "$v" ] && [ -e "$run/mbox-$v/alive" ]; then
    age=$(($(date +%s) - $(stat -c %Y "$run/mbox-$v/alive")))
    [ "$age" -gt "${IBNET_CLUSTER_HUNG:-120}" ] && why="its guest agent's heartbeat is ${age}s old (hung)"
  fi
  [ -n "$why" ] || return 1
  echo "VM ${v^^} is down: $why"
}

# qmp VM COMMAND — one QMP command (stop, cont, quit, ...) to a VM's qemu (at most 20 s).
qmp() {
  timeout -k 5 20 python3 - "$run/$1.qmp" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1]); f = s.makefile("rw")
f.readline()
for cmd in ("qmp_capabilities", sys.argv[2]):
    f.write(json.dumps({"execute": cmd}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r: break
    if "error" in r: sys.exit("qmp %s: %s" % (cmd, r["error"]))
PY
}

step "boot VM A and VM B"
t0=$SECONDS
boot_vms
t_boot=$((SECONDS - t0))

# ---- the case machinery (used by cases.sh)
declare -a RESULTS=()
npass=0 nfail=0 nskip=0 JN=0
mkdir -p "$run/failed"
# job VM SCRIPT — queues SCRIPT on VM (a|b); its id is left in $JID.
job() {
  JN=$((JN + 1)) JID=$(printf 'j%03d' $JN)
  printf '. /tmp/env\n%s\n' "$2" >"$run/mbox-$1/jobs/.$JID.tmp" 2>/dev/null &&
    mv "$run/mbox-$1/jobs/.$JID.tmp" "$run/mbox-$1/jobs/$JID.sh" || true
}
# jwait VM ID SECONDS — waits for a job; returns its exit status (124: still running; 125: a VM
# is down, see vm_down: a crashed or hung guest never finishes a job or answers its peer, so
# nobody waits for it).
jwait() {
  local f=$run/mbox-$1/out/$2.rc i
  for ((i = 0; i < $3 * 5; i++)); do
    if [ -e "$f" ]; then return "$(cat "$f")"; fi
    if ((i % 5 == 4)) && vms_down >/dev/null; then return 125; fi
    sleep 0.2
  done
  return 124
}
# jlog VM ID — the job's output (each line prefixed with the guest's clock).
jlog() { echo "$run/mbox-$1/out/$2.log"; }
# on VM SECONDS SCRIPT — runs SCRIPT on VM and waits for it (output printed).
on() {
  local rc=0
  job "$1" "timeout -k 5 $2 bash -c $(printf %q "$3")"
  jwait "$1" "$JID" $(($2 + 15)) || rc=$?
  cut -d' ' -f2- "$(jlog "$1" "$JID")" 2>/dev/null
  return $rc
}
selected() { [ -z "${IBNET_CLUSTER_ONLY:-}" ] || [[ $1 =~ $IBNET_CLUSTER_ONLY ]]; }
# vms_down — prints why for each VM that is down; true when one is.
vms_down() {
  local r=1
  vm_down a && r=0
  vm_down b && r=0
  return $r
}
# vms_ready — true when both VMs serve jobs; when one is down (a crash or hang in an earlier
# step), both are rebooted first, at most IBNET_CLUSTER_REBOOTS times per run (default 5).
vms_ready() {
  vms_down >/dev/null || return 0
  [ "$((BOOTS - 1))" -lt "${IBNET_CLUSTER_REBOOTS:-5}" ] || return 1
  vms_down | sed 's/^/    /'
  reboot_vms
  [ -n "$ready" ]
}
case_begin() {
  CASE=$1 CASE_T0=$SECONDS
  CA=$(wc -l <"$run/a.console") CB=$(wc -l <"$run/b.console")
}
# case_end RESULT [REASON] — a failed case's console section of both VMs (from case_begin on) is
# kept in failed/ now: a reboot after it starts new consoles.
case_end() {
  local r=$1 why=${2:-} v s f
  printf '%-28s %s %4ss%s\n' "$CASE" "$r" $((SECONDS - CASE_T0)) "${why:+  ($why)}"
  RESULTS+=("$CASE=$r")
  case $r in
    PASS) npass=$((npass + 1)) ;;
    FAIL)
      nfail=$((nfail + 1)) f=$run/failed/$(printf '%02d' "$nfail")-$CASE
      for v in a b; do
        if [ $v = a ]; then s=$CA; else s=$CB; fi
        echo "==== VM ${v^^} console, case $CASE:"
        tail -n +"$((s + 1))" "$run/$v.console" 2>/dev/null | tr -d '\r'
      done >"$f"
      ;;
    *) nskip=$((nskip + 1)) ;;
  esac
}

step "cases"
t0=$SECONDS t_cases0=$SECONDS
if [ -n "$ready" ]; then
  printf 'VM A GIDs:\n%s\nVM B GIDs:\n%s\n' "$(cat "$run/mbox-a/gids")" "$(cat "$run/mbox-b/gids")"
  # shellcheck source=pair.sh
  . "$here/pair.sh"
  # shellcheck source=cases.sh
  . "${IBNET_CLUSTER_CASES:-$here/cases.sh}"
  for n in "${NOTES[@]}"; do echo "note: $n"; done
  for w in "${WEDGES[@]}"; do echo "ran a second time: $w"; done
else
  CASE=setup CA=0 CB=0 CASE_T0=$t0
  case_end FAIL "the VMs did not come up ready (a: $(cat "$run/mbox-a/ready" 2>/dev/null), b: $(cat "$run/mbox-b/ready" 2>/dev/null))"
fi
t_cases=$((SECONDS - t0))

step "halt"
: >"$run/mbox-a/halt"; : >"$run/mbox-b/halt"
for v in a b; do
  qmp "$v" cont >/dev/null 2>&1 || true # a case may have left it stopped
  for _ in $(seq 150); do kill -0 "${QPID[$v]}" 2>/dev/null || break; sleep 0.2; done
done
kill_vms

step "report"
for f in "$run"/failed/*; do
  if [ -e "$f" ]; then cat "$f"; fi
done
if [ -z "$ready" ]; then
  for v in a b; do echo "==== VM ${v^^} console (tail):"; tail -n 80 "$run/$v.console" | tr -d '\r'; done
fi
echo "timings: image ${t_image}s, stage ${t_stage}s, boot ${t_boot}s, cases ${t_cases}s, total $((SECONDS - t_start))s, VM boots $BOOTS"
summary="CLUSTER-TEST-SUMMARY: $npass passed, $nfail failed, $nskip skipped | ${RESULTS[*]}"
echo "$summary"
trap - ERR
if [ "$nfail" != 0 ]; then exit 1; fi
