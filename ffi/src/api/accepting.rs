//! The acceptor side of the bootstrap handshake: every connection queued on a listen comm's
//! port is handshaken concurrently. Junk never fails `accept`; the peer NCCL waits for dying
//! does.
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
//!             a nonce holder died and none is left in progress → accept fails (see below)
//! ```
//! No connection waits for another (no head-of-line blocking): an idle one costs its own
//! `IBNET_HANDSHAKE_TIMEOUT`, never the legitimate peer's time. The listener's nonce is single
//! use: once a connection completed with it, every later one carrying it is refused (NCCL
//! accepts exactly one connection per listen comm). A connection whose Hello carries the
//! nonce but that has not completed yet does not spend it, so a stalled copy cannot lock the
//! legitimate peer out.
//!
//! # A nonce holder that dies fails `accept`
//! A connection whose Hello carried this listen comm's nonce (a *nonce holder*) comes from
//! someone who has the handle NCCL passed between the ranks: it is the peer NCCL waits for,
//! or a replayed copy of it. When a nonce holder *dies* (its socket reports end-of-file, a
//! reset or another error, in any handshake state) while the nonce is unspent, the rule is:
//! ```text
//!  another nonce holder still in progress?
//!    no  → accept fails now with the death's error (PeerGone, a reset included:
//!          ncclRemoteError; another socket error: ncclSystemError) and ONE WARN naming the
//!          dead connection's address and handshake state
//!    yes → the death is remembered (an INFO line) and the others go on: one completing
//!          spends the nonce and forgets it; once none is left in progress (they died too,
//!          sent invalid bytes or timed out), accept fails with the first death remembered
//! ```
//! So a replayed copy that dies never costs the real peer its connection while the real peer
//! is in progress, and the real peer's death is never hidden for longer than the copies that
//! outlive it. What is not a death: the handshake deadline (a stall; a real connector stalled
//! that long fails its own `connect` on its deadline, which closes its socket: a death if seen
//! first), and any other failure (invalid bytes, even after a valid Hello; this side's own
//! setup error other than a full resource or a vanished GID) while the socket is still open:
//! those connections are dropped as junk is. The same failure with the socket closed is a
//! death (a soft peer whose process died fails the QP setup before its end-of-file is read).
//! A nonce holder that
//! this side cannot make a comm for (`Error::Full`: past `maxComms`, e.g. the soft memory
//! budget; `Error::NoGid`: the port's GID in the `NCCL_IB_ADDR_FAMILY`/`_RANGE` the user set
//! vanished after init) fails `accept` as a death does, with the limit or the port in its
//! WARN: NCCL's peer would otherwise wait for ever. A
//! connection that dies before its whole Hello arrived never showed the nonce: junk. Once
//! `accept` failed, later calls are refused (`Error::Poisoned`, the same kind, logged at
//! INFO): NCCL tears the communicator down.
//!
//! These decisions (the nonce, what fails `accept`, eviction, the drop-log rate) are core's
//! ([`ibnet_core::policy::nonce`]); this module holds the sockets and acts on them.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ibnet_core::error::PeerId;
use ibnet_core::handshake::{Acceptor, Event};
use ibnet_core::policy::nonce::{self, DropLog, Failure, Nonce, Room};
use ibnet_core::rails::{VNic, MAX_DEVS_PER_NIC};
use ibnet_core::wire::RailList;
use ibnet_core::Error;

use crate::dev::{AnyRecv, Infos};
use crate::handshake_io::{pump, stalled, AtPeer, Where};
use crate::nic::Nic;
use crate::plugin::Plugin;
use crate::watch::Watch;

pub use ibnet_core::policy::nonce::MAX_PENDING;

/// One accepted connection being handshaken.
pub(super) struct Accepting {
    stream: TcpStream,
    peer: SocketAddr,
    /// The machine's state before the current step (the state an error happened in).
    state: &'static str,
    machine: Box<Acceptor>,
    /// Created at the connector's `PeerInfo`; handed to NCCL at `Done`.
    recv: Option<Box<AnyRecv>>,
    /// The connector (GID, LID, QP), from its first `PeerInfo`.
    remote: PeerId,
    /// The connector's rail infos received so far (rail order).
    peers: Box<Infos>,
    deadline: Instant,
}

/// What one listen comm knows about the connections on its port.
pub(super) struct Pending {
    conns: Vec<Accepting>,
    /// The handle's nonce (spent once a handshake completed with it) and the first nonce
    /// holder that died while another one was in progress: its error and where.
    nonce: Nonce<(Error, Where)>,
    /// The drop messages' rate limit.
    drops: DropLog,
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
            nonce: Nonce::new(),
            drops: DropLog::default(),
        }
    }

    /// Adds a freshly accepted connection (the caller accepts only while [`Self::has_room`]).
    pub(super) fn add(
        &mut self,
        (stream, peer): (TcpStream, SocketAddr),
        nic: &Nic,
        nonce: u64,
        timeout: u64,
    ) {
        let ports = nic.ports();
        let machine = match Acceptor::with_rails(nonce, &ports) {
            Ok(m) => Box::new(m),
            // Unreachable: a NIC has 1..=MAX_RAILS ports.
            Err(_) => Box::new(Acceptor::new(nonce, &nic.dev().port_info())),
        };
        self.conns.push(Accepting {
            stream,
            peer,
            state: "RecvHello",
            machine,
            recv: None,
            remote: PeerId::default(),
            peers: Box::default(),
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
        let idle = self
            .conns
            .iter()
            .map(|a| a.machine.state_name() == "RecvHello");
        match nonce::room(self.conns.len(), idle) {
            Room::Free => true,
            Room::Evict(i) => {
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
            Room::Full => false,
        }
    }

    /// Steps every connection; returns the first comm completed. Failed ones are dropped,
    /// except that the death of a nonce holder fails the call when no other one is in progress
    /// (the module doc's rule): `Err` with the death's error and where it happened.
    pub(super) fn step_all(
        &mut self,
        nic: &Nic,
        plugin: &Plugin,
        nonce: u64,
    ) -> Result<Option<Accepted>, Box<(Error, Where)>> {
        let mut i = 0;
        while i < self.conns.len() {
            match step(&mut self.conns[i], nic, plugin, nonce, self.nonce.spent()) {
                Ok(Step::Waiting) => i += 1,
                Ok(Step::Done(r)) => {
                    self.nonce.completed();
                    let a = self.conns.swap_remove(i);
                    ibnet_nccl::info!(
                        ibnet_nccl::log::NET,
                        "accept: connection from {} handshaken",
                        a.peer
                    );
                    let w = Watch::new(a.stream, a.peer, a.remote, plugin.params.stall_warn_s);
                    return Ok(Some((r, w)));
                }
                Err(e) => {
                    let a = self.conns.swap_remove(i);
                    let closed = || crate::watch::closed(Some(&a.stream));
                    match self.nonce.classify(a.machine.nonce_seen(), &e, closed) {
                        Failure::HolderDied => self.holder_died(a, e),
                        Failure::Dropped => self.dropped(a, &e),
                    }
                }
            }
        }
        let holders = self.conns.iter().any(|a| a.machine.nonce_seen());
        match self.nonce.verdict(holders) {
            Some(d) => Err(Box::new(d)),
            None => Ok(None),
        }
    }

    /// A nonce holder died (the module doc's rule): remembered as the cause `accept` fails
    /// with, unless an earlier death is; an INFO line while another holder is in progress
    /// (the failure's WARN, if it comes, names the first death).
    fn holder_died(&mut self, a: Accepting, e: Error) {
        let at = Where {
            peer: a.peer,
            state: a.state,
        };
        if let Some(r) = a.recv {
            let _ = r.close();
        }
        drop(a.stream);
        let others = self.conns.iter().any(|c| c.machine.nonce_seen());
        if self.nonce.holder_died((e, at), others) {
            ibnet_nccl::info!(
                ibnet_nccl::log::NET,
                "accept: {}; another connection carrying this listener's nonce is in progress: \
                 waiting for it",
                AtPeer(&e, at)
            );
        }
    }

    /// The listener's own accept failed (ECONNABORTED, EMFILE, …): logged like a drop.
    pub(super) fn accept_failed(&mut self, e: &Error) {
        if self.quiet() {
            return;
        }
        ibnet_nccl::warn!("accept: {e}; still accepting");
    }

    /// Whether a drop message now would exceed one per [`nonce::DROP_LOG_EVERY`] (then it is
    /// counted instead); otherwise the caller logs.
    fn quiet(&mut self) -> bool {
        !self.drops.may_log(crate::watch::now())
    }

    /// Drops `a` (its socket and half-built comm), logging at most one line per
    /// [`nonce::DROP_LOG_EVERY`].
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
        ibnet_nccl::warn!(
            "accept: dropped the connection from {}{}: {}; still accepting ({} other \
             connection(s) dropped since the last such message)",
            at.peer,
            if had_comm { " (its comm closed)" } else { "" },
            AtPeer(why, at),
            self.drops.take_quiet()
        );
    }
}

/// Drives one connection as far as it goes now.
fn step(
    a: &mut Accepting,
    nic: &Nic,
    plugin: &Plugin,
    nonce: u64,
    spent: bool,
) -> Result<Step, Error> {
    let r = step_machine(a, nic, plugin, nonce, spent);
    if let (Err(_), Some(s)) = (&r, a.machine.failed_in()) {
        // The machine's own failure: the state it failed in (one read may cross several).
        a.state = s;
    }
    r
}

/// [`step`]'s loop: pumps the machine and acts on its events.
fn step_machine(
    a: &mut Accepting,
    nic: &Nic,
    plugin: &Plugin,
    nonce: u64,
    spent: bool,
) -> Result<Step, Error> {
    let replay = nonce::replay(nonce);
    loop {
        a.state = a.machine.state_name();
        match pump(&mut a.stream, &mut *a.machine)? {
            Some(Event::PeerInfo(info)) => {
                a.state = a.machine.state_name();
                if spent {
                    return Err(replay);
                }
                nic.check_peer(core::slice::from_ref(&info))?;
                if a.peers.is_empty() {
                    a.remote = super::connect::peer_id(&info, a.stream.peer_addr().ok());
                }
                // Cannot fail: the machine reports one info per rail, at most MAX_RAILS.
                let _ = a.peers.push(info);
                if a.peers.len() == a.machine.rails() {
                    set_up(a, nic, plugin)?;
                }
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

/// `NCCL_IB_WARN_RAIL_LOCAL=1`: one INFO line when the connecting peer's physical devices are
/// not ours, as NCCL 2.28 checks them when it accepts: the device numbers both lists share are
/// fewer than the longer list has (numbers compared as numbers, since both hosts number their
/// devices alike; a plain device is a list of one, so device 0 accepting from the peer's
/// device 1 is reported too). Only the accepting side checks; off by default.
fn rail_local(nic: &Nic, peer_rails: &RailList, remote: PeerId) {
    if !crate::plugin::current().is_some_and(|p| p.params.ib_warn_rail_local) {
        return;
    }
    let ours = nic.rail_devs();
    let theirs: heapless::Vec<u16, MAX_DEVS_PER_NIC> = peer_rails.0.iter().map(|r| r.dev).collect();
    let v = VNic::new(
        &ours.iter().map(|&d| i32::from(d)).collect::<Vec<_>>(),
        usize::from(u16::MAX),
    );
    if v.is_ok_and(|v| v.rails_differ(&theirs)) {
        ibnet_nccl::info!(
            ibnet_nccl::log::NET,
            "accept from {remote}: the peer's physical devices {theirs:?} are not this side's \
             {ours:?} (NCCL_IB_WARN_RAIL_LOCAL=1; set 0 to stop this line)"
        );
    }
}

/// Every rail's info is in: the receive comm (one core comm per rail), and this
/// side's answer for each rail.
fn set_up(a: &mut Accepting, nic: &Nic, plugin: &Plugin) -> Result<(), Error> {
    let cfg = plugin.comm_config(nic.dev(), -1);
    let mut recv = Box::new(nic.new_recv(cfg, &a.peers, a.machine.peer_rails())?);
    recv.set_resilience(ibnet_core::rails::Resilience::from_params(&plugin.params));
    if let Ok(addr) = a.stream.peer_addr() {
        recv.set_peer_addr(addr);
    }
    rail_local(nic, a.machine.peer_rails(), a.remote);
    let (infos, rails) = recv.rail_infos(&nic.rail_devs());
    a.recv = Some(recv);
    for (info, rail) in infos.into_iter().zip(rails.0) {
        a.machine.handle_local_rail(info, rail)?;
    }
    Ok(())
}
