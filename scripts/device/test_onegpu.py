#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Tests for the one-GPU mode: topo_fuse.py, onegpu_launch.py, nccl_deadrank.py's pure parts,
compare_onegpu.py on canned runs, run_onegpu.sh end to end in its dry run (fake_rank.py in
place of python3: no torch, no GPU), build_nccl.sh with a fake make and prep_nccl_src.sh on a
small git repository.

    python3 -m unittest discover -s scripts/device -p 'test_*.py'
"""

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_onegpu  # noqa: E402
import fake_rank  # noqa: E402
import nccl_deadrank  # noqa: E402
import onegpu_launch  # noqa: E402
import topo_fuse  # noqa: E402

MIB = 1 << 20


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def executable(path, text):
    write(path, text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def shape(e):
    """An element's tag, attributes and children, without the whitespace between them."""
    return (e.tag, dict(e.attrib), [shape(c) for c in e])


class TopoFuseTest(unittest.TestCase):
    def fuse(self, text, names=("soft0", "soft1")):
        root = ET.fromstring(text)
        done = topo_fuse.fuse_ready(root, list(names))
        return root, done, topo_fuse.dump(root)

    def test_each_net_gets_its_own_made_up_pci_nic_under_the_cpu(self):
        root, done, out = self.fuse(fake_rank.DUMP)
        cpu = root.find("cpu")
        self.assertEqual([c.tag for c in cpu], ["pci", "pci", "pci"])  # the GPU's, soft0's, soft1's
        self.assertIsNone(cpu.find("nic"), "the shared <nic> is left empty and dropped")
        for name, bus in (("soft0", "0000:e0:00.0"), ("soft1", "0000:e1:00.0")):
            pci = cpu.find(f"pci[@busid='{bus}']")
            self.assertEqual(pci.get("class"), "0x020000")
            self.assertEqual(pci.get("link_speed"), "16.0 GT/s PCIe")
            self.assertEqual(pci.get("link_width"), "16")
            nets = pci.findall("nic/net")
            self.assertEqual([n.get("name") for n in nets], [name])
            self.assertEqual(nets[0].get("dev"), name[-1])  # the net's attributes travel with it
        self.assertEqual(len(done), 2)
        self.assertIn("soft1: moved under a made-up PCI NIC 0000:e1:00.0", done[1])
        # Written as NCCL writes its dump: its reader takes " />" as an attribute.
        self.assertNotIn(" />", out)
        self.assertTrue(out.startswith('<system version="1">\n  <cpu host_hash="0x1" numaid="0"'))
        self.assertIn('      <gpu dev="0" sm="90" rank="0" gdr="0"/>\n', out)
        self.assertEqual(shape(ET.fromstring(out)), shape(root))

    def test_bus_numbers_in_use_are_skipped(self):
        text = fake_rank.DUMP.replace("0000:18:00.0", "0000:e0:00.0")
        root, _, _ = self.fuse(text)
        buses = [p.get("busid") for p in root.iter("pci") if p.find("nic") is not None]
        self.assertEqual(buses, ["0000:e1:00.0", "0000:e2:00.0"])

    def test_a_net_with_a_pci_nic_is_left_alone_and_a_missing_one_is_an_error(self):
        root = ET.fromstring(fake_rank.DUMP)
        topo_fuse.fuse_ready(root, ["soft0"])
        done = topo_fuse.fuse_ready(root, ["soft0", "soft1"])
        self.assertIn("soft0: already under <pci busid=0000:e0:00.0>", done[0])
        with self.assertRaises(ValueError) as e:
            topo_fuse.fuse_ready(ET.fromstring(fake_rank.DUMP), ["soft0", "mlx5_0"])
        self.assertIn("no <net name=...> for mlx5_0", str(e.exception))
        self.assertIn("it has: soft0, soft1", str(e.exception))

    def test_main_writes_the_file_and_reports_errors(self):
        with tempfile.TemporaryDirectory() as d:
            src = write(os.path.join(d, "dump.xml"), fake_rank.DUMP)
            out = os.path.join(d, "fused.xml")
            with contextlib.redirect_stdout(io.StringIO()) as o:
                self.assertEqual(topo_fuse.main([src, out, "soft0", "soft1"]), 0)
            self.assertIn("topo_fuse: wrote", o.getvalue())
            self.assertEqual(len(ET.parse(out).getroot().findall("cpu/pci/nic/net")), 2)
            with contextlib.redirect_stderr(io.StringIO()) as e:
                self.assertEqual(topo_fuse.main([src, out, "soft2"]), 1)
                self.assertEqual(topo_fuse.main([os.path.join(d, "none.xml"), out, "soft0"]), 2)
                self.assertEqual(topo_fuse.main([src]), 2)
            self.assertIn("cannot read", e.getvalue())


RANK_PROG = r"""
import os, signal, sys, time
r = int(os.environ["RANK"])
print("rank", r, os.environ["NCCL_HOSTID"], os.environ["LOCAL_RANK"], os.environ.get("LD_PRELOAD", "-"), flush=True)
mode = sys.argv[1]
if mode == "die" and r == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "die":
    time.sleep(0.5)
    print("rank 0 outlived rank 1", flush=True)
if mode == "sleep":
    time.sleep(60)
if mode == "cprint":
    import ctypes
    ctypes.CDLL(None).printf(b"C stdio line of rank %d\n", r)  # as NCCL logs: C stdout, no flush
    os._exit(0)
"""


class LauncherTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.prog = write(os.path.join(self.dir.name, "prog.py"), RANK_PROG)

    def launch(self, mode, *extra):
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, os.path.join(HERE, "onegpu_launch.py"), "--run-id", "t", *extra,
                            "--", self.prog, mode], capture_output=True, text=True, timeout=60)
        return p, time.monotonic() - t0

    def test_rank_env(self):
        e = onegpu_launch.rank_env({"LD_PRELOAD": "/x.so", "A": "1"}, 1, 2, "run7", 4242, "/nccl/libnccl.so.2.30.7")
        self.assertEqual((e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["MASTER_PORT"]), ("1", "2", "0", "4242"))
        self.assertEqual(e["NCCL_HOSTID"], "run7-rank1")
        self.assertEqual(e["LD_PRELOAD"], "/nccl/libnccl.so.2.30.7:/x.so")
        self.assertNotIn("LD_PRELOAD", onegpu_launch.rank_env({}, 0, 2, "r", 1))
        self.assertEqual(onegpu_launch.exit_code(-9), 137)
        self.assertEqual(onegpu_launch.overall([0, 137], False), 137)
        self.assertEqual(onegpu_launch.overall([0, 0], True), 124)
        self.assertEqual(onegpu_launch.overall([0, 0], False), 0)

    def test_two_ranks_one_gpu_each_its_own_host(self):
        p, _ = self.launch("ok", "--preload", "/p/libnccl.so.2")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("rank 0 t-rank0 0 /p/libnccl.so.2", p.stdout)
        self.assertIn("rank 1 t-rank1 0 /p/libnccl.so.2", p.stdout)
        self.assertIn("LAUNCH ranks=2 status=0,0 timeout=0", p.stdout)

    def test_a_dead_rank_does_not_take_the_other_down(self):
        p, _ = self.launch("die")
        self.assertEqual(p.returncode, 137, p.stdout + p.stderr)
        self.assertIn("rank 0 outlived rank 1", p.stdout)
        self.assertIn("LAUNCH ranks=2 status=0,137 timeout=0", p.stdout)

    def test_c_stdio_lines_survive_os_exit(self):
        p, _ = self.launch("cprint")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("C stdio line of rank 0\n", p.stdout)
        self.assertIn("C stdio line of rank 1\n", p.stdout)

    def test_timeout_stops_every_rank(self):
        p, took = self.launch("sleep", "--timeout-s", "1")
        self.assertEqual(p.returncode, 124, p.stdout + p.stderr)
        self.assertIn("LAUNCH stopping the ranks: timeout 1s", p.stdout)
        self.assertRegex(p.stdout, r"LAUNCH ranks=2 status=143,143 timeout=1")
        self.assertLess(took, 30)

    def test_args(self):
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            onegpu_launch.parse_args(["--run-id", "x"])
        a = onegpu_launch.parse_args(["--run-id", "x", "--", "p.py", "--json", "j"])
        self.assertEqual(a.cmd, ["p.py", "--json", "j"])


class DeadrankHelpersTest(unittest.TestCase):
    def test_helpers(self):
        self.assertEqual(nccl_deadrank.one_line("a\n  b\tc"), "a b c")
        self.assertEqual(len(nccl_deadrank.one_line("x" * 5000, limit=100)), 100)
        with tempfile.TemporaryDirectory() as d:
            k = os.path.join(d, "k")
            self.assertIsNone(nccl_deadrank.read_kill_time(k))
            write(k, "12.5\n")
            self.assertEqual(nccl_deadrank.read_kill_time(k), 12.5)
            write(k, "")
            self.assertIsNone(nccl_deadrank.read_kill_time(k))
        a = nccl_deadrank.parse_args(["--json", "j", "--kill-file", "k"])
        self.assertEqual((a.bytes, a.max_wait_s), (1 << 20, 20.0))


def sweep_doc(label, bw, sizes=(8, 64 << 10, 16 * MIB), wrong=None, complete=True, planned=None):
    rows = [{"op": op, "bytes": s, "busbw": bw(op, s) if callable(bw) else bw, "algbw": 1.0,
             "wrong": (wrong or {}).get((op, s), 0)} for op in ("all_reduce", "sendrecv") for s in sizes]
    return {"label": label, "world_size": 2, "nccl_version": "2.28.9", "gpu": "H200", "results": rows,
            "planned": len(rows) if planned is None else planned, "complete": complete, "ok": complete}


def nccl_log(via, version="2.28.9", nnodes=2, plugin=True, extra=""):
    lines = [f"h:1:1 [0] NCCL INFO NCCL version {version}+cuda13.0"]
    if plugin:
        lines.append("h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin IBNet (v11)")
    lines += [f"h:1:1 [0] NCCL INFO comm 0x1 rank {r} nRanks 2 nNodes {nnodes} localRanks 1 localRank 0 MNNVL 0"
              for r in (0, 1)]
    lines += [f"h:1:9 [0] NCCL INFO Channel 0{c}/0 : 0[0] -> 1[0] [send] via {via}" for c in range(2)]
    return "\n".join(lines) + "\n" + extra


RAIL_WARN = "h:1:9 [0] NCCL WARN NET/IBNET : rail 1 (soft1) of the virtual NIC failed; its traffic moved to rail 0\n"


class CompareOnegpuTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.runs = os.path.join(self.dir.name, "runs")
        self.put("ibnet", sweep_doc("ibnet", lambda op, s: 10.0 if s >= 16 * MIB else 1.2), nccl_log("NET/IBNet/0"))
        self.put("socket", sweep_doc("socket", lambda op, s: 3.0 if s >= 16 * MIB else 1.0),
                 nccl_log("NET/Socket/0", plugin=False))
        self.put("fused", sweep_doc("fused", 6.0), nccl_log("NET/IBNet/2/GDRDMA"))
        self.put("fused-fault", sweep_doc("fused-fault", 4.0), nccl_log("NET/IBNet/2", extra=RAIL_WARN))
        self.put("proto-ll", sweep_doc("proto-ll", 1.0), nccl_log("NET/IBNet/0"))
        for label in ("ibnet", "socket"):
            self.dead(label, {"outcome": "error", "elapsed_s": 0.53, "ops_ok": 70,
                              "error": "DistBackendError: NCCL communicator was aborted: remote process exited"},
                      "h:1:9 [0] NCCL WARN NET/IBNET : peer 127.0.0.1<40123> closed its bootstrap connection\n")
        self.probe = write(os.path.join(self.dir.name, "probe.log"), "proxy_gpu_probe: PASS\n")

    def put(self, label, doc, log):
        write(os.path.join(self.runs, f"{label}.json"), json.dumps(doc))
        write(os.path.join(self.runs, f"{label}.log"), log)

    def dead(self, label, doc, log):
        self.put(f"dead-{label}", doc, log)

    def compare(self, *args):
        out = io.StringIO()
        summary = os.path.join(self.dir.name, "s.json")
        rc = compare_onegpu.main(["--runs", self.runs, "--variant", "proto-ll", "--probe-log", self.probe,
                                  "--optional", "reload,perf", "--summary", summary, *args], out=out)
        with open(summary) as f:
            return rc, out.getvalue(), json.load(f)

    def test_everything_green(self):
        rc, out, s = self.compare("--expect-nccl", "2.28.9")
        self.assertEqual(rc, 0, out)
        self.assertIn("VERDICT: PASS", out)
        self.assertIn("ibnet       : OK (6 rows, 0 wrong, 2 'via NET/IBNet' lines) [6/6 rows; NCCL 2.28.9; "
                      "IBNet (v11); nNodes [2]]", out)
        self.assertIn("goal ibnet/Socket >= 2.5 at >= 16 MiB: MET at 2/2 (min 3.33, max 3.33)", out)
        self.assertIn("goal ibnet/Socket >= 1 at <= 64 KiB: MET at 4/4 (min 1.20, max 1.20)", out)
        self.assertIn("dead rank ibnet : error after 0.53 s (70 ops ok), peer named: yes (address)", out)
        self.assertIn("failed-rail WARNs: 1 naming rail 1 (soft1)", out)
        self.assertIn("proxy_gpu_probe: OK", out)
        row = next(r for r in s["table"] if r["op"] == "all_reduce" and r["bytes"] == 16 * MIB)
        self.assertEqual((row["ibnet"], row["socket"], row["fused"], row["fault"]), (10.0, 3.0, 6.0, 4.0))
        self.assertTrue(all(g["met"] for g in s["goals"] if not g["goal"].startswith("ibnet in NCCL")), s["goals"])
        self.assertNotIn("reload", s["verdicts"])  # optional and absent

    def test_the_wrong_nccl_version_or_one_node_fails(self):
        rc, out, _ = self.compare("--expect-nccl", "2.30.7")
        self.assertEqual(rc, 1)
        self.assertIn("NCCL version 2.28.9, want 2.30.7", out)
        self.put("socket", sweep_doc("socket", 3.0), nccl_log("NET/Socket/0", nnodes=1, plugin=False))
        rc, out, s = self.compare()
        self.assertIn("socket      : FAIL", out)
        self.assertIn("nNodes != nRanks: [(2, 1)] (not one rank per node)", out)
        self.assertFalse(s["verdicts"]["socket"])

    def test_fused_must_use_the_fused_device(self):
        self.put("fused", sweep_doc("fused", 6.0), nccl_log("NET/IBNet/0"))
        rc, out, s = self.compare()
        self.assertEqual(rc, 1)
        self.assertIn("channels via NET/IBNet/0 (want only NET/IBNet/2)", out)
        self.assertFalse(next(g for g in s["goals"] if g["goal"].startswith("fused"))["met"])

    def test_a_hung_failed_rail_run_says_where_it_stopped(self):
        doc = sweep_doc("fused-fault", 4.0, complete=False, planned=9)
        doc["results"] = doc["results"][:4]
        stall = "h:1:9 [0] NCCL WARN NET/IBNET : isend to 127.0.0.1<1> has waited 15s for clear-to-send\n"
        self.put("fused-fault", doc, nccl_log("NET/IBNet/2", extra=RAIL_WARN + stall))
        rc, out, s = self.compare()
        self.assertEqual(rc, 1)
        self.assertIn("fused-fault : FAIL (4 rows, 0 wrong", out)
        self.assertIn("[4/9 rows;", out)
        self.assertIn("    stopped after sendrecv 8 B", out)
        self.assertIn("stall-watch lines: 1", out)
        self.assertIn("VERDICT: FAIL (fused-fault)", out)
        self.assertEqual(s["fault"]["stalls"], 1)

    def test_no_rail_warn_misses_the_fused_goal(self):
        self.put("fused-fault", sweep_doc("fused-fault", 4.0), nccl_log("NET/IBNet/2"))
        rc, out, s = self.compare()
        self.assertEqual(rc, 0, out)  # correct data: a verdict holds, the goal does not
        g = next(g for g in s["goals"] if g["goal"].startswith("fused"))
        self.assertEqual(g["why"], ["no WARN naming a failed rail"])

    def test_dead_rank_hang_slow_or_anonymous(self):
        self.dead("ibnet", {"outcome": "hang", "elapsed_s": None, "error": "no error within 20 s of the kill"}, "")
        rc, out, s = self.compare()
        self.assertEqual(rc, 1)
        self.assertIn("VERDICT: FAIL (dead-ibnet)", out)
        self.dead("ibnet", {"outcome": "error", "elapsed_s": 3.1, "error": "remote process exited"}, "")
        rc, out, s = self.compare()
        self.assertEqual(rc, 0, out)
        g = next(g for g in s["goals"] if g["goal"].startswith("dead"))
        self.assertEqual((g["met"], g["ibnet_s"], g["names_peer"], g["socket_s"]), (False, 3.1, False, 0.53))
        self.assertIn("peer named: no", out)
        os.remove(os.path.join(self.runs, "dead-socket.json"))
        rc, out, s = self.compare()
        self.assertIn("dead rank socket: missing", out)

    def test_wrong_elements_and_ratio_misses(self):
        self.put("ibnet", sweep_doc("ibnet", 2.0, wrong={("sendrecv", 8): 3}), nccl_log("NET/IBNet/0"))
        rc, out, s = self.compare()
        self.assertEqual(rc, 1)
        self.assertIn("3 wrong element(s) in sendrecv@8", out)
        self.assertIn("goal 0 wrong elements anywhere: NOT MET", out)
        self.assertIn("misses: all_reduce@16777216=0.67, sendrecv@16777216=0.67", out)

    def test_missing_steps_fail_unless_optional(self):
        for f in ("fused.json", "fused.log", "fused-fault.json", "fused-fault.log"):
            os.remove(os.path.join(self.runs, f))
        rc, out, _ = self.compare()
        self.assertEqual(rc, 1)
        self.assertIn("fused       : FAIL (0 rows", out)
        rc, out, s = self.compare("--optional", "fused,reload")
        self.assertNotIn("fused", s["verdicts"])

    def test_ibnet_alone_against_ibnet_in_nccl(self):
        big = (8, 16 * MIB, 64 * MIB)
        self.put("ibnet", sweep_doc("ibnet", lambda op, s: 4.5 if s == 64 * MIB else 10.0, sizes=big),
                 nccl_log("NET/IBNet/0"))
        rc, out, s = self.compare()
        g = next(g for g in s["goals"] if g["goal"].startswith("ibnet in NCCL"))
        self.assertEqual((g["met"], g["why"]), (False, "ibnet-perf not run"))
        self.assertNotIn("ibnet-perf", s["verdicts"])  # optional here
        perf = {"meta": {}, "results": [{"size": 256 << 10, "bw_gbps": 4.0}, {"size": 512 << 10, "bw_gbps": 5.0},
                                        {"size": 1 << 20, "bw_gbps": 9.0}]}
        write(os.path.join(self.runs, "perf.json"), json.dumps(perf))
        rc, out, s = self.compare()
        g = next(g for g in s["goals"] if g["goal"].startswith("ibnet in NCCL"))
        self.assertEqual((g["met"], g["ratio"], g["perf_bytes"], g["perf_bw"]), (True, 0.9, 512 << 10, 5.0))
        self.assertIn("ibnet-perf  : OK - ibnet alone, GB/s by size: 262144:4.000 524288:5.000 1048576:9.000", out)
        rc, out, s = self.compare("--perf-goal", "0.95")
        self.assertFalse(next(g for g in s["goals"] if g["goal"].startswith("ibnet in NCCL"))["met"])
        write(os.path.join(self.runs, "perf.json"), "not json")
        rc, out, s = self.compare("--optional", "reload")
        self.assertFalse(s["verdicts"]["ibnet-perf"])
        self.assertIn("ibnet-perf  : FAIL (no result)", out)

    def test_merge_of_two_versions(self):
        paths = []
        for name, ok in (("a", True), ("b", False)):
            p = os.path.join(self.dir.name, f"{name}.json")
            write(p, json.dumps({"pass": ok, "nccl_versions": ["2.28.9" if ok else "2.30.7"],
                                 "verdicts": {"ibnet": True, "fused-fault": ok},
                                 "goals": [{"goal": "0 wrong elements anywhere", "met": True}],
                                 "table": [{"op": "all_reduce", "bytes": 16 * MIB, "ibnet": 9.0, "ib_socket": 3.0}]}))
            paths.append(p)
        out = io.StringIO()
        self.assertEqual(compare_onegpu.main(["--merge", *paths], out=out), 1)
        text = out.getvalue()
        self.assertIn("NCCL 2.28.9: PASS", text)
        self.assertIn("NCCL 2.30.7: FAIL (fused-fault)", text)
        self.assertIn("VERDICT (all versions): FAIL", text)
        self.assertRegex(text, r"all_reduce +16777216 +3\.00 \(  9\.000\) +3\.00 \(  9\.000\)")
        out = io.StringIO()
        self.assertEqual(compare_onegpu.main(["--merge", paths[0]], out=out), 0)
        self.assertIn("VERDICT (all versions): PASS", out.getvalue())


OUT_FILES = ["compare.txt", "driver.log", "proof.log", "runs.tar.gz", "summary.json"]
FAKE_PERF = r"""#!/bin/sh
# Stands in for ibnet-perf: checks its arguments and the provider, prints canned JSON.
[ "$IBNET_PROVIDER" = soft ] || exit 3
case "$*" in *"--plugin /"*"--loopback --bw-only"*"--json"*) ;; *) exit 4 ;; esac
echo '{"meta": {"mode": "loopback"}, "results": [{"size": 524288, "bw_gbps": 5.0}]}'
"""


class RunOnegpuScriptTest(unittest.TestCase):
    """run_onegpu.sh end to end in its dry run: env plumbing, files, budget, exit status."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        d = self.dir.name
        self.so = write(os.path.join(d, "libnccl-net-ibnet.so"), "")
        self.nccl = write(os.path.join(d, "libnccl.so.2.30.7"), "")
        self.probe = executable(os.path.join(d, "proxy_gpu_probe"), "#!/bin/sh\necho 'proxy_gpu_probe: PASS'\n")
        self.perf = executable(os.path.join(d, "ibnet-perf"), FAKE_PERF)
        self.calls = os.path.join(d, "calls")
        self.env = dict(os.environ, DRY_RUN="1", PYTHON=os.path.join(HERE, "fake_rank.py"), FAKE_CALLS=self.calls,
                        MPS_DIR=os.path.join(d, "mps"))
        for k in ("NCCL_NET_PLUGIN", "NCCL_NET", "NCCL_PROTO", "VARIANTS", "DEADLINE", "PACK", "LD_PRELOAD"):
            self.env.pop(k, None)

    def run_script(self, *args, **env):
        return subprocess.run(["bash", os.path.join(HERE, "run_onegpu.sh"), *args], env=dict(self.env, **env),
                              capture_output=True, text=True, timeout=180)

    def calls_of(self):
        with open(self.calls) as f:
            return [line.split() for line in f]

    def test_dry_run_image_nccl(self):
        out = os.path.join(self.dir.name, "out")
        p = self.run_script(self.so, out, EXPECT_NCCL="2.28.9")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("VERDICT: PASS", p.stdout)
        self.assertIn("ibnet       : OK (8 rows, 0 wrong, 4 'via NET/IBNet' lines) [8/8 rows; NCCL 2.28.9;", p.stdout)
        self.assertEqual(sorted(os.listdir(out)), OUT_FILES)
        with tarfile.open(os.path.join(out, "runs.tar.gz")) as t:
            names = set(t.getnames())
        for label in ("ibnet", "socket", "dead-ibnet", "dead-socket", "fused", "fused-fault", "topo-dump",
                      "proto-ll", "proto-ll128", "proto-simple", "qps4-ch4"):
            self.assertIn(f"runs/{label}.log", names)
        self.assertIn("runs/topo-fused.xml", names)
        self.assertIn("runs/reload.log", names)
        calls = self.calls_of()
        # Each rank its own host: the run, the step and the rank in NCCL_HOSTID; no preload.
        ib = [c for c in calls if c[:2] == ["nccl_sweep.py", "ibnet"]]
        self.assertEqual(sorted(c[2] for c in ib), ["0", "1"])
        self.assertEqual(len({c[3] for c in ib}), 2)
        self.assertTrue(all(c[3].startswith("onegpu-image-") and "-ibnet-rank" in c[3] for c in ib), ib)
        self.assertTrue(all(c[4] == "-" for c in calls))
        order = []
        for c in calls:
            if (c[0], c[1]) not in order:
                order.append((c[0], c[1]))
        sweep, dead = "nccl_sweep.py", "nccl_deadrank.py"
        self.assertEqual(order, [(sweep, "ibnet"), (sweep, "socket"), (dead, "ibnet"), (dead, "socket"),
                                 (sweep, "topo-dump"), (sweep, "fused"), (sweep, "fused-fault"),
                                 ("nccl_reload.py", "-"), (sweep, "proto-ll"), (sweep, "proto-ll128"),
                                 (sweep, "proto-simple"), (sweep, "qps4-ch4")])
        with open(os.path.join(out, "proof.log")) as f:
            proof = f.read()
        with open(os.path.join(out, "compare.txt")) as f:
            self.assertIn("(information) two unfused soft devices, topo-dump   : OK (4 rows", f.read())
        self.assertIn("== fused-fault", proof)
        self.assertIn("rail 1 (soft1)", proof)
        self.assertIn("DEADRANK rank=0 label=ibnet outcome=error", proof)
        with open(os.path.join(out, "driver.log")) as f:
            driver = f.read()
        self.assertIn("mps: off (MPS=1 DRY_RUN=1)", driver)
        self.assertIn("VERDICT: PASS", driver)

    def test_dry_run_built_nccl_and_probe(self):
        out = os.path.join(self.dir.name, "out")
        p = self.run_script(self.so, out, "--nccl", self.nccl, "--probe", self.probe, "--perf", self.perf,
                            FAKE_WANT_PRELOAD=self.nccl,
                            VARIANTS="proto-ll:NCCL_PROTO=LL", RELOAD="0", DEAD="0")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(sorted(os.listdir(out)), sorted(OUT_FILES + ["probe.log"]))
        with open(os.path.join(out, "compare.txt")) as f:
            text = f.read()
        self.assertIn("NCCL 2.30.7 from its log", text)
        self.assertIn("proxy_gpu_probe: OK", text)
        self.assertIn("ibnet-perf  : OK - ibnet alone, GB/s by size: 524288:5.000", text)
        self.assertNotIn("dead rank ibnet", text)
        self.assertIn('goal dead rank: error within 2 s naming the peer: NOT MET {"why": "not run"}', text)
        self.assertTrue(all(c[4] == self.nccl for c in self.calls_of()))

    def test_a_hung_step_is_cut_and_recorded(self):
        out = os.path.join(self.dir.name, "out")
        t0 = time.monotonic()
        p = self.run_script(self.so, out, FAKE_HANG="fused-fault", FAULT_TIMEOUT="10", VARIANTS="", RELOAD="0",
                            PACK="0")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertLess(time.monotonic() - t0, 120)
        self.assertIn("run_sweep: fused-fault exit status 124", p.stdout)
        self.assertIn("stopped after all_reduce 16777216 B", p.stdout)
        self.assertIn("VERDICT: FAIL (fused-fault)", p.stdout)
        with open(os.path.join(out, "runs", "fused-fault.json")) as f:
            self.assertEqual(len(json.load(f)["results"]), 3)

    def test_term_stops_the_step_in_flight_and_leaves_nothing_running(self):
        out = os.path.join(self.dir.name, "term")
        pids = os.path.join(self.dir.name, "pids")
        p = subprocess.Popen(["bash", os.path.join(HERE, "run_onegpu.sh"), self.so, out],
                             env=dict(self.env, FAKE_HANG="ibnet", FAKE_PIDS=pids), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertTrue(os.path.exists(pids), "the hung step never started")
        p.terminate()
        text, _ = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 143, text)
        self.assertIn("run_onegpu: terminated", text)
        with open(pids) as f:
            for pid in map(int, f.read().split()):
                with self.assertRaises(ProcessLookupError, msg=f"rank pid {pid} still runs"):
                    os.kill(pid, 0)

    def test_keep_results_names_files_by_the_run_date(self):
        src = os.path.join(self.dir.name, "back")
        write(os.path.join(src, "compare.txt"), "date: 2026-12-04T01:02:03Z run: r nccl: image\nVERDICT: PASS\n")
        write(os.path.join(src, "summary.json"), "{}")
        results = os.path.join(self.dir.name, "repo", "scripts", "device")
        os.makedirs(os.path.join(results, "results"))
        script = os.path.join(results, "keep_results.sh")
        with open(os.path.join(HERE, "keep_results.sh")) as f:
            executable(script, f.read())
        p = subprocess.run(["bash", script, src, "h200x1-nccl2.28.9"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sorted(os.listdir(os.path.join(results, "results"))),
                         ["2026-12-04-h200x1-nccl2.28.9-compare.txt", "2026-12-04-h200x1-nccl2.28.9-summary.json"])
        p = subprocess.run(["bash", script, self.dir.name, "x"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)

    def test_out_of_time_steps_are_skipped(self):
        out = os.path.join(self.dir.name, "late")
        p = self.run_script(self.so, out, DEADLINE="0", VARIANTS="proto-ll:NCCL_PROTO=LL")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("run_sweep: ibnet skipped: out of time", p.stdout)
        self.assertIn("run_onegpu: no fused topology file (see runs/topo-dump.log); fused runs skipped", p.stdout)
        self.assertIn("fused       : FAIL (0 rows", p.stdout)
        self.assertIn("VERDICT: FAIL", p.stdout)
        self.assertFalse(os.path.exists(self.calls))

    def test_bad_arguments(self):
        for args in ((os.path.join(self.dir.name, "none.so"), "x"), (self.so, "x", "--nccl", "/none/libnccl.so.2"),
                     (self.so, "x", "--bogus"), (self.so,)):
            p = self.run_script(*[os.path.join(self.dir.name, a) if a == "x" else a for a in args])
            self.assertEqual(p.returncode, 2, (args, p.stdout, p.stderr))


FAKE_MPS = r"""#!/bin/bash
# Stands in for nvidia-cuda-mps-control: -d starts a "daemon" (a sleep) and writes its pid and
# control file where the real one does; "quit" on stdin ends it.
d="$CUDA_MPS_PIPE_DIRECTORY"
if [ "${1:-}" = -d ]; then
  echo "start" >>"$FAKE_MPS_LOG"
  mkdir -p "$d"
  setsid sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! >"$d/nvidia-cuda-mps-control.pid"
  : >"$d/control"
  exit 0
fi
read -r cmd
echo "$cmd" >>"$FAKE_MPS_LOG"
if [ "$cmd" = quit ] && [ -f "$d/nvidia-cuda-mps-control.pid" ]; then
  kill "$(cat "$d/nvidia-cuda-mps-control.pid")"
  rm -f "$d/nvidia-cuda-mps-control.pid" "$d/control"
fi
"""


class MpsTest(unittest.TestCase):
    """run_onegpu.sh's MPS handling with a fake nvidia-cuda-mps-control and a scripted CUDA
    context check (fake_rank.py): start, restart when refused, quit a stale daemon, check after
    a failed step, always stop."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        d = self.dir.name
        self.bin = os.path.join(d, "bin")
        executable(os.path.join(self.bin, "nvidia-cuda-mps-control"), FAKE_MPS)
        executable(os.path.join(self.bin, "nvidia-smi"), "#!/bin/sh\necho 'GPU 0: fake'\n")
        self.so = write(os.path.join(d, "libnccl-net-ibnet.so"), "")
        self.mps_dir = os.path.join(d, "mps")
        self.log = os.path.join(d, "mps.log")
        self.env = dict(os.environ, PATH=self.bin + ":" + os.environ["PATH"], PYTHON=os.path.join(HERE, "fake_rank.py"),
                        MPS_DIR=self.mps_dir, FAKE_MPS_LOG=self.log, FAKE_CUDA_STATE=os.path.join(d, "cuda-calls"),
                        VARIANTS="", RELOAD="0", FUSED="0", PACK="0")
        for k in ("DRY_RUN", "LD_PRELOAD", "DEADLINE"):
            self.env.pop(k, None)
        self.addCleanup(self.kill_daemon)

    def kill_daemon(self):
        pidf = os.path.join(self.mps_dir, "pipe", "nvidia-cuda-mps-control.pid")
        if os.path.exists(pidf):
            with open(pidf) as f:
                try:
                    os.kill(int(f.read()), 9)
                except (ValueError, ProcessLookupError):
                    pass

    def daemon_alive(self):
        pidf = os.path.join(self.mps_dir, "pipe", "nvidia-cuda-mps-control.pid")
        return os.path.exists(pidf)

    def run_script(self, **env):
        out = os.path.join(self.dir.name, "out")
        p = subprocess.run(["bash", os.path.join(HERE, "run_onegpu.sh"), self.so, out], env=dict(self.env, **env),
                           capture_output=True, text=True, timeout=120)
        with open(self.log) as f:
            return p, f.read().split()

    def test_started_checked_after_the_dead_rank_steps_and_stopped(self):
        p, calls = self.run_script()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("mps: on (pipe", p.stdout)
        self.assertIn("mps: stopped", p.stdout)
        self.assertEqual(calls, ["start", "quit"])
        self.assertFalse(self.daemon_alive())
        with open(self.env["FAKE_CUDA_STATE"]) as f:
            self.assertEqual(f.read(), "3")  # after the start, after each dead-rank step

    def test_refused_context_restarts_mps_once(self):
        p, calls = self.run_script(FAKE_CUDA_RCS="46,0")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("mps: restarting", p.stdout)
        self.assertIn("mps: on after a restart", p.stdout)
        self.assertEqual(calls, ["start", "quit", "start", "quit"])
        self.assertFalse(self.daemon_alive())

    def test_refused_twice_runs_without_mps(self):
        p, calls = self.run_script(FAKE_CUDA_RCS="46,46,0")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("mps: unusable; running without MPS (time-sliced)", p.stdout)
        self.assertEqual(calls, ["start", "quit", "start", "quit"])

    def test_refused_after_a_failed_step_restarts(self):
        p, calls = self.run_script(FAKE_CUDA_RCS="0,46,0")
        self.assertIn("mps: refused a context after a failed step; restarting", p.stdout)
        self.assertEqual(calls, ["start", "quit", "start", "quit"])
        self.assertFalse(self.daemon_alive())

    def test_a_stale_daemon_is_asked_to_quit_first(self):
        pipe = os.path.join(self.mps_dir, "pipe")
        os.makedirs(pipe)
        stale = subprocess.Popen(["sleep", "300"], start_new_session=True)
        self.addCleanup(stale.kill)
        write(os.path.join(pipe, "nvidia-cuda-mps-control.pid"), str(stale.pid))
        write(os.path.join(pipe, "control"), "")
        p, calls = self.run_script()
        self.assertEqual(calls, ["quit", "start", "quit"])
        self.assertEqual(stale.wait(timeout=10), -15)

    def test_term_stops_mps(self):
        pids = os.path.join(self.dir.name, "pids")
        p = subprocess.Popen(["bash", os.path.join(HERE, "run_onegpu.sh"), self.so, os.path.join(self.dir.name, "o")],
                             env=dict(self.env, FAKE_HANG="ibnet", FAKE_PIDS=pids), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertTrue(self.daemon_alive())
        p.terminate()
        text, _ = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 143, text)
        self.assertIn("mps: stopped", text)
        self.assertFalse(self.daemon_alive())


FAKE_MAKE = r"""#!/bin/sh
echo "make $*" >>"$FAKE_MAKE_LOG"
for a in "$@"; do case "$a" in BUILDDIR=*) b="${a#BUILDDIR=}";; esac; done
mkdir -p "$b/lib" && : >"$b/lib/libnccl.so.2.30.7"
"""


class BuildScriptsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_build_nccl_makes_only_the_library_for_sm90(self):
        d = self.dir.name
        src = os.path.join(d, "nccl")
        write(os.path.join(src, "makefiles", "version.mk"),
              "NCCL_MAJOR   := 2\nNCCL_MINOR   := 30\nNCCL_PATCH   := 7\nNCCL_SUFFIX  :=\n")
        gen = executable(os.path.join(src, "src", "misc", "gen.py"), "")
        os.chmod(gen, 0o644)
        bindir = os.path.join(d, "bin")
        executable(os.path.join(bindir, "make"), FAKE_MAKE)
        cuda = os.path.join(d, "cuda")
        executable(os.path.join(cuda, "bin", "nvcc"), "#!/bin/sh\n")
        log = os.path.join(d, "make.log")
        env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"], FAKE_MAKE_LOG=log, CUDA_HOME=cuda, JOBS="3")
        p = subprocess.run(["bash", os.path.join(HERE, "build_nccl.sh"), src, os.path.join(d, "out")], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(f"build_nccl: built {d}/out/lib/libnccl.so.2.30.7", p.stdout)
        with open(log) as f:
            self.assertEqual(f.read().strip(), f"make -C {src} -j 3 src.lib BUILDDIR={d}/out CUDA_HOME={cuda} "
                                               "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90")
        self.assertTrue(os.access(gen, os.X_OK))
        p = subprocess.run(["bash", os.path.join(HERE, "build_nccl.sh"), d, os.path.join(d, "o")], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("not an NCCL source tree", p.stderr)

    def test_prep_nccl_src_copies_the_tag_without_history(self):
        d = self.dir.name
        repo = os.path.join(d, "nccl")
        write(os.path.join(repo, "makefiles", "version.mk"), "NCCL_MAJOR   := 2\nNCCL_MINOR   := 30\nNCCL_PATCH   := 7\n")
        write(os.path.join(repo, "src", "init.cc"), "int x;\n")
        write(os.path.join(repo, "Makefile"), "all:\n")
        write(os.path.join(repo, "LICENSE.txt"), "license\n")
        write(os.path.join(repo, "docs", "big.md"), "not needed\n")
        git = ["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"]
        for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"], ["tag", "v2.30.7-1"]):
            subprocess.run(git + cmd, check=True, capture_output=True)
        dest = os.path.join(d, "dest")
        p = subprocess.run(["bash", os.path.join(HERE, "prep_nccl_src.sh"), repo, "v2.30.7-1", dest],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(sorted(os.listdir(dest)), ["LICENSE.txt", "Makefile", "makefiles", "src"])
        self.assertIn("NCCL 2.30.7", p.stdout)
        p = subprocess.run(["bash", os.path.join(HERE, "prep_nccl_src.sh"), repo, "v9.9.9-1", dest],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)


if __name__ == "__main__":
    unittest.main()
