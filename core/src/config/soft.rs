//! The soft provider's variables (`IBNET_SOFT_*`). `ibnet_soft::Config` parses them with
//! these ranges ([`super::var::Kind::parse`]); its defaults depend on the host (cores, memory), so
//! they are computed there and only described here.

use super::var::Kind::{Int, Text};
use super::var::Reader::Soft;
use super::var::Since::Ibnet;
use super::var::Var;

/// The most soft devices one process opens (`IBNET_SOFT_DEVICES`).
pub const MAX_DEVICES: i64 = 8;

/// The soft provider's variables, in README's order.
pub const VARS: &[Var] = &[
    Var::new(
        "IBNET_SOFT_DEVICES",
        Int { min: 1, max: MAX_DEVICES },
        "1",
        Ibnet,
        "soft provider: open `soft0`..`soft{N-1}` (1..=8), each its own provider instance (fused-NIC tests on one host)",
    ),
    Var::new(
        "IBNET_SOFT_FAULTS_DEV",
        Int { min: 0, max: MAX_DEVICES - 1 },
        "",
        Ibnet,
        "soft provider, tests only: `IBNET_SOFT_FAULTS` arms only `softN` (unset: every soft device)",
    )
    .shown("unset"),
    Var::new(
        "IBNET_SOFT_FAULTS",
        Text(512),
        "",
        Ibnet,
        "soft provider, tests only: seeded faults `seed=N,wr_fail=N[:STATUS],cq_delay_us=N,reorder=0\\|1,fifo_corrupt=N,reg_fail=N,kill_after_wrs=N` (see `ibnet_soft::faults`); malformed: refused, nothing armed",
    )
    .shown("off")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_GIDS",
        Text(512),
        "",
        Ibnet,
        "soft provider, tests only: the GID each soft device reports, a comma-separated list of IP addresses (`i`-th for `soft{i}`; IPv4 as `::ffff:a.b.c.d`), e.g. to put devices on different subnets (subnet-aware routing); malformed: one WARN, every device keeps the default",
    )
    .shown("`::ffff:127.0.0.1` each")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_WORKERS",
        Int { min: 0, max: 64 },
        "",
        Ibnet,
        "soft: copy threads for large transfers (0..=64; 0: the posting thread copies every WR itself)",
    )
    .shown("cores/4, clamped to 1..8")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_DIRECT_MAX",
        Int { min: 0, max: 1 << 30 },
        "",
        Ibnet,
        "soft: sizes copied in the posting thread when the QP is idle (larger ones are split with the copy workers: on an idle QP one copier per `IBNET_SOFT_DIRECT_MAX` bytes)",
    )
    .shown("512 KiB")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_CHUNK",
        Int { min: 4096, max: 1 << 30 },
        "",
        Ibnet,
        "soft: largest chunk of a transfer split across the posting thread and the copy threads",
    )
    .shown("256 KiB")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_MIN_PIECE",
        Int { min: 4096, max: 1 << 30 },
        "",
        Ibnet,
        "soft: smallest chunk of such a transfer (4 KiB..`IBNET_SOFT_CHUNK`; larger: fewer, larger copies for a transfer of a few hundred KiB)",
    )
    .shown("32 KiB")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_BOUNCE_MAX",
        Int { min: 0, max: 16384 },
        "",
        Ibnet,
        "soft: between processes, WRITE_WITH_IMMs of 33 B up to this size travel through a bounce slot of the target's shared segment instead of `process_vm_writev` (0: off)",
    )
    .shown("4096")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_STREAM_MIN",
        Int { min: 0, max: 1 << 30 },
        "",
        Ibnet,
        "soft: between processes, a WR of at least this size (up to `IBNET_SOFT_DIRECT_MAX`) posted while an earlier WR of its QP is not yet polled goes whole to a copy thread, so that the messages of a stream are copied in parallel (0: off)",
    )
    .shown("8192 (0 below 8 cores)")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_SPIN_US",
        Int { min: 0, max: 1_000_000 },
        "",
        Ibnet,
        "soft: µs an idle copy thread polls before sleeping (none after helping with an idle QP's WR)",
    )
    .shown("50 (0 below 8 cores)")
    .by(Soft),
    Var::new(
        "IBNET_SOFT_PTRACER",
        Int { min: 0, max: 1 },
        "1",
        Ibnet,
        "soft: 0 = do not `prctl(PR_SET_PTRACER, ANY)`",
    )
    .by(Soft),
    Var::new(
        "IBNET_SOFT_MEM",
        Int { min: 1 << 20, max: i64::MAX },
        "",
        Ibnet,
        "soft: bytes one soft device's QPs may hold (`MemTotal`, or the process's cgroup v2 `memory.max` where lower, divided by 8: as if 8 ranks of a node each filled their device; the budget is per soft device, so a process with `IBNET_SOFT_DEVICES=8` may hold up to all of it). Each QP counts at its worst case (send queue, receive queue and inbound ring all touched: 86 KiB at the 512 send and 256 receive WRs a comm asks for; an idle QP really commits about 1.5 KiB), the bounce slots (`IBNET_SOFT_BOUNCE_MAX` × 32 × 2048) come off first; `maxComms` is at most what fits, and `create_qp` past it fails (≥ 1 MiB)",
    )
    .shown("host memory / 8")
    .by(Soft),
];
