#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Side-by-side busbw of two nccl_sweep.py runs (ibnet vs NCCL's Socket), plus verdicts.

    compare.py --ibnet ibnet.json --socket socket.json \
               [--ibnet-log ibnet.log] [--socket-log socket.log] [--summary summary.json] \
               [--goal-ratio 2] [--goal-min-bytes 67108864]

Prints one row per (op, size): busbw of each run (GB/s), ibnet/Socket ratio, #wrong of each.
Then the verdicts: correctness and completeness of each run, the NCCL log lines proving which
transport was used ("via NET/IBNet", "via NET/Socket"), and the goal ratio >= 2 at >= 64 MiB.

Exit status: 0 when both runs are complete with 0 wrong elements and each log proves its
transport; 1 otherwise. The performance goal is reported, not enforced. Needs only the
standard library (runs anywhere; tested by test_compare.py on canned input).
"""

import argparse
import json
import re
import sys

PROOF = {
    "ibnet": re.compile(r"via NET/IBNet\b", re.IGNORECASE),
    "socket": re.compile(r"via NET/Socket\b", re.IGNORECASE),
}
PLUGIN_LINE = re.compile(r"(Loaded net plugin|Using network|NET/Plugin|Assigned NET plugin)", re.IGNORECASE)
OTHER_NET = re.compile(r"via NET/(?!IBNet\b)([A-Za-z0-9_]+)", re.IGNORECASE)


def load_run(path):
    """The sweep JSON, or a stub that records why it could not be read."""
    if not path:
        return {"results": [], "complete": False, "ok": False, "error": "not given"}
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return {"results": [], "complete": False, "ok": False, "error": f"{path}: {e}"}
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        return {"results": [], "complete": False, "ok": False, "error": f"{path}: not a sweep result"}
    return doc


def scan_log(path, which):
    """(proof lines, plugin lines, other-transport lines) from an NCCL INFO log."""
    proof, plugin, other = [], [], []
    if not path:
        return proof, plugin, other
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if PROOF[which].search(line):
                    proof.append(line)
                elif which == "ibnet" and OTHER_NET.search(line):
                    other.append(line)
                if PLUGIN_LINE.search(line):
                    plugin.append(line)
    except OSError:
        pass
    return proof, plugin, other


def index(doc):
    return {(r.get("op"), r.get("bytes")): r for r in doc["results"] if isinstance(r, dict)}


def fmt_bw(r):
    return f"{r['busbw']:9.3f}" if r and isinstance(r.get("busbw"), (int, float)) else f"{'-':>9}"


def fmt_wrong(r):
    return str(r.get("wrong", "?")) if r else "-"


def run_verdict(name, doc):
    rows = [r for r in doc["results"] if isinstance(r, dict)]
    wrong = sum(int(r.get("wrong", 0) or 0) for r in rows)
    bad = [f"{r.get('op')}@{r.get('bytes')}" for r in rows if r.get("wrong")]
    ok = bool(rows) and wrong == 0 and bool(doc.get("complete"))
    why = []
    if doc.get("error"):
        why.append(doc["error"])
    if not doc.get("complete"):
        why.append("sweep did not finish (timeout or crash?)")
    if wrong:
        why.append(f"{wrong} wrong element(s) in {', '.join(bad[:10])}")
    text = f"{name}: {'OK' if ok else 'FAIL'} ({len(rows)} rows, {wrong} wrong)"
    if why:
        text += " - " + "; ".join(why)
    return ok, text, wrong


def compare(args, out):
    ib, so = load_run(args.ibnet), load_run(args.socket)
    ia, sa = index(ib), index(so)
    keys = sorted(set(ia) | set(sa), key=lambda k: (str(k[0]), k[1] or 0))
    ops_order = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv"]
    keys.sort(key=lambda k: (ops_order.index(k[0]) if k[0] in ops_order else 99, k[1] or 0))

    meta = ib if ib.get("nccl_version") else so
    print(
        f"busbw in GB/s, {meta.get('world_size', '?')} ranks, NCCL {meta.get('nccl_version', '?')}, "
        f"GPU {meta.get('gpu', '?')}; ibnet = NET/IBNet, socket = NET/Socket",
        file=out,
    )
    print(f"{'op':<15}{'bytes':>12}{'ibnet':>9}{'socket':>9}{'ratio':>8}{'wrong i/s':>11}", file=out)
    goal_rows, met, ratios = 0, 0, []
    table = []
    for op, size in keys:
        a, b = ia.get((op, size)), sa.get((op, size))
        ratio = None
        if a and b and b.get("busbw", 0) > 0 and isinstance(a.get("busbw"), (int, float)):
            ratio = a["busbw"] / b["busbw"]
        rs = f"{ratio:8.2f}" if ratio is not None else f"{'-':>8}"
        print(f"{op:<15}{size:>12}{fmt_bw(a)}{fmt_bw(b)}{rs}{fmt_wrong(a) + '/' + fmt_wrong(b):>11}", file=out)
        table.append({"op": op, "bytes": size, "ibnet_busbw": a and a.get("busbw"),
                      "socket_busbw": b and b.get("busbw"), "ratio": ratio,
                      "ibnet_wrong": a and a.get("wrong"), "socket_wrong": b and b.get("wrong")})
        if size >= args.goal_min_bytes and ratio is not None:
            goal_rows += 1
            ratios.append(ratio)
            met += ratio >= args.goal_ratio

    print("", file=out)
    ok_i, text_i, _ = run_verdict("correctness ibnet ", ib)
    ok_s, text_s, _ = run_verdict("correctness socket", so)
    print(text_i, file=out)
    print(text_s, file=out)

    proof_i, plugin_i, other_i = scan_log(args.ibnet_log, "ibnet")
    proof_s, _, _ = scan_log(args.socket_log, "socket")
    have_i, have_s = bool(proof_i), bool(proof_s)
    print(f"proof ibnet : {len(proof_i)} 'via NET/IBNet' line(s)" + ("" if have_i else " - MISSING"), file=out)
    for line in proof_i[:3]:
        print(f"    {line}", file=out)
    for line in plugin_i[:3]:
        print(f"    {line}", file=out)
    if other_i:
        print(f"    WARNING: {len(other_i)} line(s) show another NET transport, e.g. {other_i[0]}", file=out)
    print(f"proof socket: {len(proof_s)} 'via NET/Socket' line(s)" + ("" if have_s else " - MISSING"), file=out)
    for line in proof_s[:2]:
        print(f"    {line}", file=out)

    mb = args.goal_min_bytes / (1 << 20)
    if goal_rows:
        print(
            f"goal ibnet/Socket >= {args.goal_ratio:g} at >= {mb:g} MiB: met at {met}/{goal_rows} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})",
            file=out,
        )
    else:
        print(f"goal ibnet/Socket >= {args.goal_ratio:g} at >= {mb:g} MiB: no comparable rows", file=out)

    passed = ok_i and ok_s and have_i and have_s and not other_i
    print(f"VERDICT: {'PASS' if passed else 'FAIL'}", file=out)
    summary = {
        "pass": passed,
        "ibnet_ok": ok_i, "socket_ok": ok_s,
        "ibnet_proof_lines": len(proof_i), "socket_proof_lines": len(proof_s),
        "other_transport_lines": len(other_i),
        "goal": {"ratio": args.goal_ratio, "min_bytes": args.goal_min_bytes,
                 "rows": goal_rows, "met": met},
        "nccl_version": meta.get("nccl_version"),
        "table": table,
    }
    return passed, summary


def main(argv=None, out=sys.stdout):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ibnet", required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("--ibnet-log")
    p.add_argument("--socket-log")
    p.add_argument("--summary", help="write a JSON summary here")
    p.add_argument("--goal-ratio", type=float, default=2.0)
    p.add_argument("--goal-min-bytes", type=int, default=64 << 20)
    args = p.parse_args(argv)
    passed, summary = compare(args, out)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
