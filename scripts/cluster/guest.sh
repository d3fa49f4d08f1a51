#!/bin/bash
# guest.sh — the guest side of the cluster suite (one script for both VMs); the host copies it
# into the share as run.sh and the image's PID 1 runs it. It names this VM's NICs by their MAC,
# addresses them, puts rxe on both rails, then serves jobs from its mailbox until told to stop.
#
# Role: `ibnet_role=a|b` on the kernel command line (a = 1, b = 2 in every address below).
# NICs (MAC 52:54:00:c1:0<nic>:0<n>): mgmt 10.20.0.n/24 fd20::n/64; rail0 10.21.0.n/24
# fd21::n/64 and a second subnet 10.31.0.n/24; rail1 10.22.0.n/24 fd22::n/64; rxe0 on rail0, rxe1
# on rail1. IPv6 duplicate address detection is off, so every address is usable at once.
#
# Mailbox (/run/mbox, this VM's read-write 9p folder on the host):
#   jobs/<id>.sh   written by the host (atomically, by rename): a bash script, run once in the
#                  background with /tmp/env sourced, in its own session
#   out/<id>.log   its output, each line prefixed with the guest's $EPOCHREALTIME
#   out/<id>.rc    its exit status, written (by rename) when it has finished
#   ready, gids    written by the guest once the setup passed (ready holds "ok" or the failure)
#   halt           written by the host: the guest stops serving and powers off
#   alive          rewritten by the guest about every 2 s while it serves jobs: the host takes a
#                  VM whose heartbeat is older than a minute or two for hung (see test.sh)
# Every job's output also goes to the console as "[<role> <id>] line", between
# CLUSTER-JOB-BEGIN / CLUSTER-JOB-END lines, so the console has the whole story.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SHARE=$(cd "$(dirname "$0")" && pwd)
ROLE=$(sed -n 's/.*ibnet_role=\([ab]\).*/\1/p' /proc/cmdline)
case $ROLE in a) N=1 P=2 ;; b) N=2 P=1 ;; *) echo "CLUSTER-GUEST-ERROR no ibnet_role"; exit 1 ;; esac
MB=/run/mbox
mkdir -p $MB
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 mbox $MB ||
  { echo "CLUSTER-GUEST-ERROR no mailbox"; exit 1; }
mkdir -p $MB/out
echo "CLUSTER-GUEST-UP $ROLE $(cut -d' ' -f1 /proc/uptime)s"

setup() {
  ulimit -l unlimited
  ip link set lo up
  modprobe virtio_net; modprobe rdma_rxe && modprobe ib_uverbs || return 1
  for k in all default; do echo 0 >/proc/sys/net/ipv6/conf/$k/accept_dad; done
  local i name mac d dev
  i=0
  for name in mgmt rail0 rail1; do
    mac=52:54:00:c1:0$i:0$N dev=
    for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$mac" ] && dev=${d##*/}; done
    [ -n "$dev" ] || { echo "no NIC with MAC $mac"; return 1; }
    [ "$dev" = "$name" ] || ip link set "$dev" name "$name" || return 1
    echo 0 >/proc/sys/net/ipv6/conf/$name/accept_dad
    i=$((i + 1))
  done
  ip addr add 10.20.0.$N/24 dev mgmt && ip -6 addr add fd20::$N/64 dev mgmt nodad &&
    ip addr add 10.21.0.$N/24 dev rail0 && ip -6 addr add fd21::$N/64 dev rail0 nodad &&
    ip addr add 10.31.0.$N/24 dev rail0 &&
    ip addr add 10.22.0.$N/24 dev rail1 && ip -6 addr add fd22::$N/64 dev rail1 nodad || return 1
  for d in mgmt rail0 rail1; do ip link set $d up || return 1; done
  # Static neighbours: the peer's MACs are known, so no ARP/ND round trip can time out under
  # TCG (rxe resolves the peer's MAC when a QP goes to RTR and gives up after about a second).
  i=0
  for name in mgmt rail0 rail1; do
    for ip in 10.2$i.0.$P fd2$i::$P; do ip neigh replace $ip lladdr 52:54:00:c1:0$i:0$P dev $name nud permanent; done
    i=$((i + 1))
  done
  ip neigh replace 10.31.0.$P lladdr 52:54:00:c1:01:0$P dev rail0 nud permanent
  rdma link add rxe0 type rxe netdev rail0 && rdma link add rxe1 type rxe netdev rail1 || return 1
  for i in $(seq 100); do
    grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null &&
      grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state 2>/dev/null && break
    sleep 0.2
  done
  # The link-local IPv6 addresses (and so their GIDs) appear once the links are up.
  sleep 1
  ip -br addr; rdma link show
  for dev in rxe0 rxe1; do
    for i in $(seq 0 15); do
      g=/sys/class/infiniband/$dev/ports/1
      v=$(cat $g/gids/$i 2>/dev/null) || continue
      [ "$v" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue
      echo "$dev gid[$i] $v $(cat $g/gid_attrs/types/$i 2>/dev/null) $(cat $g/gid_attrs/ndevs/$i 2>/dev/null)"
    done
  done | tee $MB/gids
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state &&
    grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state
}

# What every job sees.
cat >/tmp/env <<ENV
export PATH=$PATH SHARE=$SHARE BIN=$SHARE/bin LIB=$SHARE/lib SO=$SHARE/lib/libnccl-net-ibnet.so
export LD_LIBRARY_PATH=$SHARE/lib ROLE=$ROLE ME=$N PEER=$P RUST_BACKTRACE=1
export IBNET_PROVIDER=verbs NCCL_SOCKET_IFNAME=mgmt
ulimit -l unlimited
# gidx DEV REGEX: the first GID index of DEV's port 1 whose sysfs value matches REGEX.
gidx() {
  local i
  for i in \$(seq 0 15); do
    grep -qE "\$2" /sys/class/infiniband/\$1/ports/1/gids/\$i 2>/dev/null && { echo \$i; return; }
  done
  return 1
}
export -f gidx
ENV

run_job() { # run_job ID
  local id=$1 l rc
  echo "CLUSTER-JOB-BEGIN $ROLE $id $(cut -d' ' -f1 /proc/uptime)s"
  {
    (cd /tmp && . /tmp/env && exec setsid bash "$MB/jobs/$id.sh") </dev/null 2>&1 |
      while IFS= read -r l; do
        printf '%s %s\n' "$EPOCHREALTIME" "$l" >&3
        printf '[%s %s] %s\n' "$ROLE" "$id" "$l"
      done
    rc=${PIPESTATUS[0]}
  } 3>>"$MB/out/$id.log"
  echo "$rc" >"$MB/out/$id.rc.tmp" && mv "$MB/out/$id.rc.tmp" "$MB/out/$id.rc"
  echo "CLUSTER-JOB-END $ROLE $id rc=$rc $(cut -d' ' -f1 /proc/uptime)s"
}

echo "CLUSTER-SETUP-BEGIN $ROLE"
if out=$(setup 2>&1); then st=ok; else st="setup failed"; fi
echo "$out"
echo "$st" >$MB/ready.tmp && mv $MB/ready.tmp $MB/ready
echo "CLUSTER-SETUP-END $ROLE $st"

declare -A started=()
beat=-2
while [ ! -e $MB/halt ]; do
  if [ $((SECONDS - beat)) -ge 2 ]; then : >$MB/alive; beat=$SECONDS; fi
  for f in "$MB"/jobs/*.sh; do
    [ -e "$f" ] || continue
    id=${f##*/}; id=${id%.sh}
    [ -n "${started[$id]:-}" ] && continue
    started[$id]=1
    run_job "$id" &
  done
  sleep 0.2
done
echo "CLUSTER-GUEST-HALT $ROLE"
sync
