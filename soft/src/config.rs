//! Tunables of the soft provider, from `IBNET_SOFT_*` environment variables.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `IBNET_SOFT_WORKERS` | cores / 4, 1..=8 | copy-engine threads for large WRs (0: every WR is copied by the posting thread) |
//! | `IBNET_SOFT_DIRECT_MAX` | 512 KiB | WRs up to this size are copied in the posting thread (no thread hop) when the QP is idle; a larger one is split between the posting thread and one copy worker per further `DIRECT_MAX` bytes (the same workers each time; a stream's WRs use every worker) (on the 16-core host one copier was faster than a split at every size up to 512 KiB: 128 KiB 9.1 µs against 11.3 split, 256 KiB 16.3 against 26.2, 512 KiB 31.3 against 53.8, one device call) |
//! | `IBNET_SOFT_CHUNK` | 256 KiB | largest chunk of a WR above `DIRECT_MAX` (it is split into whole rounds of `workers + 1` equal chunks, fewer for a WR under `workers + 1` times `MIN_PIECE`, copied by the posting thread and the workers) |
//! | `IBNET_SOFT_MIN_PIECE` | 32 KiB | smallest chunk of a WR above `DIRECT_MAX` (4 KiB ..= `CHUNK`; a larger value means fewer, larger copies for a WR of a few hundred KiB: fewer copiers, fewer calls) |
//! | `IBNET_SOFT_BOUNCE_MAX` | 4096 | cross-process WRITE_WITH_IMMs of 33 B up to this size (at most 16384; 0: none) travel through a bounce slot in the target's shared segment (two memory copies, no syscall) instead of `process_vm_writev` (see `qp.rs`, "Bounce payloads") |
//! | `IBNET_SOFT_STREAM_MIN` | 8192 (0 with fewer than 8 cores) | a WR of at least this size (and at most `DIRECT_MAX`) posted while an earlier WR of its QP is outstanding (not yet polled) goes whole to a copy worker, so that workers copy the messages of a stream in parallel while the posting thread posts the next one (cross-process; 0: off; see `qp.rs`, "Streams"); it pays where the workers have cores of their own and stay awake between WRs (`SPIN_US` > 0); the default leaves `BOUNCE_MAX`'s 4 KiB on the bounce path, which measured faster for a 4 KiB stream (1.08 × raw CMA against 0.67–0.80 streamed, 16-core host) |
//! | `IBNET_SOFT_SPIN_US` | 50 (0 with fewer than 8 cores) | an idle copy worker polls for work this many µs before it sleeps (0: sleeps at once); a worker that just helped with an idle QP's WR sleeps at once (1 MiB ping-pong measured 58–65 µs so, against 71–101 µs spinning 50 µs) |
//! | `IBNET_SOFT_PTRACER` | 1 | 0: do not call `prctl(PR_SET_PTRACER, ANY)` (see the crate doc) |
//! | `IBNET_SOFT_MEM` | host memory / 8 | bytes the provider's QPs may hold, each counted at its worst case (send and receive queues and inbound ring all touched; the bounce slots' fixed cost comes off first); `create_qp` past it fails, and the plugin's `maxComms` is derived from it (see [`crate::budget`]) |
//! | `IBNET_SOFT_FAULTS` | off | seeded fault injection for tests: `seed=N,wr_fail=N[:STATUS],cq_delay_us=N,reorder=0\|1,fifo_corrupt=N,reg_fail=N,kill_after_wrs=N` (see [`crate::faults`]) |
//!
//! Values are integers as NCCL reads its own ([`ibnet_core::params::parse_int`]: an optional
//! sign, then decimal, `0x` hexadecimal or leading-`0` octal; surrounding whitespace ignored).

use ibnet_core::params::parse_int;
use ibnet_core::Error;

use crate::faults::{self, Faults};

/// Provider tunables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Copy-engine worker threads.
    pub workers: usize,
    /// Largest WR copied directly by the posting thread.
    pub direct_max: u64,
    /// Largest chunk of work spread over workers.
    pub chunk: u64,
    /// Smallest chunk of a WR above `direct_max` (at most `chunk`).
    pub min_piece: u64,
    /// Largest cross-process WRITE_WITH_IMM carried through a bounce slot of the target's
    /// segment (at most [`crate::BOUNCE_MAX`]; 0: none).
    pub bounce_max: u64,
    /// Smallest WR (up to `direct_max`) that goes whole to a copy worker when posted while an
    /// earlier WR of its QP is outstanding (0: never; such WRs are copied by the poster).
    pub stream_min: u64,
    /// Microseconds an idle worker polls for work before sleeping.
    pub spin_us: u64,
    /// Allow any same-user process to attach (Yama `ptrace_scope = 1`).
    pub set_ptracer: bool,
    /// Armed fault injection (`IBNET_SOFT_FAULTS`; [`Faults::OFF`] by default).
    pub faults: Faults,
    /// The memory budget of the provider's QPs in bytes (`IBNET_SOFT_MEM`; an eighth of the
    /// host's memory by default; see [`crate::budget`]).
    pub mem: u64,
}

impl Default for Config {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            workers: (cores / 4).clamp(1, 8),
            direct_max: 512 << 10,
            chunk: 256 << 10,
            min_piece: 32 << 10,
            bounce_max: 4 << 10,
            stream_min: if cores >= 8 { 8 << 10 } else { 0 },
            spin_us: if cores >= 8 { 50 } else { 0 },
            set_ptracer: true,
            faults: Faults::OFF,
            mem: crate::budget::default_budget(),
        }
    }
}

impl Config {
    /// Reads the `IBNET_SOFT_*` variables from the process environment.
    pub fn from_env() -> (Self, Vec<Error>) {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get`. A variable set to nothing (or blanks) counts as
    /// unset, as for every other variable the plugin reads. A malformed value is returned as an
    /// [`Error::Param`] (for the caller to log) and the default stands.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Self, Vec<Error>) {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut c = Self::default();
        let mut errs = Vec::new();
        let mut num = |name: &'static str, min: u64, max: u64| -> Option<u64> {
            let v = get(name)?;
            match parse_int(v.trim()) {
                Ok(n) if n >= 0 && (min..=max).contains(&n.unsigned_abs()) => Some(n as u64),
                Ok(_) => {
                    errs.push(Error::Param {
                        name,
                        reason: "out of range; default used",
                    });
                    None
                }
                Err(_) => {
                    errs.push(Error::Param {
                        name,
                        reason: "not a number; default used",
                    });
                    None
                }
            }
        };
        if let Some(n) = num("IBNET_SOFT_WORKERS", 0, 64) {
            c.workers = n as usize;
        }
        if let Some(n) = num("IBNET_SOFT_DIRECT_MAX", 0, 1 << 30) {
            c.direct_max = n;
        }
        if let Some(n) = num("IBNET_SOFT_CHUNK", 4096, 1 << 30) {
            c.chunk = n;
        }
        if let Some(n) = num("IBNET_SOFT_MIN_PIECE", 4096, c.chunk) {
            c.min_piece = n;
        }
        if let Some(n) = num(
            "IBNET_SOFT_BOUNCE_MAX",
            0,
            crate::segment::BOUNCE_MAX as u64,
        ) {
            c.bounce_max = n;
        }
        if let Some(n) = num("IBNET_SOFT_STREAM_MIN", 0, 1 << 30) {
            c.stream_min = n;
        }
        if let Some(n) = num("IBNET_SOFT_SPIN_US", 0, 1_000_000) {
            c.spin_us = n;
        }
        if let Some(n) = num("IBNET_SOFT_PTRACER", 0, 1) {
            c.set_ptracer = n == 1;
        }
        if let Some(n) = num("IBNET_SOFT_MEM", 1 << 20, i64::MAX as u64) {
            c.mem = n;
        }
        if let Some(v) = get(faults::VAR) {
            match Faults::parse(&v) {
                Ok(f) => c.faults = f,
                Err(e) => errs.push(e), // refused: no fault is armed
            }
        }
        (c, errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_values_keep_defaults_and_are_reported() {
        let (c, e) = Config::from_lookup(|k| match k {
            "IBNET_SOFT_WORKERS" => Some("3".into()),
            "IBNET_SOFT_CHUNK" => Some("12".into()),
            "IBNET_SOFT_PTRACER" => Some("yes".into()),
            "IBNET_SOFT_DIRECT_MAX" => Some(" 0x1000 ".into()),
            "IBNET_SOFT_BOUNCE_MAX" => Some("1024".into()),
            "IBNET_SOFT_STREAM_MIN" => Some("8192".into()),
            _ => None,
        });
        assert_eq!(c.bounce_max, 1024);
        assert_eq!(c.stream_min, 8192);
        assert_eq!(c.direct_max, 0x1000, "NCCL's integer syntax, trimmed");
        assert_eq!(c.workers, 3);
        assert_eq!(c.chunk, Config::default().chunk);
        assert!(c.set_ptracer);
        assert_eq!(e.len(), 2);
        assert!(matches!(
            e[0],
            Error::Param {
                name: "IBNET_SOFT_CHUNK",
                reason: "out of range; default used",
            }
        ));
        assert!(matches!(
            e[1],
            Error::Param {
                name: "IBNET_SOFT_PTRACER",
                reason: "not a number; default used",
            }
        ));
    }

    #[test]
    fn a_variable_set_to_nothing_counts_as_unset() {
        let (c, e) = Config::from_lookup(|k| {
            (k.starts_with("IBNET_SOFT_") || k == faults::VAR).then(|| " ".into())
        });
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(c.workers, Config::default().workers);
        assert_eq!(c.bounce_max, Config::default().bounce_max);
        assert!(c.set_ptracer);
        assert_eq!(c.faults, Faults::OFF);
    }

    #[test]
    fn faults_are_off_by_default_parsed_when_set_and_refused_when_malformed() {
        assert_eq!(Config::from_lookup(|_| None).0.faults, Faults::OFF);
        let (c, e) = Config::from_lookup(|k| (k == faults::VAR).then(|| "reg_fail=2".into()));
        assert!(e.is_empty());
        assert_eq!(c.faults.reg_fail, 2);
        let (c, e) = Config::from_lookup(|k| (k == faults::VAR).then(|| "wr_fail=0.5".into()));
        assert_eq!(c.faults, Faults::OFF, "refused: nothing armed");
        assert!(matches!(
            e[..],
            [Error::Param {
                name: "IBNET_SOFT_FAULTS",
                ..
            }]
        ));
    }

    #[test]
    fn bounce_max_above_the_slot_size_is_refused() {
        let (c, e) =
            Config::from_lookup(|k| (k == "IBNET_SOFT_BOUNCE_MAX").then(|| "16385".into()));
        assert_eq!(c.bounce_max, Config::default().bounce_max);
        assert!(matches!(
            e[..],
            [Error::Param {
                name: "IBNET_SOFT_BOUNCE_MAX",
                reason: "out of range; default used",
            }]
        ));
    }

    #[test]
    fn min_piece_is_bounded_by_the_chunk() {
        let (c, e) = Config::from_lookup(|k| match k {
            "IBNET_SOFT_CHUNK" => Some("131072".into()),
            "IBNET_SOFT_MIN_PIECE" => Some("65536".into()),
            _ => None,
        });
        assert!(e.is_empty());
        assert_eq!((c.chunk, c.min_piece), (128 << 10, 64 << 10));
        let (c, e) = Config::from_lookup(|k| match k {
            "IBNET_SOFT_CHUNK" => Some("65536".into()),
            "IBNET_SOFT_MIN_PIECE" => Some("131072".into()),
            _ => None,
        });
        assert_eq!(c.min_piece, Config::default().min_piece);
        assert!(matches!(
            e[..],
            [Error::Param {
                name: "IBNET_SOFT_MIN_PIECE",
                reason: "out of range; default used",
            }]
        ));
    }

    #[test]
    fn the_memory_budget_is_bytes_of_at_least_one_mib() {
        let c = |v: &str| Config::from_lookup(|k| (k == "IBNET_SOFT_MEM").then(|| v.to_string()));
        assert_eq!(
            c("0x40000000"),
            (
                Config {
                    mem: 1 << 30,
                    ..Config::default()
                },
                vec![]
            )
        );
        let (small, e) = c("4096");
        assert_eq!(small, Config::default());
        assert_eq!(
            e,
            vec![Error::Param {
                name: "IBNET_SOFT_MEM",
                reason: "out of range; default used",
            }]
        );
        assert_eq!(Config::default().mem, crate::budget::default_budget());
    }

    #[test]
    fn negative_values_are_out_of_range() {
        let (c, e) = Config::from_lookup(|k| (k == "IBNET_SOFT_WORKERS").then(|| "-1".into()));
        assert_eq!(c.workers, Config::default().workers);
        assert!(matches!(
            e[..],
            [Error::Param {
                name: "IBNET_SOFT_WORKERS",
                reason: "out of range; default used",
            }]
        ));
    }
}
