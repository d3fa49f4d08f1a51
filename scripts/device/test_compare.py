#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Tests for compare.py, nccl_sweep.py's and nccl_reload.py's pure parts and run_sweep.sh, on
canned input (no torch, no GPU).

    python3 -m unittest discover -s scripts/device -p 'test_*.py'
"""

import contextlib
import io
import json
import operator
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare  # noqa: E402
import nccl_reload  # noqa: E402  (imports no torch at module level)
import nccl_sweep  # noqa: E402  (imports no torch at module level)

KIB, MIB = 1 << 10, 1 << 20
BIG = 64 * MIB


def run_doc(label, busbw_by_key, wrong_by_key=None, complete=True, env=None):
    wrong_by_key = wrong_by_key or {}
    rows = []
    for (op, size), bw in busbw_by_key.items():
        w = wrong_by_key.get((op, size), 0)
        rows.append({"op": op, "bytes": size, "count": size // 4, "dtype": "float32",
                     "time_us": 1.0, "algbw": bw, "busbw": bw, "wrong": w, "warmup": 1, "iters": 1})
    return {"label": label, "world_size": 2, "nccl_version": "2.28.9", "gpu": "NVIDIA H200",
            "env": env or {}, "results": rows, "complete": complete,
            "ok": complete and not any(wrong_by_key.values())}


IBNET_LOG = """\
host:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin IBNet (v11)
host:1:1 [0] NCCL INFO Using network IBNet
host:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IBNet/0
host:1:9 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] [send] via NET/IBNet/0/Shared
"""
SOCKET_LOG = "host:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/Socket/0\n"
SHM_LOG = "host:3:3 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n"


def reload_log(ranks=2, cycles=2, override=None, extra=""):
    """A reload log as nccl_reload.py and NCCL 2.28.9 print it; override[(rank, cycle)] changes
    fields of one census line."""
    override = override or {}
    lines = [f"RELOAD config ranks={ranks} cycles={cycles} plugin=/tmp/x/libnccl-net.so nccl=2.28.9"]
    for c in range(1, cycles + 1):
        for r in range(ranks):
            lines.append(f"host:1:1 [{r}] NCCL INFO NET/Plugin: Loaded net plugin IBNet (v11)")
        for r in range(ranks):
            row = {"rank": r, "cycle": c, "wrong": 0, "before": 0, "during": 10, "after": 0,
                   "after_wait": 0, "mapped_during": 1, "mapped_after": 0, "left": "-"}
            row.update(override.get((r, c), {}))
            name = "/tmp/x/libnccl-net.so" if c == 1 else ""
            lines.append(f"host:1:1 [{r}] NCCL INFO Unloading plugin {name}")
            lines.append("RELOAD " + " ".join(f"{k}={v}" for k, v in row.items()))
    lines += [f"RELOAD rank={r} done ok=1" for r in range(ranks)]
    lines.append("run_sweep: reload exit status 0 after 12 s")
    return "\n".join(lines) + "\n" + extra


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, content):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def run_compare(self, ib, so, sh=None, ib_log=IBNET_LOG, so_log=SOCKET_LOG, sh_log=SHM_LOG, extra=()):
        args = ["--ibnet", self.write("i.json", ib), "--socket", self.write("s.json", so),
                "--ibnet-log", self.write("i.log", ib_log), "--socket-log", self.write("s.log", so_log),
                "--summary", os.path.join(self.dir.name, "sum.json"), *extra]
        if sh is not None:
            args += ["--shm", self.write("h.json", sh), "--shm-log", self.write("h.log", sh_log)]
        out = io.StringIO()
        rc = compare.main(args, out=out)
        with open(os.path.join(self.dir.name, "sum.json")) as f:
            summary = json.load(f)
        return rc, out.getvalue(), summary

    def three(self):
        """ibnet/socket/shm runs: every goal met except ibnet/SHM at all_reduce 64 MiB."""
        keys = [("all_reduce", 8), ("all_reduce", 64 * KIB), ("all_reduce", BIG), ("all_to_all", BIG)]
        ib = run_doc("ibnet", dict(zip(keys, [0.002, 1.5, 10.0, 12.0])))
        so = run_doc("socket", dict(zip(keys, [0.002, 0.5, 2.5, 3.0])))
        sh = run_doc("shm", dict(zip(keys, [0.004, 2.0, 25.0, 20.0])))
        return ib, so, sh

    def test_three_columns_ratios_and_goals(self):
        ib, so, sh = self.three()
        rc, text, summary = self.run_compare(ib, so, sh)
        self.assertEqual(rc, 0, text)
        self.assertIn("VERDICT: PASS", text)
        self.assertIn("ib/sock", text)
        self.assertIn("ib/shm", text)
        rows = {(r["op"], r["bytes"]): r for r in summary["table"]}
        self.assertAlmostEqual(rows[("all_reduce", BIG)]["ib_socket"], 4.0)
        self.assertAlmostEqual(rows[("all_reduce", BIG)]["ib_shm"], 0.4)
        self.assertAlmostEqual(rows[("all_to_all", BIG)]["ib_shm"], 0.6)
        self.assertAlmostEqual(rows[("all_reduce", 8)]["ib_shm"], 0.5)
        self.assertEqual(rows[("all_reduce", 8)]["wrong"], "0/0/0")
        goals = {g["goal"]: g for g in summary["goals"]}
        small = goals["ibnet/Socket >= 1 at every size <= 64 KiB"]
        self.assertEqual((small["rows"], small["met_rows"], small["met"]), (2, 2, True))
        large = goals["ibnet/Socket >= 3 at >= 64 MiB"]
        self.assertEqual((large["rows"], large["met_rows"], large["met"]), (2, 2, True))
        shm = goals["ibnet/SHM >= 0.5 at >= 64 MiB"]
        self.assertEqual((shm["rows"], shm["met_rows"], shm["met"]), (2, 1, False))
        self.assertEqual(shm["misses"], ["all_reduce@67108864=0.40"])
        self.assertIn("goal ibnet/SHM >= 0.5 at >= 64 MiB: NOT MET at 1/2 (min 0.40, max 0.60); "
                      "misses: all_reduce@67108864=0.40", text)
        self.assertIn("goal 0 wrong elements anywhere: MET (0 wrong over 3 runs)", text)
        # The key-size block repeats the rows at 8 B, 64 KiB, 1 MiB, 64 MiB, 1 GiB only.
        key_block = text.split("key sizes")[1].split("correctness")[0]
        self.assertIn("all_to_all", key_block)
        # Rows are grouped by op in sweep order.
        self.assertLess(text.index("all_reduce"), text.index("all_to_all"))

    def test_small_size_goal_misses_are_listed(self):
        ib, so, sh = self.three()
        ib["results"][0]["busbw"] = 0.001  # all_reduce 8 B: ratio 0.5
        _, text, summary = self.run_compare(ib, so, sh)
        small = summary["goals"][0]
        self.assertFalse(small["met"])
        self.assertEqual(small["misses"], ["all_reduce@8=0.50"])
        self.assertIn("NOT MET at 1/2", text)

    def test_wrong_elements_fail(self):
        ib = run_doc("ibnet", {("broadcast", 1024): 1.0}, wrong_by_key={("broadcast", 1024): 3})
        so = run_doc("socket", {("broadcast", 1024): 1.0})
        sh = run_doc("shm", {("broadcast", 1024): 1.0})
        rc, text, summary = self.run_compare(ib, so, sh)
        self.assertEqual(rc, 1)
        self.assertIn("3 wrong element(s) in broadcast@1024", text)
        self.assertIn("VERDICT: FAIL (ibnet)", text)
        self.assertFalse(summary["verdicts"]["ibnet"])
        self.assertTrue(summary["verdicts"]["socket"])
        self.assertTrue(summary["verdicts"]["shm"])
        self.assertFalse(summary["goals"][-1]["met"])

    def test_incomplete_and_missing_runs_fail(self):
        ib = run_doc("ibnet", {("all_reduce", 8): 1.0}, complete=False)
        so = run_doc("socket", {("all_reduce", 8): 1.0})
        rc, text, _ = self.run_compare(ib, so)
        self.assertEqual(rc, 1)
        self.assertIn("did not finish", text)
        self.assertIn("correctness shm   : not run", text)

        out = io.StringIO()
        rc = compare.main(["--ibnet", os.path.join(self.dir.name, "absent.json"),
                           "--socket", self.write("s2.json", so)], out=out)
        self.assertEqual(rc, 1)
        self.assertIn("absent.json", out.getvalue())

        rc = compare.main(["--ibnet", self.write("garbage.json", "{not json"),
                           "--socket", self.write("s3.json", so)], out=io.StringIO())
        self.assertEqual(rc, 1)

        # An SHM run that was asked for but never written fails the verdict.
        good = run_doc("ibnet", {("all_reduce", 8): 1.0})
        rc, text, _ = self.run_compare(good, so, extra=["--shm", os.path.join(self.dir.name, "none.json")])
        self.assertEqual(rc, 1)
        self.assertIn("VERDICT: FAIL (shm)", text)

    def test_missing_proof_or_other_transport_fails(self):
        ib = run_doc("ibnet", {("all_reduce", 8): 1.0})
        so = run_doc("socket", {("all_reduce", 8): 1.0})
        sh = run_doc("shm", {("all_reduce", 8): 1.0})
        rc, text, _ = self.run_compare(ib, so, sh, ib_log="NCCL INFO nothing here\n")
        self.assertEqual(rc, 1)
        self.assertIn("no 'via NET/IBNet' line in the log", text)
        fallback = IBNET_LOG + "host NCCL INFO Channel 02/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n"
        rc, text, summary = self.run_compare(ib, so, sh, ib_log=fallback)
        self.assertEqual(rc, 1)
        self.assertIn("line(s) of another transport", text)
        self.assertEqual(summary["runs"]["ibnet"]["other_transport_lines"], 1)
        # The SHM column must not have used P2P (or a NET transport).
        p2p = SHM_LOG + "host NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
        rc, text, summary = self.run_compare(ib, so, sh, sh_log=p2p)
        self.assertEqual(rc, 1)
        self.assertEqual(summary["runs"]["shm"]["other_transport_lines"], 1)
        self.assertIn("VERDICT: FAIL (shm)", text)

    def test_variants(self):
        ib, so, sh = self.three()
        keys = [("all_reduce", 8), ("all_reduce", 16 * MIB), ("sendrecv", 8)]
        good = run_doc("proto-ll", dict.fromkeys(keys, 1.0), env={"NCCL_PROTO": "LL", "NCCL_NET": "IBNet"})
        bad = run_doc("proto-ll128", dict.fromkeys(keys, 1.0), env={"NCCL_PROTO": "LL128"},
                      wrong_by_key={("all_reduce", 16 * MIB): 7})
        short = run_doc("qps4-ch4", dict.fromkeys(keys, 1.0), complete=False,
                        env={"NCCL_IB_QPS_PER_CONNECTION": "4", "NCCL_NCHANNELS_PER_NET_PEER": "4"})
        extra = ["--variant", "proto-ll", self.write("v1.json", good), self.write("v1.log", IBNET_LOG)]
        rc, text, summary = self.run_compare(ib, so, sh, extra=extra)
        self.assertEqual(rc, 0, text)
        self.assertIn("variant proto-ll: OK (3 rows, 0 wrong, 2 'via NET/IBNet' lines)", text)
        self.assertIn("env {'NCCL_PROTO': 'LL'}; all_reduce busbw 8:1.000 16777216:1.000", text)

        extra += ["--variant", "proto-ll128", self.write("v2.json", bad), self.write("v2.log", IBNET_LOG),
                  "--variant", "qps4-ch4", self.write("v3.json", short), self.write("v3.log", SOCKET_LOG)]
        rc, text, summary = self.run_compare(ib, so, sh, extra=extra)
        self.assertEqual(rc, 1)
        self.assertIn("variant proto-ll128: FAIL", text)
        self.assertIn("7 wrong element(s) in all_reduce@16777216", text)
        self.assertIn("variant qps4-ch4: FAIL", text)
        self.assertIn("did not finish", text)
        self.assertIn("no 'via NET/IBNet' line", text)
        self.assertEqual(summary["verdicts"], {"ibnet": True, "socket": True, "shm": True,
                                               "variant proto-ll": True, "variant proto-ll128": False,
                                               "variant qps4-ch4": False})
        self.assertEqual(summary["goals"][-1]["wrong"], 7)

    def test_reload_section(self):
        ib, so, sh = self.three()
        extra = ["--reload-log", self.write("r.log", reload_log())]
        rc, text, summary = self.run_compare(ib, so, sh, extra=extra)
        self.assertEqual(rc, 0, text)
        self.assertIn("reload: OK (2 cycle(s) x 2 rank(s); 4 'Loaded net plugin IBNet', "
                      "4 'Unloading plugin', 0 NCCL WARN)", text)
        self.assertIn("rank 1 cycle 2: wrong 0, ibnet threads before 0 during 10 after 0 (+grace 0), "
                      "image mapped after destroy: no", text)
        self.assertTrue(summary["runs"]["reload"]["ok"])

        leak = reload_log(override={(1, 1): {"after": 2, "after_wait": 1, "left": "ibnet-soft-mon"}})
        rc, text, summary = self.run_compare(ib, so, sh, extra=["--reload-log", self.write("r2.log", leak)])
        self.assertEqual(rc, 1)
        self.assertIn("rank 1 cycle 1: wrong=0 threads before/during/after/after_wait=0/10/2/1 "
                      "left=ibnet-soft-mon", text)
        self.assertIn("VERDICT: FAIL (reload)", text)

        rc, text, _ = self.run_compare(ib, so, sh, extra=["--reload-log", os.path.join(self.dir.name, "no.log")])
        self.assertEqual(rc, 1)
        self.assertIn("no 'RELOAD config' line", text)


class ReloadParseTest(unittest.TestCase):
    def test_clean_log(self):
        parsed = nccl_reload.parse_log(reload_log())
        self.assertEqual(parsed["config"]["ranks"], 2)
        self.assertEqual(parsed["config"]["plugin"], "/tmp/x/libnccl-net.so")
        self.assertEqual(len(parsed["rows"]), 4)
        self.assertEqual(parsed["rows"][(0, 2)]["during"], 10)
        self.assertEqual(parsed["rows"][(0, 2)]["left"], "-")
        self.assertEqual(parsed["done"], {0: True, 1: True})
        self.assertEqual(parsed["exit_status"], 0)
        self.assertEqual(nccl_reload.verdict(parsed), (True, []))

    def test_each_failure_is_named(self):
        cases = [
            (reload_log(override={(0, 2): {"wrong": 5}}), "rank 0 cycle 2: wrong=5"),
            (reload_log(override={(0, 2): {"before": 3}}), "threads before/during/after/after_wait=3/10/0/0"),
            # No plugin thread seen while the comm lived: the census proves nothing.
            (reload_log(override={(1, 1): {"during": 0}}), "rank 1 cycle 1"),
            (reload_log(extra="host [0] NCCL WARN NET/IBNET : finalize: something\n"), "1 NCCL WARN line(s)"),
            (reload_log().replace("Unloading plugin", "Unload skipped", 1), "3 'Unloading plugin' line(s), want 4"),
            (reload_log().replace("Loaded net plugin IBNet", "Loaded net plugin IB", 2),
             "2 'Loaded net plugin IBNet' line(s), want 4"),
            (reload_log().replace("RELOAD rank=1 done ok=1", "RELOAD rank=1 done ok=0"), "rank 1: no 'done ok=1'"),
            (reload_log().replace("exit status 0", "exit status 124"), "exit status 124"),
            ("\n".join(line for line in reload_log().splitlines() if "cycle=2" not in line or "rank=0" not in line),
             "rank 0 cycle 2: no census line"),
            ("run_sweep: reload skipped: out of time\n", "no 'RELOAD config' line"),
        ]
        for text, want in cases:
            ok, why = nccl_reload.verdict(nccl_reload.parse_log(text))
            self.assertFalse(ok, want)
            self.assertTrue(any(want in w for w in why), (want, why))


class ReloadCensusTest(unittest.TestCase):
    def test_plugin_threads_and_mapping(self):
        with tempfile.TemporaryDirectory() as d:
            task = os.path.join(d, "task")
            for tid, name in [(1, "python3"), (2, "ibnet-soft-cp0"), (3, "ibnet-async-sof"),
                              (4, "pt_nccl_watchdg"), (5, "ibnet-soft-mon")]:
                os.makedirs(os.path.join(task, str(tid)))
                with open(os.path.join(task, str(tid), "comm"), "w") as f:
                    f.write(name + "\n")
            os.makedirs(os.path.join(task, "6"))  # a thread that ended: no comm file
            self.assertEqual(nccl_reload.plugin_threads(task),
                             ["ibnet-async-sof", "ibnet-soft-cp0", "ibnet-soft-mon"])
            self.assertEqual(nccl_reload.plugin_threads(os.path.join(d, "absent")), [])

            so = os.path.join(d, "libnccl-net-ibnet.so")
            open(so, "w").close()
            link = os.path.join(d, "libnccl-net.so")
            os.symlink(so, link)
            maps = os.path.join(d, "maps")
            with open(maps, "w") as f:
                f.write(f"7f00-7f10 r-xp 00000000 08:01 42   {so}\n7f20-7f30 rw-p 00000000 00:00 0 \n")
            self.assertTrue(nccl_reload.is_mapped(link, maps))
            with open(maps, "w") as f:
                f.write(f"7f00-7f10 r-xp 00000000 08:01 43   {so}.old\n")
            self.assertFalse(nccl_reload.is_mapped(link, maps))

    def test_wait_threads_gone(self):
        seq = [["ibnet-soft-cp0"], []]
        self.assertEqual(nccl_reload.wait_threads_gone(30, poll=lambda: seq.pop(0) if seq else []), [])
        self.assertEqual(nccl_reload.wait_threads_gone(0, poll=lambda: ["ibnet-soft-mon"]), ["ibnet-soft-mon"])

    def test_args(self):
        a = nccl_reload.parse_args(["--plugin", "/x.so"])
        self.assertEqual((a.cycles, a.count), (2, 1 << 20))
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            nccl_reload.parse_args(["--plugin", "/x.so", "--cycles", "0"])


class FakeTensor:
    """Just enough of a 1-D torch tensor for nccl_sweep.Harness's data and references."""

    def __init__(self, values):
        self.v = list(values)

    def _op(self, other, f):
        if isinstance(other, FakeTensor):
            assert len(self.v) == len(other.v)
            return FakeTensor(f(a, b) for a, b in zip(self.v, other.v))
        return FakeTensor(f(a, other) for a in self.v)

    def __add__(self, o):
        return self._op(o, operator.add)

    def __sub__(self, o):
        return self._op(o, operator.sub)

    def __mul__(self, o):
        return self._op(o, operator.mul)

    def __mod__(self, o):
        return self._op(o, operator.mod)

    def __iadd__(self, o):
        self.v = (self + o).v
        return self

    def to(self, dtype):
        return FakeTensor(float(x) for x in self.v)


class FakeTorch:
    int64, float32 = "int64", "float32"

    @staticmethod
    def arange(a, b, device=None, dtype=None):
        return FakeTensor(range(a, b))

    @staticmethod
    def zeros(n, device=None, dtype=None):
        return FakeTensor([0.0] * n)

    @staticmethod
    def empty(n, device=None, dtype=None):
        return FakeTensor([0.0] * n)

    @staticmethod
    def cat(parts):
        return FakeTensor(x for p in parts for x in p.v)


def simulate(op, inputs, r, cout):
    """Rank r's output of `op`, from the definitions over every rank's input (independent of
    Harness.reference)."""
    n = len(inputs)
    if op == "all_reduce":
        return [sum(col) for col in zip(*inputs)]
    if op == "all_gather":
        return [x for q in range(n) for x in inputs[q]]
    if op == "reduce_scatter":
        return [sum(inputs[q][r * cout + i] for q in range(n)) for i in range(cout)]
    if op == "broadcast":
        return list(inputs[0])
    if op == "sendrecv":
        return list(inputs[(r - 1) % n])
    chunk = cout // n  # all_to_all: block q of my output is block r of rank q's input
    return [x for q in range(n) for x in inputs[q][r * chunk:(r + 1) * chunk]]


class SweepHelpersTest(unittest.TestCase):
    def test_sizes_double_to_max(self):
        s = nccl_sweep.sizes(8, 1 << 30)
        self.assertEqual(s[0], 8)
        self.assertEqual(s[-1], 1 << 30)
        self.assertEqual(len(s), 28)
        self.assertEqual(nccl_sweep.sizes(8, 100), [8, 16, 32, 64])

    def test_bus_factors_match_nccl_tests(self):
        self.assertEqual(nccl_sweep.bus_factor("all_reduce", 2), 1.0)
        self.assertEqual(nccl_sweep.bus_factor("all_reduce", 4), 1.5)
        self.assertEqual(nccl_sweep.bus_factor("all_gather", 2), 0.5)
        self.assertEqual(nccl_sweep.bus_factor("reduce_scatter", 8), 7 / 8)
        self.assertEqual(nccl_sweep.bus_factor("all_to_all", 2), 0.5)
        self.assertEqual(nccl_sweep.bus_factor("all_to_all", 4), 0.75)
        self.assertEqual(nccl_sweep.bus_factor("broadcast", 2), 1.0)
        self.assertEqual(nccl_sweep.bus_factor("sendrecv", 2), 1.0)

    def test_counts(self):
        self.assertEqual(nccl_sweep.counts("all_reduce", 8, 2), (2, 2))
        self.assertEqual(nccl_sweep.counts("all_gather", 8, 2), (1, 2))
        self.assertEqual(nccl_sweep.counts("reduce_scatter", 8, 2), (2, 1))
        self.assertEqual(nccl_sweep.counts("all_to_all", 8, 2), (2, 2))
        self.assertEqual(nccl_sweep.counts("all_to_all", 40, 4), (8, 8))  # 10 elements: 4 blocks of 2
        self.assertIsNone(nccl_sweep.counts("all_gather", 8, 4))
        self.assertIsNone(nccl_sweep.counts("all_to_all", 8, 4))
        self.assertEqual(nccl_sweep.counts("all_gather", 1 << 30, 2), (1 << 27, 1 << 28))

    def test_references_match_the_definitions(self):
        for n in (2, 3, 4):
            for size in (8, 48, 4096):
                for op in nccl_sweep.OPS:
                    c = nccl_sweep.counts(op, size, n)
                    if c is None:
                        continue
                    cin, cout = c
                    salt = 11
                    hs = [nccl_sweep.Harness(FakeTorch, None, "dev", r, n) for r in range(n)]
                    inputs = [hs[q].data(q, cin, salt).v for q in range(n)]
                    for r in range(n):
                        got = hs[r].reference(op, cin, cout, salt).v
                        self.assertEqual(got, simulate(op, inputs, r, cout), (op, n, size, r))
                        self.assertEqual(len(got), cout)

    def test_make_calls_the_right_collective(self):
        calls = []

        class Dist:
            def all_to_all_single(self, out, inp):
                calls.append(("all_to_all_single", out, inp))

        h = nccl_sweep.Harness(FakeTorch, Dist(), "dev", 0, 2)
        inp, out, run = h.make("all_to_all", 4, 4, 3)
        run()
        self.assertEqual(calls, [("all_to_all_single", out, inp)])
        self.assertIsNot(inp, out)

    def test_iterations_and_args(self):
        self.assertEqual(nccl_sweep.iterations(8), (5, 20))
        self.assertEqual(nccl_sweep.iterations(1 << 30), (1, 3))
        self.assertEqual(nccl_sweep.iterations(1 << 30, warmup=0, iters=1), (0, 1))
        a = nccl_sweep.parse_args(["--json", "x.json", "--max-bytes", "1024", "--ops", "all_reduce,all_to_all"])
        self.assertEqual(a.ops, ["all_reduce", "all_to_all"])
        self.assertEqual(nccl_sweep.parse_args(["--json", "x"]).ops, list(nccl_sweep.OPS))
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            nccl_sweep.parse_args(["--json", "x", "--ops", "alltoall"])
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            nccl_sweep.parse_args(["--json", "x", "--min-bytes", "64", "--max-bytes", "8"])


FAKE_TORCHRUN = r"""#!/usr/bin/env python3
# Stands in for torchrun: checks the environment run_sweep.sh sets for each run, writes canned
# results and log lines.
import json, os, sys
args = sys.argv[1:]
prog = os.path.basename(next(a for a in args if a.endswith(".py")))
env = os.environ
assert env.get("NCCL_P2P_DISABLE") == "1"
assert env.get("NCCL_NVLS_ENABLE") == "0"
assert env.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") == "1" and env.get("NVSHMEM_DISABLE_NVLS") == "1"
net, plugin = env.get("NCCL_NET"), env.get("NCCL_NET_PLUGIN")
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(" ".join(args[2:4]) + "\n")

if prog == "nccl_reload.py":
    p = args[args.index("--plugin") + 1]
    assert net == "IBNet" and env.get("IBNET_PROVIDER") == "soft" and plugin == p, (net, plugin, p)
    # The second load of NCCL 2.28.9 looks for libnccl-net.so through LD_LIBRARY_PATH.
    assert os.path.basename(p) == "libnccl-net.so" and os.path.islink(p)
    assert env["LD_LIBRARY_PATH"].split(":")[0] == os.path.dirname(p)
    assert env.get("NCCL_SHM_DISABLE") == "1"
    print("RELOAD config ranks=2 cycles=2 plugin=%s nccl=2.28.9" % p)
    for c in (1, 2):
        for r in (0, 1):
            print("h:1:1 [%d] NCCL INFO NET/Plugin: Loaded net plugin IBNet (v11)" % r)
            print("h:1:1 [%d] NCCL INFO Unloading plugin %s" % (r, p if c == 1 else ""))
            print("RELOAD rank=%d cycle=%d wrong=0 before=0 during=10 after=0 after_wait=0 "
                  "mapped_during=1 mapped_after=0 left=-" % (r, c))
    print("RELOAD rank=0 done ok=1\nRELOAD rank=1 done ok=1")
    sys.exit(0)

label = args[args.index("--label") + 1]
out = args[args.index("--json") + 1]
maxb = int(args[args.index("--max-bytes") + 1])
variants = {"proto-ll": {"NCCL_PROTO": "LL"}, "proto-ll128": {"NCCL_PROTO": "LL128"},
            "proto-simple": {"NCCL_PROTO": "SIMPLE"},
            "qps4-ch4": {"NCCL_IB_QPS_PER_CONNECTION": "4", "NCCL_NCHANNELS_PER_NET_PEER": "4"}}
if label == "ibnet" or label in variants:
    assert net == "IBNet" and os.path.isabs(plugin) and env.get("IBNET_PROVIDER") == "soft"
    assert env.get("NCCL_SHM_DISABLE") == "1"
    for k, v in variants.get(label, {}).items():
        assert env.get(k) == v, (label, k, env.get(k))
    if label in variants:
        assert maxb == 16 << 20 and "--iters" in args, args
    else:
        assert "NCCL_PROTO" not in env and maxb == 1 << 30
    bw, via = 10.0, "NET/IBNet/0"
elif label == "socket":
    assert net == "Socket" and plugin is None and env.get("NCCL_SHM_DISABLE") == "1", (net, plugin)
    bw, via = 3.0, "NET/Socket/0"
elif label == "shm":
    assert net is None and plugin is None and env.get("NCCL_SHM_DISABLE") == "0", (net, plugin)
    bw, via = 25.0, "SHM/direct/direct"
else:
    raise SystemExit("unexpected label " + label)
print("NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via %s" % via, flush=True)
print("# env %s" % {k: v for k, v in env.items() if k.startswith("NCCL_PROTO")})
rows = [{"op": op, "bytes": size, "busbw": bw if size > 1 << 16 else 1.0, "algbw": bw, "wrong": 0}
        for op in ("all_reduce", "all_to_all") for size in (8, 64 << 20)]
json.dump({"label": label, "world_size": 2, "nccl_version": "2.28.9", "results": rows,
           "env": {k: v for k, v in env.items() if k.startswith("NCCL_")},
           "complete": True, "ok": True}, open(out, "w"))
print("# total #wrong = 0; OK; 1.0 s")
"""

OUT_FILES = ["compare.txt", "cuda_probe.log", "driver.log", "proof.log", "reload.log", "runs.tar.gz",
             "summary.json"]


class RunSweepScriptTest(unittest.TestCase):
    """run_sweep.sh end to end with a fake torchrun (env plumbing, files, budget, exit status)."""

    def setUp(self):
        self.here = os.path.dirname(os.path.abspath(__file__))
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        d = self.dir.name
        fake = os.path.join(d, "fake_torchrun.py")
        with open(fake, "w") as f:
            f.write(FAKE_TORCHRUN)
        self.probe = os.path.join(d, "cuda_probe")
        with open(self.probe, "w") as f:
            f.write("#!/bin/sh\necho 'cuda_probe: done, 0 failed check(s)'\n")
        for p in (fake, self.probe):
            os.chmod(p, os.stat(p).st_mode | stat.S_IEXEC)
        self.so = os.path.join(d, "libnccl-net-ibnet.so")
        open(self.so, "w").close()
        self.calls = os.path.join(d, "calls")
        self.env = dict(os.environ, TORCHRUN=f"{sys.executable} {fake}", FAKE_CALLS=self.calls)
        for k in ("NCCL_NET_PLUGIN", "NCCL_NET", "NCCL_PROTO", "VARIANTS", "DEADLINE", "PACK"):
            self.env.pop(k, None)

    def run_script(self, *args, **env):
        return subprocess.run(["bash", os.path.join(self.here, "run_sweep.sh"), *args],
                              env=dict(self.env, **env), capture_output=True, text=True, timeout=120)

    def test_run_sweep_plumbing(self):
        outdir = os.path.join(self.dir.name, "out")
        p = self.run_script(self.so, outdir, self.probe)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("VERDICT: PASS", p.stdout)
        self.assertIn("goal ibnet/SHM >= 0.5 at >= 64 MiB: NOT MET at 0/2 (min 0.40, max 0.40)", p.stdout)
        self.assertIn("goal ibnet/Socket >= 3 at >= 64 MiB: MET at 2/2", p.stdout)
        self.assertIn("reload: OK (2 cycle(s) x 2 rank(s)", p.stdout)
        for v in ("proto-ll", "proto-ll128", "proto-simple", "qps4-ch4"):
            self.assertIn(f"variant {v}: OK", p.stdout)
        # The device tool brings back at most 8 files: exactly these 7 are left.
        self.assertEqual(sorted(os.listdir(outdir)), OUT_FILES)
        with tarfile.open(os.path.join(outdir, "runs.tar.gz")) as t:
            names = sorted(t.getnames())
        for label in ("ibnet", "socket", "shm", "proto-ll", "proto-ll128", "proto-simple", "qps4-ch4"):
            self.assertIn(f"runs/{label}.json", names)
            self.assertIn(f"runs/{label}.log", names)
        with open(os.path.join(outdir, "proof.log")) as f:
            proof = f.read()
        self.assertIn("via NET/IBNet/0", proof)
        self.assertIn("via SHM/direct/direct", proof)
        self.assertIn("Unloading plugin", proof)
        self.assertIn("== variant qps4-ch4", proof)
        with open(os.path.join(outdir, "driver.log")) as f:
            self.assertIn("VERDICT: PASS", f.read())
        with open(os.path.join(outdir, "cuda_probe.log")) as f:
            self.assertEqual(f.read(), "cuda_probe: done, 0 failed check(s)\ncuda_probe exit status: 0\n")
        with open(self.calls) as f:
            order = [line.split()[0] for line in f]
        self.assertEqual([os.path.basename(x) for x in order],
                         ["nccl_sweep.py"] * 3 + ["nccl_reload.py"] + ["nccl_sweep.py"] * 4)

    def test_out_of_time_steps_are_skipped_and_reported(self):
        outdir = os.path.join(self.dir.name, "late")
        p = self.run_script(self.so, outdir, DEADLINE="0", VARIANTS="proto-ll:NCCL_PROTO=LL")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("run_sweep: ibnet skipped: out of time", p.stdout)
        self.assertIn("run_sweep: reload skipped: out of time", p.stdout)
        self.assertIn("VERDICT: FAIL", p.stdout)
        self.assertFalse(os.path.exists(self.calls))  # nothing was launched
        self.assertEqual(sorted(os.listdir(outdir)),
                         [f for f in OUT_FILES if f != "cuda_probe.log"])

    def test_unpacked_and_without_variants_or_reload(self):
        outdir = os.path.join(self.dir.name, "plain")
        p = self.run_script(self.so, outdir, PACK="0", VARIANTS="", RELOAD="0")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("variant", p.stdout.split("== compare")[1])
        self.assertNotIn("reload:", p.stdout)
        self.assertTrue(os.path.exists(os.path.join(outdir, "runs", "shm.json")))

    def test_bad_plugin_path(self):
        p = self.run_script(os.path.join(self.dir.name, "nope.so"), os.path.join(self.dir.name, "x"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("plugin not found", p.stderr)


if __name__ == "__main__":
    unittest.main()
