#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
#
# build_nccl.sh <nccl source dir> <out dir>
#
# Builds only NCCL's shared library, for sm_90 (H100/H200) only, from a public NCCL source
# tree (see prep_nccl_src.sh): about 4.5 minutes on the 16-core GPU host. The result is
# <out dir>/lib/libnccl.so.<X.Y.Z> (and its libnccl.so.2 link); the script prints its path on
# the last line as "build_nccl: built <path>". Use it in front of PyTorch's NCCL with
# run_onegpu.sh --nccl <path> (LD_PRELOAD of the ranks).
#
# Knobs: JOBS [nproc], NVCC_GENCODE [-gencode=arch=compute_90,code=sm_90], MAKE_TARGET
# [src.lib: the shared library and headers only; src.build adds the static library and
# tools], CUDA_HOME [from nvcc on PATH, else /usr/local/cuda].
# Exit status: make's; 2 = bad arguments or no nvcc.
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 <nccl source dir> <out dir>" >&2
  exit 2
fi
SRC="$(readlink -f "$1")"
OUT="$2"
if [ ! -f "$SRC/makefiles/version.mk" ] || [ ! -d "$SRC/src" ]; then
  echo "build_nccl: $1 is not an NCCL source tree (no makefiles/version.mk or src/)" >&2
  exit 2
fi
mkdir -p "$OUT"
OUT="$(readlink -f "$OUT")"
JOBS="${JOBS:-$(nproc)}"
NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}"
MAKE_TARGET="${MAKE_TARGET:-src.lib}"
if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null; then
    CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  else
    CUDA_HOME=/usr/local/cuda
  fi
fi
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "build_nccl: no nvcc at $CUDA_HOME/bin/nvcc (set CUDA_HOME)" >&2
  exit 2
fi
ver="$(awk -F':= *' '/^NCCL_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $2; sep="."}' "$SRC/makefiles/version.mk")"
echo "build_nccl: NCCL $ver from $SRC, $MAKE_TARGET, $NVCC_GENCODE, $JOBS jobs, CUDA_HOME=$CUDA_HOME, into $OUT"
# A copy of the tree may have lost the executable bits of the generator scripts make runs.
find "$SRC/src" -type f \( -name '*.py' -o -name '*.sh' \) -exec chmod +x {} +
t0=$SECONDS
make -C "$SRC" -j "$JOBS" "$MAKE_TARGET" BUILDDIR="$OUT" CUDA_HOME="$CUDA_HOME" NVCC_GENCODE="$NVCC_GENCODE"
rc=$?
lib="$OUT/lib/libnccl.so.$ver"
echo "build_nccl: make exit status $rc after $((SECONDS - t0)) s"
if [ "$rc" -eq 0 ] && [ -f "$lib" ]; then
  echo "build_nccl: built $lib ($(stat -c %s "$lib") bytes)"
elif [ "$rc" -eq 0 ]; then
  echo "build_nccl: make succeeded but $lib is missing" >&2
  rc=1
fi
exit "$rc"
