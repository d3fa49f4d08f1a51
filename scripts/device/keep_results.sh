#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
#
# keep_results.sh <folder the device call's files came back in> <label, e.g. h200x1-nccl2.28.9>
#
# Copies a run_onegpu.sh run's compare.txt, summary.json and proof.log into results/ as
# <date>-<label>-compare.txt, -summary.json, -proof.log, the date being the run's (the
# "date:" line run_onegpu.sh puts first in compare.txt), and prints the paths. The raw logs
# (runs.tar.gz, driver.log) are not kept in the repository.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 <files folder> <label>" >&2
  exit 2
fi
SRC="$1"
LABEL="$2"
DEST="$(cd "$(dirname "$0")" && pwd)/results"
[ -f "$SRC/compare.txt" ] || { echo "keep_results: no compare.txt in $SRC" >&2; exit 2; }
day="$(sed -n '1s/^date: \([0-9-]*\)T.*/\1/p' "$SRC/compare.txt")"
[ -n "$day" ] || day="$(date -u +%Y-%m-%d)"
for f in compare.txt summary.json proof.log; do
  [ -f "$SRC/$f" ] || continue
  cp "$SRC/$f" "$DEST/$day-$LABEL-$f"
  echo "$DEST/$day-$LABEL-$f"
done
