//! The acceptor side of the bootstrap handshake: every connection queued on a listen comm's
//! port is handshaken concurrently, and one that fails never fails `accept`.
//!
//! A listen comm's port is reachable by anything on the network (port scanners, health
//! checkers, a replayed capture), and NCCL aborts the communicator when `accept` fails. So:
//! ```text
//!  accept():  take every queued connection (at most MAX_PENDING in progress; when full the
//!             oldest one still waiting for its Hello makes room)
//!             step each one's Acceptor (non-blocking):
//!               Done, nonce unused      → the recvComm; the nonce is spent
//!               invalid bytes, EOF,
//!               its own deadline passed,
//!               a replayed nonce        → dropped (socket and half-built comm), one
//!                                         rate-limited WARN naming its address
//!               waiting                 → stays, costing nothing but a recv per call
//! ```
//! No connection waits for another (no head-of-line blocking): an idle one costs its own
//! `IBNET_HANDSHAKE_TIMEOUT`, never the legitimate peer's time. The listener's nonce is single
//! use: once a connection completed with it, every later one carrying it is refused (NCCL
//! accepts exactly one connection per listen comm). A connection whose Hello carries the
//! nonce but that has not completed yet does not spend it, so a stalled copy cannot lock the
//! legitimate peer out.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ibnet_core::error::PeerId;
use ibnet_core::handshake::{Acceptor, Event};
use ibnet_core::Error;

use crate::dev::{AnyRecv, Dev};
use crate::handshake_io::{pump, stalled, AtPeer, Where};
use crate::plugin::Plugin;
use crate::watch::Watch;

/// Most handshakes in progress on one listen comm.
pub const MAX_PENDING: usize = 1024;

/// Drop messages per listen comm: at most one per this interval (the rest are counted).
const DROP_LOG_EVERY: Duration = Duration::from_secs(1);

/// One accepted connection being handshaken.
pub(super) struct Accepting {
    stream: TcpStream,
    peer: SocketAddr,
    /// The machine's state before the current step (the state an error happened in).
    state: &'static str,
    machine: Box<Acceptor>,
    /// Created at the connector's `PeerInfo`; handed to NCCL at `Done`.
    recv: Option<Box<AnyRecv>>,
    /// The connector (GID, LID, QP), from its `PeerInfo`.
    remote: PeerId,
    deadline: Instant,
}

/// What one listen comm knows about the connections on its port.
pub(super) struct Pending {
    conns: Vec<Accepting>,
    /// The handle's nonce was used by a completed handshake: refuse it from now on.
    spent: bool,
    /// When the last drop was logged, and how many were dropped silently since.
    last_log: Option<Instant>,
    quiet_drops: u64,
}

/// Why a connection that stepped without error is not done yet, or its comm.
enum Step {
    Waiting,
    Done(Box<AnyRecv>),
}

/// A finished accept: the comm and the watch of its peer (the kept bootstrap socket).
pub(super) type Accepted = (Box<AnyRecv>, Watch);

impl Pending {
    pub(super) fn new() -> Self {
        Self {
            conns: Vec::new(),
            spent: false,
            last_log: None,
            quiet_drops: 0,
        }
    }

    /// Adds a freshly accepted connection (the caller accepts only while [`Self::has_room`]).
    pub(super) fn add(
        &mut self,
        (stream, peer): (TcpStream, SocketAddr),
        dev: &Dev,
        nonce: u64,
        timeout: u64,
    ) {
        self.conns.push(Accepting {
            stream,
            peer,
            state: "RecvHello",
            machine: Box::new(Acceptor::new(nonce, &dev.port_info())),
            recv: None,
            remote: PeerId::default(),
            deadline: Instant::now() + Duration::from_secs(timeout),
        });
    }

    /// How many connections may start now (no idle one is dropped for them).
    pub(super) fn room(&self) -> usize {
        MAX_PENDING.saturating_sub(self.conns.len())
    }

    /// Whether another connection may start; when full, the oldest one still waiting for its
    /// Hello is dropped to make room (a flood of idle connections cannot shut the port).
    pub(super) fn has_room(&mut self) -> bool {
        if self.conns.len() < MAX_PENDING {
            return true;
        }
        let idle = self
            .conns
            .iter()
            .position(|a| a.machine.state_name() == "RecvHello");
        match idle {
            Some(i) => {
                let a = self.conns.remove(i);
                self.dropped(
                    a,
                    &Error::BadState {
                        op: "accept",
                        state: "idle while MAX_PENDING handshakes were in progress",
                    },
                );
                true
            }
            None => false,
        }
    }

    /// Steps every connection; returns the first comm completed. Failed ones are dropped.
    pub(super) fn step_all(&mut self, dev: &Dev, plugin: &Plugin, nonce: u64) -> Option<Accepted> {
        let mut i = 0;
        while i < self.conns.len() {
            match step(&mut self.conns[i], dev, plugin, nonce, self.spent) {
                Ok(Step::Waiting) => i += 1,
                Ok(Step::Done(r)) => {
                    self.spent = true;
                    let a = self.conns.swap_remove(i);
                    crate::info!(
                        crate::log::NET,
                        "accept: connection from {} handshaken",
                        a.peer
                    );
                    let w = Watch::new(a.stream, a.peer, a.remote, plugin.cfg.stall_warn_s);
                    return Some((r, w));
                }
                Err(e) => {
                    let a = self.conns.swap_remove(i);
                    self.dropped(a, &e);
                }
            }
        }
        None
    }

    /// The listener's own accept failed (ECONNABORTED, EMFILE, …): logged like a drop.
    pub(super) fn accept_failed(&mut self, e: &Error) {
        if self.quiet() {
            return;
        }
        crate::warn!("accept: {e}; still accepting");
    }

    /// Whether a drop message now would exceed one per [`DROP_LOG_EVERY`] (then it is
    /// counted instead); otherwise the caller logs, and the count restarts.
    fn quiet(&mut self) -> bool {
        let now = Instant::now();
        if self
            .last_log
            .is_some_and(|t| now.duration_since(t) < DROP_LOG_EVERY)
        {
            self.quiet_drops += 1;
            return true;
        }
        self.last_log = Some(now);
        false
    }

    /// Drops `a` (its socket and half-built comm), logging at most one line per
    /// [`DROP_LOG_EVERY`].
    fn dropped(&mut self, a: Accepting, why: &Error) {
        let at = Where {
            peer: a.peer,
            state: a.state,
        };
        let had_comm = a.recv.is_some();
        if let Some(r) = a.recv {
            let _ = r.close();
        }
        drop(a.stream);
        if self.quiet() {
            return;
        }
        crate::warn!(
            "accept: dropped the connection from {}{}: {}; still accepting ({} other \
             connection(s) dropped since the last such message)",
            at.peer,
            if had_comm { " (its comm closed)" } else { "" },
            AtPeer(why, at),
            self.quiet_drops
        );
        self.quiet_drops = 0;
    }
}

/// Drives one connection as far as it goes now.
fn step(
    a: &mut Accepting,
    dev: &Dev,
    plugin: &Plugin,
    nonce: u64,
    spent: bool,
) -> Result<Step, Error> {
    let replay = Error::Wire {
        what: "Hello nonce already used by a completed connection (replay refused)",
        value: nonce,
    };
    loop {
        a.state = a.machine.state_name();
        match pump(&mut a.stream, &mut *a.machine)? {
            Some(Event::PeerInfo(info)) => {
                a.state = a.machine.state_name();
                if spent {
                    return Err(replay);
                }
                dev.check_peer(&info)?;
                let addr = a.stream.peer_addr().ok();
                a.remote = super::connect::peer_id(&info, addr);
                let cfg = plugin.comm_config(dev, -1);
                let mut recv = Box::new(dev.new_recv(cfg, &info)?);
                if let Some(addr) = addr {
                    recv.set_peer_addr(addr);
                }
                a.machine.handle_local_info(recv.local_info())?;
                a.recv = Some(recv);
            }
            Some(Event::Done) if spent => return Err(replay),
            Some(Event::Done) => {
                return a.recv.take().map(Step::Done).ok_or(Error::BadState {
                    op: "accept",
                    state: "handshake done without a receive comm",
                })
            }
            None => break,
        }
    }
    stalled(a.deadline, a.machine.state_name())?;
    Ok(Step::Waiting)
}
