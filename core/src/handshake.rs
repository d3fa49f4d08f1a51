//! Connect and accept as explicit, sans-IO state machines over byte buffers.
//!
//! `ffi` owns the socket; these types decide what to send, validate everything received, and
//! say when the caller must act on its QPs. The stages are the seed's (`ncclIbConnect` /
//! `ncclIbAccept`), plus a [`Hello`] carrying the listener's nonce:
//!
//! ```text
//!  Connector                                            Acceptor
//!  SendInfo ── Hello{nonce} · QpInfo{qpns, fifo} ─────▶ RecvHello → RecvInfo
//!  RecvInfo                                             Setup: Event::PeerInfo(connector's info,
//!     │                                                        mtu = min(its, ours));
//!     │                                                 caller creates + connects its QPs, then
//!     │                                                 handle_local_info(own QpInfo)
//!     ◀──────────────────────── QpInfo{qpns, mtu} ───── SendInfo
//!  Connect: Event::PeerInfo(acceptor's info);           RecvReady
//!  caller connects its QPs (RTR/RTS), then                 │
//!  handle_qps_connected()                                  │
//!  SendReady ── Ready ────────────────────────────────▶    │
//!  Done: Event::Done                                    Done: Event::Done
//! ```
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
//! layer, nonce, a missing FIFO) is an [`Error::Wire`] and moves the machine to `Failed`; a
//! peer that closes early is [`Error::PeerGone`]; every later input returns the same error.
//! An input the current state does not accept (a caller bug) is an [`Error::BadState`] and
//! leaves the state unchanged. Nothing panics.
//!
//! Each machine changes state in exactly one function (`step`), matching on
//! `(state, input)`; [`Connector::state_name`] names the state for logs.

use core::mem;

use crate::error::{Error, PeerId, Result};
use crate::provider::{LinkLayer, Mtu, PortInfo};
use crate::wire::{
    check_ready, ready_bytes, Hello, QpInfo, HELLO_LEN, QP_INFO_HEADER_LEN, QP_INFO_MAX_LEN,
    READY_LEN,
};

/// What a machine reports to its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // no `alloc` to box into; one event per handshake
pub enum Event {
    /// The peer's validated info. Its `mtu` is the path MTU to use: for the acceptor the
    /// minimum of both ports', for the connector the acceptor's answer (already that minimum).
    PeerInfo(QpInfo),
    /// The handshake is complete; the socket is no longer needed.
    Done,
}

/// Bytes queued for the socket.
#[derive(Clone)]
struct Tx {
    buf: [u8; HELLO_LEN + QP_INFO_MAX_LEN],
    len: usize,
    sent: usize,
}

impl Tx {
    fn new(parts: &[&[u8]]) -> Self {
        let mut t = Self {
            buf: [0; HELLO_LEN + QP_INFO_MAX_LEN],
            len: 0,
            sent: 0,
        };
        for p in parts {
            t.buf[t.len..t.len + p.len()].copy_from_slice(p);
            t.len += p.len();
        }
        t
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
}

/// One input to a machine (private: the public `handle_*` methods build these).
#[allow(clippy::large_enum_variant)] // no `alloc` to box into; lives for one call
enum Input<'a> {
    Recv(&'a [u8]),
    Sent(usize),
    QpsConnected,
    LocalInfo(QpInfo),
    Eof,
}

impl Input<'_> {
    fn op(&self) -> &'static str {
        match self {
            Self::Recv(_) => "handle_recv",
            Self::Sent(_) => "handle_sent",
            Self::QpsConnected => "handle_qps_connected",
            Self::LocalInfo(_) => "handle_local_info",
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

// ---------------------------------------------------------------------------------------------

/// The connecting (sending) side's states; each owns only what is valid in it.
enum CState {
    /// Sending Hello + our QpInfo.
    SendInfo(Tx),
    /// Receiving the acceptor's QpInfo.
    RecvInfo(Rx),
    /// The caller connects its QPs; `peer` is `Some` until [`Event::PeerInfo`] is polled.
    Connect { peer: Option<QpInfo> },
    /// Sending Ready.
    SendReady(Tx),
    /// Complete; `reported` once [`Event::Done`] was polled.
    Done { reported: bool },
    /// Terminal.
    Failed(Error),
}

/// The connecting side of a handshake (NCCL `connect`, the future `SendComm`).
///
/// Created with the local QpInfo (QPs created, FIFO registered). See the module docs for the
/// driving loop.
pub struct Connector {
    state: CState,
    link_layer: LinkLayer,
    mtu: Mtu,
    nqps: usize,
    peer: PeerId,
}

impl Connector {
    /// Starts a handshake: `nonce` comes from the listener's
    /// [`ConnectHandle`](crate::wire::ConnectHandle); `local` describes this side's QPs and
    /// must carry its FIFO. Errors if `local` cannot be encoded (see [`QpInfo::encode`]) or has
    /// no FIFO.
    pub fn new(nonce: u64, local: &QpInfo) -> Result<Self> {
        if local.fifo.is_none() {
            return Err(Error::Missing {
                what: "connector FIFO in local QpInfo",
            });
        }
        let mut info = [0u8; QP_INFO_MAX_LEN];
        let n = local.encode(&mut info)?;
        let tx = Tx::new(&[&Hello { nonce }.encode(), &info[..n]]);
        Ok(Self {
            state: CState::SendInfo(tx),
            link_layer: local.link_layer,
            mtu: local.mtu,
            nqps: local.qpn.len(),
            peer: PeerId::default(),
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
            CState::RecvInfo(rx) => rx.wanted(),
            _ => 0,
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        match &mut self.state {
            CState::Connect { peer } => peer.take().map(Event::PeerInfo),
            CState::Done { reported } if !*reported => {
                *reported = true;
                Some(Event::Done)
            }
            _ => None,
        }
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

    /// The caller has connected every QP to the peer's (after [`Event::PeerInfo`]).
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
            CState::Connect { .. } => "Connect",
            CState::SendReady(_) => "SendReady",
            CState::Done { .. } => "Done",
            CState::Failed(_) => "Failed",
        }
    }

    /// Checks the acceptor's answer against our side.
    fn check_peer(&self, p: &QpInfo) -> Result<()> {
        if p.link_layer != self.link_layer {
            return Err(wire(
                "peer link layer differs from ours",
                p.link_layer as u8,
            ));
        }
        if p.qpn.len() != self.nqps {
            return Err(wire("peer nqps differs from ours", p.qpn.len() as u64));
        }
        if p.mtu > self.mtu {
            return Err(wire("peer answered an MTU above ours", p.mtu as u8));
        }
        // Wire v3: the answer carries the acceptor's sizes FIFO (multi-receive sizes).
        if p.fifo.is_none() {
            return Err(wire("acceptor sent no sizes FIFO", 0u64));
        }
        Ok(())
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
            // Our Hello + QpInfo go out; once all is written, wait for the answer.
            (CState::SendInfo(mut tx), Input::Sent(n)) => match tx.advance(n, op, name) {
                Ok(true) => (CState::RecvInfo(Rx::new(QP_INFO_HEADER_LEN)), Ok(0)),
                Ok(false) => (CState::SendInfo(tx), Ok(0)),
                Err(e) => (CState::SendInfo(tx), Err(e)),
            },
            // The acceptor's QpInfo comes in; validate it fully before reporting it.
            (CState::RecvInfo(mut rx), Input::Recv(d)) => {
                let n = rx.fill(d);
                let got = rx
                    .qp_info_progress()
                    .and_then(|whole| whole.then(|| QpInfo::decode(rx.bytes())).transpose());
                match got.and_then(|p| p.map(|p| self.check_peer(&p).map(|()| p)).transpose()) {
                    Ok(None) => (CState::RecvInfo(rx), Ok(n)),
                    Ok(Some(p)) => {
                        self.peer = peer_id(&p);
                        (CState::Connect { peer: Some(p) }, Ok(n))
                    }
                    Err(e) => (CState::Failed(e), Err(e)),
                }
            }
            // QPs are connected (and the event was taken): say Ready.
            (CState::Connect { peer: None }, Input::QpsConnected) => {
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

/// The accepting (receiving) side's states.
enum AState {
    /// Receiving the connector's Hello.
    RecvHello(Rx),
    /// Receiving the connector's QpInfo.
    RecvInfo(Rx),
    /// The caller creates and connects its QPs; `peer` is `Some` until polled. `nqps` is the
    /// count the caller must match.
    Setup {
        peer: Option<QpInfo>,
        nqps: usize,
        mtu: Mtu,
    },
    /// Sending our QpInfo.
    SendInfo(Tx),
    /// Receiving Ready.
    RecvReady(Rx),
    /// Complete; `reported` once [`Event::Done`] was polled.
    Done { reported: bool },
    /// Terminal.
    Failed(Error),
}

/// The accepting side of a handshake (NCCL `accept`, the future `RecvComm`).
///
/// Created per accepted socket with the listener's nonce and the local port. See the module
/// docs for the driving loop.
pub struct Acceptor {
    state: AState,
    nonce: u64,
    link_layer: LinkLayer,
    mtu: Mtu,
    peer: PeerId,
}

impl Acceptor {
    /// Starts accepting: `nonce` is the one this listener put in its handle; `port` is the
    /// local port the QPs will use.
    pub fn new(nonce: u64, port: &PortInfo) -> Self {
        Self {
            state: AState::RecvHello(Rx::new(HELLO_LEN)),
            nonce,
            link_layer: port.link_layer,
            mtu: port.mtu,
            peer: PeerId::default(),
        }
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
            AState::RecvHello(rx) | AState::RecvInfo(rx) | AState::RecvReady(rx) => rx.wanted(),
            _ => 0,
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        match &mut self.state {
            AState::Setup { peer, .. } => peer.take().map(Event::PeerInfo),
            AState::Done { reported } if !*reported => {
                *reported = true;
                Some(Event::Done)
            }
            _ => None,
        }
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

    /// After [`Event::PeerInfo`]: the caller created as many QPs as the peer has, connected
    /// them, and gives this side's info to send back. Its `mtu` is replaced by the negotiated
    /// one. Errors (state unchanged) when the QP count or link layer disagrees, or `local`
    /// cannot be encoded.
    pub fn handle_local_info(&mut self, local: QpInfo) -> Result<()> {
        self.step(Input::LocalInfo(local)).map(drop)
    }

    /// The socket reached end-of-file: [`Error::PeerGone`] unless the handshake is done.
    pub fn handle_eof(&mut self) -> Result<()> {
        self.step(Input::Eof).map(drop)
    }

    /// Whether the handshake completed.
    pub fn is_done(&self) -> bool {
        matches!(self.state, AState::Done { .. })
    }

    /// The current state's name, for logs.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            AState::RecvHello(_) => "RecvHello",
            AState::RecvInfo(_) => "RecvInfo",
            AState::Setup { .. } => "Setup",
            AState::SendInfo(_) => "SendInfo",
            AState::RecvReady(_) => "RecvReady",
            AState::Done { .. } => "Done",
            AState::Failed(_) => "Failed",
        }
    }

    /// Checks the connector's info against our port; returns the negotiated MTU.
    fn check_peer(&self, p: &QpInfo) -> Result<Mtu> {
        if p.link_layer != self.link_layer {
            return Err(wire(
                "peer link layer differs from ours",
                p.link_layer as u8,
            ));
        }
        if p.fifo.is_none() {
            return Err(wire("connector sent no FIFO", 0u64));
        }
        Ok(p.mtu.min(self.mtu))
    }

    /// Encodes the caller's answer, after checking it against what the peer needs.
    fn answer(&self, mut local: QpInfo, nqps: usize, mtu: Mtu) -> Result<Tx> {
        if local.fifo.is_none() {
            return Err(Error::Missing {
                what: "the acceptor's sizes FIFO",
            });
        }
        let n = local.qpn.len();
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
        local.mtu = mtu;
        let mut buf = [0u8; QP_INFO_MAX_LEN];
        let len = local.encode(&mut buf)?;
        Ok(Tx::new(&[&buf[..len]]))
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
            // The Hello must carry our nonce, or the connection is not for us.
            (AState::RecvHello(mut rx), Input::Recv(d)) => {
                let n = rx.fill(d);
                if rx.wanted() > 0 {
                    (AState::RecvHello(rx), Ok(n))
                } else {
                    match Hello::decode(rx.bytes()) {
                        Ok(h) if h.nonce == self.nonce => {
                            (AState::RecvInfo(Rx::new(QP_INFO_HEADER_LEN)), Ok(n))
                        }
                        Ok(h) => {
                            let e = wire("Hello nonce is not this listener's", h.nonce);
                            (AState::Failed(e), Err(e))
                        }
                        Err(e) => (AState::Failed(e), Err(e)),
                    }
                }
            }
            // The connector's QpInfo: validate fully, negotiate the MTU, report it.
            (AState::RecvInfo(mut rx), Input::Recv(d)) => {
                let n = rx.fill(d);
                let got = rx
                    .qp_info_progress()
                    .and_then(|whole| whole.then(|| QpInfo::decode(rx.bytes())).transpose());
                let checked = got.and_then(|p| {
                    p.map(|mut p| {
                        p.mtu = self.check_peer(&p)?;
                        Ok(p)
                    })
                    .transpose()
                });
                match checked {
                    Ok(None) => (AState::RecvInfo(rx), Ok(n)),
                    Ok(Some(p)) => {
                        self.peer = peer_id(&p);
                        let (nqps, mtu) = (p.qpn.len(), p.mtu);
                        (
                            AState::Setup {
                                peer: Some(p),
                                nqps,
                                mtu,
                            },
                            Ok(n),
                        )
                    }
                    Err(e) => (AState::Failed(e), Err(e)),
                }
            }
            // Our QPs are up: answer with our info (a bad answer is refused, state kept).
            (
                AState::Setup {
                    peer: None,
                    nqps,
                    mtu,
                },
                Input::LocalInfo(local),
            ) => match self.answer(local, nqps, mtu) {
                Ok(tx) => (AState::SendInfo(tx), Ok(0)),
                Err(e) => (
                    AState::Setup {
                        peer: None,
                        nqps,
                        mtu,
                    },
                    Err(e),
                ),
            },
            (AState::SendInfo(mut tx), Input::Sent(n)) => match tx.advance(n, op, name) {
                Ok(true) => (AState::RecvReady(Rx::new(READY_LEN)), Ok(0)),
                Ok(false) => (AState::SendInfo(tx), Ok(0)),
                Err(e) => (AState::SendInfo(tx), Err(e)),
            },
            // The connector's QPs are connected: done.
            (AState::RecvReady(mut rx), Input::Recv(d)) => {
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
        self.state = next;
        out
    }
}

#[cfg(test)]
mod tests;
