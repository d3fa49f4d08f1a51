//! The one panic boundary of every `extern "C"` function the library exports (the plugin
//! table's entry points, `crate::api::entry`, and the proxy C API, `crate::proxy::capi`): panics
//! caught, one WARN per failure (a refusal of an already failed comm is INFO), errors mapped to
//! `ncclResult_t`.
//!
//! On the ground floor of the crate: it imports nothing of ibnet-ffi but the NCCL types and the
//! logger, so either API can use it without depending on the other.

use ibnet_core::{Error, ErrorKind};

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
