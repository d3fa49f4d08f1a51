//! The one panic boundary of every `extern "C"` function the library exports (the plugin
//! table's entry points, ibnet-ffi's `api::entry`, and the proxy C API, ibnet-proxy's
//! `capi::entry` and `capi::entry_xproc`): panics caught, one WARN per failure (a refusal of an already failed comm is INFO), errors mapped to
//! `ncclResult_t`.
//!
//! It imports only the NCCL types and the logger, so either API can use it without depending on
//! the other.

use ibnet_core::{Error, ErrorKind};

use crate::types::ncclResult_t;
use crate::warn;

/// Maps an error kind to `ncclResult_t`.
pub fn to_nccl(k: ErrorKind) -> ncclResult_t {
    match k {
        ErrorKind::System => ncclResult_t::SystemError,
        ErrorKind::Internal => ncclResult_t::InternalError,
        ErrorKind::InvalidUsage => ncclResult_t::InvalidUsage,
        ErrorKind::InvalidArgument => ncclResult_t::InvalidArgument,
        ErrorKind::Remote => ncclResult_t::RemoteError,
    }
}

/// Runs `f` behind the boundary. `Ok` is `Success`; an error is logged by `log` (which calls
/// [`log_failure`] with its line) and mapped by [`to_nccl`]; a panic is caught, `on_panic` runs
/// (it undoes what the half-done call may have left behind, e.g. poisons the comm) and returns
/// what it did, and one WARN names `name` and that effect. `f` gets `T::default()` to note
/// details for `log` (the plugin API notes the peer there).
pub fn guard<T: Default>(
    name: &str,
    f: impl FnOnce(&mut T) -> Result<(), Error>,
    log: impl FnOnce(&Error, &T),
    on_panic: impl FnOnce() -> &'static str,
) -> ncclResult_t {
    let mut note = T::default();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut note))) {
        Ok(Ok(())) => ncclResult_t::Success,
        Ok(Err(e)) => {
            log(&e, &note);
            to_nccl(e.kind())
        }
        Err(_) => {
            let effect = on_panic();
            warn!("{name}: internal panic caught at the library boundary ({effect})");
            ncclResult_t::InternalError
        }
    }
}

/// [`guard`] for a call with nothing to undo after a panic and no detail to log: a failure's
/// WARN is `name: error`.
pub fn call(name: &str, f: impl FnOnce() -> Result<(), Error>) -> ncclResult_t {
    guard::<()>(
        name,
        |_| f(),
        |e, _| log_failure(e, format_args!("{name}: {e}")),
        || "nothing to undo",
    )
}

/// Logs a failed call: one WARN, except for a call refused because its comm failed earlier
/// (`Error::Poisoned`): that failure was the comm's one WARN, so each refusal after it is an
/// INFO line (NCCL may keep calling a failed comm until it tears it down).
pub fn log_failure(e: &Error, line: core::fmt::Arguments<'_>) {
    if matches!(e, Error::Poisoned { .. }) {
        crate::info!(crate::log::NET, "{line}");
    } else {
        warn!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{set_sink, Level};
    use std::cell::{Cell, RefCell};

    thread_local! {
        /// What the logger received on this thread (the sink is global; each test reads only
        /// its own thread's lines).
        static LINES: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
    }

    fn capture(level: Level, line: &str) {
        LINES.with(|l| l.borrow_mut().push((level, line.to_owned())));
    }

    /// The lines logged on this thread while `f` ran.
    fn logged(f: impl FnOnce() -> ncclResult_t) -> (ncclResult_t, Vec<(Level, String)>) {
        set_sink(capture);
        LINES.with(|l| l.borrow_mut().clear());
        let r = f();
        (r, LINES.with(|l| l.borrow_mut().split_off(0)))
    }

    #[test]
    fn success_logs_nothing_and_undoes_nothing() {
        let undone = Cell::new(0);
        let (r, lines) = logged(|| {
            guard::<()>(
                "t_ok",
                |_| Ok(()),
                |_, _| panic!("no failure to log"),
                || {
                    undone.set(undone.get() + 1);
                    "undone"
                },
            )
        });
        assert_eq!(r, ncclResult_t::Success);
        assert_eq!(undone.get(), 0);
        assert!(lines.is_empty(), "{lines:?}");
    }

    #[test]
    fn an_error_is_logged_once_by_the_caller_and_mapped_by_kind() {
        let seen = Cell::new(0);
        let (r, _) = logged(|| {
            guard(
                "t_err",
                |note: &mut u32| {
                    *note = 7;
                    Err(Error::Missing { what: "x" })
                },
                |e, note| {
                    assert_eq!(*note, 7, "the note f left reaches the logger");
                    assert!(matches!(e, Error::Missing { what: "x" }));
                    seen.set(seen.get() + 1);
                },
                || "undone",
            )
        });
        assert_eq!(r, ncclResult_t::InternalError);
        assert_eq!(seen.get(), 1);
        let (r, lines) = logged(|| call("t_call", || Err(Error::Missing { what: "y" })));
        assert_eq!(r, ncclResult_t::InternalError);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].0, Level::Warn);
        assert!(lines[0].1.contains("t_call: y is missing"), "{lines:?}");
    }

    #[test]
    fn a_refusal_of_a_failed_comm_is_info_with_the_first_kind() {
        let (r, lines) = logged(|| {
            call("t_refused", || {
                Err(Error::Poisoned {
                    op: "isend",
                    cause: ErrorKind::Remote,
                })
            })
        });
        assert_eq!(r, ncclResult_t::RemoteError);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].0, Level::Info);
    }

    #[test]
    fn a_panic_is_caught_undone_once_and_warned_once() {
        let undone = Cell::new(0);
        let (r, lines) = logged(|| {
            guard::<()>(
                "t_panic",
                |_| panic!("boom"),
                |_, _| panic!("a panic is not an error to log"),
                || {
                    undone.set(undone.get() + 1);
                    "state undone"
                },
            )
        });
        assert_eq!(r, ncclResult_t::InternalError);
        assert_eq!(undone.get(), 1);
        let warns: Vec<_> = lines.iter().filter(|l| l.0 == Level::Warn).collect();
        assert_eq!(warns.len(), 1, "{lines:?}");
        assert!(
            warns[0].1.contains("t_panic") && warns[0].1.contains("state undone"),
            "{lines:?}"
        );
    }
}
