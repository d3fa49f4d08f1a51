#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""The table, verdicts and goals of one run_onegpu.sh run (two ranks on one GPU, each its own
NCCL host), or of several such runs side by side (one per NCCL version).

    compare_onegpu.py --runs RUNS_DIR [--expect-nccl 2.30.7] [--variant LABEL]... \
        [--probe-log proxy_gpu_probe.log] [--optional fused,dead,reload,probe] [--summary S.json]
    compare_onegpu.py --merge A/summary.json B/summary.json ...

RUNS_DIR holds what run_onegpu.sh leaves in runs/: ibnet.{json,log}, socket.{json,log},
reload.log, dead-ibnet.{json,log}, dead-socket.{json,log}, fused.{json,log},
fused-fault.{json,log} and <variant>.{json,log}.

Prints busbw per (op, size) of ibnet (soft provider), NCCL's Socket, the fused soft0+soft1
device and the fused device with rail 1 failed mid-run, the ratio ibnet/Socket, #wrong of
each; then the verdicts, then the goals of issue 29:
- ibnet/Socket >= 2.5 for every op at >= 16 MiB, >= 1.0 at every size <= 64 KiB;
- 0 wrong elements in every run;
- dead rank: rank 0's NCCL call fails within 2 s of rank 1's SIGKILL and its error names
  the peer (ibnet; Socket beside it);
- fused rows: every row of the fused sweep and of the failed-rail run done, 0 wrong, every
  channel via NET/IBNet/<the fused device>, a WARN naming the failed rail;
- ibnet in NCCL against ibnet alone: all_reduce busbw at 64 MiB >= 0.8 x ibnet-perf's
  bandwidth (runs/perf.json) at the size NCCL moves per net step (512 KiB).

Verdicts (exit status 0 only when all hold, goals aside): each sweep complete with 0 wrong,
every channel via its transport, "nNodes 2" on every communicator, the expected NCCL version
in its log; each variant likewise; the reload check; each dead-rank run ended in an error (not
a hang); the fused sweep and the failed-rail run complete with 0 wrong; ibnet-perf gave a
result; the proxy GPU probe PASS. Anything listed in --optional that did not run is reported and not held against it.
--merge prints each summary's key rows and verdict side by side, and PASS only when every
one passed ("both versions green"). Standard library only.
"""

import argparse
import io
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare  # noqa: E402
import nccl_reload  # noqa: E402

NNODES = re.compile(r"\bnRanks (\d+) nNodes (\d+)\b")
VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")
PLUGIN = re.compile(r"Loaded net plugin (\S+) \((v\d+)\)")
VIA_DEV = re.compile(r"\bvia (NET/[A-Za-z0-9_]+(?:/\d+)?)")
WARN = re.compile(r"NCCL WARN\b|\bWARN\b")
RAIL_WARN = re.compile(r"\brail (\d+) \((\w+)\)")
STALL = re.compile(r"has waited \d+s for")
PEER = [
    ("address", re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?:<\d+>|:\d+)")),
    ("address", re.compile(r"\[[0-9a-fA-F:]+\](?:<\d+>|:\d+)")),
    ("rank", re.compile(r"\b(?:rank|peer) 1\b")),
]
SMALL, LARGE = 64 << 10, 16 << 20
STEPS = ("ibnet", "socket", "reload", "dead", "fused", "probe", "perf")


def log_facts(path):
    """What an NCCL INFO log proves: nNodes values, NCCL versions, plugin lines, via targets."""
    text = compare.read_text(path)
    return {
        "nnodes": [(int(a), int(b)) for a, b in NNODES.findall(text)],
        "versions": sorted(set(VERSION.findall(text))),
        "plugins": sorted(set(f"{n} ({v})" for n, v in PLUGIN.findall(text))),
        "via": VIA_DEV.findall(text),
        "warn": [ln.strip() for ln in text.splitlines() if WARN.search(ln)],
        "text": text,
    }


def proof_problems(facts, expect_nccl, via_exact=None):
    """Why a run's log does not prove a two-node run of the expected NCCL (empty: it does)."""
    why = []
    if not facts["nnodes"]:
        why.append("no 'nRanks N nNodes M' line")
    elif any(nr != nn for nr, nn in facts["nnodes"]):
        why.append(f"nNodes != nRanks: {sorted(set(facts['nnodes']))} (not one rank per node)")
    if expect_nccl and facts["versions"] != [expect_nccl]:
        why.append(f"NCCL version {','.join(facts['versions']) or 'not logged'}, want {expect_nccl}")
    if via_exact is not None:
        off = sorted(set(v for v in facts["via"] if v != via_exact))
        if off:
            why.append(f"channels via {', '.join(off)} (want only {via_exact})")
    return why


def sweep_verdict(name, runs, label, expect, expect_nccl, via_exact=None):
    """(ok, text, info) of one nccl_sweep run: compare.run_verdict plus the one-GPU proofs."""
    jpath, lpath = os.path.join(runs, f"{label}.json"), os.path.join(runs, f"{label}.log")
    doc = compare.load_run(jpath)
    ok, text, info = compare.run_verdict(name, doc, lpath, expect)
    facts = log_facts(lpath)
    more = proof_problems(facts, expect_nccl, via_exact)
    rows, planned = len(doc["results"]), doc.get("planned")
    info.update(planned=planned, versions=facts["versions"], plugins=facts["plugins"],
                nnodes=sorted(set(facts["nnodes"])), last_row=(doc["results"][-1] if doc["results"] else None))
    if more:
        ok = False
        info["why"] = info.get("why", []) + more
        text = text.replace(": OK (", ": FAIL (", 1) + (" - " if " - " not in text else "; ") + "; ".join(more)
    text += f" [{rows}/{planned if planned is not None else '?'} rows; NCCL {','.join(facts['versions']) or '?'}; " \
            f"{','.join(facts['plugins']) or 'no net plugin line'}; nNodes {sorted(set(n for _, n in facts['nnodes']))}]"
    info["ok"] = ok
    return ok, text, info, doc, facts


def dead_report(runs, label):
    """A dead-rank run: outcome, latency, the error text and whether it names the peer."""
    path = os.path.join(runs, f"dead-{label}.json")
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        doc = {"outcome": "missing", "error": f"no result: {e}"}
    if not isinstance(doc, dict) or "outcome" not in doc:
        doc = {"outcome": "missing", "error": f"{path}: not a dead-rank result"}
    facts = log_facts(os.path.join(runs, f"dead-{label}.log"))
    texts = [doc.get("error", "")] + facts["warn"]
    named = sorted(set(kind for kind, rx in PEER for t in texts if t and rx.search(t)))
    return {"label": label, "outcome": doc.get("outcome"), "elapsed_s": doc.get("elapsed_s"),
            "ops_ok": doc.get("ops_ok"), "error": doc.get("error", ""), "warn": facts["warn"][:4],
            "names_peer": bool(named), "peer_by": named, "versions": facts["versions"]}


def fault_facts(runs, label="fused-fault"):
    """The failed-rail run's WARNs naming a rail, and the stall watch's lines."""
    text = compare.read_text(os.path.join(runs, f"{label}.log"))
    rails = [ln.strip() for ln in text.splitlines() if WARN.search(ln) and RAIL_WARN.search(ln)]
    stalls = [ln.strip() for ln in text.splitlines() if STALL.search(ln)]
    named = sorted(set(f"rail {m.group(1)} ({m.group(2)})" for ln in rails for m in [RAIL_WARN.search(ln)]))
    return {"rail_warns": len(rails), "rails": named, "first": rails[:2], "stalls": len(stalls),
            "stall_first": stalls[:2]}


def table(ib, so, fu, fx):
    ia, sa, fa, xa = (compare.index(d) for d in (ib, so, fu, fx))
    keys = sorted(set(ia) | set(sa) | set(fa) | set(xa),
                  key=lambda k: (compare.OPS_ORDER.index(k[0]) if k[0] in compare.OPS_ORDER else 99,
                                 str(k[0]), k[1] or 0))
    rows = []
    for op, size in keys:
        a, b, c, d = ia.get((op, size)), sa.get((op, size)), fa.get((op, size)), xa.get((op, size))
        rows.append({"op": op, "bytes": size, "ibnet": compare.busbw(a), "socket": compare.busbw(b),
                     "fused": compare.busbw(c), "fault": compare.busbw(d), "ib_socket": compare.ratio(a, b),
                     "wrong": "/".join(compare.fmt_wrong(r) for r in (a, b, c, d))})
    return rows


def print_table(rows, out, only=None):
    print(f"{'op':<15}{'bytes':>11}{'ibnet':>9}{'socket':>9}{'ib/sock':>9}{'fused':>9}{'fault':>9}"
          f"{'wrong i/s/f/x':>15}", file=out)
    for r in rows:
        if only is not None and r["bytes"] not in only:
            continue
        print(f"{r['op']:<15}{r['bytes']:>11}{compare.fmt(r['ibnet'], 9, 3)}{compare.fmt(r['socket'], 9, 3)}"
              f"{compare.fmt(r['ib_socket'], 9, 2)}{compare.fmt(r['fused'], 9, 3)}{compare.fmt(r['fault'], 9, 3)}"
              f"{r['wrong']:>15}", file=out)


def dead_goal(dead, limit_s):
    ib = dead.get("ibnet")
    if not ib:
        return {"goal": f"dead rank: error within {limit_s:g} s naming the peer", "met": False, "why": "not run"}
    met = ib["outcome"] == "error" and ib["elapsed_s"] is not None and ib["elapsed_s"] <= limit_s and ib["names_peer"]
    so = dead.get("socket") or {}
    return {"goal": f"dead rank: error within {limit_s:g} s naming the peer", "met": met,
            "ibnet_s": ib["elapsed_s"], "socket_s": so.get("elapsed_s"), "names_peer": ib["names_peer"]}


def perf_facts(runs, step_bytes):
    """ibnet-perf's bandwidth (GB/s) by size from runs/perf.json, and the one at step_bytes
    (the largest measured size not above it). None when it did not run."""
    try:
        with open(os.path.join(runs, "perf.json")) as f:
            rows = json.load(f).get("results", [])
    except (OSError, ValueError, AttributeError):
        return None
    bw = {r["size"]: r["bw_gbps"] for r in rows if isinstance(r, dict) and isinstance(r.get("bw_gbps"), (int, float))
          and isinstance(r.get("size"), int)}
    at = [s for s in bw if s <= step_bytes]
    return {"bw": bw, "step_bytes": max(at) if at else None, "step_bw": bw[max(at)] if at else None}


def perf_goal(rows, perf, target, at_bytes=64 << 20):
    text = f"ibnet in NCCL: all_reduce busbw at 64 MiB >= {target:g} x ibnet-perf at NCCL's step size"
    if not perf or not perf["step_bw"]:
        return {"goal": text, "met": False, "why": "ibnet-perf not run"}
    r = next((r for r in rows if r["op"] == "all_reduce" and r["bytes"] == at_bytes and r["ibnet"]), None)
    if r is None:
        return {"goal": text, "met": False, "why": "no ibnet all_reduce row at 64 MiB"}
    ratio = r["ibnet"] / perf["step_bw"]
    return {"goal": text, "met": ratio >= target, "ratio": round(ratio, 3), "nccl_busbw": r["ibnet"],
            "perf_bw": perf["step_bw"], "perf_bytes": perf["step_bytes"]}


def fused_goal(info_f, info_x, fault):
    parts = []
    for name, info in (("fused", info_f), ("fused-fault", info_x)):
        if info is None:
            parts.append(f"{name} not run")
            continue
        if not info["ok"]:
            parts.append(f"{name}: {'; '.join(info['why'][:3])}")
    if info_x is not None and not fault["rail_warns"]:
        parts.append("no WARN naming a failed rail")
    return {"goal": "fused rows: every row done, 0 wrong, via the fused device, the failed rail named",
            "met": not parts, "why": parts}


def print_goal(g, out):
    if "target" in g:
        compare.print_goal(g, out)
        return
    state = "MET" if g["met"] else "NOT MET"
    extra = {k: v for k, v in g.items() if k not in ("goal", "met")}
    print(f"goal {g['goal']}: {state} {json.dumps(extra)}", file=out)


def run_steps(args, out):
    """Every verdict of one run, printed; returns (verdicts, infos, docs)."""
    runs, nccl = args.runs, args.expect_nccl
    optional = set(filter(None, (args.optional or "").split(",")))
    verdicts, infos, docs = {}, {}, {}

    def present(*names):
        return any(os.path.exists(os.path.join(runs, n)) for n in names)

    for name, label, expect, via in (("ibnet", "ibnet", "NET/IBNet", None), ("socket", "socket", "NET/Socket", None)):
        ok, text, info, doc, _ = sweep_verdict(f"{name:<12}", runs, label, expect, nccl, via)
        print(text, file=out)
        for line in info["proof"][:1] + info["plugin_lines"][:2]:
            print(f"    {line.strip()}", file=out)
        verdicts[name], infos[name], docs[name] = ok, info, doc
    for v in args.variant or []:
        ok, text, info, _, _ = sweep_verdict(f"variant {v}", runs, v, "NET/IBNet", nccl)
        print(text, file=out)
        verdicts[f"variant {v}"], infos[f"variant {v}"] = ok, info
    if present("reload.log") or "reload" not in optional:
        ok, info = compare.reload_report(os.path.join(runs, "reload.log"), out)
        verdicts["reload"], infos["reload"] = ok, info
    dead = {}
    for label in ("ibnet", "socket"):
        if not present(f"dead-{label}.json", f"dead-{label}.log") and "dead" in optional:
            continue
        d = dead_report(runs, label)
        dead[label] = d
        verdicts[f"dead-{label}"] = d["outcome"] == "error"
        print(f"dead rank {label:<6}: {d['outcome']} after {d['elapsed_s']} s ({d['ops_ok']} ops ok), "
              f"peer named: {'yes (' + ','.join(d['peer_by']) + ')' if d['names_peer'] else 'no'}", file=out)
        print(f"    error: {d['error'][:600]}", file=out)
        for w in d["warn"][:2]:
            print(f"    {w[:300]}", file=out)
    infos["dead"] = dead
    fused_dev = f"NET/IBNet/{args.fused_dev}"
    for label in ("fused", "fused-fault"):
        if not present(f"{label}.json", f"{label}.log") and "fused" in optional:
            infos[label] = None
            continue
        ok, text, info, doc, _ = sweep_verdict(f"{label:<12}", runs, label, "NET/IBNet", nccl, fused_dev)
        print(text, file=out)
        verdicts[label], infos[label], docs[label] = ok, info, doc
        if not doc.get("complete") and info.get("last_row"):
            r = info["last_row"]
            print(f"    stopped after {r.get('op')} {r.get('bytes')} B", file=out)
    if present("topo-dump.json"):
        # Information only: two soft devices unfused (NCCL_NET_MERGE_LEVEL=LOC), the run that
        # also dumps the topology.
        _, text, info, _, _ = sweep_verdict("topo-dump   ", runs, "topo-dump", "NET/IBNet", nccl)
        print(f"(information) two unfused soft devices, {text.strip()}", file=out)
        infos["topo-dump"] = {"ok": info["ok"], "rows": info["rows"], "why": info["why"]}
    fault = fault_facts(runs)
    infos["fault"] = fault
    if infos.get("fused-fault") is not None:
        print(f"    failed-rail WARNs: {fault['rail_warns']} naming {', '.join(fault['rails']) or 'no rail'}; "
              f"stall-watch lines: {fault['stalls']}", file=out)
        for w in fault["first"][:1] + fault["stall_first"][:1]:
            print(f"    {w[:300]}", file=out)
    perf = perf_facts(runs, args.perf_step_bytes)
    infos["perf"] = perf
    if perf is not None or "perf" not in optional:
        ok = bool(perf and perf["bw"])
        verdicts["ibnet-perf"] = ok
        shown = " ".join(f"{s}:{b:.3f}" for s, b in sorted((perf or {}).get("bw", {}).items()))
        print(f"ibnet-perf  : {'OK' if ok else 'FAIL (no result)'} - ibnet alone, GB/s by size: {shown or '-'}",
              file=out)
    if args.probe_log or "probe" not in optional:
        text = compare.read_text(args.probe_log)
        ok = "proxy_gpu_probe: PASS" in text
        verdicts["proxy_gpu_probe"] = ok
        last = [ln for ln in text.splitlines() if ln.startswith("proxy_gpu_probe:")]
        print(f"proxy_gpu_probe: {'OK' if ok else 'FAIL'} - {last[-1] if last else 'no output'}", file=out)
    return verdicts, infos, docs


def one(args, out):
    verdicts_out = io.StringIO()  # the verdicts are printed after the table
    verdicts, infos, docs = run_steps(args, verdicts_out)
    ib, so = docs.get("ibnet", {"results": []}), docs.get("socket", {"results": []})
    fu, fx = docs.get("fused", {"results": []}), docs.get("fused-fault", {"results": []})
    meta = next((d for d in (ib, so) if d.get("nccl_version")), {})
    versions = sorted(set(v for k in ("ibnet", "socket") for v in infos[k].get("versions", [])))
    print(f"busbw in GB/s, 2 ranks on one GPU (NCCL_HOSTID per rank, nNodes 2), NCCL "
          f"{','.join(versions) or '?'} from its log (torch reports {meta.get('nccl_version', '?')}), GPU "
          f"{meta.get('gpu', '?')}; ibnet = NET/IBNet soft provider, socket = NET/Socket, fused = "
          f"soft0+soft1 fused, fault = fused with rail 1 failed mid-run", file=out)
    rows = table(ib, so, fu, fx)
    print_table(rows, out)
    print("\nkey sizes", file=out)
    print_table(rows, out, only=set(compare.KEY_SIZES) | {LARGE, 256 << 20})
    print("", file=out)
    out.write(verdicts_out.getvalue())
    print("", file=out)
    small = lambda r: r["bytes"] <= SMALL  # noqa: E731
    large = lambda r: r["bytes"] >= LARGE  # noqa: E731
    wrong = {k: v.get("wrong", 0) for k, v in infos.items() if isinstance(v, dict) and "wrong" in v}
    gl = [
        compare.goal(rows, "ib_socket", large, args.large_goal, f"ibnet/Socket >= {args.large_goal:g} at >= 16 MiB"),
        compare.goal(rows, "ib_socket", small, args.small_goal, f"ibnet/Socket >= {args.small_goal:g} at <= 64 KiB"),
        {"goal": "0 wrong elements anywhere", "met": sum(int(v or 0) for v in wrong.values()) == 0,
         "wrong": sum(int(v or 0) for v in wrong.values())},
        dead_goal(infos["dead"], args.dead_limit_s),
        fused_goal(infos.get("fused"), infos.get("fused-fault"), infos["fault"]),
        perf_goal(rows, infos.get("perf"), args.perf_goal),
    ]
    for g in gl:
        print_goal(g, out)
    passed = bool(verdicts) and all(verdicts.values())
    failed = [k for k, v in verdicts.items() if not v]
    print(f"VERDICT: {'PASS' if passed else 'FAIL'}" + (f" ({', '.join(failed)})" if failed else ""), file=out)
    return passed, {"pass": passed, "verdicts": verdicts, "goals": gl, "nccl_versions": versions,
                    "perf": infos.get("perf"),
                    "expect_nccl": args.expect_nccl, "table": rows,
                    "runs": {k: v for k, v in infos.items() if k not in ("fault", "perf")}, "fault": infos["fault"]}


def merge(paths, out):
    """Several runs' summaries side by side: key rows, goals, verdicts; PASS when all passed."""
    sums = []
    for p in paths:
        try:
            with open(p) as f:
                sums.append((p, json.load(f)))
        except (OSError, ValueError) as e:
            sums.append((p, {"pass": False, "error": str(e), "table": [], "goals": []}))
    names = [",".join(s.get("nccl_versions") or []) or os.path.basename(os.path.dirname(p)) or p for p, s in sums]
    print("ibnet/Socket busbw ratio per NCCL version (ibnet GB/s in brackets)", file=out)
    print(f"{'op':<15}{'bytes':>11}" + "".join(f"{n:>22}" for n in names), file=out)
    keys = []
    for _, s in sums:
        for r in s.get("table", []):
            k = (r["op"], r["bytes"])
            if k not in keys and r["bytes"] in set(compare.KEY_SIZES) | {LARGE, 256 << 20}:
                keys.append(k)
    keys.sort(key=lambda k: (compare.OPS_ORDER.index(k[0]) if k[0] in compare.OPS_ORDER else 99, k[1]))
    for op, size in keys:
        cells = []
        for _, s in sums:
            r = next((r for r in s.get("table", []) if r["op"] == op and r["bytes"] == size), None)
            cells.append(f"{compare.fmt(r and r.get('ib_socket'), 8, 2)} ({compare.fmt(r and r.get('ibnet'), 7, 3)})"
                         if r else f"{'-':>18}")
        print(f"{op:<15}{size:>11}" + "".join(f"{c:>22}" for c in cells), file=out)
    for n, (p, s) in zip(names, sums):
        failed = [k for k, v in (s.get("verdicts") or {}).items() if not v]
        print(f"NCCL {n}: {'PASS' if s.get('pass') else 'FAIL'}" + (f" ({', '.join(failed)})" if failed else "")
              + (f" - {s['error']}" if s.get("error") else ""), file=out)
        for g in s.get("goals", []):
            print(f"    goal {g.get('goal')}: {'MET' if g.get('met') else 'NOT MET'}", file=out)
    passed = bool(sums) and all(s.get("pass") for _, s in sums)
    print(f"VERDICT (all versions): {'PASS' if passed else 'FAIL'}", file=out)
    return passed


def main(argv=None, out=sys.stdout):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", help="run_onegpu.sh's runs/ folder")
    p.add_argument("--merge", nargs="+", help="summary.json files of several runs")
    p.add_argument("--expect-nccl", help="the NCCL version every log must name, e.g. 2.30.7")
    p.add_argument("--variant", action="append", help="a variant label (repeatable)")
    p.add_argument("--probe-log", help="proxy_gpu_probe's output")
    p.add_argument("--optional", help="comma-separated steps not held against the verdict when absent: "
                   + ",".join(STEPS))
    p.add_argument("--fused-dev", type=int, default=2, help="NCCL's device number of the fused NIC")
    p.add_argument("--summary", help="write a JSON summary here")
    p.add_argument("--large-goal", type=float, default=2.5)
    p.add_argument("--small-goal", type=float, default=1.0)
    p.add_argument("--dead-limit-s", type=float, default=2.0)
    p.add_argument("--perf-goal", type=float, default=0.8)
    p.add_argument("--perf-step-bytes", type=int, default=512 << 10,
                   help="the bytes NCCL moves per net step (its 4 MiB buffer / 8 steps)")
    args = p.parse_args(argv)
    if args.merge:
        return 0 if merge(args.merge, out) else 1
    if not args.runs:
        p.error("need --runs or --merge")
    passed, summary = one(args, out)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
