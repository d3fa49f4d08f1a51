//! A listen comm's decisions about the connections on its port (ffi's `api/accepting.rs`
//! holds the sockets and acts): the single-use nonce, which failures fail `accept`, which
//! idle handshake makes room when the table is full, and when a drop is logged.
//!
//! ```text
//!  a connection completes       → Nonce::completed: the nonce is spent, a remembered
//!                                 death forgotten; later PeerInfo/Done carrying it: replay()
//!  a connection fails           → Nonce::classify: a nonce holder (its Hello carried the
//!                                 nonce) whose failure fails_accept, nonce unspent:
//!                                 HolderDied (remembered, first one wins); else Dropped
//!  after a round                → Nonce::verdict: a death remembered and no holder left in
//!                                 progress: accept fails with it
//!  full table (MAX_PENDING)     → evict: the oldest connection still waiting for its Hello
//! ```
//! What is a death ([`is_death`]): the peer's end closed, reset or failed. A stall past the
//! handshake deadline is not; any other failure is when the socket shows the peer gone.

use core::time::Duration;

use crate::Error;

/// Most handshakes in progress on one listen comm.
pub const MAX_PENDING: usize = 1024;

/// Drop messages per listen comm: at most one per this interval (the rest are counted).
pub const DROP_LOG_EVERY: Duration = Duration::from_secs(1);

/// What becomes of a failed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A nonce holder died (or this side is out of a resource for it): remember it.
    HolderDied,
    /// Junk, a stall, a replay, or a failure after the nonce was spent: drop it.
    Dropped,
}

/// The nonce of one listen comm, and the first nonce holder that died (`D`: its error and
/// where, as the caller describes it).
#[derive(Debug, Clone, Copy)]
pub struct Nonce<D> {
    spent: bool,
    died: Option<D>,
}

impl<D: Copy> Default for Nonce<D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<D: Copy> Nonce<D> {
    /// Unspent, no death remembered.
    pub const fn new() -> Self {
        Self {
            spent: false,
            died: None,
        }
    }

    /// Whether a completed connection used the nonce (every later one carrying it is a
    /// replay).
    pub fn spent(&self) -> bool {
        self.spent
    }

    /// A connection completed: the nonce is spent and a remembered death forgotten.
    pub fn completed(&mut self) {
        self.spent = true;
        self.died = None;
    }

    /// What becomes of a connection that failed with `e`: `nonce_seen`, whether its Hello
    /// carried the nonce; `socket_closed`, asked only when needed, whether its peer's end is
    /// closed or failed.
    pub fn classify(
        &self,
        nonce_seen: bool,
        e: &Error,
        socket_closed: impl FnOnce() -> bool,
    ) -> Failure {
        if !self.spent && nonce_seen && fails_accept(e, socket_closed) {
            Failure::HolderDied
        } else {
            Failure::Dropped
        }
    }

    /// A nonce holder died: remembered unless an earlier death is. Returns whether another
    /// holder is in progress (`others`), when the caller logs an INFO line instead of failing.
    pub fn holder_died(&mut self, d: D, others: bool) -> bool {
        self.died.get_or_insert(d);
        others
    }

    /// After a round over the connections: the death `accept` fails with, when one is
    /// remembered and no nonce holder (`holders`) is left in progress.
    pub fn verdict(&self, holders: bool) -> Option<D> {
        self.died.filter(|_| !holders)
    }
}

/// The error a connection carrying the spent nonce `nonce` is dropped with.
pub fn replay(nonce: u64) -> Error {
    Error::Wire {
        what: "Hello nonce already used by a completed connection (replay refused)",
        value: nonce,
    }
}

/// Whether `e`, a nonce holder's failure, fails `accept`: its death, or this side unable to
/// make any comm for it, which no other connection could get past either: out of a resource
/// (`Error::Full`: past `maxComms`, e.g. the soft memory budget), or no GID of the port in
/// `NCCL_IB_ADDR_FAMILY`/`_RANGE` any more (`Error::NoGid`: it vanished after init).
pub fn fails_accept(e: &Error, socket_closed: impl FnOnce() -> bool) -> bool {
    matches!(e, Error::Full { .. } | Error::NoGid { .. }) || is_death(e, socket_closed)
}

/// Whether `e`, the error of a connection, is its death: its socket closed, reset or failed.
/// A stall past the deadline is not; any other failure (invalid bytes, this side's own setup
/// error) is when `socket_closed` says the peer is gone (a soft peer whose process died fails
/// the QP setup before its socket's end-of-file is read).
pub fn is_death(e: &Error, socket_closed: impl FnOnce() -> bool) -> bool {
    match e {
        Error::PeerGone { .. } => true,
        Error::Provider { call, .. } if call.ends_with("(handshake)") => true,
        Error::Provider { call, .. } if call.starts_with("bootstrap handshake timed out") => false,
        _ => socket_closed(),
    }
}

/// Whether another connection may start on a table of `len` connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Below [`MAX_PENDING`].
    Free,
    /// Full: drop the connection at this position (the oldest still waiting for its Hello).
    Evict(usize),
    /// Full of connections past their Hello: wait.
    Full,
}

/// [`Room`] of a table whose connections, oldest first, are `idle` (still waiting for their
/// Hello) or not.
pub fn room(len: usize, idle: impl IntoIterator<Item = bool>) -> Room {
    if len < MAX_PENDING {
        return Room::Free;
    }
    match idle.into_iter().position(|i| i) {
        Some(i) => Room::Evict(i),
        None => Room::Full,
    }
}

/// Rate limit of a listen comm's drop messages: one per [`DROP_LOG_EVERY`], the rest counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct DropLog {
    last: Option<Duration>,
    quiet: u64,
}

impl DropLog {
    /// A drop at `now` (a monotonic clock's reading): `true` when it may be logged (the
    /// interval restarts), `false` when it is only counted.
    pub fn may_log(&mut self, now: Duration) -> bool {
        if self
            .last
            .is_some_and(|t| now.saturating_sub(t) < DROP_LOG_EVERY)
        {
            self.quiet += 1;
            return false;
        }
        self.last = Some(now);
        true
    }

    /// How many drops were counted without a message since the last one that named the count;
    /// the count restarts.
    pub fn take_quiet(&mut self) -> u64 {
        core::mem::take(&mut self.quiet)
    }
}

#[cfg(test)]
mod tests;
