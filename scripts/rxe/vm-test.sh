#!/usr/bin/env bash
# vm-test.sh — ibnet's verbs provider over soft-RoCE (rdma_rxe) in a qemu VM.
#
#   sudo scripts/rxe/vm-test.sh            # what .ci/run calls; exit 0 only if every case passed
#   IBNET_RXE_ONLY='probe|abi' scripts/rxe/vm-test.sh      # run only cases matching a regex
#
# 1. installs the host packages it needs (apt, when missing), 2. builds or reuses the cached VM
# image (image.sh), 3. stages a share: the guest runner (guest.sh -> run.sh, cases.sh), the
# plugin .so and the test executables built on this host, 4. boots the VM under qemu (TCG) with a
# hard timeout, 5. reports PASS/FAIL/SKIP per case, and for each failure the guest console's
# section of that case (the whole console when the VM did not finish).
#
# Environment: IBNET_RXE_CACHE (image + logs, default ~/.cache/ibnet-rxe-vm), IBNET_RXE_TIMEOUT
# (whole VM run, s, default 1200), IBNET_RXE_CASE_TIMEOUT (default per-case timeout, s, 120),
# IBNET_RXE_ONLY (case regex), IBNET_RXE_BUILD=0 (stage what target/ holds, build nothing),
# IBNET_RXE_PROFILE (cargo profile of the .so, default release; tools are debug), IBNET_RXE_TEST_PKGS
# (crates whose test executables are staged, default ibnet-ffi), IBNET_RXE_RUST_TESTS (regex on
# their test target names, default ^verbs),
# IBNET_RXE_EXTRA (more files for bin/), IBNET_RXE_CASES (another case list instead of cases.sh),
# IBNET_RXE_MEM / IBNET_RXE_SMP (2G / 2).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
CACHE=${IBNET_RXE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibnet-rxe-vm}
TIMEOUT=${IBNET_RXE_TIMEOUT:-1200}
trap 'echo "rxe: FAILED at vm-test.sh line $LINENO: $BASH_COMMAND" >&2' ERR
step() { printf '\n---- rxe: %s (%s)\n' "$*" "$(date +%T)"; }
t_start=$SECONDS

# shellcheck source-path=SCRIPTDIR source=common.sh
. "$here/common.sh"

step "host packages"
rxe_host_packages

step "VM image"
t0=$SECONDS
img=$("$here/image.sh")
t_image=$((SECONDS - t0))

step "stage the share"
t0=$SECONDS
mkdir -p "$CACHE"
share=$(mktemp -d "$CACHE/share.XXXXXX")
trap 'rm -rf "$share"' EXIT
install -m755 "$here/guest.sh" "$share/run.sh"
install -m644 "${IBNET_RXE_CASES:-$here/cases.sh}" "$share/cases.sh"
printf 'IBNET_RXE_ONLY=%q\nIBNET_RXE_CASE_TIMEOUT=%q\n' \
  "${IBNET_RXE_ONLY:-}" "${IBNET_RXE_CASE_TIMEOUT:-120}" >"$share/config"
rxe_stage "$share"
t_stage=$((SECONDS - t0))

step "boot + suite (qemu TCG, timeout ${TIMEOUT}s)"
t0=$SECONDS
log=$CACHE/console.log
# /dev/kvm may be absent or unusable (PVM hosts hang a stock kernel): TCG always works.
set +e
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
  -m "${IBNET_RXE_MEM:-2G}" -smp "${IBNET_RXE_SMP:-2}" -nographic -no-reboot -nic none \
  -kernel "$img/vmlinuz" -initrd "$img/initrd.img" \
  -append "console=ttyS0 root=/dev/vda ro init=/ibnet-init panic=-1 quiet loglevel=4 fsck.mode=skip" \
  -drive "file=$img/rootfs.img,format=raw,if=virtio,readonly=on" \
  -virtfs "local,path=$share,mount_tag=hostshare,security_model=none,readonly=on" \
  </dev/null 2>&1 | sed -u 's/\r$//' | tee "$log" | grep --line-buffered -aoE 'RXE-(CASE-END|GUEST).*'
qrc=${PIPESTATUS[0]}
set -e
t_vm=$((SECONDS - t0))

step "report"
summary=$(grep -a '^RXE-TEST-SUMMARY:' "$log" | tail -1 || true)
# Print the console section of every failed case (from its BEGIN marker to its END marker).
awk '/^RXE-CASE-END / && $3 == "FAIL" { print $2 }' "$log" | while read -r name; do
  echo "==== guest console, case $name:"
  awk -v n="$name" '$0 == "RXE-CASE-BEGIN " n { on = 1 } on { print } on && /^RXE-CASE-END / && $2 == n { on = 0 }' "$log"
done
if [ -z "$summary" ]; then
  open=$(awk '/^RXE-CASE-BEGIN / { c = $2 } /^RXE-CASE-END / { c = "" } END { print c }' "$log")
  echo "==== the VM did not finish (qemu rc=$qrc${open:+, case $open was running}); console tail:"
  tail -n 120 "$log"
fi
echo "timings: image ${t_image}s, stage ${t_stage}s, vm ${t_vm}s, total $((SECONDS - t_start))s (console: $log)"
echo "${summary:-RXE-TEST-SUMMARY: VM did not finish}"
if [ -z "$summary" ] || [[ $summary != *" 0 failed,"* ]]; then exit 1; fi
