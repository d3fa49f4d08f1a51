//! The I/O half of the bootstrap handshake: drives the core's sans-IO handshake machines
//! (`ibnet_core::handshake`: [`Connector`], [`Acceptor`], the protocol) over a non-blocking TCP
//! socket, without ever waiting, and enforces their deadline ([`stalled`]). (Named for what it
//! adds to the core's `handshake.rs`: the socket I/O.)
//!
//! One [`pump`] call moves as many bytes as the kernel takes and has, in the order the module
//! doc of [`ibnet_core::handshake`] gives:
//! ```text
//!  loop {
//!    poll_transmit → write (WouldBlock: stop writing) → handle_sent(n)
//!    poll_recv_len → read at most that many (WouldBlock: stop; 0 bytes: handle_eof)
//!                  → handle_recv(bytes)
//!    poll_event    → return it to the caller (PeerInfo: act on the QPs; Done: finished)
//!  } until neither direction made progress
//! ```
//! Reading at most `poll_recv_len` bytes means no byte after the handshake is ever consumed.
//! A closed peer becomes `Error::PeerGone` through
//! `handle_eof`; a socket error is an [`Error::Provider`] naming the call. A stalled peer is
//! the caller's deadline to enforce.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use ibnet_core::handshake::{Acceptor, Connector, Event};
use ibnet_core::wire::QP_INFO_MAX_LEN;
use ibnet_core::{Error, Result};

/// The driving surface both handshake machines share.
pub trait Machine {
    /// See [`Connector::poll_transmit`].
    fn poll_transmit(&self) -> Option<&[u8]>;
    /// See [`Connector::handle_sent`].
    fn handle_sent(&mut self, n: usize) -> Result<()>;
    /// See [`Connector::poll_recv_len`].
    fn poll_recv_len(&self) -> usize;
    /// See [`Connector::handle_recv`].
    fn handle_recv(&mut self, data: &[u8]) -> Result<usize>;
    /// See [`Connector::handle_eof`].
    fn handle_eof(&mut self) -> Result<()>;
    /// See [`Connector::poll_event`].
    fn poll_event(&mut self) -> Option<Event>;
}

macro_rules! machine {
    ($t:ty) => {
        impl Machine for $t {
            fn poll_transmit(&self) -> Option<&[u8]> {
                <$t>::poll_transmit(self)
            }
            fn handle_sent(&mut self, n: usize) -> Result<()> {
                <$t>::handle_sent(self, n)
            }
            fn poll_recv_len(&self) -> usize {
                <$t>::poll_recv_len(self)
            }
            fn handle_recv(&mut self, data: &[u8]) -> Result<usize> {
                <$t>::handle_recv(self, data)
            }
            fn handle_eof(&mut self) -> Result<()> {
                <$t>::handle_eof(self)
            }
            fn poll_event(&mut self) -> Option<Event> {
                <$t>::poll_event(self)
            }
        }
    };
}
machine!(Connector);
machine!(Acceptor);

fn io(call: &'static str, e: &std::io::Error) -> Error {
    Error::Provider {
        call,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// Moves bytes between `s` (non-blocking) and `m` until neither direction can progress or the
/// machine has an event, which is returned.
pub fn pump<M: Machine>(s: &mut TcpStream, m: &mut M) -> Result<Option<Event>> {
    let mut buf = [0u8; QP_INFO_MAX_LEN];
    loop {
        if let Some(ev) = m.poll_event() {
            return Ok(Some(ev));
        }
        let mut progressed = false;
        if let Some(tx) = m.poll_transmit() {
            if !tx.is_empty() {
                match s.write(tx) {
                    Ok(0) => return Err(io("send (handshake)", &ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        m.handle_sent(n)?;
                        progressed = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => progressed = true,
                    Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                        m.handle_eof()?;
                        return Err(io("send (handshake)", &e));
                    }
                    Err(e) => return Err(io("send (handshake)", &e)),
                }
            }
        }
        let want = m.poll_recv_len().min(buf.len());
        if want > 0 {
            match s.read(&mut buf[..want]) {
                Ok(0) => {
                    m.handle_eof()?;
                    // A machine that accepts EOF here is done; report its event, if any.
                    return Ok(m.poll_event());
                }
                Ok(n) => {
                    let used = m.handle_recv(&buf[..n])?;
                    debug_assert_eq!(used, n, "read at most poll_recv_len bytes");
                    progressed = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => progressed = true,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                    m.handle_eof()?;
                    return Err(io("recv (handshake)", &e));
                }
                Err(e) => return Err(io("recv (handshake)", &e)),
            }
        }
        if !progressed {
            return Ok(m.poll_event());
        }
    }
}

/// The error of a handshake stalled past its deadline, naming the state it stalled in (the
/// one WARN is the caller's).
pub fn stalled(deadline: Instant, state: &'static str) -> Result<()> {
    if Instant::now() > deadline {
        return Err(Error::Provider {
            call: timeout_call(state),
            errno: libc::ETIMEDOUT,
        });
    }
    Ok(())
}

/// `Error::Provider::call` for a timeout in `state` (a static string per handshake state).
fn timeout_call(state: &str) -> &'static str {
    match state {
        "TcpConnect" => "bootstrap handshake timed out in state TcpConnect (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "SendInfo" => "bootstrap handshake timed out in state SendInfo (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "RecvInfo" => "bootstrap handshake timed out in state RecvInfo (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Connect" => "bootstrap handshake timed out in state Connect (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "SendReady" => "bootstrap handshake timed out in state SendReady (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "RecvHello" => "bootstrap handshake timed out in state RecvHello (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Setup" => "bootstrap handshake timed out in state Setup (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "RecvReady" => "bootstrap handshake timed out in state RecvReady (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Done" => "bootstrap handshake timed out in state Done (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Failed" => "bootstrap handshake timed out in state Failed (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        _ => "bootstrap handshake timed out (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
    }
}

/// Where a handshake stands, for its error message: the peer's socket address and the state
/// the machine was in when the error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Where {
    /// The peer's socket address (the listener's for a connect, the connector's for accept).
    pub peer: SocketAddr,
    /// The handshake state (`TcpConnect` before the TCP connect completed).
    pub state: &'static str,
}

/// [`Where::state`] of a connected comm (its data-path errors name the peer only).
pub const CONNECTED: &str = "connected";

/// A handshake error as one line that names the peer by socket address (the core's errors
/// know no address; a peer that is gone before its QPs are known has no GID to name).
pub struct AtPeer<'a>(pub &'a Error, pub Where);

impl fmt::Display for AtPeer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Where { peer, state } = self.1;
        match *self.0 {
            // A connected comm's errors mostly name the peer already (its `PeerId`).
            ref e if state == CONNECTED => {
                let s = e.to_string();
                if s.contains(&peer.to_string()) {
                    f.write_str(&s)
                } else {
                    write!(f, "{s} (peer {peer})")
                }
            }
            // Only the handshake deadline (`stalled`) is a timeout of the peer; an ETIMEDOUT of
            // a verbs call (`ibv_modify_qp`) is that call's error.
            Error::Provider {
                call,
                errno: libc::ETIMEDOUT,
            } if call.starts_with("bootstrap handshake timed out") => write!(
                f,
                "timed out waiting for {peer} in state {state} (IBNET_HANDSHAKE_TIMEOUT)"
            ),
            Error::PeerGone { .. } => write!(
                f,
                "peer {peer} closed the bootstrap connection in state {state}"
            ),
            Error::Provider { call, errno } => write!(
                f,
                "{call} with {peer} failed in state {state} (errno {errno}: {})",
                std::io::Error::from_raw_os_error(errno)
            ),
            ref e => write!(f, "{e} (peer {peer}, handshake state {state})"),
        }
    }
}

#[cfg(test)]
mod tests {
    /// A stalled handshake is one error naming its state (the caller's WARN is the only one).
    #[test]
    fn handshake_timeout_names_the_state() {
        use std::time::Duration;
        let past = Instant::now() - Duration::from_secs(1);
        let e = super::stalled(past, "RecvReady").unwrap_err();
        assert!(matches!(
            e,
            Error::Provider {
                errno: libc::ETIMEDOUT,
                ..
            }
        ));
        assert!(e.to_string().contains("in state RecvReady"), "{e}");
        let future = Instant::now() + Duration::from_secs(60);
        assert!(super::stalled(future, "RecvReady").is_ok());
    }

    /// Handshake errors name the peer's socket address and the state.
    #[test]
    fn errors_name_the_peer_address() {
        let w = Where {
            peer: "10.1.2.3:4567".parse().unwrap(),
            state: "RecvInfo",
        };
        let t = super::stalled(
            Instant::now() - std::time::Duration::from_secs(1),
            "RecvInfo",
        );
        let s = AtPeer(&t.unwrap_err(), w).to_string();
        assert_eq!(
            s,
            "timed out waiting for 10.1.2.3:4567 in state RecvInfo (IBNET_HANDSHAKE_TIMEOUT)"
        );
        let gone = Error::PeerGone {
            peer: Default::default(),
        };
        let s = AtPeer(&gone, w).to_string();
        assert!(s.contains("peer 10.1.2.3:4567 closed"), "{s}");
        assert!(!s.contains("gid"), "{s}");
        let refused = Error::Provider {
            call: "connect",
            errno: libc::ECONNREFUSED,
        };
        let s = AtPeer(
            &refused,
            Where {
                state: "TcpConnect",
                ..w
            },
        )
        .to_string();
        assert!(s.starts_with("connect with 10.1.2.3:4567 failed"), "{s}");
    }

    use super::*;
    use ibnet_core::provider::{Gid, LinkLayer, Mtu, PortInfo, ProviderAddr};
    use ibnet_core::wire::{QpInfo, RemoteBuf};

    fn pair() -> (TcpStream, TcpStream) {
        let l = crate::sock::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let c = crate::sock::connect_start(&l.local_addr().unwrap()).unwrap();
        let mut a = None;
        while a.is_none() {
            a = crate::sock::try_accept(&l).unwrap();
        }
        while !crate::sock::connect_done(&c).unwrap() {}
        (c, a.unwrap())
    }

    fn info(fifo: bool) -> QpInfo {
        let mut qpn = heapless::Vec::new();
        qpn.push(17).unwrap();
        QpInfo {
            port: 1,
            link_layer: LinkLayer::Ethernet,
            mtu: Mtu::M4096,
            lid: 0,
            gid: Gid([1; 16]),
            sl: 0,
            tc: 0,
            qpn,
            fifo: fifo.then_some(RemoteBuf {
                addr: 0x1000,
                rkey: 5,
            }),
            addr: ProviderAddr::EMPTY,
            ece: heapless::Vec::new(),
        }
    }

    fn port() -> PortInfo {
        PortInfo {
            port: 1,
            link_layer: LinkLayer::Ethernet,
            lid: 0,
            gid: Gid([2; 16]),
            gid_index: 0,
            mtu: Mtu::M1024,
            addr: ProviderAddr::EMPTY,
        }
    }

    #[test]
    fn full_handshake_over_tcp() {
        let (mut cs, mut as_) = pair();
        let mut c = Connector::new(9, &info(true)).unwrap();
        let mut a = Acceptor::new(9, &port());
        let (mut cdone, mut adone) = (false, false);
        for _ in 0..1_000_000 {
            if cdone && adone {
                break;
            }
            if !cdone {
                match pump(&mut cs, &mut c).unwrap() {
                    Some(Event::PeerInfo(p)) => {
                        assert_eq!(p.mtu, Mtu::M1024, "acceptor answers the minimum MTU");
                        c.handle_qps_connected().unwrap();
                    }
                    Some(Event::Done) => cdone = true,
                    None => {}
                }
            }
            if !adone {
                match pump(&mut as_, &mut a).unwrap() {
                    Some(Event::PeerInfo(p)) => {
                        assert_eq!(p.qpn[0], 17);
                        a.handle_local_info(info(true)).unwrap();
                    }
                    Some(Event::Done) => adone = true,
                    None => {}
                }
            }
        }
        assert!(cdone && adone);
    }

    #[test]
    fn peer_closing_mid_handshake_is_peer_gone() {
        let (cs, mut as_) = pair();
        let mut a = Acceptor::new(9, &port());
        drop(cs);
        let e = loop {
            match pump(&mut as_, &mut a) {
                Ok(None) => std::thread::yield_now(),
                Ok(Some(ev)) => panic!("unexpected event {ev:?}"),
                Err(e) => break e,
            }
        };
        assert!(matches!(e, Error::PeerGone { .. }), "{e:?}");
    }

    #[test]
    fn wrong_nonce_is_wire_error() {
        let (mut cs, mut as_) = pair();
        let mut c = Connector::new(8, &info(true)).unwrap();
        let mut a = Acceptor::new(9, &port());
        let e = loop {
            pump(&mut cs, &mut c).unwrap();
            match pump(&mut as_, &mut a) {
                Ok(_) => std::thread::yield_now(),
                Err(e) => break e,
            }
        };
        assert!(matches!(e, Error::Wire { .. }), "{e:?}");
    }
}
