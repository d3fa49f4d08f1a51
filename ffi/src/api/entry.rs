//! The frame of every entry point: panics caught, one WARN per failure (a comm's refusals
//! after its first failure are INFO), errors mapped to `ncclResult_t`.

use core::ffi::c_void;

use ibnet_core::{Error, ErrorKind};

use crate::handles;
use crate::handshake_io::{AtPeer, Where};
use crate::nccl::types::ncclResult_t;
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

/// Runs `f`, catching panics and mapping errors; one WARN per failure.
pub fn entry(name: &str, f: impl FnOnce() -> Result<(), Error>) -> ncclResult_t {
    entry_on(name, core::ptr::null_mut(), f)
}

/// [`entry`] for a call that knows its peer (`connect`, and the data calls `isend`, `irecv`,
/// `iflush`, `test`): `f` notes the peer and where it stands in the [`Where`] it is given, and
/// a failure's WARN names that peer and state ([`AtPeer`]).
pub fn entry_at(
    name: &str,
    on: *mut c_void,
    f: impl FnOnce(&mut Option<Where>) -> Result<(), Error>,
) -> ncclResult_t {
    let mut at = None;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut at))) {
        Ok(Ok(())) => ncclResult_t::Success,
        Ok(Err(e)) => {
            match at {
                Some(w) => log_failure(&e, format_args!("{name}: {}", AtPeer(&e, w))),
                None => log_failure(&e, format_args!("{name}: {e}")),
            }
            to_nccl(e.kind())
        }
        Err(_) => panicked(name, on),
    }
}

/// [`entry`] for a call on the comm (or request) token `on`: a panic caught there poisons that
/// comm ([`handles::poison`]), since its state may be half-updated; later calls on it fail
/// with `Poisoned`.
pub fn entry_on(
    name: &str,
    on: *mut c_void,
    f: impl FnOnce() -> Result<(), Error>,
) -> ncclResult_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::Success,
        Ok(Err(e)) => {
            log_failure(&e, format_args!("{name}: {e}"));
            to_nccl(e.kind())
        }
        Err(_) => panicked(name, on),
    }
}

/// Logs a failed call: one WARN, except for a call refused because its comm failed earlier
/// (`Error::Poisoned`): that failure was the comm's one WARN, so each refusal after it is an
/// INFO line (NCCL may keep calling a failed comm until it tears it down).
fn log_failure(e: &Error, line: core::fmt::Arguments<'_>) {
    if matches!(e, Error::Poisoned { .. }) {
        crate::info!(crate::log::NET, "{line}");
    } else {
        warn!("{line}");
    }
}

/// A panic was caught in `name` on `on`: poisons that comm, one WARN.
fn panicked(name: &str, on: *mut c_void) -> ncclResult_t {
    if !on.is_null() {
        handles::poison(on as usize);
    }
    warn!("{name}: internal panic caught at the plugin boundary (comm poisoned)");
    ncclResult_t::InternalError
}
