#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
#
# run_sweep.sh <path-to-libnccl-net-ibnet.so> <outdir> [path-to-cuda_probe]
#
# On a machine with >= 2 GPUs and PyTorch, in one invocation (P2P and NVLS off throughout):
#   1. the optional hip-shim probe (cuda_probe);
#   2. nccl_sweep.py three times, all six ops, 8 B .. MAX_BYTES:
#        ibnet : NCCL_NET_PLUGIN=<abs .so> NCCL_NET=IBNet IBNET_PROVIDER=soft, SHM off
#        socket: NCCL_NET=Socket, no plugin, SHM off
#        shm   : no plugin, NCCL_NET unset, NCCL_SHM_DISABLE=0 (NCCL's shared-memory transport)
#   3. nccl_reload.py: two NCCL communicators created and destroyed in turn in one process,
#      counting NCCL's load/unload lines and the plugin's threads;
#   4. the ibnet variants (VARIANTS), smaller sizes, fewer iterations: correctness only;
#   5. compare.py: three busbw columns, the ratios, goals and verdicts.
#
# Files in <outdir> (7, within the device tool's 8):
#   compare.txt  summary.json  proof.log  driver.log  cuda_probe.log  reload.log  runs.tar.gz
# runs.tar.gz holds runs/<label>.log and runs/<label>.json of every sweep (PACK=0 keeps the
# folder runs/ instead).
#
# Time: every step has its own bound, and no step starts or runs past DEADLINE seconds after
# the start (minus RESERVE for compare and packing); a step with no time left is skipped and
# reported as missing. Knobs (environment), defaults in brackets:
#   NPROC [2]  MAX_BYTES [1073741824]  SWEEP_ARGS [] (extra nccl_sweep.py arguments)
#   RUN_TIMEOUT [150] (ibnet, socket)  SHM_TIMEOUT [90]  RELOAD_TIMEOUT [60]
#   VARIANT_TIMEOUT [45] (each)  DEADLINE [570]  RESERVE [15]  PACK [1]  RELOAD [1]
#   VARIANTS ["proto-ll:NCCL_PROTO=LL proto-ll128:NCCL_PROTO=LL128 proto-simple:NCCL_PROTO=SIMPLE
#             qps4-ch4:NCCL_IB_QPS_PER_CONNECTION=4,NCCL_NCHANNELS_PER_NET_PEER=4"]
#   VARIANT_MAX_BYTES [16777216]  VARIANT_ARGS [--warmup 1 --iters 4]
#   TORCHRUN [python3 -m torch.distributed.run]
# Exit status: compare.py's (0 = every run complete and correct with its transport proven,
# every variant correct, the reload check clean); 2 = bad arguments.
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 <path-to-libnccl-net-ibnet.so> <outdir> [path-to-cuda_probe]" >&2
  exit 2
fi
HERE="$(cd "$(dirname "$0")" && pwd)"
SO="$(readlink -f "$1")"
OUTDIR="$2"
PROBE="${3:-}"
if [ ! -f "$SO" ]; then
  echo "run_sweep: plugin not found: $1" >&2
  exit 2
fi
mkdir -p "$OUTDIR"
OUTDIR="$(readlink -f "$OUTDIR")"
RUNS="$OUTDIR/runs"
mkdir -p "$RUNS"

NPROC="${NPROC:-2}"
MAX_BYTES="${MAX_BYTES:-1073741824}"
RUN_TIMEOUT="${RUN_TIMEOUT:-150}"
SHM_TIMEOUT="${SHM_TIMEOUT:-90}"
RELOAD_TIMEOUT="${RELOAD_TIMEOUT:-60}"
VARIANT_TIMEOUT="${VARIANT_TIMEOUT:-45}"
DEADLINE="${DEADLINE:-570}"
RESERVE="${RESERVE:-15}"
PACK="${PACK:-1}"
RELOAD="${RELOAD:-1}"
VARIANTS="${VARIANTS-proto-ll:NCCL_PROTO=LL proto-ll128:NCCL_PROTO=LL128 proto-simple:NCCL_PROTO=SIMPLE qps4-ch4:NCCL_IB_QPS_PER_CONNECTION=4,NCCL_NCHANNELS_PER_NET_PEER=4}"
VARIANT_MAX_BYTES="${VARIANT_MAX_BYTES:-16777216}"
VARIANT_ARGS="${VARIANT_ARGS-"--warmup 1 --iters 4"}"
TORCHRUN="${TORCHRUN:-python3 -m torch.distributed.run}"
read -r -a EXTRA <<<"${SWEEP_ARGS:-}"
read -r -a VEXTRA <<<"$VARIANT_ARGS"

# Kept for every process this script starts (see the device README: never use NVLink multicast).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV
export PYTHONUNBUFFERED=1

# budget <wanted seconds>: what a step may use before DEADLINE (0 = no time left). The 10 s
# are timeout's grace between TERM and KILL.
budget() {
  local want="$1" left=$((DEADLINE - SECONDS - RESERVE - 10))
  [ "$left" -lt "$want" ] && want="$left"
  [ "$want" -lt 10 ] && want=0
  echo "$want"
}

# launch <log> <wanted seconds> [env args...] -- <program> [args...]: one torchrun job, its
# output in <log>, bounded by budget; appends "run_sweep: <label> exit status N after S s".
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
  # shellcheck disable=SC2086  # TORCHRUN is a command line on purpose
  env "${envs[@]}" timeout -k 10 "$t" $TORCHRUN --standalone --nproc_per_node="$NPROC" "$@" \
    >"$log" 2>&1
  rc=$?
  echo "run_sweep: $label exit status $rc after $((SECONDS - t0)) s" | tee -a "$log"
}

# sweep <label> <wanted seconds> <max bytes> [env args...] -- [nccl_sweep.py args...]
sweep() {
  local label="$1" want="$2" max="$3"
  shift 3
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  launch "$RUNS/$label.log" "$want" "${envs[@]}" -- "$HERE/nccl_sweep.py" --label "$label" \
    --max-bytes "$max" --json "$RUNS/$label.json" "$@"
}

step_machine() {
  echo "== machine"
  timeout 30 nvidia-smi -L 2>&1 | head -n 8
  timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())' 2>&1
  echo "plugin: $SO ($(stat -c %s "$SO") bytes)"
  echo "plan: deadline ${DEADLINE}s; ibnet, socket <= ${RUN_TIMEOUT}s each, shm <= ${SHM_TIMEOUT}s," \
    "reload <= ${RELOAD_TIMEOUT}s, variants <= ${VARIANT_TIMEOUT}s each: ${VARIANTS:-none}"
}

step_probe() {
  [ -n "$PROBE" ] || return 0
  echo "== cuda_probe ($PROBE)"
  IBNET_GPU=cuda timeout -k 5 30 "$PROBE" >"$OUTDIR/cuda_probe.log" 2>&1
  echo "cuda_probe exit status: $?" >>"$OUTDIR/cuda_probe.log"
  cat "$OUTDIR/cuda_probe.log"
}

step_main_sweeps() {
  local label
  sweep ibnet "$RUN_TIMEOUT" "$MAX_BYTES" NCCL_NET_PLUGIN="$SO" NCCL_NET=IBNet IBNET_PROVIDER=soft -- "${EXTRA[@]}"
  sweep socket "$RUN_TIMEOUT" "$MAX_BYTES" -u NCCL_NET_PLUGIN NCCL_NET=Socket -- "${EXTRA[@]}"
  sweep shm "$SHM_TIMEOUT" "$MAX_BYTES" -u NCCL_NET_PLUGIN -u NCCL_NET NCCL_SHM_DISABLE=0 -- "${EXTRA[@]}"
  for label in ibnet socket shm; do
    grep -E '^(#|  [a-z_]+ +[0-9])' "$RUNS/$label.log" | head -n 200
  done
}

# NCCL 2.28.9 forgets the plugin's name when it unloads it (NVIDIA/nccl#1978): a later
# communicator then looks for the default name, libnccl-net.so. A link of that name, found
# through LD_LIBRARY_PATH, lets the second load find ibnet again; a fixed NCCL loads it by the
# absolute path in NCCL_NET_PLUGIN. Either way both loads are of the same file.
step_reload() {
  [ "$RELOAD" = 1 ] || return 0
  local dir
  dir="$(mktemp -d)"
  ln -s "$SO" "$dir/libnccl-net.so"
  launch "$OUTDIR/reload.log" "$RELOAD_TIMEOUT" NCCL_NET_PLUGIN="$dir/libnccl-net.so" NCCL_NET=IBNet \
    IBNET_PROVIDER=soft LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    -- "$HERE/nccl_reload.py" --plugin "$dir/libnccl-net.so"
  grep -E 'RELOAD|Loaded net plugin|Unloading plugin|NCCL WARN' "$OUTDIR/reload.log" | head -n 40
  rm -rf "$dir"
}

# VARIANT_LIST gets "LABEL JSON LOG" triples for compare.py.
VARIANT_LIST=()
step_variants() {
  local spec label assigns envs
  for spec in $VARIANTS; do
    label="${spec%%:*}"
    assigns="${spec#*:}"
    IFS=',' read -r -a envs <<<"$assigns"
    sweep "$label" "$VARIANT_TIMEOUT" "$VARIANT_MAX_BYTES" NCCL_NET_PLUGIN="$SO" NCCL_NET=IBNet \
      IBNET_PROVIDER=soft "${envs[@]}" -- "${VEXTRA[@]}"
    grep -E '^# (env|total)' "$RUNS/$label.log"
    VARIANT_LIST+=(--variant "$label" "$RUNS/$label.json" "$RUNS/$label.log")
  done
}

step_proof() {
  local label
  {
    echo "== ibnet sweep"
    grep -m 40 -E 'Loaded net plugin|NET/IBNET|via NET/' "$RUNS/ibnet.log"
    for label in socket shm; do
      echo "== $label sweep"
      grep -m 6 -E 'via (NET|SHM|P2P)/|Using network' "$RUNS/$label.log"
    done
    echo "== reload"
    grep -E 'RELOAD|Loaded net plugin|Unloading plugin|NCCL WARN|exit status' "$OUTDIR/reload.log" | head -n 40
    for label in $VARIANTS; do
      label="${label%%:*}"
      echo "== variant $label"
      grep -m 8 -E 'set by environment to|Loaded net plugin|via NET/' "$RUNS/$label.log"
    done
  } >"$OUTDIR/proof.log" 2>/dev/null
}

step_compare() {
  echo "== compare (at ${SECONDS}s)"
  local reload_args=()
  [ "$RELOAD" = 1 ] && reload_args=(--reload-log "$OUTDIR/reload.log")
  python3 "$HERE/compare.py" \
    --ibnet "$RUNS/ibnet.json" --socket "$RUNS/socket.json" --shm "$RUNS/shm.json" \
    --ibnet-log "$RUNS/ibnet.log" --socket-log "$RUNS/socket.log" --shm-log "$RUNS/shm.log" \
    "${VARIANT_LIST[@]}" "${reload_args[@]}" \
    --summary "$OUTDIR/summary.json" >"$OUTDIR/compare.txt"
  local rc=$?
  cat "$OUTDIR/compare.txt"
  return "$rc"
}

step_pack() {
  [ "$PACK" = 1 ] || return 0
  tar -C "$OUTDIR" -czf "$OUTDIR/runs.tar.gz" runs && rm -rf "$RUNS"
  echo "run_sweep: done at ${SECONDS}s; files: $(cd "$OUTDIR" && ls | tr '\n' ' ')"
}

main() {
  local rc
  step_machine
  step_probe
  step_main_sweeps
  step_reload
  step_variants
  step_proof
  step_compare
  rc=$?
  step_pack
  return "$rc"
}

main 2>&1 | tee "$OUTDIR/driver.log"
exit "${PIPESTATUS[0]}"
