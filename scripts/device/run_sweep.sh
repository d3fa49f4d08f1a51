#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
#
# run_sweep.sh <path-to-libnccl-net-ibnet.so> <outdir> [path-to-cuda_probe]
#
# On a machine with >= 2 GPUs and PyTorch: runs nccl_sweep.py twice in one invocation,
#   (a) through ibnet:  NCCL_NET_PLUGIN=<abs .so> NCCL_NET=IBNet IBNET_PROVIDER=soft
#   (b) through NCCL's built-in Socket transport: NCCL_NET=Socket, no plugin,
# both with P2P/SHM/NVLS off so every byte between the two GPUs crosses the net plugin.
# Then compare.py prints busbw side by side, the ibnet/Socket ratio and all verdicts.
# If a cuda_probe binary (hip-shim example) is given, it runs first.
#
# Files written to <outdir> (8 at most, so a device run can bring them all back):
#   cuda_probe.log  ibnet.log  ibnet.json  socket.log  socket.json  compare.txt  summary.json
#
# Knobs (environment): NPROC (2), MAX_BYTES (1073741824), RUN_TIMEOUT seconds per sweep (200),
# SWEEP_ARGS (extra nccl_sweep.py arguments), TORCHRUN (python3 -m torch.distributed.run).
# Exit status: compare.py's (0 = both sweeps correct and the logs prove NET/IBNet and NET/Socket).
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 <path-to-libnccl-net-ibnet.so> <outdir> [path-to-cuda_probe]" >&2
  exit 2
fi
HERE="$(cd "$(dirname "$0")" && pwd)"
SO="$(readlink -f "$1")"
OUTDIR="$2"
PROBE="${3:-}"
mkdir -p "$OUTDIR"
OUTDIR="$(readlink -f "$OUTDIR")"
if [ ! -f "$SO" ]; then
  echo "run_sweep: plugin not found: $1" >&2
  exit 2
fi

NPROC="${NPROC:-2}"
MAX_BYTES="${MAX_BYTES:-1073741824}"
RUN_TIMEOUT="${RUN_TIMEOUT:-200}"
TORCHRUN="${TORCHRUN:-python3 -m torch.distributed.run}"
read -r -a EXTRA <<<"${SWEEP_ARGS:-}"

# Kept for every process this script starts (see the device README: never use NVLink multicast).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
export PYTHONUNBUFFERED=1

echo "== machine"
nvidia-smi -L 2>&1 | head -n 8
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())' 2>&1
echo "plugin: $SO ($(stat -c %s "$SO") bytes)"

if [ -n "$PROBE" ]; then
  echo "== cuda_probe ($PROBE)"
  IBNET_GPU=cuda timeout -k 5 60 "$PROBE" >"$OUTDIR/cuda_probe.log" 2>&1
  echo "cuda_probe exit status: $?" >>"$OUTDIR/cuda_probe.log"
  cat "$OUTDIR/cuda_probe.log"
fi

# run_one <label> <env assignments...>: one torchrun sweep, bounded by RUN_TIMEOUT.
run_one() {
  local label="$1"; shift
  echo "== sweep $label (timeout ${RUN_TIMEOUT}s)"
  local t0=$SECONDS
  # shellcheck disable=SC2086  # TORCHRUN is a command line on purpose
  env "$@" timeout -k 10 "$RUN_TIMEOUT" $TORCHRUN --standalone --nproc_per_node="$NPROC" \
    "$HERE/nccl_sweep.py" --label "$label" --max-bytes "$MAX_BYTES" \
    --json "$OUTDIR/$label.json" "${EXTRA[@]}" >"$OUTDIR/$label.log" 2>&1
  local rc=$?
  echo "run_sweep: $label exit status $rc after $((SECONDS - t0)) s" | tee -a "$OUTDIR/$label.log"
  grep -E '^(#|  [a-z_]+ +[0-9])' "$OUTDIR/$label.log" | head -n 200
}

run_one ibnet NCCL_NET_PLUGIN="$SO" NCCL_NET=IBNet IBNET_PROVIDER=soft
run_one socket -u NCCL_NET_PLUGIN NCCL_NET=Socket

echo "== proof lines"
grep -m 5 -iE 'via NET/IBNet' "$OUTDIR/ibnet.log" || echo "(no 'via NET/IBNet' line in ibnet.log)"
grep -m 5 -iE 'via NET/Socket' "$OUTDIR/socket.log" || echo "(no 'via NET/Socket' line in socket.log)"

echo "== compare"
python3 "$HERE/compare.py" \
  --ibnet "$OUTDIR/ibnet.json" --socket "$OUTDIR/socket.json" \
  --ibnet-log "$OUTDIR/ibnet.log" --socket-log "$OUTDIR/socket.log" \
  --summary "$OUTDIR/summary.json" | tee "$OUTDIR/compare.txt"
exit "${PIPESTATUS[0]}"
