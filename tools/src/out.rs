//! The tools' stdout (the report) and stderr (progress, errors, the plugin's log lines),
//! each line formatted whole and written with one `write_all`.
//!
//! `println!`/`eprintln!` write a line in pieces (stderr is unbuffered: one `write(2)` per
//! piece), so the lines of ibnet-perf and its loopback peer, which share stderr, and of the
//! plugin threads that log, interleaved mid-line. One write per line (up to `PIPE_BUF`, 4 KiB,
//! atomic on a pipe) keeps each line whole.
//!
//! Rust ignores `SIGPIPE`, so once the reader of stdout is gone (`ibnet-perf | head -3` after
//! its three lines) every write fails with `EPIPE`; `println!` would then panic. [`text`] and
//! [`outln!`](crate::outln) return that as an [`Error`] instead and record it: the tools' `main`
//! asks [`stdout_closed`] and then ends quietly with status 0, as a tool killed by `SIGPIPE`
//! would have ended silently, without failing a `set -o pipefail` pipeline whose reader
//! simply had enough.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::Error;

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `s` to stdout in one `write_all` on the locked handle, then flushes it.
///
/// A reader that went away (`EPIPE`) is an error that [`stdout_closed`] then reports.
pub fn text(s: &str) -> Result<(), Error> {
    match whole(&mut io::stdout().lock(), s) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            // Relaxed: an independent flag, read by `main` on this thread or after joining
            // the thread that wrote (the join orders it).
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            Err(Error("stdout closed by its reader".into()))
        }
        Err(e) => Err(Error(format!("writing stdout: {e}"))),
    }
}

/// Writes `s` to stderr in one `write_all` on the locked handle. A failure is dropped: there
/// is nowhere left to report it.
pub fn err_text(s: &str) {
    let _ = whole(&mut io::stderr().lock(), s);
}

/// Writes all of `s` to `w` with one `write_all` call, then flushes `w`.
pub fn whole(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(s.as_bytes())?;
    w.flush()
}

/// Whether a write to stdout failed because its reader went away: the tool then ends
/// quietly (status 0, nothing on stderr).
pub fn stdout_closed() -> bool {
    // Relaxed: see `text`.
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// `println!` that returns an error instead of panicking: formats the line and its newline,
/// then writes them with [`out::text`](crate::out::text) in one write.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::text(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` in one write: formats the line and its newline, then writes them with
/// [`out::err_text`](crate::out::err_text).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::err_text(&format!("{}\n", format_args!($($arg)*)))
    };
}
