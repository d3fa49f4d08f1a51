#!/usr/bin/env python3
"""Finds import cycles between the source files of a crate.

Usage: scripts/import-graph.py CRATE_SRC_DIR...   (e.g. core/src soft/src)

Each `.rs` file is a node; an edge A -> B means that A names an item of B through a
`crate::…`, `super::…`, `self::…` or `child::…` path (in a `use` or inline), where B is the file that
defines the longest module prefix of that path. `mod x;` declarations are not edges. Paths
inside an inline `mod tests { … }` of a file are resolved from that inline module, so
`use super::*` there names the file itself (no edge). Prints every cycle (strongly connected
component of more than one file) and exits 1 if there is one.
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
REL = re.compile(r"(?<![\w:])(\w+)((?:::\w+)+)")
USE = re.compile(r"\buse\s+([^;]*);", re.S)
INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")


def modpath(src, f):
    rel = os.path.relpath(f, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main"):
        rel = rel[:-1]
    elif rel[-1] == "mod":
        rel = rel[:-1]
    return tuple(rel)


def expand(use):
    """Expands a use tree `a::{b, c::{d, e}}` into flat paths."""
    use = re.sub(r"\s+", "", use)
    out = []

    def rec(prefix, s):
        if not s:
            return
        if "{" not in s:
            for part in s.split(","):
                if part:
                    out.append(prefix + part)
            return
        i = s.index("{")
        head = s[:i]
        depth, j = 0, i
        for j in range(i, len(s)):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            if depth == 0:
                break
        inner = s[i + 1 : j]
        # split inner at top-level commas
        parts, d, cur = [], 0, ""
        for ch in inner:
            if ch == "," and d == 0:
                parts.append(cur)
                cur = ""
                continue
            d += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        parts.append(cur)
        for p in parts:
            rec(prefix + head, p)

    rec("", use)
    return [p.split(" as ")[0] for p in out]


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(l.split("//")[0] if "//" in l else l for l in text.splitlines())


def resolve(base, path):
    parts = path.split("::")
    cur = list(base)
    if parts[0] == "crate":
        cur = []
    elif parts[0] == "self":
        pass
    head = 0
    while head < len(parts) and parts[head] in ("super", "self", "crate"):
        if parts[head] == "super":
            cur = cur[:-1]
        head += 1
    return tuple(cur) + tuple(p for p in parts[head:] if p != "*")


def main(srcs):
    cycles = 0
    for src in srcs:
        files = {}
        for root, _, names in os.walk(src):
            for n in names:
                if n.endswith(".rs"):
                    f = os.path.join(root, n)
                    files[modpath(src, f)] = f
        edges = {f: set() for f in files.values()}
        for mp, f in files.items():
            text = strip_comments(open(f).read())
            # Inline modules: positions and their depth-relative module path.
            spans = []
            for m in INLINE_MOD.finditer(text):
                d, j = 0, m.end() - 1
                for j in range(m.end() - 1, len(text)):
                    d += {"{": 1, "}": -1}.get(text[j], 0)
                    if d == 0:
                        break
                spans.append((m.start(), j, m.group(1)))

            def base_at(pos):
                b = mp
                for s, e, name in spans:
                    if s <= pos <= e:
                        b = b + (name,)
                return b

            found = []
            for m in USE.finditer(text):
                for p in expand(m.group(1)):
                    if p.startswith(("crate::", "super::", "self::")):
                        found.append((m.start(), p))
            used = set()
            for m in USE.finditer(text):
                used.update(range(m.start(), m.end()))
            for m in PATH.finditer(text):
                if m.start() not in used:
                    found.append((m.start(), m.group(0)))
            # Paths relative to the current module (`child::Item`, `pub use child::X`).
            for m in REL.finditer(text):
                if m.group(1) in ("crate", "super", "self"):
                    continue
                b = base_at(m.start())
                if b + (m.group(1),) in files:
                    found.append((m.start(), "self::" + m.group(0)))
            for pos, p in found:
                target = resolve(base_at(pos), p)
                best = None
                for k in range(len(target), -1, -1):
                    if target[:k] in files:
                        best = files[target[:k]]
                        break
                if best and best != f:
                    edges[f].add(best)
        # Tarjan's SCC.
        index, low, stack, on, sccs = {}, {}, [], set(), []
        counter = [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(comp)

        sys.setrecursionlimit(10000)
        for v in sorted(edges):
            if v not in index:
                visit(v)
        for comp in sccs:
            cycles += 1
            comp = sorted(comp)
            print(f"cycle in {src}:")
            for a in comp:
                inside = sorted(b for b in edges[a] if b in comp)
                print(f"  {a} -> {', '.join(inside)}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["core/src"]))
