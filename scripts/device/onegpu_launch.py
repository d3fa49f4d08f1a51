#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Starts N ranks of a torch.distributed program on one GPU, each as its own NCCL "host".

    onegpu_launch.py --nproc 2 --run-id RUN --timeout-s 90 [--port P] -- prog.py [args...]

Unlike torchrun this launcher has no agent that kills the other ranks when one dies: it
waits for every rank (the dead-rank check needs rank 0 to outlive rank 1). Each rank gets

    RANK=r WORLD_SIZE=N LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=P
    NCCL_HOSTID=<RUN>-rank<r>   (and LD_PRELOAD=<--preload>:... when --preload is given)

so every rank uses GPU 0 and NCCL counts N nodes (one rank each), sending every byte through
its net transport. PYTHONUNBUFFERED=1 also makes C's stdio unbuffered in the ranks (Python
sets it at start-up), so NCCL's log lines (fwrite to stdout, never flushed) are not lost in a
buffer when a rank is killed or leaves with os._exit. Each rank's stdout and stderr come through a pipe of its own and go to this
process's stdout a whole line at a time, so the ranks' lines never run into each other.

At --timeout-s the ranks get SIGTERM, 5 s later SIGKILL; so do they when this launcher gets
SIGTERM or SIGINT (an outer `timeout`). Each rank also dies with the launcher
(PR_SET_PDEATHSIG), so a SIGKILLed launcher leaves no rank behind.

Exit status: 0 when every rank exited 0; 124 on the timeout; otherwise the first non-zero
status in rank order (128+signal for a rank killed by a signal). The last line printed is
`LAUNCH ranks=N status=<r0>,<r1>,... timeout=0|1 elapsed_s=S`.
"""

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
GRACE_S = 5.0


def free_port():
    """A TCP port nobody listens on right now (the rendezvous of torch.distributed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(base, rank, nproc, run_id, port, preload=""):
    """The environment of rank `rank`: base plus the torch.distributed and NCCL_HOSTID keys,
    and `preload` (an NCCL library) in front of LD_PRELOAD when given."""
    env = dict(base)
    if preload:
        env["LD_PRELOAD"] = preload + (":" + base["LD_PRELOAD"] if base.get("LD_PRELOAD") else "")
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "NCCL_HOSTID": f"{run_id}-rank{rank}",
        # Unbuffered Python *and* C stdio (NCCL's log): see the module doc.
        "PYTHONUNBUFFERED": "1",
    })
    return env


def exit_code(rc):
    """A Popen return code as a shell would report it (128+signal for a signal)."""
    return 128 - rc if rc is not None and rc < 0 else rc


def overall(codes, timed_out):
    """The launcher's exit status from the ranks' codes."""
    if timed_out:
        return 124
    for c in codes:
        if c:
            return c
    return 0


def forward(stream, lock, out):
    """Copies a rank's output to `out` a whole line at a time (until EOF)."""
    for line in iter(stream.readline, b""):
        with lock:
            out.write(line if line.endswith(b"\n") else line + b"\n")
            out.flush()
    stream.close()


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--run-id", required=True, help="names the run in NCCL_HOSTID")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--port", type=int, default=0, help="MASTER_PORT (0: a free one)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--preload", default="", help="a library put in front of the ranks' LD_PRELOAD (only theirs)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- program.py [args...]")
    a = p.parse_args(argv)
    if a.cmd and a.cmd[0] == "--":
        a.cmd = a.cmd[1:]
    if not a.cmd or a.nproc < 1:
        p.error("need --nproc >= 1 and a program after --")
    return a


def main(argv=None):
    a = parse_args(argv)
    port = a.port or free_port()
    cmd = ([a.python] if a.cmd[0].endswith(".py") else []) + a.cmd
    t0 = time.monotonic()
    procs = [subprocess.Popen(cmd, env=rank_env(os.environ, r, a.nproc, a.run_id, port, a.preload),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
             for r in range(a.nproc)]
    lock = threading.Lock()
    out = sys.stdout.buffer
    readers = [threading.Thread(target=forward, args=(p.stdout, lock, out), daemon=True) for p in procs]
    for t in readers:
        t.start()
    stop = {"why": None}

    def on_signal(signum, _frame):
        stop["why"] = f"signal {signum}"

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    timed_out = False
    while any(p.poll() is None for p in procs):
        if stop["why"] is None and time.monotonic() - t0 > a.timeout_s:
            stop["why"] = f"timeout {a.timeout_s:g}s"
            timed_out = True
        if stop["why"]:
            with lock:
                out.write(f"LAUNCH stopping the ranks: {stop['why']}\n".encode())
                out.flush()
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            end = time.monotonic() + GRACE_S
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            timed_out = timed_out or stop["why"].startswith("signal")
            break
        time.sleep(0.05)
    for t in readers:
        t.join(timeout=5)  # a grandchild holding the pipe open must not hold us
    codes = [exit_code(p.returncode) for p in procs]
    status = overall(codes, timed_out)
    with lock:
        out.write(f"LAUNCH ranks={a.nproc} status={','.join(str(c) for c in codes)} timeout={int(timed_out)} "
                  f"elapsed_s={time.monotonic() - t0:.1f}\n".encode())
        out.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
