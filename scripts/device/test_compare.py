#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Tests for compare.py and nccl_sweep.py's pure helpers, on canned input (no torch, no GPU).

    python3 -m unittest discover -s scripts/device -p 'test_*.py'
"""

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare  # noqa: E402
import nccl_sweep  # noqa: E402  (imports no torch at module level)


def run_doc(label, busbw_by_key, wrong_by_key=None, complete=True):
    wrong_by_key = wrong_by_key or {}
    rows = []
    for (op, size), bw in busbw_by_key.items():
        w = wrong_by_key.get((op, size), 0)
        rows.append({"op": op, "bytes": size, "count": size // 4, "dtype": "float32",
                     "time_us": 1.0, "algbw": bw, "busbw": bw, "wrong": w, "warmup": 1, "iters": 1})
    return {"label": label, "world_size": 2, "nccl_version": "2.28.9", "gpu": "NVIDIA H200",
            "results": rows, "complete": complete, "ok": complete and not any(wrong_by_key.values())}


IBNET_LOG = """\
host:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin IBNet (v11)
host:1:1 [0] NCCL INFO Using network IBNet
host:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IBNet/0
host:1:9 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] [send] via NET/IBNet/0
"""
SOCKET_LOG = "host:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/Socket/0\n"

BIG = 64 << 20


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, content):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def run_compare(self, ib, so, ib_log=IBNET_LOG, so_log=SOCKET_LOG, extra=()):
        args = ["--ibnet", self.write("i.json", ib), "--socket", self.write("s.json", so),
                "--ibnet-log", self.write("i.log", ib_log), "--socket-log", self.write("s.log", so_log),
                "--summary", os.path.join(self.dir.name, "sum.json"), *extra]
        out = io.StringIO()
        rc = compare.main(args, out=out)
        with open(os.path.join(self.dir.name, "sum.json")) as f:
            summary = json.load(f)
        return rc, out.getvalue(), summary

    def test_pass_with_ratio_table(self):
        ib = run_doc("ibnet", {("all_reduce", 8): 0.001, ("all_reduce", BIG): 20.0, ("sendrecv", BIG): 9.0})
        so = run_doc("socket", {("all_reduce", 8): 0.002, ("all_reduce", BIG): 5.0, ("sendrecv", BIG): 6.0})
        rc, text, summary = self.run_compare(ib, so)
        self.assertEqual(rc, 0, text)
        self.assertIn("VERDICT: PASS", text)
        self.assertIn("4.00", text)  # all_reduce ratio at 64 MiB
        self.assertIn("1.50", text)  # sendrecv ratio
        self.assertIn("0.50", text)  # small-size ratio
        self.assertIn("met at 1/2", text)
        self.assertIn("via NET/IBNet/0", text)
        self.assertEqual(summary["goal"], {"ratio": 2.0, "min_bytes": BIG, "rows": 2, "met": 1})
        self.assertEqual(summary["ibnet_proof_lines"], 2)
        rows = {(r["op"], r["bytes"]): r for r in summary["table"]}
        self.assertAlmostEqual(rows[("all_reduce", BIG)]["ratio"], 4.0)
        # Rows are grouped by op in sweep order, sizes ascending.
        self.assertLess(text.index("all_reduce"), text.index("sendrecv"))

    def test_wrong_elements_fail(self):
        ib = run_doc("ibnet", {("broadcast", 1024): 1.0}, wrong_by_key={("broadcast", 1024): 3})
        so = run_doc("socket", {("broadcast", 1024): 1.0})
        rc, text, summary = self.run_compare(ib, so)
        self.assertEqual(rc, 1)
        self.assertIn("3 wrong element(s) in broadcast@1024", text)
        self.assertFalse(summary["ibnet_ok"])
        self.assertTrue(summary["socket_ok"])

    def test_incomplete_and_missing_runs_fail(self):
        ib = run_doc("ibnet", {("all_reduce", 8): 1.0}, complete=False)
        so = run_doc("socket", {("all_reduce", 8): 1.0})
        rc, text, _ = self.run_compare(ib, so)
        self.assertEqual(rc, 1)
        self.assertIn("did not finish", text)

        out = io.StringIO()
        rc = compare.main(["--ibnet", os.path.join(self.dir.name, "absent.json"),
                           "--socket", self.write("s2.json", so)], out=out)
        self.assertEqual(rc, 1)
        self.assertIn("absent.json", out.getvalue())

        rc = compare.main(["--ibnet", self.write("garbage.json", "{not json"),
                           "--socket", self.write("s3.json", so)], out=io.StringIO())
        self.assertEqual(rc, 1)

    def test_missing_proof_or_fallback_fails(self):
        ib = run_doc("ibnet", {("all_reduce", 8): 1.0})
        so = run_doc("socket", {("all_reduce", 8): 1.0})
        rc, text, _ = self.run_compare(ib, so, ib_log="NCCL INFO nothing here\n")
        self.assertEqual(rc, 1)
        self.assertIn("'via NET/IBNet' line(s) - MISSING", text)
        fallback = IBNET_LOG + "host NCCL INFO Channel 02/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n"
        rc, text, summary = self.run_compare(ib, so, ib_log=fallback)
        self.assertEqual(rc, 1)
        self.assertIn("another NET transport", text)
        self.assertEqual(summary["other_transport_lines"], 1)


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
        self.assertEqual(nccl_sweep.bus_factor("broadcast", 2), 1.0)
        self.assertEqual(nccl_sweep.bus_factor("sendrecv", 2), 1.0)

    def test_counts(self):
        self.assertEqual(nccl_sweep.counts("all_reduce", 8, 2), (2, 2))
        self.assertEqual(nccl_sweep.counts("all_gather", 8, 2), (1, 2))
        self.assertEqual(nccl_sweep.counts("reduce_scatter", 8, 2), (2, 1))
        self.assertIsNone(nccl_sweep.counts("all_gather", 8, 4))
        self.assertEqual(nccl_sweep.counts("all_gather", 1 << 30, 2), (1 << 27, 1 << 28))

    def test_iterations_and_args(self):
        self.assertEqual(nccl_sweep.iterations(8), (5, 20))
        self.assertEqual(nccl_sweep.iterations(1 << 30), (1, 3))
        self.assertEqual(nccl_sweep.iterations(1 << 30, warmup=0, iters=1), (0, 1))
        a = nccl_sweep.parse_args(["--json", "x.json", "--max-bytes", "1024", "--ops", "all_reduce,sendrecv"])
        self.assertEqual(a.ops, ["all_reduce", "sendrecv"])
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            nccl_sweep.parse_args(["--json", "x", "--ops", "alltoall"])
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            nccl_sweep.parse_args(["--json", "x", "--min-bytes", "64", "--max-bytes", "8"])


FAKE_TORCHRUN = r"""#!/usr/bin/env python3
# Stands in for torchrun: checks the environment run_sweep.sh sets, writes canned results.
import json, os, sys
args = sys.argv[1:]
label = args[args.index("--label") + 1]
out = args[args.index("--json") + 1]
net = os.environ.get("NCCL_NET")
plugin = os.environ.get("NCCL_NET_PLUGIN")
for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
    assert os.environ.get(k) == "1", k
assert os.environ.get("NCCL_NVLS_ENABLE") == "0"
assert os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") == "1"
if label == "ibnet":
    assert net == "IBNet" and os.path.isabs(plugin) and os.environ.get("IBNET_PROVIDER") == "soft"
    bw = 8.0
else:
    assert net == "Socket" and plugin is None, (net, plugin)
    bw = 2.0
print("NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/%s/0" % net, flush=True)
rows = [{"op": op, "bytes": 64 << 20, "busbw": bw, "algbw": bw, "wrong": 0}
        for op in ("all_reduce", "sendrecv")]
json.dump({"label": label, "world_size": 2, "nccl_version": "2.28.9", "results": rows,
           "complete": True, "ok": True}, open(out, "w"))
"""


class RunSweepScriptTest(unittest.TestCase):
    """run_sweep.sh end to end with a fake torchrun (checks env plumbing, files, exit status)."""

    def test_run_sweep_plumbing(self):
        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "fake_torchrun.py")
            with open(fake, "w") as f:
                f.write(FAKE_TORCHRUN)
            os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
            so = os.path.join(d, "libnccl-net-ibnet.so")
            open(so, "w").close()
            outdir = os.path.join(d, "out")
            env = dict(os.environ, TORCHRUN=f"{sys.executable} {fake}", RUN_TIMEOUT="30")
            env.pop("NCCL_NET_PLUGIN", None)
            p = subprocess.run(["bash", os.path.join(here, "run_sweep.sh"), so, outdir],
                               env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("VERDICT: PASS", p.stdout)
            self.assertIn("met at 2/2", p.stdout)
            for name in ("ibnet.log", "ibnet.json", "socket.log", "socket.json", "compare.txt", "summary.json"):
                self.assertTrue(os.path.exists(os.path.join(outdir, name)), name)
            p = subprocess.run(["bash", os.path.join(here, "run_sweep.sh"), os.path.join(d, "nope.so"), outdir],
                               env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2)


if __name__ == "__main__":
    unittest.main()
