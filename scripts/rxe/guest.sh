#!/bin/bash
# guest.sh — the guest side of the rxe suite; the host copies it into the share as run.sh and the
# image's PID 1 runs it. It puts soft-RoCE on a dummy interface, then runs the cases of cases.sh
# (each with a timeout), bracketing each case's output on the console:
#
#   RXE-CASE-BEGIN <name>
#   ...output...
#   RXE-CASE-END <name> PASS|FAIL|SKIP <seconds>s [reason]
#   RXE-TEST-SUMMARY: <n> passed, <n> failed, <n> skipped | <name>=PASS ...
#
# Layout of the share (read-only, /run/host): run.sh, cases.sh, config (host settings),
# bin/ (executables), lib/ (the plugin .so), rust/ (cargo test binaries).
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SHARE=$(cd "$(dirname "$0")" && pwd)
export SHARE BIN=$SHARE/bin LIB=$SHARE/lib
# shellcheck disable=SC2034 # IBNET_RXE_CASE_TIMEOUT is read by cases.sh
IBNET_RXE_ONLY='' IBNET_RXE_CASE_TIMEOUT=120 # defaults; config overrides, cases.sh reads them
# shellcheck source=/dev/null
[ -r "$SHARE/config" ] && . "$SHARE/config"
NETDEV=dummy0 RXE_IP=10.11.0.1

declare -a RESULTS=()
npass=0 nfail=0 nskip=0
ts() { cut -d' ' -f1 /proc/uptime; }
record() { # record NAME RESULT SECONDS [REASON]
  echo "RXE-CASE-END $1 $2 ${3}s${4:+ $4}"
  RESULTS+=("$1=$2")
  case $2 in PASS) npass=$((npass + 1)) ;; FAIL) nfail=$((nfail + 1)) ;; *) nskip=$((nskip + 1)) ;; esac
}
selected() { [ -z "$IBNET_RXE_ONLY" ] || [[ $1 =~ $IBNET_RXE_ONLY ]]; }
elapsed() { echo "$(ts) $1" | awk '{printf "%.1f", $1 - $2}'; }
# The program a command line runs: its first word that is not a VAR=value assignment.
program() {
  local w
  for w in $1; do [[ $w =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "$w"; return; }; done
}
# SKIP (not FAIL) when a case's program was not staged: tests appear as their binaries land.
missing() {
  local p
  p=$(program "$1")
  command -v "$p" >/dev/null 2>&1 && return 1
  echo "RXE-CASE-BEGIN $2"; record "$2" SKIP 0 "(no $p)"
}

# t NAME TIMEOUT "COMMAND" — one process; passes when it exits 0 within TIMEOUT seconds.
t() {
  local name=$1 to=$2 cmd=$3 t0 rc
  selected "$name" || return 0
  missing "$cmd" "$name" && return 0
  echo "RXE-CASE-BEGIN $name"; echo "+ $cmd"
  t0=$(ts)
  timeout -k 5 "$to" bash -o pipefail -c "$cmd" </dev/null 2>&1; rc=$?
  [ $rc = 124 ] && echo "(timed out after ${to}s)"
  record "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(elapsed "$t0")" "$([ $rc = 0 ] || echo "rc=$rc")"
}

# pair NAME TIMEOUT "SERVER" "CLIENT" [PORT] — a server and a client process, both must exit 0.
# The client starts once the server listens on TCP PORT (or after 2 s without PORT); the server
# has its own timeout, so a server whose client failed cannot hang the suite.
pair() {
  local name=$1 to=$2 srv=$3 cli=$4 port=${5:-} t0 spid crc src i
  selected "$name" || return 0
  missing "$srv" "$name" && return 0
  echo "RXE-CASE-BEGIN $name"; echo "+ server: $srv"; echo "+ client: $cli"
  t0=$(ts)
  timeout -k 5 "$to" bash -o pipefail -c "$srv" </dev/null >/tmp/server.log 2>&1 & spid=$!
  if [ -n "$port" ]; then
    for i in $(seq 100); do
      ss -Hltn "sport = :$port" | grep -q . && break
      kill -0 $spid 2>/dev/null || break
      sleep 0.2
    done
  else
    sleep 2
  fi
  timeout -k 5 "$to" bash -o pipefail -c "$cli" </dev/null 2>&1; crc=$?
  wait $spid; src=$?
  echo "--- server (rc=$src):"; cat /tmp/server.log; echo "--- client rc=$crc"
  [ $crc = 124 ] || [ $src = 124 ] && echo "(timed out after ${to}s)"
  record "$name" "$([ $crc = 0 ] && [ $src = 0 ] && echo PASS || echo FAIL)" "$(elapsed "$t0")" \
    "$([ $crc = 0 ] && [ $src = 0 ] || echo "client=$crc server=$src")"
}

# ---- soft-RoCE on dummy0 (rxe on lo works for raw verbs but not for rdma_cm route resolution)
echo "RXE-CASE-BEGIN rxe-setup"
t0=$(ts)
ulimit -l unlimited
ip link set lo up
modprobe rdma_rxe && modprobe ib_uverbs && modprobe dummy numdummies=0 &&
  ip link add $NETDEV type dummy && ip addr add $RXE_IP/24 dev $NETDEV && ip link set $NETDEV up &&
  rdma link add rxe0 type rxe netdev $NETDEV
rc=$?
for i in $(seq 50); do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break
  sleep 0.2
done
rdma link show; ls /dev/infiniband
# The RoCE v2 GID that maps $RXE_IP (what NCCL_IB_GID_INDEX auto-selection must pick).
want=$(echo $RXE_IP | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1,$2,$3,$4}')
RXE_GID=
for i in 0 1 2 3 4 5 6 7; do
  g=/sys/class/infiniband/rxe0/ports/1
  v=$(cat $g/gids/$i 2>/dev/null) || continue
  ty=$(cat $g/gid_attrs/types/$i 2>/dev/null)
  echo "gid[$i] $v $ty"
  [ -z "$RXE_GID" ] && [ "$v" = "$want" ] && [ "$ty" = "RoCE v2" ] && RXE_GID=$i
done
echo "rxe0 on $NETDEV $RXE_IP, RoCE v2 IPv4 GID index ${RXE_GID:-none}"
[ $rc = 0 ] && [ -n "$RXE_GID" ] && grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state
rc=$?
record rxe-setup "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(elapsed "$t0")"

# What every case sees: the verbs provider on rxe0, bootstrap sockets on dummy0.
export RXE_DEV=rxe0 RXE_GID=${RXE_GID:-1} RXE_IP NETDEV
export IBNET_PROVIDER=verbs NCCL_SOCKET_IFNAME=$NETDEV RUST_BACKTRACE=1
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# shellcheck source-path=SCRIPTDIR source=cases.sh
[ $rc = 0 ] && . "$SHARE/cases.sh"

echo "RXE-TEST-SUMMARY: $npass passed, $nfail failed, $nskip skipped | ${RESULTS[*]}"
sync
