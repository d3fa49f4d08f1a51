#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""A stand-in for python3 in run_onegpu.sh's dry run (DRY_RUN=1 PYTHON="python3 fake_rank.py"):
no torch, no GPU.

Run as `fake_rank.py <script> [args...]`: for nccl_sweep.py, nccl_deadrank.py and
nccl_reload.py it acts as one rank of them: it checks the environment run_onegpu.sh and
onegpu_launch.py give each rank (NCCL_HOSTID per rank, GPU 0, NVLink multicast off, the
transport's variables, LD_PRELOAD only with --nccl) and prints the NCCL log lines and writes
the results the real program would, so that the whole driver, compare_onegpu.py included,
runs end to end. Any other script (onegpu_launch.py, topo_fuse.py, compare_onegpu.py, "-")
is run by the real interpreter. FAKE_CALLS, if set, names a file that gets one line per
rank: "<script> <label> RANK NCCL_HOSTID LD_PRELOAD".
"""

import json
import os
import signal
import sys
import time

DUMP = """<system version="1">
  <cpu host_hash="0x1" numaid="0" affinity="ffffffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:18:00.0" class="0x030200" vendor="0x10de" device="0x2335" subsystem_vendor="0x10de" subsystem_device="0x18be" link_speed="32.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="90" rank="0" gdr="0"/>
    </pci>
    <nic>
      <net name="soft0" dev="0" latency="0" speed="100000" port="1" guid="0x4942" maxconn="1024" gdr="0" keep="1" net="1"/>
      <net name="soft1" dev="1" latency="0" speed="100000" port="1" guid="0x4942" maxconn="1024" gdr="0" keep="1" net="1"/>
    </nic>
  </cpu>
</system>
"""


def arg(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def check_env(env, script):
    rank = int(env["RANK"])
    assert env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "0", env
    assert env["NCCL_HOSTID"].endswith(f"-rank{rank}"), env["NCCL_HOSTID"]
    assert env.get("NCCL_NVLS_ENABLE") == "0" and env.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") == "1"
    assert env.get("NVSHMEM_DISABLE_NVLS") == "1" and env.get("NCCL_P2P_DISABLE") == "1"
    want = env.get("FAKE_WANT_PRELOAD")
    if want:
        assert env.get("LD_PRELOAD", "").split(":")[0] == want, env.get("LD_PRELOAD")
    else:
        assert "LD_PRELOAD" not in env, env.get("LD_PRELOAD")
    net = env.get("NCCL_NET")
    if net == "IBNet":
        assert os.path.isabs(env["NCCL_NET_PLUGIN"]) and env.get("IBNET_PROVIDER") == "soft", env
    else:
        assert net == "Socket" and "NCCL_NET_PLUGIN" not in env, env
    return rank


def version(env):
    return "2.30.7" if "2.30.7" in env.get("LD_PRELOAD", "") else "2.28.9"


def nccl_lines(env, rank, via):
    v = version(env)
    print(f"h:{os.getpid()}:1 [0] NCCL INFO NCCL version {v}+cuda13.0", flush=True)
    if env.get("NCCL_NET") == "IBNet":
        print(f"h:{os.getpid()}:1 [0] NCCL INFO NET/Plugin: Loaded net plugin IBNet (v11)")
    print(f"h:{os.getpid()}:1 [0] NCCL INFO comm 0x1 rank {rank} nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0")
    for ch in range(2):
        print(f"h:{os.getpid()}:9 [0] NCCL INFO Channel {ch:02d}/0 : {rank}[0] -> {1 - rank}[0] [send] via {via}",
              flush=True)


def sweep(env, rank, args):
    label, out = arg(args, "--label"), arg(args, "--json")
    maxb = int(arg(args, "--max-bytes"))
    fused = "NCCL_TOPO_FILE" in env
    if env.get("NCCL_NET") == "IBNet":
        via = "NET/IBNet/2" if fused else "NET/IBNet/0"
    else:
        via = "NET/Socket/0"
    if "NCCL_TOPO_DUMP_FILE" in env:
        assert env.get("IBNET_SOFT_DEVICES") == "2" and env.get("NCCL_NET_MERGE_LEVEL") == "LOC", env
        if rank == 0:
            with open(env["NCCL_TOPO_DUMP_FILE"], "w") as f:
                f.write(DUMP)
    if fused:
        assert env.get("NCCL_NET_FORCE_MERGE") == "soft0,soft1" and env.get("IBNET_SOFT_DEVICES") == "2", env
        with open(env["NCCL_TOPO_FILE"]) as f:
            assert 'class="0x020000"' in f.read()
    if label.startswith("proto-"):
        assert env.get("NCCL_PROTO") == label.split("-")[1].upper(), (label, env.get("NCCL_PROTO"))
    nccl_lines(env, rank, via)
    if label == "fused-fault":
        assert env.get("IBNET_SOFT_FAULTS", "").startswith("seed=7,wr_fail=3000") and env.get("IBNET_SOFT_FAULTS_DEV") == "1"
        print(f"h:{os.getpid()}:9 [0] NCCL WARN NET/IBNET : rail 1 (soft1) of the virtual NIC failed "
              "(RetryExceeded); its traffic moved to rail 0 (soft0)", flush=True)
    if rank != 0:
        return 0
    bw = {"ibnet": 10.0, "socket": 3.0}.get(label, 8.0)
    sizes = [s for s in (8, 64 << 10, 16 << 20, 256 << 20) if s <= maxb]
    rows = [{"op": op, "bytes": s, "busbw": bw if s > 1 << 16 else (1.2 if label == "ibnet" else 1.0),
             "algbw": bw, "wrong": 0} for op in ("all_reduce", "all_to_all") for s in sizes]
    hang = env.get("FAKE_HANG") == label
    done = rows[: len(rows) // 2] if hang else rows
    doc = {"label": label, "world_size": 2, "nccl_version": "2.28.9", "gpu": "fake", "planned": len(rows),
           "results": done, "env": {"NCCL_HOSTID": env["NCCL_HOSTID"]}, "complete": not hang, "ok": not hang}
    with open(out, "w") as f:
        json.dump(doc, f)
    if hang:
        if env.get("FAKE_PIDS"):
            with open(env["FAKE_PIDS"], "a") as f:
                f.write(f"{os.getpid()}\n")
        time.sleep(3600)
    print("# total #wrong = 0; OK; 1.0 s")
    return 0


def deadrank(env, rank, args):
    assert env.get("TORCH_NCCL_BLOCKING_WAIT") == "1", env
    label = arg(args, "--label")
    nccl_lines(env, rank, "NET/IBNet/0" if label == "ibnet" else "NET/Socket/0")
    kill = arg(args, "--kill-file")
    if rank == 1:
        with open(kill, "w") as f:
            f.write(f"{time.time():.6f}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    peer = "127.0.0.1<40123>" if label == "ibnet" else "127.0.0.1<40125>"
    print(f"h:{os.getpid()}:9 [0] NCCL WARN NET/IBNET : peer {peer} closed its bootstrap connection")
    doc = {"rank": 0, "label": label, "outcome": "error", "elapsed_s": 0.5, "ops_ok": 70,
           "error": f"NCCL Error 6: remote process exited or there was a network error; last error: peer {peer}"}
    with open(arg(args, "--json"), "w") as f:
        json.dump(doc, f)
    print(f"DEADRANK rank=0 label={label} outcome=error elapsed_s=0.5 ops_ok=70 error={doc['error']}")
    return 0


def reload(env, rank, args):
    p = arg(args, "--plugin")
    assert env.get("NCCL_NET_PLUGIN") == p and os.path.islink(p), (p, env.get("NCCL_NET_PLUGIN"))
    if rank == 0:
        print(f"RELOAD config ranks=2 cycles=2 plugin={p} nccl=2.28.9", flush=True)
    time.sleep(0.1 * rank)
    for c in (1, 2):
        print(f"h:1:1 [{rank}] NCCL INFO NET/Plugin: Loaded net plugin IBNet (v11)")
        print(f"h:1:1 [{rank}] NCCL INFO Unloading plugin {p if c == 1 else ''}")
        print(f"RELOAD rank={rank} cycle={c} wrong=0 before=0 during=10 after=0 after_wait=0 "
              f"mapped_during=1 mapped_after=0 left=-", flush=True)
    print(f"RELOAD rank={rank} done ok=1", flush=True)
    return 0


def cuda_check(env):
    """run_onegpu.sh's CUDA context check (`python3 -` and a script on stdin): the exit status
    of call k is the k-th entry of FAKE_CUDA_RCS ("0,46,0": fine, refused, fine; 0 past its
    end); FAKE_CUDA_STATE counts the calls."""
    sys.stdin.read()
    state = env["FAKE_CUDA_STATE"]
    try:
        with open(state) as f:
            k = int(f.read() or 0)
    except OSError:
        k = 0
    with open(state, "w") as f:
        f.write(str(k + 1))
    rcs = [int(x) for x in env.get("FAKE_CUDA_RCS", "").split(",") if x]
    rc = rcs[k] if k < len(rcs) else 0
    print(f"cuda check: fake call {k + 1}: {rc}" + (" CUDA_ERROR_DEVICE_UNAVAILABLE" if rc else ""))
    return rc


def main():
    args = sys.argv[1:]
    script = os.path.basename(args[0]) if args else "-"
    if script == "-" and os.environ.get("FAKE_CUDA_STATE"):
        return cuda_check(os.environ)
    handlers = {"nccl_sweep.py": sweep, "nccl_deadrank.py": deadrank, "nccl_reload.py": reload}
    if script not in handlers:
        os.execv(sys.executable, [sys.executable] + args)
    env = os.environ
    rank = check_env(env, script)
    if env.get("FAKE_CALLS"):
        with open(env["FAKE_CALLS"], "a") as f:
            f.write(f"{script} {arg(args, '--label', '-')} {rank} {env['NCCL_HOSTID']} {env.get('LD_PRELOAD', '-')}\n")
    return handlers[script](env, rank, args[1:])


if __name__ == "__main__":
    sys.exit(main())
