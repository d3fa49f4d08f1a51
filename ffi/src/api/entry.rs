//! The frame of every plugin entry point, over [`ibnet_nccl::boundary`] (panics caught, one WARN per
//! failure, errors mapped to `ncclResult_t`): a caught panic poisons the comm it ran on, and a
//! data or connect call's WARN names its peer.

use core::ffi::c_void;

use ibnet_core::Error;

use crate::handles;
use crate::handshake_io::{AtPeer, Where};
use ibnet_nccl::boundary::{guard, log_failure};
use ibnet_nccl::types::ncclResult_t;

pub use ibnet_nccl::boundary::to_nccl;

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
    guard(
        name,
        f,
        |e, at: &Option<Where>| match *at {
            Some(w) => log_failure(e, format_args!("{name}: {}", AtPeer(e, w))),
            None => log_failure(e, format_args!("{name}: {e}")),
        },
        || poison(on),
    )
}

/// [`entry`] for a call on the comm (or request) token `on`: a panic caught there poisons that
/// comm ([`handles::poison`]), since its state may be half-updated; later calls on it fail
/// with `Poisoned`.
pub fn entry_on(
    name: &str,
    on: *mut c_void,
    f: impl FnOnce() -> Result<(), Error>,
) -> ncclResult_t {
    guard::<()>(
        name,
        |_| f(),
        |e, _| log_failure(e, format_args!("{name}: {e}")),
        || poison(on),
    )
}

/// After a panic caught on `on`: poisons that comm.
fn poison(on: *mut c_void) -> &'static str {
    if on.is_null() {
        return "no comm to poison";
    }
    handles::poison(on as usize);
    "comm poisoned"
}
