#!/usr/bin/env bash
# SPDX-License-Identifier: MIT OR Apache-2.0
#
# prep_nccl_src.sh <nccl git dir> [tag] [dest]
#
# Here, before a device call: copies the files of NCCL's public source that build_nccl.sh
# needs (Makefile, makefiles/, src/, LICENSE.txt) at <tag> (default v2.30.7-1) from a git
# mirror (e.g. the `fetch` tool's /work/.mirror/NVIDIA+nccl/repo) into <dest> (default
# .nccl-src/ at the repository root), which it adds to .git/info/exclude so that the fetched
# source is never committed. It prints the copy's size: the device tool carries at most 64 MiB
# for the whole working tree (2.30.7's copy is about 6 MB).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 <nccl git dir> [tag (v2.30.7-1)] [dest (.nccl-src)]" >&2
  exit 2
fi
GITDIR="$1"
TAG="${2:-v2.30.7-1}"
ROOT="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
DEST="${3:-$ROOT/.nccl-src}"
git -C "$GITDIR" rev-parse --verify -q "$TAG^{commit}" >/dev/null || {
  echo "prep_nccl_src: no $TAG in $GITDIR" >&2
  exit 2
}
rm -rf "$DEST"
mkdir -p "$DEST"
git -C "$GITDIR" archive --format=tar "$TAG" Makefile makefiles src LICENSE.txt | tar -x -C "$DEST"
ex="$(git -C "$ROOT" rev-parse --git-path info/exclude)"
case "$DEST" in
  "$ROOT"/*)
    rel="/${DEST#"$ROOT"/}/"
    mkdir -p "$(dirname "$ex")"
    grep -qxF "$rel" "$ex" 2>/dev/null || echo "$rel" >>"$ex"
    ;;
esac
echo "prep_nccl_src: $TAG ($(git -C "$GITDIR" rev-parse "$TAG^{commit}")) in $DEST," \
  "$(du -sb "$DEST" | cut -f1) bytes; NCCL $(awk -F':= *' '/^NCCL_(MAJOR|MINOR|PATCH)/ {printf "%s%s", s, $2; s="."}' "$DEST/makefiles/version.mk")"
