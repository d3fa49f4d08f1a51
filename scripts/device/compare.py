#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""busbw of three nccl_sweep.py runs side by side (ibnet, NCCL's Socket, NCCL's SHM), the
variant runs, the unload/reload check, the goals and the verdicts.

    compare.py --ibnet ibnet.json --socket socket.json [--shm shm.json] \
               [--ibnet-log L] [--socket-log L] [--shm-log L] \
               [--variant LABEL JSON LOG]... [--reload-log reload.log] [--summary summary.json]

Prints one row per (op, size): busbw of each run (GB/s), the ratios ibnet/Socket and
ibnet/SHM, #wrong of each; then the same at the key sizes (8 B, 64 KiB, 1 MiB, 64 MiB, 1 GiB).
Then the verdicts:
- each run complete with 0 wrong elements, and its NCCL log proves its transport
  ("via NET/IBNet", "via NET/Socket", "via SHM/") with no line of another transport
  ("via NET/<other>", "via SHM/", "via P2P/");
- each variant run (ibnet with NCCL_PROTO=..., more QPs, ...): the same;
- the reload check (nccl_reload.py's log): see nccl_reload.verdict.
And the goals (reported, not enforced): ibnet/Socket >= 1.0 at every size <= 64 KiB,
>= 3 at >= 64 MiB; ibnet/SHM >= 0.5 at >= 64 MiB; 0 wrong elements everywhere.

Exit status: 0 when every verdict holds (goals aside), 1 otherwise. Needs only the standard
library (runs anywhere; tested by test_compare.py on canned input).
"""

import argparse
import json
import re
import sys

import nccl_reload

OPS_ORDER = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv", "all_to_all"]
KEY_SIZES = [8, 64 << 10, 1 << 20, 64 << 20, 1 << 30]
EXPECT = {"ibnet": "NET/IBNet", "socket": "NET/Socket", "shm": "SHM/"}
VIA = re.compile(r"\bvia (NET/[A-Za-z0-9_]+|SHM/|P2P/)", re.IGNORECASE)
PLUGIN_LINE = re.compile(r"(Loaded net plugin|Using network|Assigned NET plugin)", re.IGNORECASE)


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


def read_text(path):
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def scan_log(path, expect):
    """(proof lines, plugin lines, other-transport lines) of an NCCL INFO log, where proof lines
    name the transport `expect` ("NET/IBNet", "SHM/", ...) and other lines any other one."""
    proof, plugin, other = [], [], []
    for line in read_text(path).splitlines():
        m = VIA.search(line)
        if m:
            (proof if m.group(1).lower() == expect.lower() else other).append(line)
        if PLUGIN_LINE.search(line):
            plugin.append(line)
    return proof, plugin, other


def index(doc):
    return {(r.get("op"), r.get("bytes")): r for r in doc["results"] if isinstance(r, dict)}


def busbw(r):
    bw = r.get("busbw") if r else None
    return bw if isinstance(bw, (int, float)) else None


def ratio(a, b):
    x, y = busbw(a), busbw(b)
    return x / y if x is not None and y else None


def fmt(x, width, prec):
    return f"{x:{width}.{prec}f}" if x is not None else f"{'-':>{width}}"


def fmt_wrong(r):
    return str(r.get("wrong", "?")) if r else "-"


def run_verdict(name, doc, log, expect):
    """(ok, text, wrong): complete, 0 wrong, proof lines of `expect` and none of another."""
    rows = [r for r in doc["results"] if isinstance(r, dict)]
    wrong = sum(int(r.get("wrong", 0) or 0) for r in rows)
    bad = [f"{r.get('op')}@{r.get('bytes')}" for r in rows if r.get("wrong")]
    proof, plugin, other = scan_log(log, expect)
    why = []
    if doc.get("error"):
        why.append(doc["error"])
    if not doc.get("complete"):
        why.append("sweep did not finish (timeout or crash?)")
    if wrong:
        why.append(f"{wrong} wrong element(s) in {', '.join(bad[:10])}")
    if not proof:
        why.append(f"no 'via {expect}' line in the log")
    if other:
        why.append(f"{len(other)} line(s) of another transport, e.g. {other[0].strip()}")
    ok = bool(rows) and not why
    text = f"{name}: {'OK' if ok else 'FAIL'} ({len(rows)} rows, {wrong} wrong, {len(proof)} 'via {expect}' lines)"
    if why:
        text += " - " + "; ".join(why)
    return ok, text, {"ok": ok, "rows": len(rows), "wrong": wrong, "proof_lines": len(proof),
                      "other_transport_lines": len(other), "plugin_lines": plugin[:4], "proof": proof[:4],
                      "why": why}


def table_rows(ib, so, sh):
    """One dict per (op, size) present in any run, in sweep order."""
    ia, sa, ha = index(ib), index(so), index(sh)
    keys = sorted(set(ia) | set(sa) | set(ha),
                  key=lambda k: (OPS_ORDER.index(k[0]) if k[0] in OPS_ORDER else 99, str(k[0]), k[1] or 0))
    rows = []
    for op, size in keys:
        a, b, c = ia.get((op, size)), sa.get((op, size)), ha.get((op, size))
        rows.append({"op": op, "bytes": size, "ibnet": busbw(a), "socket": busbw(b), "shm": busbw(c),
                     "ib_socket": ratio(a, b), "ib_shm": ratio(a, c),
                     "wrong": "/".join(fmt_wrong(r) for r in (a, b, c))})
    return rows


def print_table(rows, out, only_sizes=None):
    print(f"{'op':<15}{'bytes':>12}{'ibnet':>9}{'socket':>9}{'shm':>9}{'ib/sock':>9}{'ib/shm':>8}"
          f"{'wrong i/s/m':>13}", file=out)
    for r in rows:
        if only_sizes is not None and r["bytes"] not in only_sizes:
            continue
        print(f"{r['op']:<15}{r['bytes']:>12}{fmt(r['ibnet'], 9, 3)}{fmt(r['socket'], 9, 3)}"
              f"{fmt(r['shm'], 9, 3)}{fmt(r['ib_socket'], 9, 2)}{fmt(r['ib_shm'], 8, 2)}{r['wrong']:>13}",
              file=out)


def goal(rows, key, pick, target, text):
    """One goal over the rows `pick` selects: every ratio `key` >= target."""
    got = [(r[key], r["op"], r["bytes"]) for r in rows if pick(r) and r[key] is not None]
    misses = sorted(g for g in got if g[0] < target)
    res = {"goal": text, "target": target, "rows": len(got), "met_rows": len(got) - len(misses),
           "met": bool(got) and not misses,
           "min": min(got)[0] if got else None, "max": max(got)[0] if got else None,
           "misses": [f"{op}@{size}={v:.2f}" for v, op, size in misses]}
    return res


def goals(rows, args, runs_wrong):
    small = lambda r: r["bytes"] <= args.small_max_bytes  # noqa: E731
    large = lambda r: r["bytes"] >= args.large_min_bytes  # noqa: E731
    kib, mib = args.small_max_bytes / 1024, args.large_min_bytes / (1 << 20)
    out = [
        goal(rows, "ib_socket", small, args.small_goal, f"ibnet/Socket >= {args.small_goal:g} at every size <= {kib:g} KiB"),
        goal(rows, "ib_socket", large, args.socket_goal, f"ibnet/Socket >= {args.socket_goal:g} at >= {mib:g} MiB"),
        goal(rows, "ib_shm", large, args.shm_goal, f"ibnet/SHM >= {args.shm_goal:g} at >= {mib:g} MiB"),
    ]
    total = sum(runs_wrong.values())
    out.append({"goal": "0 wrong elements anywhere", "met": total == 0, "wrong": total,
                "runs": len(runs_wrong)})
    return out


def print_goal(g, out):
    if "target" not in g:
        state = "MET" if g["met"] else "NOT MET"
        print(f"goal {g['goal']}: {state} ({g['wrong']} wrong over {g['runs']} runs)", file=out)
        return
    if not g["rows"]:
        print(f"goal {g['goal']}: no comparable rows", file=out)
        return
    state = "MET" if g["met"] else "NOT MET"
    line = f"goal {g['goal']}: {state} at {g['met_rows']}/{g['rows']} (min {g['min']:.2f}, max {g['max']:.2f})"
    if g["misses"]:
        line += "; misses: " + ", ".join(g["misses"][:12]) + (" ..." if len(g["misses"]) > 12 else "")
    print(line, file=out)


def variant_report(label, json_path, log_path, out):
    """A variant run (ibnet with other settings): complete, 0 wrong, proven NET/IBNet."""
    doc = load_run(json_path)
    ok, text, info = run_verdict(f"variant {label}", doc, log_path, EXPECT["ibnet"])
    env = doc.get("env", {})
    knobs = {k: v for k, v in env.items() if k in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_IB_QPS_PER_CONNECTION",
                                                    "NCCL_NCHANNELS_PER_NET_PEER")}
    print(text, file=out)
    ar = {r.get("bytes"): busbw(r) for r in doc["results"] if isinstance(r, dict) and r.get("op") == "all_reduce"}
    shown = [f"{s}:{ar[s]:.3f}" for s in sorted(ar) if s in KEY_SIZES or s == max(ar)]
    print(f"    env {knobs or '(none recorded)'}; all_reduce busbw " + (" ".join(shown) or "-"), file=out)
    info.update({"label": label, "env": knobs, "wrong_total": info["wrong"]})
    return ok, info


def reload_report(path, out):
    parsed = nccl_reload.parse_log(read_text(path))
    ok, why = nccl_reload.verdict(parsed)
    rows = [parsed["rows"][k] for k in sorted(parsed["rows"])]
    cfg = parsed["config"] or {}
    print(f"reload: {'OK' if ok else 'FAIL'} ({cfg.get('cycles', '?')} cycle(s) x {cfg.get('ranks', '?')} rank(s); "
          f"{len(parsed['loaded'])} 'Loaded net plugin IBNet', {len(parsed['unloading'])} 'Unloading plugin', "
          f"{len(parsed['warn'])} NCCL WARN)" + (" - " + "; ".join(why) if why else ""), file=out)
    for r in rows:
        print(f"    rank {r.get('rank')} cycle {r.get('cycle')}: wrong {r.get('wrong')}, ibnet threads "
              f"before {r.get('before')} during {r.get('during')} after {r.get('after')} "
              f"(+grace {r.get('after_wait')}), image mapped after destroy: "
              f"{'yes' if r.get('mapped_after') else 'no'}", file=out)
    for line in (parsed["loaded"][:2] + parsed["unloading"][:2]):
        print(f"    {line.strip()}", file=out)
    wrong = sum(int(r.get("wrong", 0) or 0) for r in rows if isinstance(r.get("wrong"), int))
    return ok, {"ok": ok, "why": why, "rows": rows, "loaded": len(parsed["loaded"]),
                "unloading": len(parsed["unloading"]), "warn": len(parsed["warn"]), "wrong": wrong}


def header(docs, out):
    meta = next((d for d in docs if d.get("nccl_version")), {})
    print(f"busbw in GB/s, {meta.get('world_size', '?')} ranks, NCCL {meta.get('nccl_version', '?')}, "
          f"GPU {meta.get('gpu', '?')}; ibnet = NET/IBNet (soft provider), socket = NET/Socket, "
          f"shm = NCCL's SHM transport (P2P off in all three)", file=out)
    return meta


def compare(args, out):
    ib, so = load_run(args.ibnet), load_run(args.socket)
    sh = load_run(args.shm) if args.shm else {"results": []}
    meta = header([ib, so, sh], out)
    rows = table_rows(ib, so, sh)
    print_table(rows, out)
    print("\nkey sizes", file=out)
    print_table(rows, out, only_sizes=set(KEY_SIZES))
    print("", file=out)

    verdicts, wrong, runs = {}, {}, {}
    for name, doc, log, given in (("ibnet", ib, args.ibnet_log, True), ("socket", so, args.socket_log, True),
                                  ("shm", sh, args.shm_log, bool(args.shm))):
        if not given:
            print("correctness shm   : not run (no --shm)", file=out)
            continue
        ok, text, info = run_verdict(f"correctness {name:<6}", doc, log, EXPECT[name])
        print(text, file=out)
        for line in (info["proof"][:2] + info["plugin_lines"][:3]):
            print(f"    {line.strip()}", file=out)
        verdicts[name], wrong[name], runs[name] = ok, info["wrong"], info
    for label, jpath, lpath in args.variant or []:
        ok, info = variant_report(label, jpath, lpath, out)
        verdicts[f"variant {label}"], wrong[f"variant {label}"], runs[f"variant {label}"] = ok, info["wrong"], info
    if args.reload_log:
        ok, info = reload_report(args.reload_log, out)
        verdicts["reload"], wrong["reload"], runs["reload"] = ok, info["wrong"], info

    print("", file=out)
    gl = goals(rows, args, wrong)
    for g in gl:
        print_goal(g, out)
    passed = all(verdicts.values()) and "ibnet" in verdicts and "socket" in verdicts
    failed = [k for k, v in verdicts.items() if not v]
    print(f"VERDICT: {'PASS' if passed else 'FAIL'}" + (f" ({', '.join(failed)})" if failed else ""), file=out)
    summary = {"pass": passed, "verdicts": verdicts, "runs": runs, "goals": gl,
               "nccl_version": meta.get("nccl_version"), "table": rows}
    return passed, summary


def main(argv=None, out=sys.stdout):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ibnet", required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("--shm", help="NCCL's SHM-transport sweep (no plugin, P2P off)")
    p.add_argument("--ibnet-log")
    p.add_argument("--socket-log")
    p.add_argument("--shm-log")
    p.add_argument("--variant", nargs=3, action="append", metavar=("LABEL", "JSON", "LOG"),
                   help="an ibnet variant run (repeatable)")
    p.add_argument("--reload-log", help="nccl_reload.py's log")
    p.add_argument("--summary", help="write a JSON summary here")
    p.add_argument("--small-max-bytes", type=int, default=64 << 10)
    p.add_argument("--small-goal", type=float, default=1.0)
    p.add_argument("--large-min-bytes", type=int, default=64 << 20)
    p.add_argument("--socket-goal", type=float, default=3.0)
    p.add_argument("--shm-goal", type=float, default=0.5)
    args = p.parse_args(argv)
    passed, summary = compare(args, out)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
