//! The logger handed to a plugin's `init`.
//!
//! NCCL's `ncclDebugLogger_t` is C-variadic (`level, flags, file, line, fmt, ...`); a C shim
//! (`logshim.c`) formats the message with `vsnprintf` and calls [`ibnet_tools_log_sink`], which
//! prints WARN (and ABORT) lines to stderr always, INFO and TRACE lines only when verbose.
//! Nothing goes to stdout, which belongs to the report.

use core::ffi::{c_char, c_int, c_ulong};
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

/// `NCCL_LOG_WARN`.
pub const LEVEL_WARN: c_int = 2;
/// `NCCL_LOG_INFO`.
pub const LEVEL_INFO: c_int = 3;
/// `NCCL_LOG_ABORT`.
pub const LEVEL_ABORT: c_int = 4;

static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Shows INFO/TRACE lines too (`-v`).
pub fn set_verbose(v: bool) {
    // Relaxed: an independent flag; a late observation only changes which lines print.
    VERBOSE.store(v, Ordering::Relaxed);
}

/// Whether a line at `level` is printed.
pub fn shown(level: c_int, verbose: bool) -> bool {
    matches!(level, LEVEL_WARN | LEVEL_ABORT) || (verbose && level > 0)
}

extern "C" {
    /// The C-variadic logger (src/logshim.c) passed to the plugin as `ncclDebugLogger_t`.
    pub fn ibnet_tools_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

/// Receives each formatted line from the C shim.
///
/// # Safety
/// `file` and `msg` are NULL or NUL-terminated strings valid for the call (the shim passes its
/// stack buffer and the plugin's `file` argument).
#[no_mangle]
pub unsafe extern "C" fn ibnet_tools_log_sink(
    level: c_int,
    _flags: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
) {
    // Relaxed: see `set_verbose`.
    if !shown(level, VERBOSE.load(Ordering::Relaxed)) || msg.is_null() {
        return;
    }
    // SAFETY: non-NULL and NUL-terminated per the contract above.
    let m = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    let f = if file.is_null() {
        String::new()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(file) }
            .to_string_lossy()
            .into_owned()
    };
    let tag = match level {
        LEVEL_WARN => "WARN",
        LEVEL_INFO => "INFO",
        LEVEL_ABORT => "ABORT",
        _ => "TRACE",
    };
    // Nowhere to report a failed write to stderr.
    let _ = emit(&mut std::io::stderr().lock(), tag, &f, line, &m);
}

/// Writes one log line to `w` in one write (see [`out`](crate::out)): the loopback peer
/// shares stderr, and plugin threads log concurrently.
fn emit(
    w: &mut impl std::io::Write,
    tag: &str,
    file: &str,
    line: c_int,
    msg: &str,
) -> std::io::Result<()> {
    let text = format!(
        "[{}] {tag} {file}:{line} {}\n",
        std::process::id(),
        msg.trim_end()
    );
    crate::out::whole(w, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each `write` call.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl std::io::Write for Writes {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_log_line_is_one_write() {
        // The driver and its loopback peer share stderr, and plugin threads log concurrently:
        // a line written in pieces interleaves with another process's pieces.
        let mut w = Writes::default();
        emit(
            &mut w,
            "WARN",
            "ffi/src/x.rs",
            12,
            "NET/IBNET : bad thing\n",
        )
        .unwrap();
        let want = format!(
            "[{}] WARN ffi/src/x.rs:12 NET/IBNET : bad thing\n",
            std::process::id()
        );
        assert_eq!(
            w.0,
            vec![want.into_bytes()],
            "one write holding the whole line"
        );
    }
}
