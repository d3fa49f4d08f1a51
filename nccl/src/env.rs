//! The one reader of the process environment: every variable ibnet reads is read here, and
//! only variables declared in the configuration table (`ibnet_core::config`) are.
//!
//! * [`load`] reads every plugin variable (NCCL's and `IBNET_*`) into the one typed value,
//!   `Params`, with what to log about them ([`Note`]: a malformed value, a refused variable, a
//!   malformed `NCCL_IB_HCA` entry). The plugin calls it when it is created (the first `init`,
//!   and again after `plugin::idle` stopped it).
//! * [`var`] is the getter for the other readers, which take their values from here: the soft
//!   provider's config (`ibnet_soft::Config::from_lookup(env::var)`), the GPU runtime's `Env`
//!   (`ibnet_hip::Env::Lookup(env::var)`), the libibverbs loader ([`ibverbs_lib`]), the logger
//!   ([`log_stderr`]) and ibnet-ffi's `gpu.rs` WARN.
//!
//! This file logs nothing itself (the logger reads `IBNET_LOG_STDERR` through it): [`load`]
//! returns its notes and ibnet-ffi's `plugin.rs` logs them, one line each. A malformed `IBNET_LOG_STDERR`
//! is such a note too; with no NCCL logger, `log.rs` writes its WARN to stderr once instead.
//!
//! ```text
//!  getenv ── env::var(name) ── declared in ibnet_core::config? ── Some(value)
//!  env::load() ── Params::set(name, value) for each plugin variable ── (Params, notes)
//!             └── Var::refusal(value) for each refused one ── one WARN note each
//! ```

use std::ffi::OsString;
use std::fmt;

use ibnet_core::config::{self, readme::Values, Reader, Why};
use ibnet_core::params::Params;

/// The value of the declared variable `name`, when set to something other than blanks (an
/// empty variable counts as unset, as in NCCL). An undeclared name reads as unset (and fails a
/// debug build's assertion): every variable ibnet reads is in the table.
pub fn var(name: &str) -> Option<String> {
    var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// [`var`] as the bytes the environment holds (paths).
pub fn var_os(name: &str) -> Option<OsString> {
    debug_assert!(
        config::find(name).is_some(),
        "{name} is not in ibnet_core::config"
    );
    config::find(name)?;
    std::env::var_os(name).filter(|v| !v.to_string_lossy().trim().is_empty())
}

/// The libibverbs the user named, and by which variable: `IBNET_IBVERBS_PATH` wins over NCCL's
/// `NCCL_IBVERBS_LIB` (ibnet's own name is the more specific one) when both are set; `None`:
/// the system's (`libibverbs.so.1`, then `libibverbs.so`).
pub fn ibverbs_lib() -> Option<(&'static str, OsString)> {
    ["IBNET_IBVERBS_PATH", "NCCL_IBVERBS_LIB"]
        .into_iter()
        .find_map(|n| var_os(n).map(|p| (n, p)))
}

/// `IBNET_LOG_STDERR`: whether to log to stderr when NCCL gave no logger (a non-zero integer:
/// on). A malformed value is `Err` with its note (logging to stderr stays off): the logger
/// writes that WARN once itself (`log.rs`; this file cannot log), and [`load`] returns it too.
pub fn log_stderr() -> Result<bool, Note> {
    let Some(value) = var("IBNET_LOG_STDERR") else {
        return Ok(false);
    };
    let kind = config::find("IBNET_LOG_STDERR").map(|d| d.kind);
    match kind.map(|k| k.parse(&value)) {
        Some(Ok(x)) => Ok(x.flag().unwrap_or(false)),
        Some(Err(reason)) => Err(Note::Malformed {
            name: "IBNET_LOG_STDERR",
            value,
            reason,
        }),
        None => Ok(false),
    }
}

/// Something [`load`] found that the plugin logs: one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A variable set and taken (INFO).
    Set {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// A malformed value: the default stands (WARN).
    Malformed {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A variable ibnet does not honour set to a value it won't honour (WARN).
    Refused {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why.
        why: Why,
    },
    /// A malformed `NCCL_IB_HCA` entry; the rest of the list applies (WARN).
    HcaEntry {
        /// The whole value.
        value: String,
        /// The entry.
        entry: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Note {
    /// Whether the note is a WARN (else an INFO of the ENV subsystem).
    pub fn is_warn(&self) -> bool {
        !matches!(self, Self::Set { .. })
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Set { name, value } => write!(f, "{name} set by environment to {value}"),
            Self::Malformed {
                name,
                value,
                reason,
            } => {
                let kind = config::find(name).map(|v| v.kind);
                write!(f, "ignoring {name}={value:?}: {reason}")?;
                if let Some(k) = kind {
                    // README's markdown escapes the word separator; a log line does not.
                    let expected = Values(k).to_string().replace("\\|", "|");
                    write!(f, " (expected {expected})")?;
                }
                f.write_str("; the default stands")
            }
            Self::Refused { name, value, why } => write!(
                f,
                "{name}={value:?} refused: {}; ibnet goes on as if it were unset",
                why.text()
            ),
            Self::HcaEntry {
                value,
                entry,
                reason,
            } => write!(
                f,
                "NCCL_IB_HCA={value:?}: entry {entry:?}: {reason}; the rest of the list applies"
            ),
        }
    }
}

/// Reads every plugin variable from the environment into [`Params`] (NCCL's defaults where
/// unset or malformed) and checks every refused one, returning what to log.
pub fn load() -> (Params, Vec<Note>) {
    let mut p = Params::default();
    let mut notes = Vec::new();
    for v in config::all() {
        let Some(value) = var(v.name) else {
            continue;
        };
        let name = v.name;
        match v.reader {
            Reader::Plugin => match p.set(name, &value) {
                Ok(_) => notes.push(Note::Set { name, value }),
                Err(ibnet_core::Error::Param { reason, .. }) => notes.push(Note::Malformed {
                    name,
                    value,
                    reason,
                }),
                Err(_) => {}
            },
            Reader::Refused { .. } => match v.refusal(&value) {
                Ok(None) => notes.push(Note::Set { name, value }),
                Ok(Some(why)) => notes.push(Note::Refused { name, value, why }),
                Err(reason) => notes.push(Note::Malformed {
                    name,
                    value,
                    reason,
                }),
            },
            Reader::Log => {
                if let Err(n) = log_stderr() {
                    notes.push(n);
                }
            }
            _ => {}
        }
    }
    for m in p.hca.malformed() {
        notes.push(Note::HcaEntry {
            value: p.ib_hca.to_string(),
            entry: m.entry(&p.ib_hca).to_string(),
            reason: m.reason,
        });
    }
    (p, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ibnet_ibverbs_path_wins_over_nccl_ibverbs_lib() {
        // The only test of this binary that touches these two variables.
        std::env::set_var("NCCL_IBVERBS_LIB", "/a/libibverbs.so.1");
        std::env::set_var("IBNET_IBVERBS_PATH", "  ");
        assert_eq!(
            ibverbs_lib(),
            Some(("NCCL_IBVERBS_LIB", "/a/libibverbs.so.1".into())),
            "blanks count as unset"
        );
        std::env::set_var("IBNET_IBVERBS_PATH", "/b/libibverbs.so");
        assert_eq!(
            ibverbs_lib(),
            Some(("IBNET_IBVERBS_PATH", "/b/libibverbs.so".into()))
        );
        std::env::remove_var("NCCL_IBVERBS_LIB");
        std::env::remove_var("IBNET_IBVERBS_PATH");
        assert_eq!(ibverbs_lib(), None);
    }

    #[test]
    fn notes_say_what_and_the_default() {
        let m = Note::Malformed {
            name: "NCCL_IB_TIMEOUT",
            value: "40".into(),
            reason: "out of range",
        };
        assert!(m.is_warn());
        assert_eq!(
            m.to_string(),
            "ignoring NCCL_IB_TIMEOUT=\"40\": out of range (expected 0..=31); the default stands"
        );
        let r = Note::Refused {
            name: "NCCL_IB_OOO_RQ",
            value: "1".into(),
            why: Why::Mlx5Only,
        };
        assert!(r
            .to_string()
            .starts_with("NCCL_IB_OOO_RQ=\"1\" refused: an mlx5-only"));
        assert!(r.to_string().ends_with("as if it were unset"), "{r}");
        let w = Note::Malformed {
            name: "NCCL_IB_RAIL_POLICY",
            value: "ROUND".into(),
            reason: "unrecognized value",
        };
        assert!(w.to_string().contains("(expected `CX` | `NONE` |"), "{w}");
        assert!(!Note::Set {
            name: "NCCL_IB_TIMEOUT",
            value: "3".into()
        }
        .is_warn());
    }
}
