//! The tools' stdout: the report, written a whole line (or block) at a time.
//!
//! Rust ignores `SIGPIPE`, so once the reader of stdout is gone (`ibnet-perf | head -3` after
//! its three lines) every write fails with `EPIPE`; `println!` would then panic. [`text`] and
//! [`outln!`](crate::outln) return that as an [`Error`] instead and record it: the tools' `main`
//! asks [`stdout_closed`] and then ends quietly with status 0, as a tool killed by `SIGPIPE`
//! would have ended silently, without failing a `set -o pipefail` pipeline whose reader
//! simply had enough.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::Error;

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `s` to stdout in one `write_all` on the locked handle, then flushes it.
///
/// A reader that went away (`EPIPE`) is an error that [`stdout_closed`] then reports.
pub fn text(s: &str) -> Result<(), Error> {
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            // Relaxed: an independent flag, read by `main` on this thread or after joining
            // the thread that wrote (the join orders it).
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            Err(Error("stdout closed by its reader".into()))
        }
        Err(e) => Err(Error(format!("writing stdout: {e}"))),
    }
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
