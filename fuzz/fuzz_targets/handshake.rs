//! The handshake: the wire decoders, and both state machines fed arbitrary peer bytes.
//!
//! Input: `mode`, `cfg`, `chunk`, then the peer's bytes (see `ibnet_fuzz::seeds_handshake`).
//! * wire: every decoder gets the bytes; whatever decodes must re-encode to exactly those bytes,
//!   and every refusal is an `Error::Wire`.
//! * accept / connect: the machine is driven as `ffi::handshake_io::pump` drives it, reading at most
//!   `poll_recv_len` bytes and at most `chunk` at a time; events are answered as `ffi` answers
//!   them (an answer carries the sizes FIFO). A peer error is `Wire` or `PeerGone`, leaves the
//!   machine `Failed`, and repeats on every later input; a reported peer info satisfies what the
//!   machine promises about it.
#![no_main]

use ibnet_core::handshake::{Acceptor, Connector, Event};
use ibnet_core::wire::{
    check_ready, ready_bytes, Hello, QpInfo, RailList, MAX_RAILS, QP_INFO_HEADER_LEN,
    QP_INFO_MAX_LEN,
};
use ibnet_core::Error;
use ibnet_fuzz::{Cursor, Side, MODE_ACCEPT, MODE_CONNECT, NONCE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let mode = c.u8() % 3;
    let side = Side::from_cfg(c.u8());
    let chunk = 1 + usize::from(c.u8() % 64);
    let peer = c.rest();
    match mode {
        MODE_ACCEPT => accept(side, chunk, peer),
        MODE_CONNECT => connect(side, chunk, peer),
        _ => wire(peer),
    }
});

fn is_wire(e: &Error) -> bool {
    matches!(e, Error::Wire { .. })
}

fn wire(b: &[u8]) {
    match QpInfo::frame_len(b) {
        Ok(n) => assert!((QP_INFO_HEADER_LEN..=QP_INFO_MAX_LEN).contains(&n), "{n}"),
        Err(e) => assert!(is_wire(&e), "{e:?}"),
    }
    match QpInfo::decode(b) {
        Ok(i) => {
            assert_eq!(QpInfo::frame_len(b), Ok(b.len()));
            let mut out = [0u8; QP_INFO_MAX_LEN];
            let n = i.encode(&mut out).expect("a decoded QpInfo encodes");
            assert_eq!(&out[..n], b, "QpInfo re-encodes to other bytes");
        }
        Err(e) => assert!(is_wire(&e), "{e:?}"),
    }
    match Hello::decode_rails(b) {
        Ok((h, rails)) => assert_eq!(
            &h.encode_rails(rails)[..],
            b,
            "Hello re-encodes to other bytes"
        ),
        Err(e) => assert!(is_wire(&e), "{e:?}"),
    }
    // A rail list of the count its own header byte claims (so the fuzzer can reach decoding).
    let n = b.get(6).map_or(1, |&n| usize::from(n));
    match RailList::decode(b, n) {
        Ok(l) => {
            assert_eq!(b.len(), RailList::encoded_len(n));
            let mut out = [0u8; RailList::encoded_len(MAX_RAILS)];
            let len = l.encode(&mut out).expect("a decoded rail list encodes");
            assert_eq!(&out[..len], b, "rail list re-encodes to other bytes");
        }
        Err(e) => assert!(is_wire(&e), "{e:?}"),
    }
    match check_ready(b) {
        Ok(()) => assert_eq!(&ready_bytes()[..], b),
        Err(e) => assert!(is_wire(&e), "{e:?}"),
    }
}

/// The part both machines share: feeding bytes and checking how errors behave.
trait Machine {
    fn poll_transmit(&self) -> Option<&[u8]>;
    fn handle_sent(&mut self, n: usize) -> ibnet_core::Result<()>;
    fn poll_recv_len(&self) -> usize;
    fn handle_recv(&mut self, d: &[u8]) -> ibnet_core::Result<usize>;
    fn handle_eof(&mut self) -> ibnet_core::Result<()>;
    fn state_name(&self) -> &'static str;
    fn is_done(&self) -> bool;
}

macro_rules! machine {
    ($t:ty) => {
        impl Machine for $t {
            fn poll_transmit(&self) -> Option<&[u8]> {
                <$t>::poll_transmit(self)
            }
            fn handle_sent(&mut self, n: usize) -> ibnet_core::Result<()> {
                <$t>::handle_sent(self, n)
            }
            fn poll_recv_len(&self) -> usize {
                <$t>::poll_recv_len(self)
            }
            fn handle_recv(&mut self, d: &[u8]) -> ibnet_core::Result<usize> {
                <$t>::handle_recv(self, d)
            }
            fn handle_eof(&mut self) -> ibnet_core::Result<()> {
                <$t>::handle_eof(self)
            }
            fn state_name(&self) -> &'static str {
                <$t>::state_name(self)
            }
            fn is_done(&self) -> bool {
                <$t>::is_done(self)
            }
        }
    };
}
machine!(Acceptor);
machine!(Connector);

/// What one round of driving did.
enum Step {
    Progress,
    Stuck,
    Failed,
}

/// Sends what the machine has (in `chunk`s), then feeds it at most `chunk` peer bytes.
fn drive(m: &mut impl Machine, chunk: usize, peer: &mut &[u8]) -> Step {
    let mut moved = false;
    while let Some(tx) = m.poll_transmit() {
        let n = tx.len().min(chunk);
        if n == 0 {
            break;
        }
        m.handle_sent(n)
            .expect("sending what poll_transmit offered");
        moved = true;
    }
    let want = m.poll_recv_len();
    assert!(want <= QP_INFO_MAX_LEN, "asks for {want} bytes");
    let n = want.min(chunk).min(peer.len());
    if n == 0 {
        return if moved { Step::Progress } else { Step::Stuck };
    }
    match m.handle_recv(&peer[..n]) {
        Ok(used) => {
            assert!(used <= n, "consumed {used} of {n}");
            *peer = &peer[used..];
            if used > 0 || moved {
                Step::Progress
            } else {
                Step::Stuck
            }
        }
        Err(e) => {
            assert!(
                matches!(e, Error::Wire { .. } | Error::PeerGone { .. }),
                "peer bytes gave {e:?}"
            );
            assert_eq!(m.state_name(), "Failed");
            assert_eq!(m.handle_recv(&peer[..n]), Err(e), "a failure repeats");
            assert_eq!(m.handle_eof(), Err(e), "a failure repeats");
            assert!(m.poll_transmit().is_none() && m.poll_recv_len() == 0);
            Step::Failed
        }
    }
}

/// End of the peer's bytes: EOF is fine once done, `PeerGone` before.
fn finish(m: &mut impl Machine, failed: bool) {
    if failed {
        return;
    }
    let r = m.handle_eof();
    if m.is_done() {
        assert_eq!(r, Ok(()));
    } else {
        assert!(matches!(r, Err(Error::PeerGone { .. })), "{r:?}");
        assert_eq!(m.state_name(), "Failed");
    }
}

fn accept(side: Side, chunk: usize, mut peer: &[u8]) {
    let mut a = Acceptor::new(NONCE, &side.port());
    let mut failed = false;
    for _ in 0..10_000 {
        match a.poll_event() {
            Some(Event::PeerInfo(p)) => {
                assert_eq!(p.link_layer, side.link_layer);
                assert!(p.mtu <= side.mtu, "negotiated MTU above ours");
                assert!(p.fifo.is_some(), "a connector without FIFO was accepted");
                assert!(!p.qpn.is_empty());
                a.handle_local_info(side.info(p.qpn.len(), true))
                    .expect("a matching answer is accepted");
                continue;
            }
            Some(Event::Done) => assert!(a.is_done()),
            None => {}
        }
        match drive(&mut a, chunk, &mut peer) {
            Step::Progress => {}
            Step::Stuck => break,
            Step::Failed => {
                failed = true;
                break;
            }
        }
    }
    finish(&mut a, failed);
}

fn connect(side: Side, chunk: usize, mut peer: &[u8]) {
    let local = side.info(side.nqps, true);
    let mut c = Connector::new(NONCE, &local).expect("the local info is valid");
    let mut failed = false;
    for _ in 0..10_000 {
        match c.poll_event() {
            Some(Event::PeerInfo(p)) => {
                assert_eq!(p.link_layer, side.link_layer);
                assert_eq!(p.qpn.len(), side.nqps);
                assert!(p.mtu <= side.mtu, "acceptor answered an MTU above ours");
                assert!(
                    p.fifo.is_some(),
                    "an answer without sizes FIFO was accepted"
                );
                c.handle_qps_connected().expect("connect after PeerInfo");
                continue;
            }
            Some(Event::Done) => assert!(c.is_done()),
            None => {}
        }
        match drive(&mut c, chunk, &mut peer) {
            Step::Progress => {}
            Step::Stuck => break,
            Step::Failed => {
                failed = true;
                break;
            }
        }
    }
    finish(&mut c, failed);
}
