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
//! call still waiting on it, which could never complete anyway. The state machine is core's
//! ([`ibnet_core::policy::watch`]); this module holds the socket and the clock.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ibnet_core::error::PeerId;
use ibnet_core::policy::watch::{Liveness, Look, Wait};
use ibnet_core::Error;

pub use ibnet_core::policy::watch::{PROBE_EVERY, SPIN_CHECK};

/// A monotonic clock's reading as the time since a fixed origin (the first call), the shape
/// core's policies take "now" in.
pub fn now() -> Duration {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed()
}
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
    live: Liveness,
    /// The tag of the last `isend` / first tag of the last `irecv` (for the stall WARN).
    pub tag: u32,
}

impl Watch {
    /// Watches `sock` (the comm's bootstrap socket, handshake done) of the peer at `addr`.
    /// `stall_warn_s` 0: never warn. Keepalive failing to set is logged, not fatal.
    pub fn new(sock: TcpStream, addr: SocketAddr, peer: PeerId, stall_warn_s: u64) -> Self {
        let (idle, intvl, cnt) = KEEPALIVE;
        if let Err(e) = crate::sock::keepalive(&sock, idle, intvl, cnt) {
            ibnet_nccl::warn!("TCP keepalive on the bootstrap socket of {addr}: {e} (a silent host will not be noticed)");
        }
        Self {
            sock: Some(sock),
            addr,
            peer,
            live: Liveness::new(stall_warn_s),
            tag: 0,
        }
    }

    /// A call made progress: the wait, if any, is over.
    #[inline]
    pub fn progress(&mut self) {
        self.live.progress();
    }

    /// A call on comm `comm` returned "not yet" while waiting for `what`; `Err(PeerGone)` once
    /// the peer is known dead (the caller may look once more before reporting it).
    #[inline]
    pub fn waiting(&mut self, what: &str, comm: usize) -> Result<(), Error> {
        match self.live.waiting() {
            Wait::Spin => Ok(()),
            Wait::Dead => Err(Error::PeerGone { peer: self.peer }),
            Wait::Look => self.look(what, comm),
        }
    }

    #[cold]
    fn look(&mut self, what: &str, comm: usize) -> Result<(), Error> {
        let sock = &self.sock;
        match self.live.look(now(), || closed(sock.as_ref())) {
            Look::Waiting => {}
            Look::Dead => return Err(Error::PeerGone { peer: self.peer }),
            Look::Stalled(waited) => ibnet_nccl::warn!(
                "comm or request {comm:#x} has waited {}s for {what} from peer {} ({}), tag {:#x}: \
                 the peer is alive but not progressing (IBNET_STALL_WARN)",
                waited.as_secs(),
                self.addr,
                self.peer,
                self.tag
            ),
        }
        Ok(())
    }
}

/// Whether the peer's end of `sock` is closed or failed (one non-blocking peek; no socket:
/// never).
pub fn closed(sock: Option<&TcpStream>) -> bool {
    let Some(s) = sock else { return false };
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    }
}
