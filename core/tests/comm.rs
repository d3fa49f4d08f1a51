//! The core's data path end to end over the in-process loopback provider: single and
//! multi-receive, tags, sizes 0 B..8 MiB, size mismatch, QP splitting, adaptive routing, flush,
//! request exhaustion, error completions, hostile FIFO elements.

use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm};
use ibnet_core::error::{Error, ErrorKind};
use ibnet_core::fifo::{FifoRing, PostedRecv, MAX_REQUESTS};
use ibnet_core::provider::{
    Access, MrKeys, Provider, QpAttr, RegKind, SendWr, Sge, WcStatus, WrOpcode,
};
use ibnet_core::request::ReqId;
use ibnet_testkit::{connect_pair, fill_pattern, AlignedBuf, Fault, Loopback};

type S = SendComm<Loopback>;
type R = RecvComm<Loopback>;

fn pair(cfg: CommConfig) -> (Loopback, S, R) {
    let dev = Loopback::new();
    let (s, r) = connect_pair(&dev, cfg).expect("connect");
    (dev, s, r)
}

fn reg(dev: &Loopback, b: &AlignedBuf) -> MrKeys {
    dev.register(b.addr(), b.len() as u64).expect("register").0
}

fn wait(mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> Done {
    for _ in 0..1_000_000 {
        if let Some(d) = f().expect("test") {
            return d;
        }
    }
    panic!("request never completed");
}

fn until_some(mut f: impl FnMut() -> ibnet_core::Result<Option<ReqId>>) -> ReqId {
    for _ in 0..1000 {
        if let Some(id) = f().expect("post") {
            return id;
        }
    }
    panic!("never accepted");
}

/// One message of `size` bytes with `cfg`; returns the receiver's Done.
fn one_message(cfg: CommConfig, size: usize) -> Done {
    let (dev, mut s, mut r) = pair(cfg);
    let mut src = AlignedBuf::new(size.max(1));
    let dst = AlignedBuf::new(size.max(1));
    fill_pattern(src.as_mut_slice(), size as u64);
    let (sk, rk) = (reg(&dev, &src), reg(&dev, &dst));
    let rid = r
        .irecv(&[RecvBuf {
            addr: dst.addr(),
            size: size as u64,
            tag: 7,
            mr: rk,
        }])
        .unwrap()
        .unwrap();
    let sid = until_some(|| s.isend(src.addr(), size as u64, 7, sk));
    let sd = wait(|| s.test(sid));
    assert_eq!(sd.sizes[0], size as u64);
    let rd = wait(|| r.test(rid));
    assert_eq!(
        &dst.as_slice()[..size],
        &src.as_slice()[..size],
        "payload of {size} B"
    );
    assert_eq!(s.requests_in_use(), 0);
    assert_eq!(r.requests_in_use(), 0);
    rd
}

#[test]
fn single_receive_every_size_byte_for_byte() {
    for size in [0usize, 1, 7, 128, 4095, 4096, 65_537, 1 << 20, 8 << 20] {
        let d = one_message(CommConfig::default(), size);
        assert_eq!(d.n, 1);
        assert_eq!(d.sizes[0], size as u64);
    }
}

#[test]
fn split_over_four_qps_reassembles_and_reports_the_full_size() {
    let cfg = CommConfig {
        nqps: 4,
        split_data: true,
        ..CommConfig::default()
    };
    for size in [0usize, 100, 129, 4096 * 3 + 5, 1 << 20] {
        let d = one_message(cfg, size);
        assert_eq!(d.sizes[0], size as u64, "size {size}");
    }
}

#[test]
fn four_qps_without_split_round_robin_whole_messages() {
    let cfg = CommConfig {
        nqps: 4,
        ..CommConfig::default()
    };
    let (dev, mut s, mut r) = pair(cfg);
    let mut src = AlignedBuf::new(4096);
    let dst = AlignedBuf::new(4096);
    let (sk, rk) = (reg(&dev, &src), reg(&dev, &dst));
    for i in 0..10u64 {
        fill_pattern(src.as_mut_slice(), i);
        let rid = r
            .irecv(&[RecvBuf {
                addr: dst.addr(),
                size: 4096,
                tag: 1,
                mr: rk,
            }])
            .unwrap()
            .unwrap();
        let sid = until_some(|| s.isend(src.addr(), 1000 + i, 1, sk));
        wait(|| s.test(sid));
        let d = wait(|| r.test(rid));
        assert_eq!(d.sizes[0], 1000 + i);
        assert_eq!(
            &dst.as_slice()[..1000 + i as usize],
            &src.as_slice()[..1000 + i as usize]
        );
    }
}

#[test]
fn adaptive_routing_sends_the_immediate_separately_above_the_threshold() {
    let cfg = CommConfig {
        adaptive_routing: true,
        ar_threshold: 1024,
        ..CommConfig::default()
    };
    let (dev, mut s, mut r) = pair(cfg);
    let mut src = AlignedBuf::new(8192);
    let dst = AlignedBuf::new(8192);
    fill_pattern(src.as_mut_slice(), 3);
    let (sk, rk) = (reg(&dev, &src), reg(&dev, &dst));
    for (size, wrs) in [(1000u64, 1u64), (8192, 2)] {
        let rid = r
            .irecv(&[RecvBuf {
                addr: dst.addr(),
                size: 8192,
                tag: 2,
                mr: rk,
            }])
            .unwrap()
            .unwrap();
        let before = dev.wrs_posted();
        let sid = until_some(|| s.isend(src.addr(), size, 2, sk));
        assert_eq!(dev.wrs_posted() - before, wrs, "WRs for {size} B");
        wait(|| s.test(sid));
        assert_eq!(wait(|| r.test(rid)).sizes[0], size);
        assert_eq!(
            &dst.as_slice()[..size as usize],
            &src.as_slice()[..size as usize]
        );
    }
}

#[test]
fn eight_way_multi_receive_matches_tags_in_any_order() {
    let (dev, mut s, mut r) = pair(CommConfig::default());
    let sizes = [0usize, 1, 4096, 77, 65536, 0, 3, 1 << 20];
    // Each receive buffer is larger than its send: `test` reports what was sent.
    let posted = |i: usize| sizes[i] + 64 * (i + 1);
    let mut srcs: Vec<AlignedBuf> = sizes.iter().map(|&n| AlignedBuf::new(n.max(1))).collect();
    let dsts: Vec<AlignedBuf> = (0..8).map(|i| AlignedBuf::new(posted(i))).collect();
    for (i, b) in srcs.iter_mut().enumerate() {
        fill_pattern(b.as_mut_slice(), 100 + i as u64);
    }
    let bufs: Vec<RecvBuf> = dsts
        .iter()
        .enumerate()
        .map(|(i, d)| RecvBuf {
            addr: d.addr(),
            size: posted(i) as u64,
            tag: 0x10 + i as u32,
            mr: reg(&dev, d),
        })
        .collect();
    let rid = r.irecv(&bufs).unwrap().unwrap();
    let order = [5usize, 2, 7, 0, 3, 6, 1, 4];
    let mut sids = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let sk = reg(&dev, &srcs[i]);
        let sid = until_some(|| s.isend(srcs[i].addr(), sizes[i] as u64, 0x10 + i as u32, sk));
        sids.push(sid);
        if k + 1 < order.len() {
            // Nothing moves until every receive of the multi-receive has a send.
            assert_eq!(r.test(rid).unwrap(), None);
        }
    }
    // A tag that is not in the slot is not matched.
    for sid in sids {
        wait(|| s.test(sid));
    }
    let d = wait(|| r.test(rid));
    assert_eq!(d.n, 8);
    for i in 0..8 {
        assert_eq!(d.sizes[i], sizes[i] as u64, "bytes of receive {i}");
        assert_eq!(
            &dsts[i].as_slice()[..sizes[i]],
            &srcs[i].as_slice()[..sizes[i]],
            "buffer {i}"
        );
    }
}

/// A send larger than its receive is cut to the receive's size, as NCCL 2.30 does: both ends
/// report the receive's size, nothing lands past it, and the comm notes the first truncation
/// once (its caller logs one WARN per comm).
#[test]
fn unknown_tag_waits_and_larger_send_is_truncated_to_the_receive() {
    let (dev, mut s, mut r) = pair(CommConfig::default());
    let mut src = AlignedBuf::new(4096);
    let mut dst = AlignedBuf::new(4096);
    fill_pattern(src.as_mut_slice(), 3);
    dst.as_mut_slice().fill(0xee);
    let (sk, rk) = (reg(&dev, &src), reg(&dev, &dst));
    assert_eq!(
        s.isend(src.addr(), 10, 1, sk).unwrap(),
        None,
        "nothing posted yet"
    );
    let rid = r
        .irecv(&[RecvBuf {
            addr: dst.addr(),
            size: 100,
            tag: 1,
            mr: rk,
        }])
        .unwrap()
        .unwrap();
    assert_eq!(
        s.isend(src.addr(), 10, 9, sk).unwrap(),
        None,
        "tag 9 was not posted"
    );
    let sid = s.isend(src.addr(), 101, 1, sk).unwrap().expect("posted");
    let t = s.take_truncation().expect("the truncation is noted");
    assert_eq!((t.send, t.recv, t.tag), (101, 100, 1));
    assert_eq!(s.take_truncation(), None, "noted once");
    assert_eq!(wait(|| s.test(sid)).sizes[0], 100, "the sender sent 100");
    assert_eq!(wait(|| r.test(rid)).sizes[0], 100, "the receiver got 100");
    let (a, b) = (src.as_slice(), dst.as_slice());
    assert_eq!(a[..100], b[..100]);
    assert!(
        b[100..].iter().all(|&x| x == 0xee),
        "nothing past the receive"
    );
    // A second truncation is not noted again.
    let rid = r
        .irecv(&[RecvBuf {
            addr: dst.addr(),
            size: 50,
            tag: 1,
            mr: rk,
        }])
        .unwrap()
        .unwrap();
    let sid = until_some(|| s.isend(src.addr(), 4096, 1, sk));
    assert_eq!(s.take_truncation(), None, "one note per comm");
    assert_eq!(wait(|| s.test(sid)).sizes[0], 50);
    assert_eq!(wait(|| r.test(rid)).sizes[0], 50);
}

#[test]
fn flush_reads_back_only_when_enabled_and_needed() {
    let (dev, _s, mut r) = pair(CommConfig {
        gdr_flush: true,
        ..CommConfig::default()
    });
    let dst = AlignedBuf::new(4096);
    let rk = reg(&dev, &dst);
    let buf = RecvBuf {
        addr: dst.addr(),
        size: 4096,
        tag: 0,
        mr: rk,
    };
    assert_eq!(
        r.iflush(&[RecvBuf { size: 0, ..buf }]).unwrap(),
        None,
        "all empty: no flush"
    );
    let id = r.iflush(&[buf]).unwrap().expect("flush posted");
    let d = wait(|| r.test(id));
    assert_eq!(d.n, 0);
    let (_d2, _s2, mut r2) = pair(CommConfig::default());
    assert_eq!(r2.iflush(&[buf]).unwrap(), None, "flush disabled");
}

#[test]
fn request_pool_exhaustion_is_an_error() {
    let (dev, _s, mut r) = pair(CommConfig::default());
    let dst = AlignedBuf::new(64);
    let rk = reg(&dev, &dst);
    let buf = [RecvBuf {
        addr: dst.addr(),
        size: 64,
        tag: 0,
        mr: rk,
    }];
    for _ in 0..MAX_REQUESTS {
        r.irecv(&buf).unwrap().unwrap();
    }
    assert_eq!(
        r.irecv(&buf).unwrap_err(),
        Error::Full {
            what: "request pool",
            cap: MAX_REQUESTS
        }
    );
    let too_many = [buf[0]; 9];
    assert!(matches!(
        r.irecv(&too_many).unwrap_err(),
        Error::OutOfRange { value: 9, .. }
    ));
    assert!(matches!(
        r.irecv(&[]).unwrap_err(),
        Error::OutOfRange { value: 0, .. }
    ));
}

#[test]
fn error_completion_is_reported_with_the_peer_and_poisons_the_comm() {
    let (dev, mut s, mut r) = pair(CommConfig::default());
    let src = AlignedBuf::new(4096);
    let dst = AlignedBuf::new(4096);
    let (sk, rk) = (reg(&dev, &src), reg(&dev, &dst));
    r.irecv(&[RecvBuf {
        addr: dst.addr(),
        size: 4096,
        tag: 0,
        mr: rk,
    }])
    .unwrap()
    .unwrap();
    dev.inject(Fault::FailWr {
        after: 0,
        status: WcStatus::RetryExceeded,
    });
    let sid = s.isend(src.addr(), 4096, 0, sk).unwrap().unwrap();
    let e = s.test(sid).unwrap_err();
    match e {
        Error::Completion { status, peer, .. } => {
            assert_eq!(status, WcStatus::RetryExceeded);
            assert_eq!(peer.qpn, r.local_info().qpn[0]);
        }
        other => panic!("unexpected {other}"),
    }
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert_eq!(
        s.isend(src.addr(), 1, 0, sk).unwrap_err(),
        Error::Poisoned {
            op: "isend",
            cause: ErrorKind::Remote
        }
    );
    let refused = s.test(sid).unwrap_err();
    assert_eq!(
        refused,
        Error::Poisoned {
            op: "test",
            cause: ErrorKind::Remote
        }
    );
    // Refused as the first failure was reported.
    assert_eq!(refused.kind(), e.kind());
}

#[test]
fn stale_request_handle_is_an_error() {
    let (dev, mut s, mut r) = pair(CommConfig::default());
    let src = AlignedBuf::new(64);
    let dst = AlignedBuf::new(64);
    let (sk, rk) = (reg(&dev, &src), reg(&dev, &dst));
    let rid = r
        .irecv(&[RecvBuf {
            addr: dst.addr(),
            size: 64,
            tag: 0,
            mr: rk,
        }])
        .unwrap()
        .unwrap();
    let sid = until_some(|| s.isend(src.addr(), 64, 0, sk));
    wait(|| s.test(sid));
    wait(|| r.test(rid));
    assert!(matches!(
        r.test(rid).unwrap_err(),
        Error::StaleRequest { .. }
    ));
}

#[test]
fn wrong_rkey_from_the_receiver_is_a_remote_access_error() {
    let (dev, mut s, mut r) = pair(CommConfig::default());
    let src = AlignedBuf::new(64);
    let dst = AlignedBuf::new(64);
    let (sk, mut rk) = (reg(&dev, &src), reg(&dev, &dst));
    rk.rkey ^= 0xff;
    r.irecv(&[RecvBuf {
        addr: dst.addr(),
        size: 64,
        tag: 0,
        mr: rk,
    }])
    .unwrap()
    .unwrap();
    let sid = until_some(|| s.isend(src.addr(), 64, 0, sk));
    let e = s.test(sid).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Completion {
                status: WcStatus::RemoteAccessError,
                ..
            }
        ),
        "{e}"
    );
    assert!(dst.as_slice().iter().all(|&b| b == 0), "nothing written");
}

#[test]
fn hostile_fifo_element_is_an_error_not_a_write() {
    // A rogue receiver writes a well-formed element that names address 0.
    let dev = Loopback::new();
    let mut s = SendComm::new(dev.clone(), CommConfig::default()).unwrap();
    let info = s.local_info();
    let cq = dev.create_cq(16).unwrap();
    let attr = QpAttr {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_inline: 0,
        access: Access::ALL,
    };
    let mut qp = dev.create_qp(&cq, &attr).unwrap();
    let mut rogue = info.clone();
    // Some sizes FIFO (never written: the hostile element stops the send first).
    rogue.fifo = Some(ibnet_core::wire::RemoteBuf {
        addr: 0x1000,
        rkey: 7,
    });
    rogue.qpn = core::iter::once(dev.qp_num(&qp)).collect();
    s.connect(&rogue).unwrap();
    let ca = ibnet_core::provider::ConnectAttr {
        remote_qpn: info.qpn[0],
        remote_lid: 0,
        remote_gid: info.gid,
        remote_addr: info.addr,
        link_layer: info.link_layer,
        mtu: info.mtu,
        gid_index: 0,
        timeout: 20,
        retry_cnt: 7,
        sl: 0,
        tc: 0,
        pkey_index: 0,
    };
    dev.connect_qp(&mut qp, &ca).unwrap();
    let staging: Box<FifoRing> = Box::default();
    let smr = dev
        .reg_mr(
            staging.base_addr(),
            FifoRing::<MAX_REQUESTS>::BYTES as u64,
            Access::ALL,
            RegKind::Plain,
        )
        .unwrap();
    let (off, len) = staging.publish(
        0,
        &[PostedRecv {
            addr: 0,
            size: 100,
            rkey: 0,
            tag: 1,
        }],
    );
    let fifo = info.fifo.unwrap();
    let wr = SendWr {
        opcode: WrOpcode::Write,
        sge: Sge {
            addr: staging.base_addr() + off as u64,
            len: len as u32,
            lkey: dev.mr_keys(&smr).lkey,
        },
        remote_addr: fifo.addr + off as u64,
        rkey: fifo.rkey,
        ..SendWr::EMPTY
    };
    dev.post_send(&mut qp, &[wr]).unwrap();
    let src = AlignedBuf::new(64);
    let sk = reg(&dev, &src);
    let e = s.isend(src.addr(), 10, 1, sk).unwrap_err();
    assert!(matches!(e, Error::BadFifoElem { field: "addr", .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Remote);
}

#[test]
fn random_tags_widths_and_sizes_across_many_fifo_laps() {
    let (dev, mut s, mut r) = pair(CommConfig {
        nqps: 2,
        split_data: true,
        ..CommConfig::default()
    });
    const MAX: usize = 16 << 10;
    let mut srcs: Vec<AlignedBuf> = (0..8).map(|_| AlignedBuf::new(MAX)).collect();
    let dsts: Vec<AlignedBuf> = (0..8).map(|_| AlignedBuf::new(MAX)).collect();
    let sks: Vec<MrKeys> = srcs.iter().map(|b| reg(&dev, b)).collect();
    let rks: Vec<MrKeys> = dsts.iter().map(|b| reg(&dev, b)).collect();
    let mut x = 0x1234_5678u64;
    let mut rnd = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for msg in 0..3 * MAX_REQUESTS as u64 {
        let n = 1 + rnd(8) as usize;
        let base_tag = rnd(1 << 20) as u32;
        let sizes: Vec<usize> = (0..n).map(|_| rnd(MAX as u64 + 1) as usize).collect();
        let bufs: Vec<RecvBuf> = (0..n)
            .map(|i| RecvBuf {
                addr: dsts[i].addr(),
                size: MAX as u64,
                tag: base_tag + i as u32,
                mr: rks[i],
            })
            .collect();
        let rid = r.irecv(&bufs).unwrap().unwrap();
        let mut sids = Vec::new();
        for i in (0..n).rev() {
            fill_pattern(srcs[i].as_mut_slice(), msg * 8 + i as u64);
            sids.push(until_some(|| {
                s.isend(srcs[i].addr(), sizes[i] as u64, base_tag + i as u32, sks[i])
            }));
        }
        for sid in sids {
            wait(|| s.test(sid));
        }
        let d = wait(|| r.test(rid));
        for i in 0..n {
            assert_eq!(d.sizes[i], sizes[i] as u64, "msg {msg} buf {i}");
            assert_eq!(
                &dsts[i].as_slice()[..sizes[i]],
                &srcs[i].as_slice()[..sizes[i]],
                "msg {msg} buf {i}"
            );
        }
    }
}

#[test]
fn close_releases_every_provider_object() {
    let (dev, s, r) = pair(CommConfig {
        nqps: 3,
        gdr_flush: true,
        ..CommConfig::default()
    });
    assert!(dev.live_qps() >= 7);
    s.close().unwrap();
    r.close().unwrap();
    assert_eq!(dev.live_qps(), 0);
    assert_eq!(dev.live_mrs(), 0);
}

#[test]
fn config_from_default_params_is_nccl_2_28s_default() {
    use ibnet_core::params::Params;
    use ibnet_core::provider::LinkLayer;
    let p = Params::default();
    assert_eq!(
        CommConfig::from_params(&p, LinkLayer::Ethernet, None, false),
        CommConfig::default()
    );
    // Adaptive routing defaults on for InfiniBand only; the config's TC applies when set.
    let ib = CommConfig::from_params(&p, LinkLayer::Infiniband, Some(106), true);
    assert!(ib.adaptive_routing && ib.gdr_flush);
    assert_eq!(ib.tc, 106);
    let mut q = Params::default();
    q.set("NCCL_IB_QPS_PER_CONNECTION", "4").unwrap();
    q.set("NCCL_IB_SPLIT_DATA_ON_QPS", "1").unwrap();
    q.set("NCCL_GDR_FLUSH_DISABLE", "1").unwrap();
    let c = CommConfig::from_params(&q, LinkLayer::Ethernet, None, true);
    assert_eq!((c.nqps, c.split_data, c.gdr_flush), (4, true, false));
}

#[test]
fn a_failed_accept_releases_its_cq_and_qps() {
    let dev = Loopback::new();
    let cfg = CommConfig {
        nqps: 4,
        ..CommConfig::default()
    };
    let s = SendComm::new(dev.clone(), cfg).unwrap();
    let (qps, cqs) = (dev.live_qps(), dev.live_cqs());
    let mut info = s.local_info();
    info.link_layer = ibnet_core::provider::LinkLayer::Infiniband;
    for _ in 0..3 {
        let e = RecvComm::new(dev.clone(), cfg, &info)
            .err()
            .expect("link layer mismatch");
        assert!(matches!(e, Error::Wire { .. }), "{e}");
    }
    assert_eq!(
        (dev.live_qps(), dev.live_cqs()),
        (qps, cqs),
        "nothing leaked"
    );
}

#[test]
fn peer_posted_is_false_exactly_until_the_receiver_posts_the_next_slot() {
    let (dev, mut s, mut r) = pair(CommConfig::default());
    let src = AlignedBuf::new(64);
    let dsts = [AlignedBuf::new(64), AlignedBuf::new(64)];
    let sk = reg(&dev, &src);
    let buf = |i: usize, tag: u32| RecvBuf {
        addr: dsts[i].addr(),
        size: 64,
        tag,
        mr: reg(&dev, &dsts[i]),
    };
    for round in 0..3u32 {
        // Nothing posted: the hint says so, and an isend agrees.
        assert!(!s.peer_posted(), "round {round}: before the irecv");
        assert_eq!(s.isend(src.addr(), 8, 1, sk).unwrap(), None);
        // A multi-receive of two: posted until both of its sends matched.
        let rid = r.irecv(&[buf(0, 1), buf(1, 2)]).unwrap().unwrap();
        assert!(s.peer_posted(), "round {round}: after the irecv");
        let a = s.isend(src.addr(), 8, 1, sk).unwrap().expect("first send");
        assert!(
            s.peer_posted(),
            "round {round}: one of two receives matched"
        );
        let b = s.isend(src.addr(), 8, 2, sk).unwrap().expect("second send");
        // The slot is used up: the next one is not posted yet.
        assert!(!s.peer_posted(), "round {round}: after the slot's sends");
        wait(|| s.test(a));
        wait(|| s.test(b));
        assert_eq!(wait(|| r.test(rid)).n, 2);
    }
}
