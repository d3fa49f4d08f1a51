#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Unload/reload of the net plugin inside one process, with a thread and mapping census.

Run with torchrun (one process per GPU), NCCL_NET_PLUGIN pointing at ibnet:

    torchrun --standalone --nproc_per_node=2 nccl_reload.py --plugin /abs/libnccl-net.so

The default process group is gloo (CPU), so it holds no NCCL communicator. Each cycle then
creates one NCCL communicator (`new_group(backend="nccl")` plus one checked all_reduce), and
destroys it (`destroy_process_group(group)`). With nothing else holding the plugin, NCCL 2.28
loads it when the communicator is created ("NET/Plugin: Loaded net plugin IBNet (v11)") and,
once the last communicator is finalized, dlcloses it ("Unloading plugin <name>").

Per rank and cycle it prints one line:

    RELOAD rank=0 cycle=1 wrong=0 before=0 during=10 after=0 after_wait=0 mapped_during=1
           mapped_after=0 left=-

- before/during/after: threads of this process whose name starts with "ibnet" (the plugin's
  threads: ibnet-async-<dev>, ibnet-soft-cp<i>, ibnet-soft-mon; /proc/self/task/*/comm),
  before the communicator exists, after the all_reduce, and right after the destroy returns;
  after_wait: the same after up to --grace-s seconds more (tells "late" from "leaked");
- mapped_during/after: whether the plugin's file is still mapped (/proc/self/maps), i.e.
  whether the dlclose really unmapped it (information only: a profiler or tuner handle, or
  thread-local destructors, can keep an image mapped);
- left: the names of the plugin threads still alive after the wait, "-" if none.

Rank 0 first prints `RELOAD config ranks=N cycles=C plugin=PATH`; every rank ends with
`RELOAD rank=R done ok=0|1`. `parse_log`/`verdict` read these lines (and NCCL's) back; compare.py
uses them. Exit status: 0 all cycles correct and no plugin thread left, 1 otherwise.
"""

import argparse
import os
import re
import sys
import time

THREAD_PREFIX = "ibnet"
LOADED = re.compile(r"Loaded net plugin IBNet\b", re.IGNORECASE)
UNLOADING = re.compile(r"Unloading plugin\b", re.IGNORECASE)
NCCL_WARN = re.compile(r"NCCL WARN\b")
RELOAD_LINE = re.compile(r"\bRELOAD (\S.*)$")
EXIT_LINE = re.compile(r"run_sweep: reload exit status (\d+)")
KV = re.compile(r"([a-z_]+)=(\S*)")


def plugin_threads(task_dir="/proc/self/task", prefix=THREAD_PREFIX):
    """Sorted names of this process's threads whose name starts with `prefix`."""
    names = []
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return names
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "comm")) as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended while we looked
        if name.startswith(prefix):
            names.append(name)
    return sorted(names)


def is_mapped(path, maps="/proc/self/maps"):
    """Whether the file `path` (resolved) is mapped into this process."""
    real = os.path.realpath(path)
    try:
        with open(maps) as f:
            return any(line.rstrip("\n").endswith(" " + real) for line in f)
    except OSError:
        return False


def wait_threads_gone(grace_s, poll=plugin_threads):
    """The plugin threads still alive after waiting up to grace_s for them to end."""
    left = poll()
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = poll()
    return left


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plugin", required=True, help="the plugin file NCCL loads (for /proc/self/maps)")
    p.add_argument("--cycles", type=int, default=2)
    p.add_argument("--count", type=int, default=1 << 20, help="float32 elements in the all_reduce")
    p.add_argument("--grace-s", type=float, default=3.0)
    p.add_argument("--timeout-s", type=int, default=120, help="process-group timeout")
    a = p.parse_args(argv)
    if a.cycles < 1 or a.count < 1:
        p.error("need --cycles >= 1 and --count >= 1")
    return a


def one_cycle(torch, dist, dev, rank, n, cycle, args):
    """Create a NCCL communicator, check one all_reduce on it, destroy it; the census line."""
    before = plugin_threads()
    group = dist.new_group(backend="nccl")
    t = torch.full((args.count,), float(rank + cycle), device=dev, dtype=torch.float32)
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    expect = float(sum(q + cycle for q in range(n)))
    wrong = int(torch.count_nonzero(t != expect).item())
    during = plugin_threads()
    mapped_during = is_mapped(args.plugin)
    dist.destroy_process_group(group)
    del group, t
    after = plugin_threads()
    left = wait_threads_gone(args.grace_s)
    row = {
        "rank": rank, "cycle": cycle, "wrong": wrong, "before": len(before), "during": len(during),
        "after": len(after), "after_wait": len(left), "mapped_during": int(mapped_during),
        "mapped_after": int(is_mapped(args.plugin)), "left": ",".join(left) or "-",
    }
    print("RELOAD " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    dist.barrier()  # gloo: the next cycle starts once every rank has destroyed its comm
    return row


def main(argv=None):
    args = parse_args(argv)
    import datetime

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    if rank == 0:
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        print(f"RELOAD config ranks={n} cycles={args.cycles} plugin={args.plugin} nccl={nccl}", flush=True)
    ok = True
    for cycle in range(1, args.cycles + 1):
        row = one_cycle(torch, dist, dev, rank, n, cycle, args)
        ok = ok and row_ok(row)
    print(f"RELOAD rank={rank} done ok={int(ok)}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


def row_ok(row):
    """A cycle is clean: right sum, the plugin's threads seen while the comm lived, none before
    it or right after its destroy."""
    return (row.get("wrong") == 0 and row.get("before") == 0 and (row.get("during") or 0) > 0
            and row.get("after") == 0 and row.get("after_wait") == 0)


def _num(v):
    try:
        return int(v)
    except ValueError:
        return v


def parse_log(text):
    """What a reload log says: config, per-(rank, cycle) rows, done lines, NCCL's load/unload
    and WARN lines, and run_sweep's exit-status line."""
    out = {"config": None, "rows": {}, "done": {}, "loaded": [], "unloading": [], "warn": [],
           "exit_status": None}
    for line in text.splitlines():
        m = RELOAD_LINE.search(line)
        if m:
            words = m.group(1).split()
            kv = {k: _num(v) for k, v in KV.findall(m.group(1))}
            if words[0] == "config":
                out["config"] = kv
            elif "done" in words:
                out["done"][kv.get("rank")] = kv.get("ok") == 1
            elif "rank" in kv and "cycle" in kv:
                out["rows"][(kv["rank"], kv["cycle"])] = kv
            continue
        if LOADED.search(line):
            out["loaded"].append(line)
        elif UNLOADING.search(line):
            out["unloading"].append(line)
        if NCCL_WARN.search(line):
            out["warn"].append(line)
        m = EXIT_LINE.search(line)
        if m:
            out["exit_status"] = int(m.group(1))
    return out


def verdict(parsed):
    """(ok, [reasons]) for a parsed reload log: every rank ran every cycle cleanly (row_ok), NCCL
    loaded and unloaded the plugin once per rank and cycle, no NCCL WARN, exit status 0."""
    cfg = parsed["config"]
    if not cfg:
        return False, ["no 'RELOAD config' line (the program did not start?)"]
    n, cycles = cfg.get("ranks", 0), cfg.get("cycles", 0)
    why = []
    for r in range(n):
        for c in range(1, cycles + 1):
            row = parsed["rows"].get((r, c))
            if row is None:
                why.append(f"rank {r} cycle {c}: no census line")
            elif not row_ok(row):
                why.append(f"rank {r} cycle {c}: wrong={row.get('wrong')} threads before/during/"
                           f"after/after_wait={row.get('before')}/{row.get('during')}/"
                           f"{row.get('after')}/{row.get('after_wait')} left={row.get('left')}")
        if not parsed["done"].get(r):
            why.append(f"rank {r}: no 'done ok=1' line")
    want = n * cycles
    if len(parsed["loaded"]) != want:
        why.append(f"{len(parsed['loaded'])} 'Loaded net plugin IBNet' line(s), want {want}")
    if len(parsed["unloading"]) != want:
        why.append(f"{len(parsed['unloading'])} 'Unloading plugin' line(s), want {want}")
    if parsed["warn"]:
        why.append(f"{len(parsed['warn'])} NCCL WARN line(s), e.g. {parsed['warn'][0].strip()}")
    if parsed["exit_status"] not in (None, 0):
        why.append(f"exit status {parsed['exit_status']}")
    return not why, why


if __name__ == "__main__":
    sys.exit(main())
