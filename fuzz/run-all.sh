#!/usr/bin/env bash
# Runs every fuzz target for SECONDS and prints, per target: executions, crashes (artifacts
# written) and corpus size. Exits non-zero when any target crashed.
#
#   fuzz/run-all.sh SECONDS [JOBS]
#
# JOBS: how many targets run at once (default 1; each target is one libFuzzer process, so use
# up to the number of targets on a machine with the cores for it).
#
# Environment:
#   FUZZ_BIN_DIR   directory of prebuilt target binaries (default: fuzz/target/<triple>/release).
#                  With prebuilt binaries neither cargo nor cargo-fuzz is needed.
#   FUZZ_BUILD     1: build first with `cargo fuzz build -O -a` (needs cargo-fuzz; on a stable
#                  toolchain RUSTC_BOOTSTRAP=1 is set for it); 0: never build; default: build
#                  only when a binary is missing from FUZZ_BIN_DIR.
#   FUZZ_TARGETS   space-separated subset of targets (default: all).
#   FUZZ_WORK      where corpus/ and artifacts/ go (default: fuzz/). New inputs libFuzzer finds
#                  are written to corpus/<target>/; the committed seeds/<target>/ are read only.
#   FUZZ_ARGS      extra libFuzzer flags for every target (e.g. -rss_limit_mb=4096).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
secs="${1:?usage: fuzz/run-all.sh SECONDS [JOBS]}"
jobs="${2:-1}"
targets=(${FUZZ_TARGETS:-handshake fifo env connect_handle soft_access})
triple="$(uname -m)-unknown-linux-gnu"
bin_dir="${FUZZ_BIN_DIR:-$here/target/$triple/release}"
work="${FUZZ_WORK:-$here}"

missing=0
for t in "${targets[@]}"; do [ -x "$bin_dir/$t" ] || missing=1; done
if [ "${FUZZ_BUILD:-}" = 1 ] || { [ "${FUZZ_BUILD:-}" != 0 ] && [ "$missing" = 1 ]; }; then
  (cd "$here" && RUSTC_BOOTSTRAP=1 cargo fuzz build -O -a)
fi
for t in "${targets[@]}"; do
  [ -x "$bin_dir/$t" ] || { echo "no binary $bin_dir/$t (build with FUZZ_BUILD=1)" >&2; exit 2; }
done

logs="$work/artifacts/logs"
mkdir -p "$logs"

# One target: libFuzzer on corpus/<t> (written) and seeds/<t> (read), for $secs seconds.
run_one() {
  local t="$1"
  local corpus="$work/corpus/$t" art="$work/artifacts/$t/"
  mkdir -p "$corpus" "$art"
  local seeds=()
  [ -d "$here/seeds/$t" ] && seeds=("$here/seeds/$t")
  # -timeout: an input running 10 s is a hang (reported as a timeout artifact).
  # shellcheck disable=SC2086
  "$bin_dir/$t" -max_total_time="$secs" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$art" ${FUZZ_ARGS:-} "$corpus" "${seeds[@]}" >"$logs/$t.log" 2>&1 || true
}

start=$(date +%s)
stamp="$logs/.start"
touch "$stamp"
running=0
for t in "${targets[@]}"; do
  rm -f "$logs/$t.log"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
done
wait || true

printf '\n%-16s %14s %10s %8s %16s  %s\n' target execs exec/s crashes corpus "log"
fail=0
for t in "${targets[@]}"; do
  log="$logs/$t.log"
  execs=$(awk '/^stat::number_of_executed_units:/ {v = $2} END {print v}' "$log")
  rate=$(awk '/^stat::average_exec_per_sec:/ {v = $2} END {print v}' "$log")
  crashes=$(find "$work/artifacts/$t" -maxdepth 1 -type f -newer "$stamp" \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  files=$(find "$work/corpus/$t" -type f | wc -l)
  bytes=$(du -sk "$work/corpus/$t" | awk '{print $1}')
  # A run that ended in a crash or a deadly signal also counts when no artifact was written.
  if grep -q -E '^==[0-9]+== ERROR: (libFuzzer|AddressSanitizer)|^SUMMARY: ' "$log" && [ "$crashes" -eq 0 ]; then
    crashes=1
  fi
  [ "$crashes" -eq 0 ] || fail=1
  printf '%-16s %14s %10s %8s %10s files %sK  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$crashes" \
    "$files" "$bytes" "$log"
done
echo "(wall time $(( $(date +%s) - start )) s for ${#targets[@]} targets, ${secs} s each, ${jobs} at a time)"
if [ "$fail" != 0 ]; then
  echo "FUZZ: crashes found; inputs under $work/artifacts/<target>/, reproduce with" \
    "\`$bin_dir/<target> <input>\`, details in the logs" >&2
  for t in "${targets[@]}"; do
    grep -q -E 'panicked at|ERROR: ' "$logs/$t.log" && { echo "--- $t" >&2; grep -m3 -A3 -E 'panicked at|ERROR: ' "$logs/$t.log" >&2; }
  done
  exit 1
fi
