//! Two machines over simulated byte pipes, every split size, and every way to fail.

use std::collections::VecDeque;

use super::*;
use crate::provider::{Gid, ProviderAddr};
use crate::wire::{RemoteBuf, MAX_QPS};

const NONCE: u64 = 0x5EED_F00D_1234_5678;

fn port(link_layer: LinkLayer, mtu: Mtu) -> PortInfo {
    PortInfo {
        port: 1,
        link_layer,
        lid: 7,
        gid: Gid([9; 16]),
        gid_index: 3,
        mtu,
        addr: ProviderAddr::EMPTY,
    }
}

fn qps(nqps: usize, base: u32, ll: LinkLayer, mtu: Mtu, fifo: bool) -> QpInfo {
    let mut qpn = heapless::Vec::new();
    for i in 0..nqps {
        qpn.push(base + i as u32).unwrap();
    }
    QpInfo {
        port: 1,
        link_layer: ll,
        mtu,
        lid: base as u16,
        gid: Gid([base as u8; 16]),
        sl: 1,
        tc: 2,
        qpn,
        fifo: fifo.then_some(RemoteBuf {
            addr: 0x1000,
            rkey: 0x42,
        }),
        addr: ProviderAddr::new(b"soft-addr").unwrap(),
        ece: heapless::Vec::new(),
    }
}

/// Outcome of a simulated handshake.
#[derive(Debug, Default)]
struct Run {
    acc_saw: Option<QpInfo>,
    conn_saw: Option<QpInfo>,
    conn_done: bool,
    acc_done: bool,
}

/// Moves bytes through two pipes, `chunk` bytes per write and per read, until both sides are
/// done or nothing moves. `answer` builds the acceptor's QpInfo from what it saw.
fn run(
    c: &mut Connector,
    a: &mut Acceptor,
    chunk: usize,
    answer: impl Fn(&QpInfo) -> QpInfo,
) -> Result<Run> {
    let (mut to_a, mut to_c) = (VecDeque::new(), VecDeque::new());
    let mut out = Run::default();
    for _ in 0..100_000 {
        let mut moved = false;
        if let Some(b) = c.poll_transmit() {
            let n = b.len().min(chunk);
            to_a.extend(&b[..n]);
            c.handle_sent(n)?;
            moved |= n > 0;
        }
        if let Some(b) = a.poll_transmit() {
            let n = b.len().min(chunk);
            to_c.extend(&b[..n]);
            a.handle_sent(n)?;
            moved |= n > 0;
        }
        let n = a.poll_recv_len().min(chunk).min(to_a.len());
        if n > 0 {
            let d: Vec<u8> = to_a.drain(..n).collect();
            assert_eq!(a.handle_recv(&d)?, n);
            moved = true;
        }
        let n = c.poll_recv_len().min(chunk).min(to_c.len());
        if n > 0 {
            let d: Vec<u8> = to_c.drain(..n).collect();
            assert_eq!(c.handle_recv(&d)?, n);
            moved = true;
        }
        while let Some(e) = a.poll_event() {
            moved = true;
            match e {
                Event::PeerInfo(p) => {
                    a.handle_local_info(answer(&p))?;
                    out.acc_saw = Some(p);
                }
                Event::Done => out.acc_done = true,
            }
        }
        while let Some(e) = c.poll_event() {
            moved = true;
            match e {
                Event::PeerInfo(p) => {
                    c.handle_qps_connected()?;
                    out.conn_saw = Some(p);
                }
                Event::Done => out.conn_done = true,
            }
        }
        if (out.conn_done && out.acc_done) || !moved {
            break;
        }
    }
    Ok(out)
}

fn echo_answer(ll: LinkLayer, mtu: Mtu) -> impl Fn(&QpInfo) -> QpInfo {
    move |p| qps(p.qpn.len(), 500, ll, mtu, true)
}

#[test]
fn completes_for_every_split() {
    for chunk in [1, 2, 3, 5, 7, 16, 47, 48, 49, 64, 1000] {
        for nqps in [1, 3, MAX_QPS] {
            let local = qps(nqps, 100, LinkLayer::Ethernet, Mtu::M4096, true);
            let mut c = Connector::new(NONCE, &local).unwrap();
            let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M1024));
            let r = run(
                &mut c,
                &mut a,
                chunk,
                echo_answer(LinkLayer::Ethernet, Mtu::M4096),
            )
            .unwrap_or_else(|e| panic!("chunk {chunk} nqps {nqps}: {e}"));
            assert!(r.conn_done && r.acc_done, "chunk {chunk}");
            assert!(c.is_done() && a.is_done());
            // The acceptor saw the connector's info, MTU lowered to its port's.
            let mut want = local.clone();
            want.mtu = Mtu::M1024;
            assert_eq!(r.acc_saw.as_ref(), Some(&want));
            // The connector saw the acceptor's answer with the negotiated MTU.
            let mut ans = qps(nqps, 500, LinkLayer::Ethernet, Mtu::M1024, true);
            ans.mtu = Mtu::M1024;
            assert_eq!(r.conn_saw.as_ref(), Some(&ans));
            // Nothing more to do; events are reported once; close after done is fine.
            assert_eq!((c.poll_transmit(), c.poll_recv_len()), (None, 0));
            assert_eq!((a.poll_transmit(), a.poll_recv_len()), (None, 0));
            assert_eq!((c.poll_event(), a.poll_event()), (None, None));
            assert_eq!(c.handle_eof(), Ok(()));
            assert_eq!(a.handle_eof(), Ok(()));
        }
    }
}

#[test]
fn mtu_is_the_minimum_of_both_ports() {
    let local = qps(1, 1, LinkLayer::Infiniband, Mtu::M2048, true);
    let mut c = Connector::new(NONCE, &local).unwrap();
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Infiniband, Mtu::M4096));
    let r = run(
        &mut c,
        &mut a,
        1000,
        echo_answer(LinkLayer::Infiniband, Mtu::M4096),
    )
    .unwrap();
    assert_eq!(r.acc_saw.unwrap().mtu, Mtu::M2048);
    assert_eq!(
        r.conn_saw.unwrap().mtu,
        Mtu::M2048,
        "acceptor's own MTU is overridden"
    );
}

#[test]
fn link_layer_mismatch_is_a_hard_error() {
    // Connector on RoCE, acceptor on InfiniBand: the acceptor refuses.
    let local = qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let mut c = Connector::new(NONCE, &local).unwrap();
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Infiniband, Mtu::M4096));
    let e = run(
        &mut c,
        &mut a,
        7,
        echo_answer(LinkLayer::Infiniband, Mtu::M4096),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Wire {
                what: PEER_LINK_LAYER,
                value: 2
            }
        ),
        "{e:?}"
    );
    assert_eq!(a.state_name(), "Failed");
    assert_eq!(a.handle_recv(&[1]), Err(e), "failure is sticky");

    // The connector refuses an answer on another link layer.
    let mut c = Connector::new(NONCE, &local).unwrap();
    let e = feed_connector_answer(&mut c, &qps(1, 9, LinkLayer::Infiniband, Mtu::M256, true));
    assert!(matches!(
        e,
        Err(Error::Wire {
            what: PEER_LINK_LAYER,
            ..
        })
    ));
}

/// Issue 28 point 6: the error (and so the WARN) of a link-layer mismatch names the fix,
/// `NCCL_IB_HCA`, on both sides.
#[test]
fn link_layer_mismatch_names_nccl_ib_hca() {
    let local = qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let mut c = Connector::new(NONCE, &local).unwrap();
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Infiniband, Mtu::M4096));
    let e = run(
        &mut c,
        &mut a,
        7,
        echo_answer(LinkLayer::Infiniband, Mtu::M4096),
    )
    .unwrap_err();
    assert!(e.to_string().contains("NCCL_IB_HCA"), "acceptor: {e}");
    let mut c = Connector::new(NONCE, &local).unwrap();
    let e = feed_connector_answer(&mut c, &qps(1, 9, LinkLayer::Infiniband, Mtu::M256, true))
        .unwrap_err();
    assert!(e.to_string().contains("NCCL_IB_HCA"), "connector: {e}");
}

/// Sends the connector's first message into the void, then feeds it `answer`.
fn feed_connector_answer(c: &mut Connector, answer: &QpInfo) -> Result<usize> {
    let n = c.poll_transmit().unwrap().len();
    c.handle_sent(n).unwrap();
    let mut b = [0u8; crate::wire::QP_INFO_MAX_LEN + crate::wire::RAILS_MAX_LEN];
    let mut len = answer.encode(&mut b).unwrap();
    // An encode error (a bad answer) was caught above; a frame the connector refuses stops
    // it before the rail list.
    len += crate::wire::RailList::single(0)
        .encode(&mut b[len..])
        .unwrap();
    c.handle_recv(&b[..len])
}

#[test]
fn connector_validates_the_answer() {
    let local = qps(2, 1, LinkLayer::Ethernet, Mtu::M1024, true);
    let cases = [
        (
            qps(3, 9, LinkLayer::Ethernet, Mtu::M1024, true),
            "peer nqps differs from ours",
        ),
        (
            qps(2, 9, LinkLayer::Ethernet, Mtu::M2048, true),
            "peer answered an MTU above ours",
        ),
    ];
    for (ans, what) in cases {
        let mut c = Connector::new(NONCE, &local).unwrap();
        match feed_connector_answer(&mut c, &ans) {
            Err(Error::Wire { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(c.state_name(), "Failed");
    }
    // A good answer (FIFO optional for the acceptor) is reported.
    let mut c = Connector::new(NONCE, &local).unwrap();
    let ans = qps(2, 9, LinkLayer::Ethernet, Mtu::M512, true);
    assert!(feed_connector_answer(&mut c, &ans).is_ok());
    assert_eq!(c.poll_event(), Some(Event::PeerInfo(ans)));
}

#[test]
fn wrong_nonce_is_rejected() {
    let local = qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let mut c = Connector::new(NONCE + 1, &local).unwrap();
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
    let e = run(
        &mut c,
        &mut a,
        3,
        echo_answer(LinkLayer::Ethernet, Mtu::M4096),
    )
    .unwrap_err();
    assert_eq!(
        e,
        Error::Wire {
            what: "Hello nonce is not this listener's",
            value: NONCE + 1
        }
    );
    assert!(!a.nonce_seen(), "a wrong nonce is not this listener's peer");
}

#[test]
fn fifo_is_required_from_the_connector() {
    let no_fifo = qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, false);
    assert!(matches!(
        Connector::new(NONCE, &no_fifo),
        Err(Error::Missing { .. })
    ));
    // A hostile connector that sends no FIFO anyway.
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
    assert_eq!(
        a.handle_recv(&Hello { nonce: NONCE }.encode()),
        Ok(HELLO_LEN)
    );
    let mut b = [0u8; crate::wire::QP_INFO_MAX_LEN];
    let n = no_fifo.encode(&mut b).unwrap();
    let e = a.handle_recv(&b[..n]).unwrap_err();
    assert_eq!(
        e,
        Error::Wire {
            what: "connector sent no FIFO",
            value: 0
        }
    );
}

#[test]
fn sizes_fifo_is_required_in_the_answer() {
    // The connector refuses an answer without the acceptor's sizes FIFO (a wire v2 peer).
    let mut c = Connector::new(NONCE, &qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, true)).unwrap();
    let e = feed_connector_answer(&mut c, &qps(1, 9, LinkLayer::Ethernet, Mtu::M4096, false));
    assert_eq!(
        e,
        Err(Error::Wire {
            what: "acceptor sent no sizes FIFO",
            value: 0
        })
    );
    // The acceptor does not answer without one.
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
    assert_eq!(
        a.handle_recv(&Hello { nonce: NONCE }.encode()),
        Ok(HELLO_LEN)
    );
    let peer = qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let mut b = [0u8; crate::wire::QP_INFO_MAX_LEN];
    let n = peer.encode(&mut b).unwrap();
    assert_eq!(a.handle_recv(&b[..n]), Ok(n));
    let n = crate::wire::RailList::single(0).encode(&mut b).unwrap();
    assert_eq!(a.handle_recv(&b[..n]), Ok(n));
    assert!(matches!(a.poll_event(), Some(Event::PeerInfo(_))));
    assert!(matches!(
        a.handle_local_info(qps(1, 9, LinkLayer::Ethernet, Mtu::M4096, false)),
        Err(Error::Missing { .. })
    ));
}

#[test]
fn local_answer_must_match_the_peer() {
    let local = qps(2, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let mut c = Connector::new(NONCE, &local).unwrap();
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
    let bytes = c.poll_transmit().unwrap().to_vec();
    c.handle_sent(bytes.len()).unwrap();
    // One call takes both messages.
    assert_eq!(a.handle_recv(&bytes), Ok(bytes.len()));
    assert_eq!(a.state_name(), "Setup");
    // Answering before taking the event is a caller bug.
    let ans = qps(2, 9, LinkLayer::Ethernet, Mtu::M4096, true);
    assert!(matches!(
        a.handle_local_info(ans.clone()),
        Err(Error::BadState { .. })
    ));
    assert!(matches!(a.poll_event(), Some(Event::PeerInfo(_))));
    // Wrong QP count: refused, state kept, then the right one works.
    let e = a.handle_local_info(qps(3, 9, LinkLayer::Ethernet, Mtu::M4096, true));
    assert!(matches!(
        e,
        Err(Error::OutOfRange {
            what: "acceptor nqps",
            value: 3,
            ..
        })
    ));
    let e = a.handle_local_info(qps(2, 9, LinkLayer::Infiniband, Mtu::M4096, true));
    assert!(matches!(e, Err(Error::BadState { .. })));
    assert_eq!(a.state_name(), "Setup");
    assert_eq!(a.handle_local_info(ans), Ok(()));
    assert_eq!(a.state_name(), "SendInfo");
}

#[test]
fn wrong_inputs_are_errors_not_panics() {
    let local = qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let mut c = Connector::new(NONCE, &local).unwrap();
    fn bad<T>(r: Result<T>) -> bool {
        matches!(r, Err(Error::BadState { .. }))
    }
    assert!(
        bad(c.handle_recv(&[0])),
        "connector receives nothing while sending"
    );
    assert!(bad(c.handle_qps_connected()));
    let pending = c.poll_transmit().unwrap().len();
    assert!(bad(c.handle_sent(pending + 1)), "more than pending");
    assert_eq!(c.handle_recv(&[]), Ok(0));
    assert_eq!(
        c.state_name(),
        "SendInfo",
        "state unchanged by refused inputs"
    );
    c.handle_sent(pending).unwrap();
    assert!(bad(c.handle_sent(1)));

    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
    assert!(bad(a.handle_sent(1)));
    assert!(bad(a.handle_local_info(local.clone())));
    assert_eq!(a.state_name(), "RecvHello");
    // Bytes past the handshake's last expected byte are not consumed.
    let mut c = Connector::new(NONCE, &local).unwrap();
    let n = c.poll_transmit().unwrap().len();
    c.handle_sent(n).unwrap();
    let mut b = [0xAAu8; crate::wire::QP_INFO_MAX_LEN + 5];
    let mut len = qps(1, 9, LinkLayer::Ethernet, Mtu::M256, true)
        .encode(&mut b)
        .unwrap();
    len += crate::wire::RailList::single(0)
        .encode(&mut b[len..])
        .unwrap();
    assert_eq!(c.handle_recv(&b[..len + 5]), Ok(len));
    assert_eq!(c.state_name(), "Connect");
}

#[test]
fn eof_at_every_stage_is_peer_gone() {
    let local = qps(2, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    // Stop the run after `steps` moved bytes, then close: count how many distinct stages fail.
    for stop_at in 0..2000 {
        let mut c = Connector::new(NONCE, &local).unwrap();
        let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
        let (mut to_a, mut to_c) = (VecDeque::new(), VecDeque::new());
        let mut budget = stop_at;
        while budget > 0 && !(c.is_done() && a.is_done()) {
            budget -= 1;
            if let Some(b) = c.poll_transmit() {
                to_a.push_back(b[0]);
                c.handle_sent(1).unwrap();
            } else if let Some(b) = a.poll_transmit() {
                to_c.push_back(b[0]);
                a.handle_sent(1).unwrap();
            } else if a.poll_recv_len() > 0 && !to_a.is_empty() {
                a.handle_recv(&[to_a.pop_front().unwrap()]).unwrap();
            } else if c.poll_recv_len() > 0 && !to_c.is_empty() {
                c.handle_recv(&[to_c.pop_front().unwrap()]).unwrap();
            } else if let Some(Event::PeerInfo(p)) = a.poll_event() {
                a.handle_local_info(qps(p.qpn.len(), 7, LinkLayer::Ethernet, Mtu::M4096, true))
                    .unwrap();
            } else if let Some(Event::PeerInfo(_)) = c.poll_event() {
                c.handle_qps_connected().unwrap();
            } else {
                break;
            }
        }
        if c.is_done() && a.is_done() {
            assert!(
                stop_at > 100,
                "the handshake needs a few hundred one-byte steps"
            );
            return;
        }
        // The peer of whichever side is still working closes.
        if !a.is_done() {
            // The nonce counts as seen from the whole Hello on, and stays so after failing.
            let seen = a.state_name() != "RecvHello";
            assert_eq!(a.nonce_seen(), seen, "{}", a.state_name());
            let state = a.state_name();
            assert_eq!(a.failed_in(), None);
            let e = a.handle_eof().unwrap_err();
            assert_eq!(a.failed_in(), Some(state), "the state it failed in");
            assert!(matches!(e, Error::PeerGone { .. }), "{e:?}");
            assert_eq!(a.handle_recv(&[0]), Err(e));
            assert_eq!(a.poll_event(), None);
            assert_eq!(a.nonce_seen(), seen);
        }
        if !c.is_done() {
            let e = c.handle_eof().unwrap_err();
            assert!(matches!(e, Error::PeerGone { .. }), "{e:?}");
            assert_eq!(c.handle_qps_connected(), Err(e));
        }
    }
    panic!("handshake never completed");
}

#[test]
fn peer_gone_names_the_peer_once_known() {
    let local = qps(1, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let mut c = Connector::new(NONCE, &local).unwrap();
    let ans = qps(1, 77, LinkLayer::Ethernet, Mtu::M4096, true);
    feed_connector_answer(&mut c, &ans).unwrap();
    match c.handle_eof() {
        Err(Error::PeerGone { peer }) => {
            assert_eq!((peer.qpn, peer.lid, peer.gid), (77, 77, ans.gid));
        }
        other => panic!("{other:?}"),
    }
}

/// Flip every byte of the connector's stream on its way to the acceptor: the acceptor either
/// rejects it with a wire error or (a flip in a free field such as the GID) proceeds; it never
/// panics, and a flip in a magic, version or count is always caught.
#[test]
fn corrupted_connector_stream() {
    let local = qps(2, 1, LinkLayer::Ethernet, Mtu::M4096, true);
    let stream = Connector::new(NONCE, &local)
        .unwrap()
        .poll_transmit()
        .unwrap()
        .to_vec();
    for at in 0..stream.len() {
        let mut s = stream.clone();
        s[at] ^= 0xFF;
        let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
        let mut res = Ok(0);
        for b in &s {
            if a.poll_recv_len() == 0 {
                break;
            }
            res = a.handle_recv(core::slice::from_ref(b));
            if res.is_err() {
                break;
            }
        }
        let must_fail = at < 8
            || (HELLO_LEN..HELLO_LEN + 8).contains(&at)
            || [HELLO_LEN + 9, HELLO_LEN + 32, HELLO_LEN + 33].contains(&at);
        if must_fail {
            assert!(
                matches!(res, Err(Error::Wire { .. })),
                "flip at {at}: {res:?}"
            );
        }
        if res.is_ok() {
            // Then the whole stream was consumed (or framing stopped early) with no panic.
            assert!(
                matches!(a.state_name(), "Setup" | "RecvInfo" | "RecvRails"),
                "flip at {at}"
            );
        }
    }
}

/// The machines live inside a comm that `ffi` allocates once; keep them small.
#[test]
fn machines_are_small() {
    let (c, a, q) = (
        size_of::<Connector>(),
        size_of::<Acceptor>(),
        size_of::<QpInfo>(),
    );
    println!("Connector {c} B, Acceptor {a} B, QpInfo {q} B");
    // Each holds its largest outgoing stream (a QpInfo of 128 QPs with their ECE options per
    // rail, 8 rails: ~17 KiB), one incoming message (~2.2 KiB) and the peer's decoded infos
    // (8 × ~2.2 KiB): under 40 KiB; ffi boxes them, only while a handshake runs.
    assert!(
        c <= 40 * 1024 && a <= 40 * 1024,
        "Connector {c} B, Acceptor {a} B"
    );
}

fn fused_rails(n: usize, base: u64) -> crate::wire::RailList {
    let mut l = crate::wire::RailList::default();
    for i in 0..n {
        let ring = Some(RemoteBuf {
            addr: base + i as u64 * 0x100,
            rkey: 7 + i as u32,
        });
        l.0.push(crate::wire::RailInfo {
            dev: i as u16,
            ring,
            speed: 250 * (i as u16 + 1),
        })
        .unwrap();
    }
    l
}

/// Wire v4: two rails. Each side's QpInfo per rail is reported in rail order (the acceptor's
/// MTU lowered per rail to that rail's port), and each side reads the other's rail list
/// (devices and notice rings).
#[test]
fn two_rails_complete_with_rail_lists() {
    let locals = [
        qps(2, 100, LinkLayer::Ethernet, Mtu::M4096, true),
        qps(2, 200, LinkLayer::Ethernet, Mtu::M4096, true),
    ];
    let mut c = Connector::with_rails(NONCE, &locals, &fused_rails(2, 0x10_000)).unwrap();
    let ports = [
        port(LinkLayer::Ethernet, Mtu::M1024),
        port(LinkLayer::Ethernet, Mtu::M2048),
    ];
    let mut a = Acceptor::with_rails(NONCE, &ports).unwrap();
    assert_eq!((c.rails(), a.rails()), (2, 2));
    // The whole connector stream at once, then the acceptor's events and answers.
    let s = c.poll_transmit().unwrap().to_vec();
    c.handle_sent(s.len()).unwrap();
    assert_eq!(a.handle_recv(&s), Ok(s.len()));
    let mut seen = Vec::new();
    while let Some(Event::PeerInfo(p)) = a.poll_event() {
        seen.push(p);
    }
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].qpn[0], seen[0].mtu), (100, Mtu::M1024));
    assert_eq!((seen[1].qpn[0], seen[1].mtu), (200, Mtu::M2048));
    assert_eq!(a.peer_rails(), &fused_rails(2, 0x10_000));
    let back = fused_rails(2, 0x20_000);
    for (i, r) in back.0.iter().enumerate() {
        let ans = qps(
            2,
            300 + i as u32 * 100,
            LinkLayer::Ethernet,
            Mtu::M4096,
            true,
        );
        a.handle_local_rail(ans, *r).unwrap();
    }
    let s = a.poll_transmit().unwrap().to_vec();
    a.handle_sent(s.len()).unwrap();
    assert_eq!(c.handle_recv(&s), Ok(s.len()));
    let mut got = Vec::new();
    while let Some(Event::PeerInfo(p)) = c.poll_event() {
        got.push(p);
    }
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].qpn[0], got[0].mtu), (300, Mtu::M1024));
    assert_eq!((got[1].qpn[0], got[1].mtu), (400, Mtu::M2048));
    assert_eq!(c.peer_rails(), &back);
    c.handle_qps_connected().unwrap();
    let r = c.poll_transmit().unwrap().to_vec();
    c.handle_sent(r.len()).unwrap();
    assert_eq!(a.handle_recv(&r), Ok(r.len()));
    assert_eq!(a.poll_event(), Some(Event::Done));
    assert_eq!(c.poll_event(), Some(Event::Done));
}

/// A connector with another rail count than the listener's is refused by name (a fused NIC on
/// one side only), and a fused rail list without notice rings is refused at either end.
#[test]
fn rail_count_mismatch_is_refused() {
    let l = qps(1, 100, LinkLayer::Ethernet, Mtu::M4096, true);
    let locals = [l.clone(), l.clone()];
    let mut c = Connector::with_rails(NONCE, &locals, &fused_rails(2, 0x1000)).unwrap();
    let mut a = Acceptor::new(NONCE, &port(LinkLayer::Ethernet, Mtu::M4096));
    let s = c.poll_transmit().unwrap().to_vec();
    c.handle_sent(s.len()).unwrap();
    match a.handle_recv(&s) {
        Err(Error::Wire { what, value: 2 }) => assert!(what.contains("rail count"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.state_name(), "Failed");
    // One rail against a two-rail listener.
    let mut c = Connector::new(NONCE, &l).unwrap();
    let ports = [port(LinkLayer::Ethernet, Mtu::M4096); 2];
    let mut a = Acceptor::with_rails(NONCE, &ports).unwrap();
    let s = c.poll_transmit().unwrap().to_vec();
    c.handle_sent(s.len()).unwrap();
    assert!(matches!(
        a.handle_recv(&s),
        Err(Error::Wire { value: 1, .. })
    ));
    // Two rails without rings cannot even be sent.
    let mut plain = crate::wire::RailList::single(0);
    plain
        .0
        .push(crate::wire::RailInfo {
            dev: 1,
            ring: None,
            speed: 0,
        })
        .unwrap();
    assert!(matches!(
        Connector::with_rails(NONCE, &locals, &plain),
        Err(Error::Wire { .. })
    ));
    // More rails than the list names, or none.
    assert!(Connector::with_rails(NONCE, &locals, &crate::wire::RailList::single(0)).is_err());
    assert!(Connector::with_rails(NONCE, &[], &crate::wire::RailList::default()).is_err());
    assert!(Acceptor::with_rails(NONCE, &[]).is_err());
}
