#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""NCCL collective sweep through PyTorch, with every result checked.

Run with torchrun (one process per GPU):

    torchrun --standalone --nproc_per_node=2 nccl_sweep.py --json out.json [--max-bytes N]

For each size (8 B doubling up to --max-bytes) and each op (all_reduce, all_gather,
reduce_scatter, broadcast, sendrecv, all_to_all) it:

1. fills the input with deterministic per-rank data: small integers in float32,
   f(rank, i) = ((7*i + 13*rank + 5*salt) mod 17) - 8, so every sum is exact;
2. runs the op once and compares the output, element by element, with a reference
   computed directly from f (never through NCCL) -> #wrong;
3. times warm-up + iterations with CUDA events (max over ranks);
4. runs and checks once more (the buffers have been hammered by the timed loop).

Sizes follow nccl-tests: all_gather's size is the whole output, reduce_scatter's the whole
input, sendrecv's the bytes each rank sends, all_to_all's the whole buffer each rank sends
(n blocks, block q to rank q). busbw = algbw * factor with factor 2(n-1)/n (all_reduce),
(n-1)/n (all_gather, reduce_scatter, all_to_all), 1 (broadcast, sendrecv).

Rank 0 prints one row per (op, size) and rewrites the JSON after every row, so a run cut
short by a timeout still leaves its results. Exit status: 0 all correct, 1 any wrong
element, 2 setup error.
"""

import argparse
import json
import os
import sys
import time

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv", "all_to_all")
SPLIT_OPS = ("all_gather", "reduce_scatter", "all_to_all")  # sizes split into n blocks
ELEM = 4  # float32


def sizes(min_bytes, max_bytes):
    """8, 16, 32, ... up to max_bytes (inclusive), starting at min_bytes."""
    out, s = [], max(ELEM, min_bytes)
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out


def bus_factor(op, n):
    """nccl-tests' busbw factor."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in SPLIT_OPS:
        return (n - 1) / n
    return 1.0


def counts(op, size, n):
    """(elements in the input, elements in the output) for an op at nccl-tests size `size`,
    or None when the size cannot be split over n ranks."""
    total = size // ELEM
    if op in SPLIT_OPS:
        chunk = total // n
        if chunk == 0:
            return None
        if op == "all_gather":
            return (chunk, chunk * n)
        if op == "reduce_scatter":
            return (chunk * n, chunk)
        return (chunk * n, chunk * n)
    if total == 0:
        return None
    return (total, total)


def iterations(size, warmup=None, iters=None):
    """Few iterations at large sizes keep the whole sweep inside a few minutes."""
    if size <= 1 << 20:
        w, i = 5, 20
    elif size <= 64 << 20:
        w, i = 2, 8
    else:
        w, i = 1, 3
    return (w if warmup is None else warmup, i if iters is None else iters)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="where rank 0 writes the results")
    p.add_argument("--label", default=os.environ.get("NCCL_NET", "default"))
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    p.add_argument("--warmup", type=int, default=None, help="override warm-up iterations")
    p.add_argument("--iters", type=int, default=None, help="override timed iterations")
    p.add_argument("--timeout-s", type=int, default=300, help="process-group timeout")
    a = p.parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error("unknown op(s): " + ",".join(bad))
    if a.min_bytes < 1 or a.max_bytes < a.min_bytes:
        p.error("need 1 <= --min-bytes <= --max-bytes")
    a.ops = ops
    return a


ENV_KEYS = (
    "NCCL_NET", "NCCL_NET_PLUGIN", "IBNET_PROVIDER", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
    "NCCL_NVLS_ENABLE", "NCCL_PROTO", "NCCL_ALGO", "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_HOSTID", "IBNET_SOFT_DEVICES", "NCCL_NET_FORCE_MERGE",
    "NCCL_TOPO_FILE", "IBNET_SOFT_FAULTS", "IBNET_SOFT_FAULTS_DEV", "LD_PRELOAD",
)


class Harness:
    """Builds each op's buffers, runs it and checks it against a reference computed from f
    directly (never through NCCL). Needs torch; one instance per rank."""

    def __init__(self, torch, dist, dev, rank, n):
        self.torch, self.dist, self.dev, self.rank, self.n = torch, dist, dev, rank, n

    def data(self, r, count, salt, start=0):
        """f(r, i) for i in start..start+count, as float32 (small integers: sums are exact)."""
        torch = self.torch
        i = torch.arange(start, start + count, device=self.dev, dtype=torch.int64)
        return (((i * 7 + r * 13 + salt * 5) % 17) - 8).to(torch.float32)

    def reference(self, op, cin, cout, salt):
        """What this rank's output must hold after `op`."""
        torch, n, r = self.torch, self.n, self.rank
        if op in ("all_reduce", "reduce_scatter"):
            start = r * cout if op == "reduce_scatter" else 0
            acc = torch.zeros(cout, device=self.dev, dtype=torch.float32)
            for q in range(n):
                acc += self.data(q, cout, salt, start=start)
            return acc
        if op == "all_gather":
            return torch.cat([self.data(q, cin, salt) for q in range(n)])
        if op == "all_to_all":
            # Block q of the output is block r of rank q's input.
            chunk = cout // n
            return torch.cat([self.data(q, chunk, salt, start=r * chunk) for q in range(n)])
        if op == "broadcast":
            return self.data(0, cout, salt)
        return self.data((r - 1) % n, cout, salt)  # sendrecv: ring, receive from the left

    def make(self, op, cin, cout, salt):
        """(input, output, run): the buffers and a closure that runs the op once
        (stream-ordered on the current stream)."""
        torch, dist, n, rank = self.torch, self.dist, self.n, self.rank
        inp = self.data(rank, cin, salt)
        if op == "all_reduce":
            return inp, inp, lambda: dist.all_reduce(inp)
        if op == "broadcast":
            return inp, inp, lambda: dist.broadcast(inp, src=0)
        out = torch.empty(cout, device=self.dev, dtype=torch.float32)
        if op == "all_gather":
            return inp, out, lambda: dist.all_gather_into_tensor(out, inp)
        if op == "reduce_scatter":
            return inp, out, lambda: dist.reduce_scatter_tensor(out, inp)
        if op == "all_to_all":
            return inp, out, lambda: dist.all_to_all_single(out, inp)

        def sendrecv():
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, inp, (rank + 1) % n),
                    dist.P2POp(dist.irecv, out, (rank - 1) % n),
                ]
            )
            for r in reqs:
                r.wait()

        return inp, out, sendrecv

    def check(self, op, inp, out, run, cin, cout, salt):
        """Refill the input, run once, count wrong output elements over all ranks."""
        inp.copy_(self.data(self.rank, cin, salt))
        run()
        exp = self.reference(op, cin, cout, salt)
        wrong = self.torch.count_nonzero(out != exp)
        self.dist.all_reduce(wrong)  # total over ranks
        return int(wrong.item())

    def max_over_ranks(self, x):
        t = self.torch.tensor([x], device=self.dev, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def measure(self, op, size, args):
        """One table row for (op, size), or None when the size cannot be split over n ranks."""
        torch, dist = self.torch, self.dist
        c = counts(op, size, self.n)
        if c is None:
            return None
        cin, cout = c
        salt = (size.bit_length() * 31 + OPS.index(op)) % 97
        inp, out, run = self.make(op, cin, cout, salt)
        wrong = self.check(op, inp, out, run, cin, cout, salt)
        warm, iters = iterations(size, args.warmup, args.iters)
        for _ in range(warm):
            run()
        torch.cuda.synchronize()
        dist.barrier(device_ids=[self.dev.index])
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        end.synchronize()
        sec = self.max_over_ranks(start.elapsed_time(end) / 1e3 / max(iters, 1))
        wrong += self.check(op, inp, out, run, cin, cout, salt + 1)
        algbw = size / 1e9 / sec if sec > 0 else 0.0
        return {
            "op": op, "bytes": size, "count": cout, "dtype": "float32",
            "time_us": sec * 1e6, "algbw": algbw, "busbw": algbw * bus_factor(op, self.n),
            "wrong": wrong, "warmup": warm, "iters": iters,
        }


def save(doc, path):
    """Write the JSON atomically (a reader never sees half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


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
    dist.init_process_group(
        "nccl", timeout=datetime.timedelta(seconds=args.timeout_s), device_id=dev
    )
    h = Harness(torch, dist, dev, rank, n)
    nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
    doc = {
        "label": args.label,
        "world_size": n,
        "nccl_version": nccl_version,
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(dev),
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "results": [],
        "planned": sum(1 for s in sizes(args.min_bytes, args.max_bytes) for o in args.ops
                       if counts(o, s, n) is not None),
        "complete": False,
        "ok": False,
    }
    if rank == 0:
        print(f"# nccl_sweep label={args.label} ranks={n} nccl={nccl_version} torch={torch.__version__}")
        print(f"# env {doc['env']}")
        print(f"# {'op':<15}{'bytes':>12}{'count':>12}{'time_us':>12}{'algbw':>9}{'busbw':>9}{'#wrong':>8}")
        save(doc, args.json)
    total_wrong = 0
    t_start = time.time()
    for size in sizes(args.min_bytes, args.max_bytes):
        for op in args.ops:
            row = h.measure(op, size, args)
            if row is None:
                continue
            total_wrong += row["wrong"]
            doc["results"].append(row)
            if rank == 0:
                print(
                    f"  {op:<15}{size:>12}{row['count']:>12}{row['time_us']:>12.1f}"
                    f"{row['algbw']:>9.3f}{row['busbw']:>9.3f}{row['wrong']:>8}",
                    flush=True,
                )
                save(doc, args.json)
        torch.cuda.empty_cache()
    doc["complete"] = True
    doc["ok"] = total_wrong == 0
    doc["elapsed_s"] = time.time() - t_start
    if rank == 0:
        save(doc, args.json)
        print(f"# total #wrong = {total_wrong}; {'OK' if total_wrong == 0 else 'WRONG RESULTS'}; "
              f"{doc['elapsed_s']:.1f} s")
    dist.barrier(device_ids=[local])
    dist.destroy_process_group()
    return 0 if total_wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
