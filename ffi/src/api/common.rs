//! What the entry points share: argument checks, the initialised plugin and its devices.
#![allow(unsafe_code)]
// NCCL's out-pointers and getrandom; every block has a SAFETY comment.
// `out_ptr` is the entry points' check of NCCL's out-pointers (valid or NULL by contract).
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::sync::Arc;

use ibnet_core::Error;

use crate::dev::Dev;
use crate::dev_cache::DevCache;
use crate::plugin::{self, Plugin};

/// `Missing { what }`: a NULL argument.
pub fn missing(what: &'static str) -> Error {
    Error::Missing { what }
}

/// An OS error of `call` as a provider error.
pub fn sys(call: &'static str, e: &std::io::Error) -> Error {
    Error::Provider {
        call,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// NCCL's out-pointer `p`, or `Missing { what }` for NULL.
#[allow(clippy::mut_from_ref)] // the lifetime is NCCL's: the pointer outlives the call
pub fn out_ptr<T>(p: *mut *mut T, what: &'static str) -> Result<&'static mut *mut T, Error> {
    // SAFETY: NCCL passes a valid, writable pointer or NULL; NULL is rejected.
    unsafe { p.as_mut() }.ok_or(missing(what))
}

/// The initialised plugin.
pub fn plugin() -> Result<Arc<Plugin>, Error> {
    plugin::current().ok_or(Error::BadState {
        op: "plugin call",
        state: "not initialised (init was not called or finalize already ran)",
    })
}

fn out_of_range(dev: c_int, n: usize) -> Error {
    Error::OutOfRange {
        what: "dev",
        value: dev as i64,
        min: 0,
        max: n as i64 - 1,
    }
}

/// Device `dev` of `p`.
pub fn device(p: &Plugin, dev: c_int) -> Result<Dev, Error> {
    usize::try_from(dev)
        .ok()
        .and_then(|d| p.devs.get(d).cloned())
        .ok_or(out_of_range(dev, p.devs.len()))
}

/// The registration cache of device `dev` of `p`.
pub fn dev_cache(p: &Plugin, dev: c_int) -> Result<Arc<DevCache>, Error> {
    usize::try_from(dev)
        .ok()
        .and_then(|d| p.caches.get(d).cloned())
        .ok_or(out_of_range(dev, p.caches.len()))
}

/// A random odd 64-bit value (nonces, connect tokens; never 0).
pub fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut c_void, 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        v = t ^ ((std::process::id() as u64) << 32) ^ (&v as *const u64 as u64);
    }
    v | 1
}
