#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""A rank that dies mid-stream: how long the survivor's NCCL call takes to fail, and what it says.

Run with onegpu_launch.py (not torchrun, whose agent would kill rank 0 as soon as rank 1 dies),
two ranks, TORCH_NCCL_BLOCKING_WAIT=1:

    onegpu_launch.py --nproc 2 --run-id R -- nccl_deadrank.py --json dead.json --kill-file k.txt

Both ranks run --warm checked 1 MiB all_reduces. Then rank 1 runs --kill-after more, starts
one more without waiting for it, writes the wall-clock time to --kill-file and SIGKILLs
itself. Rank 0 runs blocking 1 MiB all_reduces until one raises; the time from rank 1's kill
to the raise is the detection latency. Rank 0 prints

    DEADRANK rank=0 outcome=error elapsed_s=0.531 ops_ok=70 error=<the exception, one line>

(outcome=hang when nothing raised within --max-wait-s of the kill, outcome=no-kill when rank 1
never got there), writes the same to --json and leaves at once with os._exit (NCCL's
finalize could wait on the dead peer). The NCCL WARN lines of the log and the exception text
must name the peer; compare_onegpu.py judges that. Exit status: 0 for outcome=error, 3 hang,
4 no-kill, 1 wrong data before the kill.
"""

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--kill-file", required=True, help="rank 1 writes its kill time here")
    p.add_argument("--label", default=os.environ.get("NCCL_NET", "default"))
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--warm", type=int, default=20)
    p.add_argument("--kill-after", type=int, default=50)
    p.add_argument("--max-wait-s", type=float, default=20.0)
    p.add_argument("--timeout-s", type=int, default=30, help="process-group timeout")
    return p.parse_args(argv)


def one_line(text, limit=1500):
    """An exception's text on one line, at most `limit` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def read_kill_time(path):
    """Rank 1's kill time (seconds since the epoch), or None before it wrote it."""
    try:
        with open(path) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def flush_c_stdio():
    """Writes out what C code (NCCL's log: fwrite to stdout, never flushed) still buffers, before
    os._exit skips it."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def report(doc, path):
    line = " ".join(f"{k}={doc[k]}" for k in ("rank", "label", "outcome", "elapsed_s", "ops_ok") if k in doc)
    print(f"DEADRANK {line} error={doc.get('error', '-')}", flush=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    flush_c_stdio()


def watchdog(args, doc, done):
    """Rank 0: outcome=hang once --max-wait-s have passed since the kill with no error."""
    while not done.is_set():
        t_kill = read_kill_time(args.kill_file)
        if t_kill is not None and time.time() - t_kill > args.max_wait_s:
            doc.update(outcome="hang", elapsed_s=None, t_kill=t_kill,
                       error=f"no error within {args.max_wait_s:g} s of the kill")
            report(doc, args.json)
            os._exit(3)
        time.sleep(0.05)


def main(argv=None):
    args = parse_args(argv)
    import datetime

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.timeout_s), device_id=dev)
    count = args.bytes // 4
    x = torch.ones(count, device=dev, dtype=torch.float32)
    doc = {"rank": rank, "label": args.label, "bytes": args.bytes, "world_size": n,
           "blocking_wait": os.environ.get("TORCH_NCCL_BLOCKING_WAIT"), "ops_ok": 0}
    for _ in range(args.warm):
        x.fill_(1.0)
        dist.all_reduce(x)
    torch.cuda.synchronize()
    wrong = int(torch.count_nonzero(x != float(n)).item())
    dist.barrier(device_ids=[local])
    if wrong:
        doc.update(outcome="wrong", error=f"{wrong} wrong elements in the warm-up")
        report(doc, args.json)
        os._exit(1)
    if rank == 1:
        for _ in range(args.kill_after):
            dist.all_reduce(x)
        dist.all_reduce(x, async_op=True)  # in flight when we die
        with open(args.kill_file + ".tmp", "w") as f:
            f.write(f"{time.time():.6f}\n")
        os.replace(args.kill_file + ".tmp", args.kill_file)
        print(f"DEADRANK rank=1 SIGKILL after {args.warm + args.kill_after} all_reduces", flush=True)
        flush_c_stdio()
        os.kill(os.getpid(), signal.SIGKILL)
    if rank != 0:
        return 0
    done = threading.Event()
    threading.Thread(target=watchdog, args=(args, doc, done), daemon=True).start()
    t_last_ok = time.time()
    limit = args.kill_after + 100000
    try:
        for _ in range(limit):
            dist.all_reduce(x)  # blocking under TORCH_NCCL_BLOCKING_WAIT=1
            doc["ops_ok"] += 1
            t_last_ok = time.time()
        torch.cuda.synchronize()
        done.set()
        doc.update(outcome="no-kill", error=f"{limit} all_reduces finished; rank 1 never died")
        report(doc, args.json)
        os._exit(4)
    except Exception as e:  # noqa: BLE001 - the error is the measurement
        t_err = time.time()
        done.set()
        t_kill = read_kill_time(args.kill_file)
        doc.update(outcome="error", t_kill=t_kill, t_err=t_err,
                   elapsed_s=round(t_err - t_kill, 3) if t_kill is not None else None,
                   since_last_ok_s=round(t_err - t_last_ok, 3),
                   error_type=type(e).__name__, error=one_line(e))
        report(doc, args.json)
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
