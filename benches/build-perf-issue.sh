#!/usr/bin/env bash
# Builds (release) and copies into DIR every binary benches/run-perf-issue.sh needs, so that the
# run can happen on a machine without a Rust toolchain (same OS/libc as this one):
#   DIR/soft_vs_cma  DIR/proxy  DIR/comm_cycle  (bench executables, `cargo bench --no-run`)
#   DIR/ibnet-perf   DIR/libnccl-net-ibnet.so   DIR/run-perf-issue.sh   DIR/perf-issue-table.awk
# Usage: benches/build-perf-issue.sh DIR
# Then, on the 16-core host: DIR/run-perf-issue.sh OUTDIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p "$dir"
export CARGO_TERM_COLOR=never
# The bench executables: cargo prints their paths as JSON artifacts.
exes=$(cargo bench --no-run --message-format=json \
    -p ibnet-soft --bench soft_vs_cma -p ibnet-benches --bench proxy --bench comm_cycle \
  | python3 -c '
import json, sys
for l in sys.stdin:
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])')
while read -r name exe; do
  [ -n "$name" ] && cp -f "$exe" "$dir/$name"
done <<<"$exes"
cargo build --release -p ibnet-tools --bin ibnet-perf
cargo build --release -p ibnet-ffi
cp -f target/release/ibnet-perf "$dir/ibnet-perf"
cp -f target/release/libnccl_net_ibnet.so "$dir/libnccl-net-ibnet.so"
cp -f benches/run-perf-issue.sh benches/perf-issue-table.awk "$dir/"
# Debug info off the copies (timing does not need it): ~84 MB -> ~20 MB, under the device
# tool's 64 MiB carry limit.
for f in soft_vs_cma proxy comm_cycle ibnet-perf libnccl-net-ibnet.so; do
  strip --strip-debug "$dir/$f"
done
du -sh "$dir"
ls -l "$dir"
