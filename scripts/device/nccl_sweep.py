#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""NCCL collective sweep through PyTorch, with every result checked.

Run with torchrun (one process per GPU):

    torchrun --standalone --nproc_per_node=2 nccl_sweep.py --json out.json [--max-bytes N]

For each size (8 B doubling up to --max-bytes) and each op (all_reduce, all_gather,
reduce_scatter, broadcast, sendrecv) it:

1. fills the input with deterministic per-rank data: small integers in float32,
   f(rank, i) = ((7*i + 13*rank + 5*salt) mod 17) - 8, so every sum is exact;
2. runs the op once and compares the output, element by element, with a reference
   computed directly from f (never through NCCL) -> #wrong;
3. times warm-up + iterations with CUDA events (max over ranks);
4. runs and checks once more (the buffers have been hammered by the timed loop).

Sizes follow nccl-tests: all_gather's size is the whole output, reduce_scatter's the whole
input, sendrecv's the bytes each rank sends. busbw = algbw * factor with factor
2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter), 1 (broadcast, sendrecv).

Rank 0 prints one row per (op, size) and rewrites the JSON after every row, so a run cut
short by a timeout still leaves its results. Exit status: 0 all correct, 1 any wrong
element, 2 setup error.
"""

import argparse
import json
import os
import sys
import time

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv")
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
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def counts(op, size, n):
    """(elements in the input, elements in the output) for an op at nccl-tests size `size`,
    or None when the size cannot be split over n ranks."""
    total = size // ELEM
    if op in ("all_gather", "reduce_scatter"):
        chunk = total // n
        if chunk == 0:
            return None
        return (chunk, chunk * n) if op == "all_gather" else (chunk * n, chunk)
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

    def data(r, count, salt, start=0):
        i = torch.arange(start, start + count, device=dev, dtype=torch.int64)
        return (((i * 7 + r * 13 + salt * 5) % 17) - 8).to(torch.float32)

    def reference(op, r, cin, cout, salt):
        if op == "all_reduce":
            acc = torch.zeros(cout, device=dev, dtype=torch.float32)
            for q in range(n):
                acc += data(q, cout, salt)
            return acc
        if op == "all_gather":
            return torch.cat([data(q, cin, salt) for q in range(n)])
        if op == "reduce_scatter":
            acc = torch.zeros(cout, device=dev, dtype=torch.float32)
            for q in range(n):
                acc += data(q, cout, salt, start=r * cout)
            return acc
        if op == "broadcast":
            return data(0, cout, salt)
        return data((r - 1) % n, cout, salt)  # sendrecv: ring, receive from the left

    def make(op, cin, cout, salt):
        """Buffers plus a closure that runs the op once (stream-ordered on the current stream)."""
        inp = data(rank, cin, salt)
        if op == "all_reduce":
            return inp, inp, lambda: dist.all_reduce(inp)
        if op == "broadcast":
            return inp, inp, lambda: dist.broadcast(inp, src=0)
        out = torch.empty(cout, device=dev, dtype=torch.float32)
        if op == "all_gather":
            return inp, out, lambda: dist.all_gather_into_tensor(out, inp)
        if op == "reduce_scatter":
            return inp, out, lambda: dist.reduce_scatter_tensor(out, inp)

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

    def check(op, inp, out, run, cin, cout, salt):
        inp.copy_(data(rank, cin, salt))
        run()
        exp = reference(op, rank, cin, cout, salt)
        wrong = torch.count_nonzero(out != exp)
        dist.all_reduce(wrong)  # total over ranks
        return int(wrong.item())

    def max_over_ranks(x):
        t = torch.tensor([x], device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
    env_keys = [
        "NCCL_NET", "NCCL_NET_PLUGIN", "IBNET_PROVIDER", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
        "NCCL_NVLS_ENABLE", "NCCL_PROTO", "NCCL_ALGO",
    ]
    doc = {
        "label": args.label,
        "world_size": n,
        "nccl_version": nccl_version,
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(dev),
        "env": {k: os.environ[k] for k in env_keys if k in os.environ},
        "results": [],
        "complete": False,
        "ok": False,
    }

    def save():
        if rank != 0:
            return
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.json)

    if rank == 0:
        print(f"# nccl_sweep label={args.label} ranks={n} nccl={nccl_version} torch={torch.__version__}")
        print(f"# env {doc['env']}")
        print(f"# {'op':<15}{'bytes':>12}{'count':>12}{'time_us':>12}{'algbw':>9}{'busbw':>9}{'#wrong':>8}")
    save()
    total_wrong = 0
    t_start = time.time()
    for size in sizes(args.min_bytes, args.max_bytes):
        for op in args.ops:
            c = counts(op, size, n)
            if c is None:
                continue
            cin, cout = c
            salt = (size.bit_length() * 31 + OPS.index(op)) % 97
            inp, out, run = make(op, cin, cout, salt)
            wrong = check(op, inp, out, run, cin, cout, salt)
            warm, iters = iterations(size, args.warmup, args.iters)
            for _ in range(warm):
                run()
            torch.cuda.synchronize()
            dist.barrier(device_ids=[local])
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                run()
            end.record()
            end.synchronize()
            sec = max_over_ranks(start.elapsed_time(end) / 1e3 / max(iters, 1))
            wrong += check(op, inp, out, run, cin, cout, salt + 1)
            total_wrong += wrong
            algbw = size / 1e9 / sec if sec > 0 else 0.0
            busbw = algbw * bus_factor(op, n)
            row = {
                "op": op, "bytes": size, "count": cout, "dtype": "float32",
                "time_us": sec * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong,
                "warmup": warm, "iters": iters,
            }
            doc["results"].append(row)
            if rank == 0:
                print(
                    f"  {op:<15}{size:>12}{cout:>12}{sec * 1e6:>12.1f}{algbw:>9.3f}{busbw:>9.3f}{wrong:>8}",
                    flush=True,
                )
            save()
            del inp, out, run
        torch.cuda.empty_cache()
    doc["complete"] = True
    doc["ok"] = total_wrong == 0
    doc["elapsed_s"] = time.time() - t_start
    save()
    if rank == 0:
        print(f"# total #wrong = {total_wrong}; {'OK' if total_wrong == 0 else 'WRONG RESULTS'}; "
              f"{doc['elapsed_s']:.1f} s")
    dist.barrier(device_ids=[local])
    dist.destroy_process_group()
    return 0 if total_wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
