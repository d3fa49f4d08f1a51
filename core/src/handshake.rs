//! Connect and accept as explicit, sans-IO state machines over byte buffers.
//!
//! `ffi` owns the socket; these types decide what to send, validate everything received, and
//! say when the caller must act on its QPs. The stages are the seed's (`ncclIbConnect` /
//! `ncclIbAccept`), plus a [`Hello`] carrying the listener's nonce and the connector's rail
//! count, and a [`RailList`] after each side's QP infos (one `QpInfo` per rail: a fused NIC
//! has up to [`MAX_RAILS`], a plain device one):
//!
//! ```text
//!  Connector                                            Acceptor
//!  SendInfo ── Hello{nonce, n} · QpInfo×n · RailList ─▶ RecvHello (n = the listener's, else
//!  RecvInfo                                             refused) → RecvInfo → RecvRails
//!     │                                                 Setup: Event::PeerInfo ×n (rail order;
//!     │                                                        mtu = min(its, ours));
//!     │                                                 caller creates + connects its QPs, then
//!     │                                                 handle_local_rail ×n (own QpInfo, rail)
//!     ◀──────────────────── QpInfo×n{qpns, mtu} · RailList ── SendInfo
//!  RecvInfo → RecvRails                                 RecvReady
//!  Connect: Event::PeerInfo ×n (acceptor's infos);         │
//!  caller connects its QPs (RTR/RTS), then                 │
//!  handle_qps_connected()                                  │
//!  SendReady ── Ready ────────────────────────────────▶    │
//!  Done: Event::Done                                    Done: Event::Done
//! ```
//! The peer's [`RailList`] (its devices, and a fused comm's notice rings) is readable with
//! `peer_rails()` from the first [`Event::PeerInfo`] on. After the handshake a fused comm's
//! rails agree on nothing else in advance: which rails a message uses travels with each
//! clear-to-send (the receiver's live-rail mask, part of wire v4; `crate::fused`).
//!
//! # Driving a machine
//! Inputs are `handle_*`, outputs `poll_*`. In a loop, until [`Event::Done`] or an error:
//! 1. [`poll_transmit`](Connector::poll_transmit): write these bytes to the socket (any
//!    amount), then report how many with [`handle_sent`](Connector::handle_sent).
//! 2. [`poll_recv_len`](Connector::poll_recv_len): read *at most* this many bytes, and feed
//!    them to [`handle_recv`](Connector::handle_recv). Any split works, down to one byte.
//! 3. [`poll_event`](Connector::poll_event): act on [`Event::PeerInfo`] (connect the QPs, then
//!    tell the machine), and stop at [`Event::Done`].
//! 4. A socket that reports end-of-file: [`handle_eof`](Connector::handle_eof).
//!
//! # Errors
//! Anything malformed or inconsistent from the peer (magic, version, lengths, counts, MTU, link
//! layer, nonce, a missing FIFO, a rail count other than ours) is an [`Error::Wire`] and moves
//! the machine to `Failed`; a peer that closes early is [`Error::PeerGone`]; every later input
//! returns the same error. An input the current state does not accept (a caller bug) is an
//! [`Error::BadState`] and leaves the state unchanged. Nothing panics.
//!
//! Each machine changes state in exactly one function (`step`), matching on
//! `(state, input)`; [`Connector::state_name`] names the state for logs.

use core::mem;

use crate::error::{Error, PeerId, Result};
use crate::provider::{LinkLayer, Mtu, PortInfo};
use crate::wire::{
    check_ready, ready_bytes, Hello, QpInfo, RailInfo, RailList, HELLO_LEN, MAX_RAILS,
    QP_INFO_HEADER_LEN, QP_INFO_MAX_LEN, RAILS_MAX_LEN, READY_LEN,
};

/// The error text of a peer on another link layer (InfiniBand against RoCE): it names the
/// fix, as NCCL users look for it.
pub const PEER_LINK_LAYER: &str =
    "peer link layer differs from ours: select ports of one link layer on both sides with NCCL_IB_HCA";

/// What a machine reports to its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // no `alloc` to box into; one event per rail
pub enum Event {
    /// The peer's validated info for the next rail (rail order). Its `mtu` is the path MTU to
    /// use: for the acceptor the minimum of both ports', for the connector the acceptor's
    /// answer (already that minimum).
    PeerInfo(QpInfo),
    /// The handshake is complete; the socket is no longer needed.
    Done,
}

/// Bytes one side sends at most: Hello, a `QpInfo` per rail, the rail list.
const TX_MAX: usize = HELLO_LEN + MAX_RAILS * QP_INFO_MAX_LEN + RAILS_MAX_LEN;

/// Bytes queued for the socket.
#[derive(Clone)]
struct Tx {
    buf: [u8; TX_MAX],
    len: usize,
    sent: usize,
}

impl Tx {
    fn new(parts: &[&[u8]]) -> Self {
        let mut t = Self {
            buf: [0; TX_MAX],
            len: 0,
            sent: 0,
        };
        for p in parts {
            t.push(p);
        }
        t
    }
    /// Appends `p` (callers stay within [`TX_MAX`]: at most one Hello, `MAX_RAILS` infos and
    /// one rail list).
    fn push(&mut self, p: &[u8]) {
        self.buf[self.len..self.len + p.len()].copy_from_slice(p);
        self.len += p.len();
    }
    /// Appends what `enc` writes into the free room.
    fn push_with(&mut self, enc: impl FnOnce(&mut [u8]) -> Result<usize>) -> Result<()> {
        let n = enc(&mut self.buf[self.len..])?;
        self.len += n;
        Ok(())
    }
    fn pending(&self) -> &[u8] {
        &self.buf[self.sent..self.len]
    }
    /// Records `n` sent bytes; `Ok(true)` once all are sent.
    fn advance(&mut self, n: usize, op: &'static str, state: &'static str) -> Result<bool> {
        if n > self.len - self.sent {
            return Err(Error::BadState { op, state });
        }
        self.sent += n;
        Ok(self.sent == self.len)
    }
}

/// Bytes being collected from the socket; `need` may grow once a header is known.
#[derive(Clone)]
struct Rx {
    buf: [u8; QP_INFO_MAX_LEN],
    got: usize,
    need: usize,
}

impl Rx {
    fn new(need: usize) -> Self {
        Self {
            buf: [0; QP_INFO_MAX_LEN],
            got: 0,
            need,
        }
    }
    fn wanted(&self) -> usize {
        self.need - self.got
    }
    /// Takes what fits; returns the count taken.
    fn fill(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.wanted());
        self.buf[self.got..self.got + n].copy_from_slice(&data[..n]);
        self.got += n;
        n
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.got]
    }
    /// For a QpInfo: once the header is in, learn the frame length. `Ok(true)` when the
    /// whole message is in.
    fn qp_info_progress(&mut self) -> Result<bool> {
        if self.got == QP_INFO_HEADER_LEN && self.need == QP_INFO_HEADER_LEN {
            self.need = QpInfo::frame_len(self.bytes())?;
        }
        Ok(self.got == self.need && self.need > QP_INFO_HEADER_LEN)
    }
    /// A whole `QpInfo` decoded, or `None` while bytes are missing.
    fn qp_info(&mut self) -> Result<Option<QpInfo>> {
        if !self.qp_info_progress()? {
            return Ok(None);
        }
        QpInfo::decode(self.bytes()).map(Some)
    }
}

/// One input to a machine (private: the public `handle_*` methods build these).
#[allow(clippy::large_enum_variant)] // no `alloc` to box into; lives for one call
enum Input<'a> {
    Recv(&'a [u8]),
    Sent(usize),
    QpsConnected,
    LocalInfo(QpInfo, RailInfo),
    Eof,
}

impl Input<'_> {
    fn op(&self) -> &'static str {
        match self {
            Self::Recv(_) => "handle_recv",
            Self::Sent(_) => "handle_sent",
            Self::QpsConnected => "handle_qps_connected",
            Self::LocalInfo(..) => "handle_local_rail",
            Self::Eof => "handle_eof",
        }
    }
}

fn wire(what: &'static str, value: impl Into<u64>) -> Error {
    Error::Wire {
        what,
        value: value.into(),
    }
}

fn peer_id(i: &QpInfo) -> PeerId {
    PeerId {
        gid: i.gid,
        lid: i.lid,
        qpn: i.qpn.first().copied().unwrap_or(0),
        addr: None,
    }
}

/// The rails' infos a side received so far.
type Peers = heapless::Vec<QpInfo, MAX_RAILS>;

/// The states both sides pass through while reading the peer's QpInfos (one per rail) and then
/// its rail list: [`take_info`] and [`recv_rails`] serve the connector and the acceptor alike.
trait PeerRead: Sized {
    /// Reading the peer's QpInfo of the next rail.
    fn info(rx: Rx) -> Self;
    /// Reading the peer's rail list.
    fn rails(rx: Rx) -> Self;
    /// The rail list is in: this side's next state.
    fn ready() -> Self;
    /// Terminal.
    fn failed(e: Error) -> Self;
}

/// The state after `n` more bytes of the peer's next QpInfo (`got`: not whole yet, or whole and
/// checked by the side): a whole one is kept in `peers`, and the next rail's QpInfo or, after
/// the last of `rails`, the rail list is read next.
fn take_info<S: PeerRead>(
    got: Result<Option<QpInfo>>,
    rx: Rx,
    n: usize,
    rails: usize,
    peers: &mut Peers,
) -> (S, Result<usize>) {
    match got {
        Ok(None) => (S::info(rx), Ok(n)),
        Ok(Some(p)) => {
            // Cannot fail: one info per rail, at most MAX_RAILS (the state moves on after the
            // last one).
            let _ = peers.push(p);
            if peers.len() < rails {
                (S::info(Rx::new(QP_INFO_HEADER_LEN)), Ok(n))
            } else {
                (S::rails(Rx::new(RailList::encoded_len(rails))), Ok(n))
            }
        }
        Err(e) => (S::failed(e), Err(e)),
    }
}

/// Bytes of the peer's rail list: once whole, decoded into `peer_rails` and the peer named
/// (`peer`) by its first rail; the side's next state follows.
fn recv_rails<S: PeerRead>(
    mut rx: Rx,
    d: &[u8],
    rails: usize,
    peers: &Peers,
    peer_rails: &mut RailList,
    peer: &mut PeerId,
) -> (S, Result<usize>) {
    let n = rx.fill(d);
    if rx.wanted() > 0 {
        return (S::rails(rx), Ok(n));
    }
    match RailList::decode(rx.bytes(), rails) {
        Ok(l) => {
            *peer_rails = l;
            *peer = peer_id(&peers[0]);
            (S::ready(), Ok(n))
        }
        Err(e) => (S::failed(e), Err(e)),
    }
}

// ---------------------------------------------------------------------------------------------

/// The connecting (sending) side's states; each owns only what is valid in it.
enum CState {
    /// Sending Hello, our QpInfos and rail list.
    SendInfo(Tx),
    /// Receiving the acceptor's QpInfo of the next rail.
    RecvInfo(Rx),
    /// Receiving the acceptor's rail list.
    RecvRails(Rx),
    /// The caller connects its QPs; `next` is the rail whose [`Event::PeerInfo`] comes next.
    Connect { next: usize },
    /// Sending Ready.
    SendReady(Tx),
    /// Complete; `reported` once [`Event::Done`] was polled.
    Done { reported: bool },
    /// Terminal.
    Failed(Error),
}

impl PeerRead for CState {
    fn info(rx: Rx) -> Self {
        CState::RecvInfo(rx)
    }
    fn rails(rx: Rx) -> Self {
        CState::RecvRails(rx)
    }
    /// The caller connects its QPs, rail 0's event first.
    fn ready() -> Self {
        CState::Connect { next: 0 }
    }
    fn failed(e: Error) -> Self {
        CState::Failed(e)
    }
}

/// The connecting side of a handshake (NCCL `connect`, the future `SendComm`).
///
/// Created with the local QpInfo of each rail (QPs created, FIFO registered). See the module
/// docs for the driving loop.
pub struct Connector {
    state: CState,
    link_layer: LinkLayer,
    mtu: [Mtu; MAX_RAILS],
    nqps: usize,
    rails: usize,
    peer: PeerId,
    peers: Peers,
    peer_rails: RailList,
}

impl Connector {
    /// Starts a one-rail handshake: `nonce` comes from the listener's
    /// [`ConnectHandle`](crate::wire::ConnectHandle); `local` describes this side's QPs and
    /// must carry its FIFO. Errors if `local` cannot be encoded (see [`QpInfo::encode`]) or has
    /// no FIFO.
    pub fn new(nonce: u64, local: &QpInfo) -> Result<Self> {
        Self::with_rails(nonce, core::slice::from_ref(local), &RailList::single(0))
    }

    /// Starts a handshake over `locals.len()` rails (rail order): `locals[i]` describes rail
    /// `i`'s QPs (each with its FIFO, all of one link layer and QP count), `rails` their
    /// devices and, for a fused comm, this side's back ring on each.
    pub fn with_rails(nonce: u64, locals: &[QpInfo], rails: &RailList) -> Result<Self> {
        let n = locals.len();
        if n == 0 || n > MAX_RAILS || rails.len() != n {
            return Err(Error::OutOfRange {
                what: "rails of a connect (QP infos and rail list)",
                value: n as i64,
                min: 1,
                max: MAX_RAILS as i64,
            });
        }
        let mut tx = Tx::new(&[&Hello { nonce }.encode_rails(n as u8)]);
        let mut mtu = [Mtu::M256; MAX_RAILS];
        for (i, l) in locals.iter().enumerate() {
            if l.fifo.is_none() {
                return Err(Error::Missing {
                    what: "connector FIFO in local QpInfo",
                });
            }
            if l.link_layer != locals[0].link_layer || l.qpn.len() != locals[0].qpn.len() {
                return Err(Error::BadState {
                    op: "connect",
                    state: "rails differ in link layer or QP count",
                });
            }
            mtu[i] = l.mtu;
            tx.push_with(|b| l.encode(b))?;
        }
        tx.push_with(|b| rails.encode(b))?;
        Ok(Self {
            state: CState::SendInfo(tx),
            link_layer: locals[0].link_layer,
            mtu,
            nqps: locals[0].qpn.len(),
            rails: n,
            peer: PeerId::default(),
            peers: Peers::new(),
            peer_rails: RailList::default(),
        })
    }

    /// Bytes to write to the socket now, if any.
    pub fn poll_transmit(&self) -> Option<&[u8]> {
        match &self.state {
            CState::SendInfo(tx) | CState::SendReady(tx) => Some(tx.pending()),
            _ => None,
        }
    }

    /// How many bytes the machine wants to read now (0: none). Read at most this many.
    pub fn poll_recv_len(&self) -> usize {
        match &self.state {
            CState::RecvInfo(rx) | CState::RecvRails(rx) => rx.wanted(),
            _ => 0,
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        match &mut self.state {
            CState::Connect { next } if *next < self.peers.len() => {
                *next += 1;
                Some(Event::PeerInfo(self.peers[*next - 1].clone()))
            }
            CState::Done { reported } if !*reported => {
                *reported = true;
                Some(Event::Done)
            }
            _ => None,
        }
    }

    /// The acceptor's devices (and notice rings of a fused comm); empty before the first
    /// [`Event::PeerInfo`].
    pub fn peer_rails(&self) -> &RailList {
        &self.peer_rails
    }

    /// How many rails this connect has.
    pub fn rails(&self) -> usize {
        self.rails
    }

    /// `n` bytes of [`Connector::poll_transmit`] were written.
    pub fn handle_sent(&mut self, n: usize) -> Result<()> {
        self.step(Input::Sent(n)).map(drop)
    }

    /// Bytes read from the socket, in any split. Consumes as many as the handshake expects
    /// from the peer (across message boundaries) and returns that count; bytes past the last
    /// one the peer should send are left unconsumed. Reading at most
    /// [`Connector::poll_recv_len`] bytes at a time never over-reads the socket.
    pub fn handle_recv(&mut self, data: &[u8]) -> Result<usize> {
        let mut used = self.step(Input::Recv(data))?;
        while used < data.len() && self.poll_recv_len() > 0 {
            used += self.step(Input::Recv(&data[used..]))?;
        }
        Ok(used)
    }

    /// The caller has connected every rail's QPs to the peer's (after the last rail's
    /// [`Event::PeerInfo`]).
    pub fn handle_qps_connected(&mut self) -> Result<()> {
        self.step(Input::QpsConnected).map(drop)
    }

    /// The socket reached end-of-file: [`Error::PeerGone`] unless the handshake is done.
    pub fn handle_eof(&mut self) -> Result<()> {
        self.step(Input::Eof).map(drop)
    }

    /// Whether the handshake completed.
    pub fn is_done(&self) -> bool {
        matches!(self.state, CState::Done { .. })
    }

    /// The current state's name, for logs.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            CState::SendInfo(_) => "SendInfo",
            CState::RecvInfo(_) => "RecvInfo",
            CState::RecvRails(_) => "RecvRails",
            CState::Connect { .. } => "Connect",
            CState::SendReady(_) => "SendReady",
            CState::Done { .. } => "Done",
            CState::Failed(_) => "Failed",
        }
    }

    /// Checks the acceptor's answer for the next rail against our side.
    fn check_peer(&self, p: &QpInfo) -> Result<()> {
        if p.link_layer != self.link_layer {
            return Err(wire(PEER_LINK_LAYER, p.link_layer as u8));
        }
        if p.qpn.len() != self.nqps {
            return Err(wire("peer nqps differs from ours", p.qpn.len() as u64));
        }
        if p.mtu > self.mtu[self.peers.len()] {
            return Err(wire("peer answered an MTU above ours", p.mtu as u8));
        }
        // Wire v3: the answer carries the acceptor's sizes FIFO (multi-receive sizes).
        if p.fifo.is_none() {
            return Err(wire("acceptor sent no sizes FIFO", 0u64));
        }
        Ok(())
    }

    /// Bytes of the acceptor's next QpInfo: the next state once it is whole and checked.
    fn recv_info(&mut self, mut rx: Rx, d: &[u8]) -> (CState, Result<usize>) {
        let n = rx.fill(d);
        let got = rx
            .qp_info()
            .and_then(|p| p.map(|p| self.check_peer(&p).map(|()| p)).transpose());
        take_info(got, rx, n, self.rails, &mut self.peers)
    }

    /// The only place the state changes.
    fn step(&mut self, input: Input<'_>) -> Result<usize> {
        let op = input.op();
        let name = self.state_name();
        let placeholder = CState::Failed(Error::BadState { op, state: name });
        let (next, out) = match (mem::replace(&mut self.state, placeholder), input) {
            // Terminal: every input repeats the failure.
            (CState::Failed(e), _) => (CState::Failed(e), Err(e)),
            // A close after completion is normal.
            (s @ CState::Done { .. }, Input::Eof) => (s, Ok(0)),
            // A close before completion fails the handshake.
            (_, Input::Eof) => {
                let e = Error::PeerGone { peer: self.peer };
                (CState::Failed(e), Err(e))
            }
            // Our Hello, QpInfos and rail list go out; once all is written, wait for the answer.
            (CState::SendInfo(mut tx), Input::Sent(n)) => match tx.advance(n, op, name) {
                Ok(true) => (CState::RecvInfo(Rx::new(QP_INFO_HEADER_LEN)), Ok(0)),
                Ok(false) => (CState::SendInfo(tx), Ok(0)),
                Err(e) => (CState::SendInfo(tx), Err(e)),
            },
            // The acceptor's QpInfos come in; each is validated fully before it is reported.
            (CState::RecvInfo(rx), Input::Recv(d)) if !d.is_empty() => self.recv_info(rx, d),
            (CState::RecvRails(rx), Input::Recv(d)) if !d.is_empty() => {
                let (peers, rails) = (&self.peers, self.rails);
                recv_rails(rx, d, rails, peers, &mut self.peer_rails, &mut self.peer)
            }
            // Every rail's QPs are connected (and every event was taken): say Ready.
            (CState::Connect { next }, Input::QpsConnected) if next == self.peers.len() => {
                (CState::SendReady(Tx::new(&[&ready_bytes()])), Ok(0))
            }
            (CState::SendReady(mut tx), Input::Sent(n)) => match tx.advance(n, op, name) {
                Ok(true) => (CState::Done { reported: false }, Ok(0)),
                Ok(false) => (CState::SendReady(tx), Ok(0)),
                Err(e) => (CState::SendReady(tx), Err(e)),
            },
            // Receiving nothing is always fine.
            (s, Input::Recv([])) => (s, Ok(0)),
            // Anything else is a caller bug: refuse, keep the state.
            (s, _) => (s, Err(Error::BadState { op, state: name })),
        };
        self.state = next;
        out
    }
}

// ---------------------------------------------------------------------------------------------

/// The accepting (receiving) side's states. `Setup` is the largest by its rail list (8 rails);
/// core never allocates, so no variant is boxed: ffi boxes the whole machine.
#[allow(clippy::large_enum_variant)]
enum AState {
    /// Receiving the connector's Hello.
    RecvHello(Rx),
    /// Receiving the connector's QpInfo of the next rail.
    RecvInfo(Rx),
    /// Receiving the connector's rail list.
    RecvRails(Rx),
    /// The caller creates and connects its QPs: `next` is the rail whose [`Event::PeerInfo`]
    /// comes next, `answered` how many rails the caller answered (into `tx`, with `rails`).
    Setup {
        next: usize,
        answered: usize,
        tx: Tx,
        rails: RailList,
    },
    /// Sending our QpInfos and rail list.
    SendInfo(Tx),
    /// Receiving Ready.
    RecvReady(Rx),
    /// Complete; `reported` once [`Event::Done`] was polled.
    Done { reported: bool },
    /// Terminal.
    Failed(Error),
}

impl PeerRead for AState {
    fn info(rx: Rx) -> Self {
        AState::RecvInfo(rx)
    }
    fn rails(rx: Rx) -> Self {
        AState::RecvRails(rx)
    }
    /// The caller creates and connects its QPs, rail 0's event first.
    fn ready() -> Self {
        AState::Setup {
            next: 0,
            answered: 0,
            tx: Tx::new(&[]),
            rails: RailList::default(),
        }
    }
    fn failed(e: Error) -> Self {
        AState::Failed(e)
    }
}

/// The accepting side of a handshake (NCCL `accept`, the future `RecvComm`).
///
/// Created per accepted socket with the listener's nonce and the local ports (one per rail).
/// See the module docs for the driving loop.
pub struct Acceptor {
    state: AState,
    nonce: u64,
    /// A Hello carrying `nonce` was received (it stays set when the machine fails later).
    nonce_seen: bool,
    /// The state the machine failed in (`None` while it has not).
    failed_in: Option<&'static str>,
    link_layer: LinkLayer,
    mtu: [Mtu; MAX_RAILS],
    rails: usize,
    peer: PeerId,
    peers: Peers,
    peer_rails: RailList,
}

impl Acceptor {
    /// Starts accepting on one rail: `nonce` is the one this listener put in its handle;
    /// `port` is the local port the QPs will use.
    pub fn new(nonce: u64, port: &PortInfo) -> Self {
        let mut mtu = [Mtu::M256; MAX_RAILS];
        mtu[0] = port.mtu;
        Self {
            state: AState::RecvHello(Rx::new(HELLO_LEN)),
            nonce,
            nonce_seen: false,
            failed_in: None,
            link_layer: port.link_layer,
            mtu,
            rails: 1,
            peer: PeerId::default(),
            peers: Peers::new(),
            peer_rails: RailList::default(),
        }
    }

    /// Starts accepting on the rails whose ports are `ports` (rail order, 1..=[`MAX_RAILS`],
    /// of rail 0's link layer): a connector must announce as many rails.
    pub fn with_rails(nonce: u64, ports: &[PortInfo]) -> Result<Self> {
        let (Some(first), true) = (ports.first(), ports.len() <= MAX_RAILS) else {
            return Err(Error::OutOfRange {
                what: "rails of an accept (ports)",
                value: ports.len() as i64,
                min: 1,
                max: MAX_RAILS as i64,
            });
        };
        let mut me = Self::new(nonce, first);
        for (m, p) in me.mtu.iter_mut().zip(ports) {
            *m = p.mtu;
        }
        me.rails = ports.len();
        Ok(me)
    }

    /// Bytes to write to the socket now, if any.
    pub fn poll_transmit(&self) -> Option<&[u8]> {
        match &self.state {
            AState::SendInfo(tx) => Some(tx.pending()),
            _ => None,
        }
    }

    /// How many bytes the machine wants to read now (0: none). Read at most this many.
    pub fn poll_recv_len(&self) -> usize {
        match &self.state {
            AState::RecvHello(rx)
            | AState::RecvInfo(rx)
            | AState::RecvRails(rx)
            | AState::RecvReady(rx) => rx.wanted(),
            _ => 0,
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        match &mut self.state {
            AState::Setup { next, .. } if *next < self.peers.len() => {
                *next += 1;
                Some(Event::PeerInfo(self.peers[*next - 1].clone()))
            }
            AState::Done { reported } if !*reported => {
                *reported = true;
                Some(Event::Done)
            }
            _ => None,
        }
    }

    /// The connector's devices (and back rings of a fused comm); empty before the first
    /// [`Event::PeerInfo`].
    pub fn peer_rails(&self) -> &RailList {
        &self.peer_rails
    }

    /// How many rails this accept has.
    pub fn rails(&self) -> usize {
        self.rails
    }

    /// Bytes read from the socket, in any split. Consumes as many as the handshake expects
    /// from the peer (across message boundaries) and returns that count; bytes past the last
    /// one the peer should send are left unconsumed. Reading at most
    /// [`Acceptor::poll_recv_len`] bytes at a time never over-reads the socket.
    pub fn handle_recv(&mut self, data: &[u8]) -> Result<usize> {
        let mut used = self.step(Input::Recv(data))?;
        while used < data.len() && self.poll_recv_len() > 0 {
            used += self.step(Input::Recv(&data[used..]))?;
        }
        Ok(used)
    }

    /// `n` bytes of [`Acceptor::poll_transmit`] were written.
    pub fn handle_sent(&mut self, n: usize) -> Result<()> {
        self.step(Input::Sent(n)).map(drop)
    }

    /// One-rail [`Acceptor::handle_local_rail`] on device 0 without a ring.
    pub fn handle_local_info(&mut self, local: QpInfo) -> Result<()> {
        self.handle_local_rail(local, RailInfo::default())
    }

    /// After the next unanswered rail's [`Event::PeerInfo`]: the caller created as many QPs as
    /// the peer has on that rail, connected them, and gives this side's info (its `mtu` is
    /// replaced by the negotiated one) and rail description to send back; after the last rail
    /// the answer goes out. Errors (state unchanged) when the QP count or link layer
    /// disagrees, `local` cannot be encoded, or `rail` has a ring exactly when it must not.
    pub fn handle_local_rail(&mut self, local: QpInfo, rail: RailInfo) -> Result<()> {
        self.step(Input::LocalInfo(local, rail)).map(drop)
    }

    /// The socket reached end-of-file: [`Error::PeerGone`] unless the handshake is done.
    pub fn handle_eof(&mut self) -> Result<()> {
        self.step(Input::Eof).map(drop)
    }

    /// Whether the handshake completed.
    pub fn is_done(&self) -> bool {
        matches!(self.state, AState::Done { .. })
    }

    /// The state the handshake failed in (`None` while it has not failed), for the failure's
    /// message: [`Self::state_name`] says `Failed` by then, and one socket read may have moved
    /// the machine through several states before the error.
    pub fn failed_in(&self) -> Option<&'static str> {
        self.failed_in
    }

    /// Whether the connector's Hello carried this listener's nonce (whatever happened after,
    /// failure included): the connection is from someone who holds the listener's handle.
    pub fn nonce_seen(&self) -> bool {
        self.nonce_seen
    }

    /// The current state's name, for logs.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            AState::RecvHello(_) => "RecvHello",
            AState::RecvInfo(_) => "RecvInfo",
            AState::RecvRails(_) => "RecvRails",
            AState::Setup { .. } => "Setup",
            AState::SendInfo(_) => "SendInfo",
            AState::RecvReady(_) => "RecvReady",
            AState::Done { .. } => "Done",
            AState::Failed(_) => "Failed",
        }
    }

    /// Checks the connector's info for the next rail against our port; returns the
    /// negotiated MTU.
    fn check_peer(&self, p: &QpInfo) -> Result<Mtu> {
        if p.link_layer != self.link_layer {
            return Err(wire(PEER_LINK_LAYER, p.link_layer as u8));
        }
        if p.fifo.is_none() {
            return Err(wire("connector sent no FIFO", 0u64));
        }
        if let Some(first) = self.peers.first() {
            if first.qpn.len() != p.qpn.len() {
                return Err(wire("peer's rails differ in nqps", p.qpn.len() as u64));
            }
        }
        Ok(p.mtu.min(self.mtu[self.peers.len()]))
    }

    /// Encodes the caller's answer for rail `i` into `tx`, after checking it against what the
    /// peer needs.
    fn answer(&self, tx: &mut Tx, mut local: QpInfo, i: usize) -> Result<()> {
        if local.fifo.is_none() {
            return Err(Error::Missing {
                what: "the acceptor's sizes FIFO",
            });
        }
        let (n, nqps) = (local.qpn.len(), self.peers[i].qpn.len());
        if n != nqps {
            let (v, m) = (n as i64, nqps as i64);
            return Err(Error::OutOfRange {
                what: "acceptor nqps",
                value: v,
                min: m,
                max: m,
            });
        }
        if local.link_layer != self.link_layer {
            return Err(Error::BadState {
                op: "handle_local_info",
                state: "link layer changed",
            });
        }
        local.mtu = self.peers[i].mtu;
        let mut buf = [0u8; QP_INFO_MAX_LEN];
        let len = local.encode(&mut buf)?;
        tx.push(&buf[..len]);
        Ok(())
    }

    /// The caller's answer for the next rail; after the last one, the whole answer goes out.
    fn local_rail(
        &self,
        (next, answered, mut tx, mut rails): (usize, usize, Tx, RailList),
        local: QpInfo,
        rail: RailInfo,
    ) -> (AState, Result<usize>) {
        let op = "handle_local_rail";
        if answered >= next {
            let setup = AState::Setup {
                next,
                answered,
                tx,
                rails,
            };
            let state = "Setup (no rail's PeerInfo awaits an answer)";
            return (setup, Err(Error::BadState { op, state }));
        }
        let (len, n_rails) = (tx.len, rails.0.len());
        let mut r = self.answer(&mut tx, local, answered);
        if r.is_ok() {
            // Cannot fail: one entry per rail, at most MAX_RAILS.
            let _ = rails.0.push(rail);
            if answered + 1 == self.rails {
                r = tx.push_with(|b| rails.encode(b));
                if r.is_ok() {
                    return (AState::SendInfo(tx), Ok(0));
                }
            }
        }
        if let Err(e) = r {
            // Refused: nothing of this answer stays queued.
            tx.len = len;
            rails.0.truncate(n_rails);
            let setup = AState::Setup {
                next,
                answered,
                tx,
                rails,
            };
            return (setup, Err(e));
        }
        let setup = AState::Setup {
            next,
            answered: answered + 1,
            tx,
            rails,
        };
        (setup, Ok(0))
    }

    /// Bytes of the connector's Hello: its nonce must be ours, its rail count our rails'.
    fn recv_hello(&mut self, mut rx: Rx, d: &[u8]) -> (AState, Result<usize>) {
        let n = rx.fill(d);
        if rx.wanted() > 0 {
            return (AState::RecvHello(rx), Ok(n));
        }
        let e = match Hello::decode_rails(rx.bytes()) {
            Ok((h, _)) if h.nonce != self.nonce => {
                wire("Hello nonce is not this listener's", h.nonce)
            }
            Ok((_, r)) => {
                self.nonce_seen = true;
                if usize::from(r) == self.rails {
                    return (AState::RecvInfo(Rx::new(QP_INFO_HEADER_LEN)), Ok(n));
                }
                wire(
                    "peer's rail count differs from this listener's (a fused NIC on one side \
                     only: both ends must fuse as many devices)",
                    r,
                )
            }
            Err(e) => e,
        };
        (AState::Failed(e), Err(e))
    }

    /// Bytes of the connector's next QpInfo: validated fully, the MTU negotiated.
    fn recv_info(&mut self, mut rx: Rx, d: &[u8]) -> (AState, Result<usize>) {
        let n = rx.fill(d);
        let checked = rx.qp_info().and_then(|p| {
            p.map(|mut p| {
                p.mtu = self.check_peer(&p)?;
                Ok(p)
            })
            .transpose()
        });
        take_info(checked, rx, n, self.rails, &mut self.peers)
    }

    /// The only place the state changes.
    fn step(&mut self, input: Input<'_>) -> Result<usize> {
        let op = input.op();
        let name = self.state_name();
        let placeholder = AState::Failed(Error::BadState { op, state: name });
        let (next, out) = match (mem::replace(&mut self.state, placeholder), input) {
            // Terminal: every input repeats the failure.
            (AState::Failed(e), _) => (AState::Failed(e), Err(e)),
            // A close after completion is normal.
            (s @ AState::Done { .. }, Input::Eof) => (s, Ok(0)),
            // A close before completion fails the handshake.
            (_, Input::Eof) => {
                let e = Error::PeerGone { peer: self.peer };
                (AState::Failed(e), Err(e))
            }
            // The Hello must carry our nonce and rail count, or the connection is not for us.
            (AState::RecvHello(rx), Input::Recv(d)) if !d.is_empty() => self.recv_hello(rx, d),
            // The connector's QpInfos and rail list: validated, the MTU negotiated, reported.
            (AState::RecvInfo(rx), Input::Recv(d)) if !d.is_empty() => self.recv_info(rx, d),
            (AState::RecvRails(rx), Input::Recv(d)) if !d.is_empty() => {
                let (peers, rails) = (&self.peers, self.rails);
                recv_rails(rx, d, rails, peers, &mut self.peer_rails, &mut self.peer)
            }
            // Our QPs of a rail are up: its answer (a bad answer is refused, state kept).
            (
                AState::Setup {
                    next,
                    answered,
                    tx,
                    rails,
                },
                Input::LocalInfo(local, rail),
            ) => self.local_rail((next, answered, tx, rails), local, rail),
            (AState::SendInfo(mut tx), Input::Sent(n)) => match tx.advance(n, op, name) {
                Ok(true) => (AState::RecvReady(Rx::new(READY_LEN)), Ok(0)),
                Ok(false) => (AState::SendInfo(tx), Ok(0)),
                Err(e) => (AState::SendInfo(tx), Err(e)),
            },
            // The connector's QPs are connected: done.
            (AState::RecvReady(mut rx), Input::Recv(d)) if !d.is_empty() => {
                let n = rx.fill(d);
                if rx.wanted() > 0 {
                    (AState::RecvReady(rx), Ok(n))
                } else {
                    match check_ready(rx.bytes()) {
                        Ok(()) => (AState::Done { reported: false }, Ok(n)),
                        Err(e) => (AState::Failed(e), Err(e)),
                    }
                }
            }
            // Receiving nothing is always fine.
            (s, Input::Recv([])) => (s, Ok(0)),
            // Anything else is a caller bug: refuse, keep the state.
            (s, _) => (s, Err(Error::BadState { op, state: name })),
        };
        if matches!(next, AState::Failed(_)) && self.failed_in.is_none() {
            self.failed_in = Some(name);
        }
        self.state = next;
        out
    }
}

#[cfg(test)]
mod tests;
