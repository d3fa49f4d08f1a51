//! Tunables of the soft provider, from the `IBNET_SOFT_*` variables.
//!
//! Each variable is declared once, with its range and doc line, in `ibnet_core::config::soft`
//! (README's variable table is rendered from there); this file parses them with those ranges
//! and computes the defaults that depend on the host (cores, memory). Notes on the defaults:
//!
//! * `IBNET_SOFT_DIRECT_MAX` (512 KiB): on the 16-core host one copier was faster than a split
//!   at every size up to 512 KiB: 128 KiB 9.1 µs against 11.3 split, 256 KiB 16.3 against 26.2,
//!   512 KiB 31.3 against 53.8, one device call.
//! * `IBNET_SOFT_STREAM_MIN` (8192, 0 with fewer than 8 cores): it pays where the workers have
//!   cores of their own and stay awake between WRs (`SPIN_US` > 0); the default leaves
//!   `BOUNCE_MAX`'s 4 KiB on the bounce path, which measured faster for a 4 KiB stream (1.08 ×
//!   raw CMA against 0.67–0.80 streamed, 16-core host).
//! * `IBNET_SOFT_SPIN_US` (50, 0 with fewer than 8 cores): 1 MiB ping-pong measured 58–65 µs
//!   with a worker that sleeps at once after helping an idle QP, against 71–101 µs spinning 50 µs.
//!
//! The values come from the caller ([`Config::from_lookup`]): the plugin passes its one reader
//! of the environment (`ibnet_nccl::env::var`); this crate never reads the environment itself.
//! Values are integers as NCCL reads its own ([`ibnet_core::params::parse_int`]: an optional
//! sign, then decimal, `0x` hexadecimal or leading-`0` octal; surrounding whitespace ignored).

use ibnet_core::config::{self, Kind};
use ibnet_core::Error;

use crate::faults::{self, Faults};
use crate::gids;

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
    /// The GID each soft device reports (`IBNET_SOFT_GIDS`; unset: `::ffff:127.0.0.1` each;
    /// see [`crate::gids`]).
    pub gids: gids::Gids,
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
            gids: [None; ibnet_core::config::soft::MAX_DEVICES as usize],
        }
    }
}

impl Config {
    /// Reads the variables through `get`. A variable set to nothing (or blanks) counts as
    /// unset, as for every other variable the plugin reads. A malformed value is returned as an
    /// [`Error::Param`] (for the caller to log) and the default stands.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Self, Vec<Error>) {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut c = Self::default();
        let mut errs = Vec::new();
        // The range is the table's (`ibnet_core::config::soft`), narrowed by `max`.
        let mut num = |name: &'static str, max: u64| -> Option<u64> {
            let v = get(name)?;
            let kind = config::find(name).map(|d| d.kind);
            match kind.unwrap_or(Kind::Flag).parse(&v).map(|x| x.int()) {
                Ok(Some(n)) if n >= 0 && n.unsigned_abs() <= max => Some(n as u64),
                Ok(_) | Err("out of range") => {
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
        let any = u64::MAX;
        if let Some(n) = num("IBNET_SOFT_WORKERS", any) {
            c.workers = n as usize;
        }
        if let Some(n) = num("IBNET_SOFT_DIRECT_MAX", any) {
            c.direct_max = n;
        }
        if let Some(n) = num("IBNET_SOFT_CHUNK", any) {
            c.chunk = n;
        }
        if let Some(n) = num("IBNET_SOFT_MIN_PIECE", c.chunk) {
            c.min_piece = n;
        }
        if let Some(n) = num("IBNET_SOFT_BOUNCE_MAX", crate::segment::BOUNCE_MAX as u64) {
            c.bounce_max = n;
        }
        if let Some(n) = num("IBNET_SOFT_STREAM_MIN", any) {
            c.stream_min = n;
        }
        if let Some(n) = num("IBNET_SOFT_SPIN_US", any) {
            c.spin_us = n;
        }
        if let Some(n) = num("IBNET_SOFT_PTRACER", any) {
            c.set_ptracer = n == 1;
        }
        if let Some(n) = num("IBNET_SOFT_MEM", any) {
            c.mem = n;
        }
        if let Some(v) = get(gids::VAR) {
            match gids::parse(&v) {
                Ok(g) => c.gids = g,
                Err(e) => errs.push(e), // every device keeps the default GID
            }
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

    #[test]
    fn gids_are_read_and_a_malformed_list_keeps_the_default() {
        let c = |v: &str| Config::from_lookup(|k| (k == gids::VAR).then(|| v.to_string()));
        let (ok, e) = c("10.0.0.1,10.0.1.1");
        assert!(e.is_empty());
        assert_eq!(gids::of(&ok.gids, 1).0[12..], [10, 0, 1, 1]);
        let (bad, e) = c("10.0.0.1,x");
        assert_eq!(bad, Config::default());
        assert!(matches!(
            e[..],
            [Error::Param {
                name: gids::VAR,
                ..
            }]
        ));
    }
}
