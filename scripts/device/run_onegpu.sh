#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
#
# run_onegpu.sh <libnccl-net-ibnet.so> <outdir> [--nccl <libnccl.so.2>] [--probe <proxy_gpu_probe>]
#               [--perf <ibnet-perf>]
#
# ibnet inside NCCL on ONE GPU: two ranks share GPU 0, each with its own NCCL_HOSTID
# (<run>-rank<r>), so NCCL counts two nodes and sends every byte through its net transport.
# The ranks run under CUDA MPS so that their kernels run at the same time. One invocation,
# within DEADLINE seconds (470 by default, inside the device tool's 600):
#   1. the proxy engine's GPU probe (--probe), before MPS starts;
#   2. MPS: started (a stale daemon of an earlier run asked to quit first), checked with a
#      CUDA context; restarted once if the device is "busy or unavailable", else the run
#      goes on without MPS (logged); checked again (and restarted if refused) after any step
#      that failed; always stopped on exit (trap: also on failure, TERM or INT);
#   3. nccl_sweep.py, 8 B .. MAX_BYTES, all six ops, every element checked: ibnet
#      (IBNET_PROVIDER=soft) and NCCL's Socket; with --perf, ibnet alone (ibnet-perf --loopback
#      over the same plugin, no NCCL) at the sizes NCCL moves per step;
#   4. nccl_deadrank.py: rank 1 SIGKILLs itself mid-stream of 1 MiB all_reduces; rank 0's
#      error and its latency, ibnet and Socket;
#   5. two soft devices fused inside NCCL: NCCL's topology dump (IBNET_SOFT_DEVICES=2,
#      NCCL_TOPO_DUMP_FILE), topo_fuse.py moves soft0/soft1 under made-up PCI NICs, then a
#      sweep over NCCL_NET_FORCE_MERGE=soft0,soft1 with that NCCL_TOPO_FILE, and the same
#      with rail 1 failed mid-run (FAULTS);
#   6. nccl_reload.py: two communicators in turn in one process;
#   7. the variants (VARIANTS): NCCL_PROTO=LL, LL128, SIMPLE, 4 QPs per connection;
#   8. compare_onegpu.py: table, verdicts, goals.
# With --nccl, every rank runs with LD_PRELOAD=<that libnccl.so.2> (PyTorch then uses it; the
# version is proven from NCCL's "NCCL version X" line, not from torch).
#
# Files in <outdir> (5, 6 with --probe; within the device tool's 8):
#   compare.txt  summary.json  proof.log  driver.log  probe.log  runs.tar.gz
# runs.tar.gz holds runs/: each step's log and JSON, the topology dump and the fused file,
# and MPS's logs (PACK=0 keeps the folder instead).
#
# Knobs (environment), defaults in brackets:
#   MAX_BYTES [268435456]  RUN_TIMEOUT [100] (ibnet, socket each)  DEAD_TIMEOUT [45] (each)
#   TOPO_TIMEOUT [45]  FUSED_TIMEOUT [60]  FAULT_TIMEOUT [75]  FUSED_MAX_BYTES [16777216]
#   RELOAD_TIMEOUT [45]  VARIANT_TIMEOUT [35] (each)  VARIANT_MAX_BYTES [4194304]
#   VARIANT_ARGS [--warmup 1 --iters 4]  FUSED_ARGS [--warmup 1 --iters 4]  SWEEP_ARGS []
#   VARIANTS ["proto-ll:NCCL_PROTO=LL proto-ll128:NCCL_PROTO=LL128 proto-simple:NCCL_PROTO=SIMPLE
#             qps4-ch4:NCCL_IB_QPS_PER_CONNECTION=4,NCCL_NCHANNELS_PER_NET_PEER=4"]
#   FAULTS [seed=7,wr_fail=3000:RetryExceeded]  FAULTS_DEV [1]  STALL_WARN [15] (the failed-rail
#   run's IBNET_STALL_WARN: a hang names what it waits for before the step's timeout)
#   MPS [1]  DEAD [1]  FUSED [1]  RELOAD [1]  PACK [1]  DEADLINE [470]  RESERVE [15]
#   RUN_ID [onegpu-<nccl tag>-<pid>]  PYTHON [python3]  MPS_DIR [/tmp/ibnet-mps]
#   EXPECT_NCCL [the version in --nccl's file name]: the version every NCCL log must name
#   DRY_RUN [0]: 1 = no GPU: no nvidia-smi, no MPS; PYTHON may be a fake (the tests use it)
# Exit status: compare_onegpu.py's (0 = every verdict holds); 2 = bad arguments.
set -uo pipefail

usage() {
  echo "usage: $0 <libnccl-net-ibnet.so> <outdir> [--nccl <libnccl.so.2>] [--probe <proxy_gpu_probe>]" \
    "[--perf <ibnet-perf>]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
HERE="$(cd "$(dirname "$0")" && pwd)"
# abspath <path>: the absolute path, also of a path that does not exist (readlink -f gives none).
abspath() { readlink -f "$1" 2>/dev/null || echo "$1"; }
PLUGIN_ARG="$1"
SO="$(abspath "$1")"
OUTDIR="$2"
shift 2
NCCL_LIB=""
PROBE=""
PERF=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nccl) [ $# -ge 2 ] || usage; NCCL_LIB="$(abspath "$2")"; shift 2 ;;
    --probe) [ $# -ge 2 ] || usage; PROBE="$(abspath "$2")"; shift 2 ;;
    --perf) [ $# -ge 2 ] || usage; PERF="$(abspath "$2")"; shift 2 ;;
    *) usage ;;
  esac
done
if [ ! -f "$SO" ]; then
  echo "run_onegpu: plugin not found: $PLUGIN_ARG" >&2
  exit 2
fi
if [ -n "$NCCL_LIB" ] && [ ! -f "$NCCL_LIB" ]; then
  echo "run_onegpu: NCCL library not found: $NCCL_LIB" >&2
  exit 2
fi
for exe in "$PROBE" "$PERF"; do
  if [ -n "$exe" ] && [ ! -x "$exe" ]; then
    echo "run_onegpu: not found or not executable: $exe" >&2
    exit 2
  fi
done
mkdir -p "$OUTDIR"
OUTDIR="$(readlink -f "$OUTDIR")"
RUNS="$OUTDIR/runs"
mkdir -p "$RUNS"

MAX_BYTES="${MAX_BYTES:-268435456}"
RUN_TIMEOUT="${RUN_TIMEOUT:-100}"
DEAD_TIMEOUT="${DEAD_TIMEOUT:-45}"
TOPO_TIMEOUT="${TOPO_TIMEOUT:-45}"
FUSED_TIMEOUT="${FUSED_TIMEOUT:-60}"
FAULT_TIMEOUT="${FAULT_TIMEOUT:-75}"
FUSED_MAX_BYTES="${FUSED_MAX_BYTES:-16777216}"
RELOAD_TIMEOUT="${RELOAD_TIMEOUT:-45}"
VARIANT_TIMEOUT="${VARIANT_TIMEOUT:-35}"
VARIANT_MAX_BYTES="${VARIANT_MAX_BYTES:-4194304}"
VARIANT_ARGS="${VARIANT_ARGS-"--warmup 1 --iters 4"}"
FUSED_ARGS="${FUSED_ARGS-"--warmup 1 --iters 4"}"
VARIANTS="${VARIANTS-proto-ll:NCCL_PROTO=LL proto-ll128:NCCL_PROTO=LL128 proto-simple:NCCL_PROTO=SIMPLE qps4-ch4:NCCL_IB_QPS_PER_CONNECTION=4,NCCL_NCHANNELS_PER_NET_PEER=4}"
FAULTS="${FAULTS:-seed=7,wr_fail=3000:RetryExceeded}"
FAULTS_DEV="${FAULTS_DEV:-1}"
STALL_WARN="${STALL_WARN:-15}"
MPS="${MPS:-1}"
DEAD="${DEAD:-1}"
FUSED="${FUSED:-1}"
RELOAD="${RELOAD:-1}"
PACK="${PACK:-1}"
DEADLINE="${DEADLINE:-470}"
RESERVE="${RESERVE:-15}"
DRY_RUN="${DRY_RUN:-0}"
EXPECT_NCCL="${EXPECT_NCCL:-}"
PYTHON="${PYTHON:-python3}"
MPS_DIR="${MPS_DIR:-/tmp/ibnet-mps}"
NCCL_TAG="image"
[ -n "$NCCL_LIB" ] && NCCL_TAG="$(basename "$NCCL_LIB" | sed 's/^libnccl\.so\.//')"
RUN_ID="${RUN_ID:-onegpu-$NCCL_TAG-$$}"
read -r -a EXTRA <<<"${SWEEP_ARGS:-}"
read -r -a VEXTRA <<<"$VARIANT_ARGS"
read -r -a FEXTRA <<<"$FUSED_ARGS"

# Kept for every process this script starts (the device README: never use NVLink multicast).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV
export PYTHONUNBUFFERED=1
# Only the ranks get the NCCL library in front (onegpu_launch.py --preload), not the tools,
# the launcher or the MPS daemon.
GRAPH_LOG=("NCCL_DEBUG_SUBSYS=INIT,NET,ENV,GRAPH")

# ---------------------------------------------------------------- time
# budget <wanted seconds>: what a step may use before DEADLINE (0 = no time left). The 10 s
# are timeout's grace between TERM and KILL.
budget() {
  local want="$1" left=$((DEADLINE - SECONDS - RESERVE - 10))
  [ "$left" -lt "$want" ] && want="$left"
  [ "$want" -lt 10 ] && want=0
  echo "$want"
}

# ---------------------------------------------------------------- MPS
MPS_ON=0
export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"

# A CUDA context on GPU 0 through the driver API (about 1 s): 0 = fine, else the CUresult.
# Under MPS this is what fails with CUDA_ERROR_DEVICE_UNAVAILABLE (46, "busy or unavailable").
cuda_ctx_check() {
  [ "$DRY_RUN" = 1 ] && { echo "cuda check: skipped (dry run)"; return 0; }
  timeout -k 5 30 "$PYTHON" - <<'EOF'
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
for what, rc in (("cuInit", lambda: cu.cuInit(0)), ("cuDeviceGet", lambda: cu.cuDeviceGet(ctypes.byref(dev), 0)),
                 ("cuDevicePrimaryCtxRetain", lambda: cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))):
    r = rc()
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        print(f"cuda check: {what} failed: {r} {s.value.decode() if s.value else ''}")
        sys.exit(r)
cu.cuDevicePrimaryCtxRelease(dev)
print("cuda check: context on GPU 0 ok")
EOF
}

# Asks the control daemon of MPS_DIR (this run's, or one an earlier run left) to quit and waits
# up to 10 s; if it is still there then, kills it by the pid it wrote (a daemon this script
# started, in this run or an earlier one).
mps_alive() {
  local pidf="$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" pid
  pid="$(cat "$pidf" 2>/dev/null)"
  if [ -n "$pid" ]; then kill -0 "$pid" 2>/dev/null; else [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; fi
}
# mps_quit [force]: force (a daemon this run started) sends "quit" even when neither the pid
# file nor the control file is where this script expects them.
mps_quit() {
  mps_alive || [ "${1:-}" = force ] || return 0
  local pid
  pid="$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null)"
  echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
  for _ in $(seq 1 40); do
    mps_alive || break
    sleep 0.25
  done
  if ! mps_alive; then
    echo "mps: stopped (control daemon of $CUDA_MPS_PIPE_DIRECTORY)"
  elif [ -n "$pid" ]; then
    echo "mps: the control daemon did not quit within 10 s; killing its pid $pid"
    kill -KILL "$pid" 2>/dev/null
    rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  else
    echo "mps: the control daemon did not quit within 10 s (no pid file)"
  fi
}

mps_start() {
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! nvidia-cuda-mps-control -d; then
    echo "mps: nvidia-cuda-mps-control -d failed"
    return 1
  fi
  sleep 0.5
  cuda_ctx_check
}

# Starts MPS, checks a context, restarts it once if that fails; MPS_ON says whether it runs.
mps_up() {
  MPS_ON=0
  if [ "$MPS" != 1 ] || [ "$DRY_RUN" = 1 ]; then
    echo "mps: off (MPS=$MPS DRY_RUN=$DRY_RUN)"
    return 0
  fi
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "mps: nvidia-cuda-mps-control not found; running without MPS (time-sliced)"
    return 0
  fi
  mps_quit # a daemon an earlier run left behind
  if mps_start; then
    MPS_ON=1
    echo "mps: on (pipe $CUDA_MPS_PIPE_DIRECTORY)"
    return 0
  fi
  echo "mps: restarting"
  mps_quit force
  if mps_start; then
    MPS_ON=1
    echo "mps: on after a restart"
    return 0
  fi
  mps_quit force
  echo "mps: unusable; running without MPS (time-sliced)"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  cuda_ctx_check
}

# After a step that failed, ran into its timeout or lost a rank to a signal: MPS may refuse
# the next clients ("busy or unavailable"); check, restart.
mps_check() {
  [ "$MPS_ON" = 1 ] || return 0
  if ! cuda_ctx_check; then
    echo "mps: refused a context after a failed step; restarting"
    mps_quit force
    mps_up
  fi
}

cleanup() {
  local rc=$?
  [ -n "${CHILD:-}" ] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
  if [ "$MPS_ON" = 1 ]; then
    mps_quit force
    cp -r "$CUDA_MPS_LOG_DIRECTORY" "$RUNS/mps-log" 2>/dev/null
    MPS_ON=0
  fi
  return "$rc"
}

# ---------------------------------------------------------------- steps
# launch <log> <wanted seconds> [env args...] -- <program> [args...]: two ranks through
# onegpu_launch.py, output in <log>, bounded by budget; appends
# "run_sweep: <label> exit status N after S s" (the reload parser reads that line).
CHILD=""
launch() {
  local log="$1" want="$2" label t rc t0
  shift 2
  label="$(basename "$log" .log)"
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  t="$(budget "$want")"
  if [ "$t" -le 0 ]; then
    echo "run_sweep: $label skipped: out of time (deadline ${DEADLINE}s, at ${SECONDS}s)" | tee "$log"
    return
  fi
  echo "== $label (timeout ${t}s, at ${SECONDS}s)"
  t0=$SECONDS
  env "${envs[@]}" timeout -k 10 "$((t + 5))" "$PYTHON" "$HERE/onegpu_launch.py" --nproc 2 \
    --run-id "$RUN_ID-$label" --timeout-s "$t" --python "$PYTHON" --preload "$NCCL_LIB" -- "$@" >"$log" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=""
  echo "run_sweep: $label exit status $rc after $((SECONDS - t0)) s" | tee -a "$log"
  grep -h -m 1 '^LAUNCH ranks' "$log"
  # A step that timed out or whose rank was killed (the dead-rank check's rank 1 SIGKILLs
  # itself) can leave MPS refusing new clients: check a context, restart MPS if refused.
  [ "$rc" = 0 ] || mps_check
}

IBNET_ENV=(NCCL_NET_PLUGIN="$SO" NCCL_NET=IBNet IBNET_PROVIDER=soft)
SOCKET_ENV=(-u NCCL_NET_PLUGIN NCCL_NET=Socket)

# sweep <label> <wanted seconds> <max bytes> [env args...] -- [nccl_sweep.py args...]
sweep() {
  local label="$1" want="$2" max="$3"
  shift 3
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  launch "$RUNS/$label.log" "$want" "${envs[@]}" -- "$HERE/nccl_sweep.py" --label "$label" \
    --max-bytes "$max" --json "$RUNS/$label.json" "$@"
  grep -h -E '^# total' "$RUNS/$label.log"
}

step_machine() {
  echo "== machine (run $RUN_ID)"
  if [ "$DRY_RUN" = 1 ]; then
    echo "dry run: no GPU used"
  else
    timeout 30 nvidia-smi -L 2>&1 | head -n 4
    timeout 30 nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader 2>&1 | head -n 2
  fi
  echo "plugin: $SO ($(stat -c %s "$SO") bytes)"
  echo "nccl: ${NCCL_LIB:-as in the image, through PyTorch}"
  echo "plan: deadline ${DEADLINE}s; ibnet, socket <= ${RUN_TIMEOUT}s each (<= $MAX_BYTES B); dead rank" \
    "<= ${DEAD_TIMEOUT}s each; topo dump <= ${TOPO_TIMEOUT}s, fused <= ${FUSED_TIMEOUT}s, failed rail" \
    "<= ${FAULT_TIMEOUT}s (<= $FUSED_MAX_BYTES B); reload <= ${RELOAD_TIMEOUT}s; variants <= ${VARIANT_TIMEOUT}s" \
    "each (<= $VARIANT_MAX_BYTES B): ${VARIANTS:-none}"
}

step_probe() {
  [ -n "$PROBE" ] || return 0
  echo "== proxy_gpu_probe ($PROBE, at ${SECONDS}s)"
  IBNET_GPU=cuda timeout -k 5 60 "$PROBE" >"$OUTDIR/probe.log" 2>&1
  echo "proxy_gpu_probe exit status: $?" >>"$OUTDIR/probe.log"
  cat "$OUTDIR/probe.log"
}

step_main_sweeps() {
  sweep ibnet "$RUN_TIMEOUT" "$MAX_BYTES" "${IBNET_ENV[@]}" -- "${EXTRA[@]}"
  sweep socket "$RUN_TIMEOUT" "$MAX_BYTES" "${SOCKET_ENV[@]}" -- "${EXTRA[@]}"
}

# ibnet alone, same plugin, same machine, same run: ibnet-perf streaming through the plugin's
# C API between two processes (the soft provider, no NCCL, no GPU), at the sizes NCCL moves per
# step (its net step is 512 KiB with the default 4 MiB buffer).
step_perf() {
  [ -n "$PERF" ] || return 0
  local t
  t="$(budget 45)"
  if [ "$t" -le 0 ]; then
    echo "run_sweep: perf skipped: out of time" | tee "$RUNS/perf.log"
    return
  fi
  echo "== perf (timeout ${t}s, at ${SECONDS}s)"
  IBNET_PROVIDER=soft timeout -k 5 "$t" "$PERF" --plugin "$SO" --loopback --bw-only --min-bytes 64K \
    --max-bytes 4M --budget 512M --json >"$RUNS/perf.json" 2>"$RUNS/perf.log"
  echo "run_sweep: perf exit status $? (at ${SECONDS}s)" | tee -a "$RUNS/perf.log"
}

step_dead() {
  [ "$DEAD" = 1 ] || return 0
  local label envs
  for label in ibnet socket; do
    if [ "$label" = ibnet ]; then envs=("${IBNET_ENV[@]}"); else envs=("${SOCKET_ENV[@]}"); fi
    rm -f "$RUNS/dead-$label.kill"
    launch "$RUNS/dead-$label.log" "$DEAD_TIMEOUT" "${envs[@]}" TORCH_NCCL_BLOCKING_WAIT=1 \
      TORCH_NCCL_ASYNC_ERROR_HANDLING=2 -- "$HERE/nccl_deadrank.py" --label "$label" \
      --json "$RUNS/dead-$label.json" --kill-file "$RUNS/dead-$label.kill"
    grep -h -E '^DEADRANK' "$RUNS/dead-$label.log"
  done
}

# Two soft devices inside NCCL: the topology dump (with NCCL_NET_MERGE_LEVEL=LOC NCCL makes
# no vNIC of its own, so this short run also tells whether two unfused soft devices work),
# the fused topology file, the fused sweep and the failed-rail run.
step_fused() {
  [ "$FUSED" = 1 ] || return 0
  local dumpf="$RUNS/topo-dump.xml" topof="$RUNS/topo-fused.xml"
  local fused_env=("${IBNET_ENV[@]}" "${GRAPH_LOG[@]}" IBNET_SOFT_DEVICES=2 "NCCL_NET_FORCE_MERGE=soft0,soft1"
    NCCL_TOPO_FILE="$topof")
  rm -f "$dumpf"
  sweep topo-dump "$TOPO_TIMEOUT" 65536 "${IBNET_ENV[@]}" "${GRAPH_LOG[@]}" IBNET_SOFT_DEVICES=2 \
    NCCL_NET_MERGE_LEVEL=LOC NCCL_TOPO_DUMP_FILE="$dumpf" -- --ops all_reduce --warmup 0 --iters 1
  if ! "$PYTHON" "$HERE/topo_fuse.py" "$dumpf" "$topof" soft0 soft1 >>"$RUNS/topo-dump.log" 2>&1; then
    echo "run_onegpu: no fused topology file (see runs/topo-dump.log); fused runs skipped" |
      tee -a "$RUNS/topo-dump.log" "$RUNS/fused.log" "$RUNS/fused-fault.log"
    return 0
  fi
  grep -h '^topo_fuse' "$RUNS/topo-dump.log"
  sweep fused "$FUSED_TIMEOUT" "$FUSED_MAX_BYTES" "${fused_env[@]}" -- "${FEXTRA[@]}"
  sweep fused-fault "$FAULT_TIMEOUT" "$FUSED_MAX_BYTES" "${fused_env[@]}" IBNET_SOFT_FAULTS="$FAULTS" \
    IBNET_SOFT_FAULTS_DEV="$FAULTS_DEV" IBNET_STALL_WARN="$STALL_WARN" -- "${FEXTRA[@]}"
  grep -h -E 'rail [0-9]+ \(soft[0-9]+\)|has waited' "$RUNS/fused-fault.log" | head -n 6
}

# NCCL 2.28.9 forgets the plugin's name when it unloads it (NVIDIA/nccl#1978): a link named
# libnccl-net.so, found through LD_LIBRARY_PATH, lets the second load find ibnet again.
step_reload() {
  [ "$RELOAD" = 1 ] || return 0
  local dir
  dir="$(mktemp -d)"
  ln -s "$SO" "$dir/libnccl-net.so"
  launch "$RUNS/reload.log" "$RELOAD_TIMEOUT" NCCL_NET_PLUGIN="$dir/libnccl-net.so" NCCL_NET=IBNet \
    IBNET_PROVIDER=soft LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    -- "$HERE/nccl_reload.py" --plugin "$dir/libnccl-net.so"
  grep -h -E '^RELOAD rank=.*done' "$RUNS/reload.log"
  rm -rf "$dir"
}

VARIANT_LABELS=()
step_variants() {
  local spec label envs
  for spec in $VARIANTS; do
    label="${spec%%:*}"
    IFS=',' read -r -a envs <<<"${spec#*:}"
    sweep "$label" "$VARIANT_TIMEOUT" "$VARIANT_MAX_BYTES" "${IBNET_ENV[@]}" "${envs[@]}" -- "${VEXTRA[@]}"
    VARIANT_LABELS+=(--variant "$label")
  done
}

step_proof() {
  local f
  {
    for f in ibnet socket dead-ibnet dead-socket topo-dump fused fused-fault reload "${VARIANT_LABELS[@]}"; do
      [ "$f" = --variant ] && continue
      [ -f "$RUNS/$f.log" ] || continue
      echo "== $f"
      grep -h -m 3 -E 'NCCL version [0-9]' "$RUNS/$f.log"
      grep -h -m 2 -E 'Loaded net plugin|nNodes [0-9]' "$RUNS/$f.log"
      grep -h -m 4 -E 'via (NET|SHM|P2P)/' "$RUNS/$f.log"
      grep -h -m 6 -E 'set by environment to|made virtual device|NCCL WARN|DEADRANK|rail [0-9]+ \(|run_sweep: ' "$RUNS/$f.log"
    done
  } >"$OUTDIR/proof.log" 2>/dev/null
}

step_compare() {
  echo "== compare (at ${SECONDS}s)"
  local opt=() expect=()
  [ "$RELOAD" = 1 ] || opt+=(reload)
  [ "$DEAD" = 1 ] || opt+=(dead)
  [ "$FUSED" = 1 ] || opt+=(fused)
  [ -n "$PROBE" ] || opt+=(probe)
  [ -n "$PERF" ] || opt+=(perf)
  if [ -n "$EXPECT_NCCL" ]; then
    expect=(--expect-nccl "$EXPECT_NCCL")
  elif [ -n "$NCCL_LIB" ] && [[ "$NCCL_TAG" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    # libnccl.so.2.30.7 -> 2.30.7; a name without the version proves nothing, so no check.
    expect=(--expect-nccl "$NCCL_TAG")
  fi
  local probe=()
  [ -n "$PROBE" ] && probe=(--probe-log "$OUTDIR/probe.log")
  "$PYTHON" "$HERE/compare_onegpu.py" --runs "$RUNS" "${expect[@]}" "${VARIANT_LABELS[@]}" "${probe[@]}" \
    --optional "$(IFS=,; echo "${opt[*]}")" --summary "$OUTDIR/summary.json" >"$OUTDIR/compare.txt"
  local rc=$?
  { echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ) run: $RUN_ID nccl: ${NCCL_LIB:-image}"; cat "$OUTDIR/compare.txt"; } \
    >"$OUTDIR/compare.txt.new" && mv "$OUTDIR/compare.txt.new" "$OUTDIR/compare.txt"
  cat "$OUTDIR/compare.txt"
  return "$rc"
}

step_pack() {
  [ "$PACK" = 1 ] || return 0
  tar -C "$OUTDIR" -czf "$OUTDIR/runs.tar.gz" runs && rm -rf "$RUNS"
  echo "run_onegpu: done at ${SECONDS}s; files:" "$OUTDIR"/*
}

main() {
  local rc
  trap cleanup EXIT
  trap 'echo "run_onegpu: terminated at ${SECONDS}s"; exit 143' TERM INT
  step_machine
  step_probe
  echo "== mps (at ${SECONDS}s)"
  mps_up
  step_main_sweeps
  step_perf
  step_dead
  step_fused
  step_reload
  step_variants
  cleanup # MPS off before compare and packing (its logs go into runs/)
  step_proof
  step_compare
  rc=$?
  step_pack
  return "$rc"
}

# main runs in the background so that a TERM to this script reaches it at once (its trap stops
# the step in flight and MPS); tee copies its output to driver.log.
exec 3> >(tee "$OUTDIR/driver.log")
TEE=$!
main >&3 2>&1 &
MAIN=$!
trap 'kill -TERM "$MAIN" 2>/dev/null' TERM INT
while true; do
  wait "$MAIN"
  rc=$?
  kill -0 "$MAIN" 2>/dev/null || break
done
exec 3>&-
wait "$TEE" 2>/dev/null
exit "$rc"
