#!/usr/bin/env bash
# Instructions per hot-path operation, under callgrind (deterministic; see
# benches/benches/callgrind.rs for the cases). Usage:
#   benches/callgrind.sh [CALLGRIND_BENCH_EXE [PLUGIN_SO]]
# Without arguments it builds the bench (`cargo bench --no-run`) and the plugin (release).
# Prints one line per case: name, instructions per operation, operations counted.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 1; }
exe=${1:-}
plugin=${2:-}
if [ -z "$exe" ]; then
  cd "$root"
  exe=$(cargo bench --no-run --message-format=json -p ibnet-benches --bench callgrind \
    | python3 -c '
import json, sys
for l in sys.stdin:
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "callgrind":
        print(m["executable"])' | tail -1)
  cargo build --release -q -p ibnet-ffi
  plugin=$root/target/release/libnccl_net_ibnet.so
fi
[ -n "$plugin" ] && export IBNET_PLUGIN=$plugin
export IBNET_PROVIDER=${IBNET_PROVIDER:-soft}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-14s %12s %8s\n' case "instr/op" ops
for c in core_cycle mr_hit proxy_step bare_step plugin_cycle fused_cycle; do
  out=$tmp/cg.$c
  ops=$(valgrind --tool=callgrind --callgrind-out-file="$out" --collect-atstart=no \
      --toggle-collect="*cg_${c}*" "$exe" "$c" 2>"$tmp/log.$c" | awk '$1=="CGOPS"{print $3}') || true
  if [ -z "$ops" ]; then
    echo "$c: failed (valgrind log: $(tail -3 "$tmp/log.$c" | tr '\n' ' '))" >&2
    continue
  fi
  ir=$(awk '/^(summary|totals):/{print $2; exit}' "$out")
  printf '%-14s %12.1f %8d\n' "$c" "$(echo "$ir / $ops" | bc -l)" "$ops"
done
