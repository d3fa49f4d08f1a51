//! Dead and stalled peers of a connected comm, noticed on the data path without costing it.
//!
//! A comm keeps its bootstrap socket after the handshake. The peer's process dying closes it
//! (the kernel does, whatever killed the process); the peer's host dying or dropping off the
//! network makes it fail by TCP keepalive ([`KEEPALIVE`]: within 25 s of silence). Neither
//! needs any traffic of ours, so a peer that dies while we wait for it (for its clear-to-send,
//! for its data, for our send's completion) is found on every provider.
//!
//! Cost: a call that made progress resets the wait (two stores). A call that returns "not
//! yet" counts; every [`SPIN_CHECK`]-th one reads the clock (vDSO, no syscall), and only when
//! the wait has lasted [`PROBE_EVERY`] since the last look does it peek at the socket (one
//! non-blocking `recv(MSG_PEEK)`):
//! ```text
//!  progress ──▶ Idle ──not yet──▶ Waiting{since} ──every 100 ms──▶ peek socket
//!                                    │   EOF / error: Dead (every later wait fails at once)
//!                                    └── waited IBNET_STALL_WARN s: one WARN (peer, comm,
//!                                        tag, what is awaited); the wait goes on
//! ```
//! A peer that closed its comm normally closes the socket too; that is an error only for a
//! call still waiting on it, which could never complete anyway.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ibnet_core::error::PeerId;
use ibnet_core::Error;

/// "Not yet" answers between two looks at the clock.
pub const SPIN_CHECK: u32 = 64;
/// Least time between two looks at the socket while a call waits.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// TCP keepalive of the kept socket, seconds: (idle, interval, probes). A silent host is
/// noticed within idle + probes × interval = 25 s.
pub const KEEPALIVE: (i32, i32, i32) = (10, 5, 3);

/// The liveness watch of one comm (data-path state: NCCL serialises a comm's calls).
pub struct Watch {
    sock: Option<TcpStream>,
    /// The peer's bootstrap socket address.
    pub addr: SocketAddr,
    /// The peer's GID, LID and first QP number.
    pub peer: PeerId,
    stall_warn: Option<Duration>,
    spins: u32,
    since: Option<Instant>,
    last_probe: Option<Instant>,
    warned: bool,
    dead: bool,
    /// The tag of the last `isend` / first tag of the last `irecv` (for the stall WARN).
    pub tag: u32,
}

impl Watch {
    /// Watches `sock` (the comm's bootstrap socket, handshake done) of the peer at `addr`.
    /// `stall_warn_s` 0: never warn. Keepalive failing to set is logged, not fatal.
    pub fn new(sock: TcpStream, addr: SocketAddr, peer: PeerId, stall_warn_s: u64) -> Self {
        let (idle, intvl, cnt) = KEEPALIVE;
        if let Err(e) = crate::sock::keepalive(&sock, idle, intvl, cnt) {
            crate::warn!("TCP keepalive on the bootstrap socket of {addr}: {e} (a silent host will not be noticed)");
        }
        Self {
            sock: Some(sock),
            addr,
            peer,
            stall_warn: (stall_warn_s > 0).then(|| Duration::from_secs(stall_warn_s)),
            spins: 0,
            since: None,
            last_probe: None,
            warned: false,
            dead: false,
            tag: 0,
        }
    }

    /// A call made progress: the wait, if any, is over.
    #[inline]
    pub fn progress(&mut self) {
        self.spins = 0;
        self.since = None;
        self.warned = false;
    }

    /// A call on comm `comm` returned "not yet" while waiting for `what`; `Err(PeerGone)` once
    /// the peer is known dead (the caller may look once more before reporting it).
    #[inline]
    pub fn waiting(&mut self, what: &str, comm: usize) -> Result<(), Error> {
        if self.dead {
            return Err(Error::PeerGone { peer: self.peer });
        }
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPIN_CHECK) {
            return Ok(());
        }
        self.look(what, comm)
    }

    #[cold]
    fn look(&mut self, what: &str, comm: usize) -> Result<(), Error> {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if self
            .last_probe
            .is_none_or(|t| now.duration_since(t) >= PROBE_EVERY)
        {
            self.last_probe = Some(now);
            if self.closed() {
                self.dead = true;
                return Err(Error::PeerGone { peer: self.peer });
            }
        }
        if let Some(limit) = self.stall_warn {
            if !self.warned && now.duration_since(since) >= limit {
                self.warned = true;
                crate::warn!(
                    "comm or request {comm:#x} has waited {}s for {what} from peer {} ({}), tag {:#x}: \
                     the peer is alive but not progressing (IBNET_STALL_WARN)",
                    now.duration_since(since).as_secs(),
                    self.addr,
                    self.peer,
                    self.tag
                );
            }
        }
        Ok(())
    }

    /// Whether the peer's end of the socket is closed or failed (one non-blocking peek).
    fn closed(&self) -> bool {
        let Some(s) = &self.sock else { return false };
        let mut b = [0u8; 1];
        match s.peek(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        }
    }
}
