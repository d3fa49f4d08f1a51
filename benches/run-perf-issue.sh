#!/usr/bin/env bash
# Everything issue 15's table needs, in one run (about 6-8 minutes on 16 cores), from prebuilt
# release binaries (benches/build-perf-issue.sh DIR puts them, this script and
# perf-issue-table.awk into DIR).
# Usage: run-perf-issue.sh OUTDIR [BINDIR]   (BINDIR: default the directory of this script)
#        run-perf-issue.sh --summary OUTDIR  (only recompute OUTDIR/summary.txt from its files)
# Writes to OUTDIR (5 files):
#   soft_vs_cma.txt   provider latency (8 B, and per size 8 B..64 MiB beside one raw call of the size)/bandwidth vs raw process_vm_writev, comms section
#   proxy.txt         proxy engine vs bare comms (summary lines; criterion skipped)
#   comm_cycle.txt    criterion: irecv+isend+test cycle over the loopback double
#   ibnet-perf.txt    plugin sweep 8 B .. 64 MiB over soft between two processes (p50/p99, BW)
#   summary.txt       host facts, then issue 15's table: every figure as the ratio its goal is
#                     stated in (median over the runs, each run, goal, met / NOT MET; the latency
#                     rows against 1.5 x (raw CMA time of the size: one raw call of it where
#                     soft_vs_cma measured one, else size / raw bandwidth; + one raw 8 B call), and size-to-size
#                     steps for cliffs), computed by perf-issue-table.awk; then the raw lines
# soft_vs_cma and the proxy summary run REPS times (default 3). Set QUICK=1 for a short smoke
# run (fewer iterations; noisier).
set -uo pipefail
usage="usage: $0 OUTDIR [BINDIR] | $0 --summary OUTDIR"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
only_summary=0
if [ "$1" = --summary ]; then
  only_summary=1
  shift
  [ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
fi
out=$1
bin=${2:-$here}
mkdir -p "$out"
quick=()
[ "${QUICK:-0}" = 1 ] && quick=(--quick)
t0=$(date +%s)
log() { printf '[%4ds] %s\n' $(( $(date +%s) - t0 )) "$*" >&2; }

summary() {
  echo "host: $(nproc) cores, $(uname -r), $(date -u +%FT%TZ); binaries: $bin"
  grep -m1 -o 'model name.*' /proc/cpuinfo || true
  grep -m1 -E '^ibnet-soft vs raw' "$out/soft_vs_cma.txt" || true
  echo
  awk -f "$here/perf-issue-table.awk" "$out/soft_vs_cma.txt" "$out/proxy.txt" "$out/ibnet-perf.txt"
  echo
  echo "==== raw lines the table is computed from"
  echo "== provider 8 B one-way vs one raw process_vm_writev"
  grep -E 'raw process_vm_writev, one call|soft WRITE_WITH_IMM one-way \(RTT/2\) +[0-9.]+ us +ratio' "$out/soft_vs_cma.txt"
  echo "== comm 8 B one-way vs one raw call"
  grep -E '8 B one-way' "$out/soft_vs_cma.txt"
  echo "== comm bandwidth / raw CMA"
  sed -n '/ibnet comms/,/in-process/p' "$out/soft_vs_cma.txt" | grep -E 'KiB|MiB|^#### run'
  echo "== proxy engine / bare"
  grep 'proxy summary' "$out/proxy.txt"
  echo "== provider one-way latency per size (ping-pong, idle QP; p50; post_send = the posting thread's share)"
  sed -n '/^provider one-way latency per size/,/^$/p' "$out/soft_vs_cma.txt" | grep -E 'KiB|MiB|^#### run'
  echo "== raw CMA bandwidth per size (raw time = size / BW)"
  sed -n '/^bandwidth/,/^$/p' "$out/soft_vs_cma.txt" | grep -E 'KiB|MiB'
  grep -E 'FAILED' "$out"/*.txt
}

if [ "$only_summary" = 1 ]; then
  summary >"$out/summary.txt" 2>&1
  cat "$out/summary.txt"
  exit 0
fi

reps=${REPS:-3}
: >"$out/soft_vs_cma.txt"
: >"$out/proxy.txt"
for r in $(seq "$reps"); do
  log "soft_vs_cma (run $r of $reps)"
  echo "#### run $r" >>"$out/soft_vs_cma.txt"
  timeout 300 "$bin/soft_vs_cma" "${quick[@]}" >>"$out/soft_vs_cma.txt" 2>&1 || echo "FAILED rc=$?" >>"$out/soft_vs_cma.txt"
  log "proxy summary (run $r of $reps)"
  echo "#### run $r" >>"$out/proxy.txt"
  IBNET_PROXY_CRITERION=0 timeout 200 "$bin/proxy" --bench --warm-up-time 1 --measurement-time 1 >>"$out/proxy.txt" 2>&1 || echo "FAILED rc=$?" >>"$out/proxy.txt"
done

log "comm_cycle"
timeout 100 "$bin/comm_cycle" --bench --warm-up-time 1 --measurement-time 3 >"$out/comm_cycle.txt" 2>&1 || echo "FAILED rc=$?" >>"$out/comm_cycle.txt"

log "ibnet-perf"
n=1000
[ "${QUICK:-0}" = 1 ] && n=200
IBNET_PROVIDER=soft timeout 200 "$bin/ibnet-perf" --plugin "$bin/libnccl-net-ibnet.so" \
  --max-bytes 64M -n "$n" >"$out/ibnet-perf.txt" 2>&1 || echo "FAILED rc=$?" >>"$out/ibnet-perf.txt"

log "summary"
summary >"$out/summary.txt" 2>&1
log "done: $out (table: $out/summary.txt)"
