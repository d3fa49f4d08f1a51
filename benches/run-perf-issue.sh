#!/usr/bin/env bash
# Everything issue 15's table needs, in one run (about 6-8 minutes on 16 cores), from prebuilt
# release binaries (benches/build-perf-issue.sh DIR puts them, and this script, into DIR).
# Usage: run-perf-issue.sh OUTDIR [BINDIR]   (BINDIR: default the directory of this script)
# Writes to OUTDIR (5 files):
#   soft_vs_cma.txt   provider latency/bandwidth vs raw process_vm_writev, comms section
#   proxy.txt         proxy engine vs bare comms (summary lines; criterion skipped)
#   comm_cycle.txt    criterion: irecv+isend+test cycle over the loopback double
#   ibnet-perf.txt    plugin sweep 8 B .. 64 MiB over soft between two processes (p50/p99, BW)
#   summary.txt       host facts and the table's figures, extracted from the files above
# soft_vs_cma and the proxy summary run REPS times (default 3; all runs in the files and the
# summary: take medians). Set QUICK=1 for a short smoke run (fewer iterations; noisier).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [BINDIR]" >&2; exit 2; }
out=$1
bin=${2:-$(cd "$(dirname "$0")" && pwd)}
mkdir -p "$out"
quick=()
[ "${QUICK:-0}" = 1 ] && quick=(--quick)
t0=$(date +%s)
log() { printf '[%4ds] %s\n' $(( $(date +%s) - t0 )) "$*" >&2; }

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
{
  echo "host: $(nproc) cores, $(uname -r), $(date -u +%FT%TZ); binaries: $bin"
  grep -m1 -o 'model name.*' /proc/cpuinfo || true
  echo
  echo "== provider 8 B one-way vs one raw process_vm_writev (goal ratio <= 1.5)"
  grep -E 'raw process_vm_writev, one call|soft WRITE_WITH_IMM one-way \(RTT/2\) +[0-9.]+ us +ratio' "$out/soft_vs_cma.txt"
  echo "== comm 8 B one-way vs one raw call (goal <= 2)"
  grep -E '8 B one-way' "$out/soft_vs_cma.txt"
  echo "== comm bandwidth / raw CMA (goal >= 0.9 at >= 4 KiB; >= 1.5 at >= 1 MiB)"
  sed -n '/ibnet comms/,/in-process/p' "$out/soft_vs_cma.txt" | grep -E 'KiB|MiB|^#### run'
  echo "== proxy engine / bare (goal >= 0.9 at 8 B, overhead <= 30 ns)"
  grep 'proxy summary' "$out/proxy.txt"
  echo "== ibnet-perf p50/p99 latency (goal: <= 1.5 x (raw CMA time of the size + one 8 B call), no cliff)"
  grep -E '^│ [0-9]' "$out/ibnet-perf.txt" | awk -F'│' '{print $2}' | awk '{printf "  %-8s p50 %10s  p99 %10s  BW %8s\n", $1, $2, $3, $4}'
  echo "== raw CMA bandwidth per size (for the latency goal: raw time = size / BW)"
  sed -n '/^bandwidth/,/^$/p' "$out/soft_vs_cma.txt" | grep -E 'KiB|MiB'
} >"$out/summary.txt" 2>&1
log "done: $out"
