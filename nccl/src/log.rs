//! Logging through the logger NCCL passes to `init`.
//!
//! NCCL's logger is `void (*)(ncclDebugLogLevel, unsigned long flags, const char* file, int line,
//! const char* fmt, ...)`. Every message is formatted in Rust and passed as `"%s"`, so no text
//! from a peer or the environment is ever interpreted as a format string. Each line starts with
//! `NET/IBNET`. Without a logger (before `init`, or in Rust unit tests) messages are dropped,
//! unless `IBNET_LOG_STDERR` (non-zero) sends them to stderr; a malformed value leaves it off
//! and is one WARN (on stderr, once, when there is no logger). Nothing is ever written to stdout.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::ffi::{c_int, c_ulong};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// NCCL's `ncclDebugLogger_t` (non-NULL).
pub use crate::types::DebugLogFn as Logger;

/// `ncclDebugLogLevel` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Level {
    /// `NCCL_LOG_WARN`.
    Warn = 2,
    /// `NCCL_LOG_INFO`.
    Info = 3,
    /// `NCCL_LOG_TRACE`.
    Trace = 5,
}

/// `NCCL_INIT` subsystem flag.
pub const INIT: c_ulong = 0x1;
/// `NCCL_NET` subsystem flag.
pub const NET: c_ulong = 0x10;
/// `NCCL_ENV` subsystem flag.
pub const ENV: c_ulong = 0x80;
/// `NCCL_ALL`.
pub const ALL: c_ulong = !0;

/// The current logger as a `usize` (0: none).
static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// A Rust sink for every line (0: none), for tests and tools that have no C-variadic logger.
static SINK: AtomicUsize = AtomicUsize::new(0);

/// Set once the WARN about a malformed `IBNET_LOG_STDERR` went to stderr.
static STDERR_WARNED: AtomicBool = AtomicBool::new(false);

/// Installs a Rust sink that receives every line (with its level) besides NCCL's logger.
pub fn set_sink(f: fn(Level, &str)) {
    // Release pairs with the Acquire in `emit`, as for the logger.
    SINK.store(f as usize, Ordering::Release);
}

/// Installs NCCL's logger (NULL leaves the current one in place).
pub fn set_logger(l: Option<Logger>) {
    if let Some(l) = l {
        // Release pairs with the Acquire in `emit`: a thread that sees the pointer sees a
        // fully-initialised function pointer (it is a plain value; Release is conservative).
        LOGGER.store(l as usize, Ordering::Release);
    }
}

/// Writes one line at `level` with subsystem `flags`.
pub fn emit(
    level: Level,
    flags: c_ulong,
    file: &'static str,
    line: u32,
    msg: core::fmt::Arguments<'_>,
) {
    // Acquire pairs with the Release in `set_logger`.
    let l = LOGGER.load(Ordering::Acquire);
    let text = format!("NET/IBNET : {msg}");
    // Acquire pairs with the Release in `set_sink`.
    let sink = SINK.load(Ordering::Acquire);
    if sink != 0 {
        // SAFETY: `sink` was stored from a valid `fn(Level, &str)` in `set_sink`.
        let f = unsafe { core::mem::transmute::<usize, fn(Level, &str)>(sink) };
        f(level, &text);
    }
    if l == 0 {
        match crate::env::log_stderr() {
            Ok(on) => {
                if on {
                    eprintln!("{text}");
                }
            }
            // A malformed IBNET_LOG_STDERR: off, and with no logger to carry its WARN it is
            // written to stderr once (env.rs cannot log; `plugin::create` logs the same note
            // through NCCL's logger when there is one).
            Err(note) => {
                // Relaxed: a one-shot flag guarding no other data.
                if !STDERR_WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!("NET/IBNET : {note}");
                }
            }
        }
        return;
    }
    let cmsg = std::ffi::CString::new(text.replace('\0', "?")).unwrap_or_default();
    let cfile = std::ffi::CString::new(file).unwrap_or_default();
    // SAFETY: `l` was stored from a valid `Logger` in `set_logger`; "%s" consumes exactly the
    // one NUL-terminated string argument passed.
    unsafe {
        let f: Logger = core::mem::transmute::<usize, Logger>(l);
        f(
            level as c_int,
            flags,
            cfile.as_ptr(),
            line as c_int,
            c"%s".as_ptr(),
            cmsg.as_ptr(),
        );
    }
}

/// `warn!("…")`: one WARN line (all subsystems, as NCCL's own WARN).
#[macro_export]
macro_rules! warn {
    ($($a:tt)*) => { $crate::log::emit($crate::log::Level::Warn, $crate::log::ALL, file!(), line!(), format_args!($($a)*)) };
}

/// `info!(flags, "…")`: one INFO line for the given subsystem flags.
#[macro_export]
macro_rules! info {
    ($f:expr, $($a:tt)*) => { $crate::log::emit($crate::log::Level::Info, $f, file!(), line!(), format_args!($($a)*)) };
}

/// `trace!(flags, "…")`: one TRACE line.
#[macro_export]
macro_rules! trace {
    ($f:expr, $($a:tt)*) => { $crate::log::emit($crate::log::Level::Trace, $f, file!(), line!(), format_args!($($a)*)) };
}
