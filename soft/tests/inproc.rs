//! Provider-level RC semantics over the in-process fabric (two providers in one process, and a
//! loopback QP pair on one provider).

mod common;

use std::time::Duration;

use common::*;
use ibnet_core::provider::{
    Access, Provider, QpAttr, RegKind, SendWr, WcOpcode, WcStatus, WrOpcode,
};
use ibnet_core::Error;
use ibnet_soft::{Config, SoftProvider};

/// WRITE_WITH_IMM of `len` bytes from a to b; checks both completions and the bytes.
fn write_imm_roundtrip(a: &mut Side, b: &mut Side, len: usize, seed: u64) {
    let mut src = Region::new(len);
    src.fill(seed);
    let dst = Region::new(len);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    b.recv(900 + seed);
    let w = wr(
        seed,
        WrOpcode::WriteWithImm,
        src.addr(),
        len as u32,
        a.key(&ms),
        dst.addr(),
        b.key(&md),
        0xabc0 + seed as u32,
        true,
    );
    a.post(&[w]).unwrap();
    let ca = a.wait(1);
    assert_eq!(ca[0].status, WcStatus::Success);
    assert_eq!(ca[0].wr_id, seed);
    assert_eq!(ca[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(ca[0].qp_num, a.p.qp_num(&a.qp));
    let cb = b.wait(1);
    assert_eq!(cb[0].status, WcStatus::Success);
    assert_eq!(cb[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(cb[0].wr_id, 900 + seed);
    assert_eq!(cb[0].imm, 0xabc0 + seed as u32);
    assert_eq!(cb[0].byte_len, len as u32);
    assert_eq!(cb[0].qp_num, b.p.qp_num(&b.qp));
    assert!(dst.bytes() == src.bytes(), "payload of {len} bytes differs");
}

#[test]
fn write_with_imm_sizes_0_to_64mib_byte_for_byte() {
    let (pa, pb) = (provider(), provider());
    let (mut a, mut b) = pair(&pa, &pb);
    for (i, len) in [
        0usize,
        1,
        7,
        8,
        4096,
        65_536,
        65_537,
        300_001,
        1 << 20,
        (4 << 20) + 3,
        64 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        write_imm_roundtrip(&mut a, &mut b, len, i as u64 + 1);
    }
}

#[test]
fn loopback_on_one_provider() {
    let p = provider();
    let (mut a, mut b) = pair(&p, &p);
    write_imm_roundtrip(&mut a, &mut b, 12_345, 3);
    write_imm_roundtrip(&mut b, &mut a, 1 << 20, 4);
}

#[test]
fn imm_completion_implies_earlier_writes_are_visible() {
    // Large unsignaled writes go to the copy engine in chunks; the small WRITE_WITH_IMM behind
    // them is copied at once by the posting thread, but its immediate must wait for them.
    let p = SoftProvider::open_with(Config {
        workers: 3,
        chunk: 64 << 10,
        ..Config::default()
    })
    .unwrap();
    let (mut a, mut b) = pair(&p, &p);
    const N: usize = 6;
    const LEN: usize = 3 << 20;
    for round in 0..4u64 {
        let mut srcs: Vec<Region> = (0..N).map(|_| Region::new(LEN)).collect();
        let dsts: Vec<Region> = (0..N).map(|_| Region::new(LEN)).collect();
        for (i, s) in srcs.iter_mut().enumerate() {
            s.fill(round * 100 + i as u64);
        }
        let ms: Vec<_> = srcs.iter().map(|r| a.reg(r)).collect();
        let md: Vec<_> = dsts.iter().map(|r| b.reg(r)).collect();
        b.recv(1);
        let mut wrs: Vec<SendWr> = (0..N)
            .map(|i| {
                wr(
                    i as u64,
                    WrOpcode::Write,
                    srcs[i].addr(),
                    LEN as u32,
                    a.key(&ms[i]),
                    dsts[i].addr(),
                    b.key(&md[i]),
                    0,
                    false,
                )
            })
            .collect();
        let flag_src = Region::new(8);
        let flag_dst = Region::new(8);
        let (mfs, mfd) = (a.reg(&flag_src), b.reg(&flag_dst));
        wrs.push(wr(
            99,
            WrOpcode::WriteWithImm,
            flag_src.addr(),
            8,
            a.key(&mfs),
            flag_dst.addr(),
            b.key(&mfd),
            7,
            true,
        ));
        a.post(&wrs).unwrap();
        let c = b.wait(1);
        assert_eq!((c[0].status, c[0].imm), (WcStatus::Success, 7));
        // At this instant every earlier write must be complete.
        for i in 0..N {
            assert!(
                dsts[i].bytes() == srcs[i].bytes(),
                "write {i} not visible at the immediate"
            );
        }
        let ca = a.wait(1);
        assert_eq!(ca.len(), 1, "only the signaled WR completes");
        assert_eq!(ca[0].wr_id, 99);
    }
}

#[test]
fn rdma_read_and_signaled_vs_unsignaled() {
    let (pa, pb) = (provider(), provider());
    let (mut a, b) = pair(&pa, &pb);
    let mut remote = Region::new(1 << 20);
    remote.fill(42);
    let local = Region::new(1 << 20);
    let (mr, ml) = (b.reg(&remote), a.reg(&local));
    let small = wr(
        1,
        WrOpcode::Read,
        local.addr(),
        100,
        a.key(&ml),
        remote.addr(),
        b.key(&mr),
        0,
        false,
    );
    let big = wr(
        2,
        WrOpcode::Read,
        local.addr() + 100,
        (1 << 20) - 100,
        a.key(&ml),
        remote.addr() + 100,
        b.key(&mr),
        0,
        true,
    );
    a.post(&[small, big]).unwrap();
    let c = a.wait(1);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].opcode, c[0].status),
        (2, WcOpcode::RdmaRead, WcStatus::Success)
    );
    assert_eq!(c[0].byte_len, (1 << 20) - 100);
    assert!(local.bytes() == remote.bytes());
    assert!(
        a.drain_for(Duration::from_millis(20)).is_empty(),
        "the unsignaled read completed"
    );
}

#[test]
fn send_queue_and_cq_capacity_are_errors_not_ub() {
    let p = provider();
    let attr = QpAttr {
        max_send_wr: 4,
        max_recv_wr: 2,
        max_inline: 0,
        access: Access::ALL,
    };
    let mut a = Side::with(&p, 3, attr);
    let mut b = Side::new(&p);
    let (ia, ib) = (a.info(), b.info());
    a.connect(ib).unwrap();
    b.connect(ia).unwrap();
    let z = |id| wr(id, WrOpcode::Write, 0, 0, 0, 0, 0, 0, false);
    // SQ: 4 outstanding at most; a chain that does not fit posts nothing.
    a.post(&[z(1), z(2), z(3)]).unwrap();
    assert!(matches!(
        a.post(&[z(4), z(5)]),
        Err(Error::Full { cap: 4, .. })
    ));
    a.post(&[z(4)]).unwrap();
    assert!(matches!(a.post(&[z(5)]), Err(Error::Full { .. })));
    assert!(a.drain_for(Duration::from_millis(5)).is_empty()); // retires the unsignaled WRs
                                                               // CQ depth 3: two receives + one signaled send fit, the next signaled one does not.
    a.recv(10);
    a.recv(11);
    assert!(
        matches!(a.p.post_recv(&mut a.qp, 12), Err(Error::Full { .. })),
        "RQ depth 2"
    );
    let s = |id| wr(id, WrOpcode::Write, 0, 0, 0, 0, 0, 0, true);
    a.post(&[s(20)]).unwrap();
    assert!(matches!(
        a.post(&[s(21)]),
        Err(Error::Full {
            what: "soft completion queue",
            cap: 3
        })
    ));
    let c = a.wait(1);
    assert_eq!(c[0].wr_id, 20);
    a.post(&[s(21)]).unwrap(); // its slot came back
    assert_eq!(a.wait(1)[0].wr_id, 21);
    // Inline larger than max_inline.
    let mut w = z(30);
    w.inline = true;
    w.sge.len = 1;
    assert!(matches!(a.post(&[w]), Err(Error::OutOfRange { .. })));
    // Bad attributes.
    let bad = QpAttr {
        max_send_wr: 0,
        ..attr
    };
    assert!(matches!(
        p.create_qp(&a.cq, &bad),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(p.create_cq(0), Err(Error::OutOfRange { .. })));
}

#[test]
fn post_before_connect_is_bad_state() {
    let p = provider();
    let mut a = Side::new(&p);
    let z = wr(1, WrOpcode::Write, 0, 0, 0, 0, 0, 0, true);
    assert!(matches!(a.post(&[z]), Err(Error::BadState { .. })));
    let mut garbage = common::connect_attr(
        ibnet_core::provider::ProviderAddr::new(&[1, 2, 3]).unwrap(),
        1,
    );
    assert!(matches!(
        p.connect_qp(&mut a.qp, &garbage),
        Err(Error::Wire { .. })
    ));
    garbage.remote_addr = p.port_info().addr;
    garbage.remote_qpn = 0x0012_3456;
    assert!(matches!(
        p.connect_qp(&mut a.qp, &garbage),
        Err(Error::Wire { .. })
    ));
}

/// Posts a bad WR, then a good one; expects `status` then WrFlushError, and flush for WRs
/// posted afterwards.
fn expect_error_then_flush(a: &mut Side, bad: SendWr, good: SendWr, status: WcStatus) {
    a.post(&[bad, good]).unwrap();
    let c = a.wait(2);
    assert_eq!((c[0].wr_id, c[0].status), (bad.wr_id, status), "{c:?}");
    assert_eq!(
        (c[1].wr_id, c[1].status),
        (good.wr_id, WcStatus::WrFlushError)
    );
    a.post(&[good]).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::WrFlushError);
}

#[test]
fn bad_rkey_out_of_range_deregistered_and_bad_lkey_are_errors() {
    let p = provider();
    let src = Region::new(4096);
    let dst = Region::new(4096);
    let canary = Region::new(4096);
    let cases: [(&str, WcStatus); 6] = [
        ("bad rkey", WcStatus::RemoteAccessError),
        ("out of range", WcStatus::RemoteAccessError),
        ("deregistered", WcStatus::RemoteAccessError),
        ("no remote write", WcStatus::RemoteAccessError),
        ("bad lkey", WcStatus::LocalProtectionError),
        ("local range", WcStatus::LocalProtectionError),
    ];
    for (what, status) in cases {
        let (mut a, b) = pair(&p, &p);
        let ms = a.reg(&src);
        let md = b.reg(&dst);
        let ro = p
            .reg_mr(
                dst.addr(),
                4096,
                Access {
                    remote_write: false,
                    ..Access::ALL
                },
                RegKind::Plain,
            )
            .unwrap();
        let good = wr(
            2,
            WrOpcode::Write,
            src.addr(),
            64,
            a.key(&ms),
            dst.addr(),
            b.key(&md),
            0,
            true,
        );
        let mut bad = good;
        bad.wr_id = 1;
        bad.signaled = false; // an error completes even an unsignaled WR
        match what {
            "bad rkey" => bad.rkey ^= 0x00ff_0000,
            "out of range" => bad.remote_addr = dst.addr() + 4090,
            "deregistered" => {
                let k = b.key(&md);
                p.dereg_mr(md).unwrap();
                bad.rkey = k;
            }
            "no remote write" => bad.rkey = p.mr_keys(&ro).rkey,
            "bad lkey" => bad.sge.lkey = 0x7777,
            _ => bad.sge.addr = canary.addr(),
        }
        expect_error_then_flush(&mut a, bad, good, status);
        assert!(
            dst.bytes().iter().all(|&x| x == 0),
            "{what}: the target was written"
        );
    }
}

#[test]
fn write_with_imm_without_receive_waits_like_rnr() {
    let p = provider();
    let (mut a, mut b) = pair(&p, &p);
    let mut src = Region::new(256);
    src.fill(9);
    let dst = Region::new(256);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    let w = wr(
        5,
        WrOpcode::WriteWithImm,
        src.addr(),
        256,
        a.key(&ms),
        dst.addr(),
        b.key(&md),
        77,
        true,
    );
    a.post(&[w, w]).unwrap();
    // No receive: neither side completes anything.
    assert!(a.drain_for(Duration::from_millis(30)).is_empty());
    assert!(b.drain_for(Duration::from_millis(5)).is_empty());
    b.recv(1);
    // The initiator's progress (poll) delivers the first immediate.
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let c = b.wait(1);
    assert_eq!((c[0].wr_id, c[0].imm, c[0].byte_len), (1, 77, 256));
    b.recv(2);
    a.wait(1);
    assert_eq!(b.wait(1)[0].wr_id, 2);
    assert!(dst.bytes() == src.bytes());
}

#[test]
fn destroyed_target_qp_fails_pending_work_with_retry_exceeded() {
    let p = provider();
    let (mut a, b) = pair(&p, &p);
    let w = wr(5, WrOpcode::WriteWithImm, 0, 0, 0, 0, 0, 1, true);
    a.post(&[w]).unwrap();
    drop(b); // destroys the target QP: the pending immediate can never be delivered
    let c = a.wait(1);
    assert_eq!(c[0].status, WcStatus::RetryExceeded);
    a.post(&[w]).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::WrFlushError);
}

#[test]
fn many_small_messages_in_order() {
    let p = provider();
    let (mut a, mut b) = pair(&p, &p);
    let mut src = Region::new(64 * 256);
    src.fill(1);
    let dst = Region::new(64 * 256);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    let (ks, kd) = (a.key(&ms), b.key(&md));
    let mut got = 0u32;
    for round in 0..200u32 {
        for i in 0..64u32 {
            b.recv((round * 64 + i) as u64);
        }
        let wrs: Vec<SendWr> = (0..64u32)
            .map(|i| {
                wr(
                    i as u64,
                    WrOpcode::WriteWithImm,
                    src.addr() + 256 * i as u64,
                    256,
                    ks,
                    dst.addr() + 256 * i as u64,
                    kd,
                    round * 64 + i,
                    i == 63,
                )
            })
            .collect();
        a.post(&wrs).unwrap();
        for c in b.wait(64) {
            assert_eq!(c.imm, got, "immediates arrive in order");
            assert_eq!(c.wr_id, got as u64, "receives are consumed in order");
            got += 1;
        }
        assert_eq!(a.wait(1)[0].wr_id, 63);
    }
    assert!(dst.bytes() == src.bytes());
}

#[test]
fn shutdown_joins_and_refuses_work() {
    let p = provider();
    let (mut a, _b) = pair(&p, &p);
    p.shutdown();
    p.shutdown(); // idempotent
    let w = wr(1, WrOpcode::Write, 0, 0, 0, 0, 0, 0, true);
    assert!(matches!(a.post(&[w]), Err(Error::BadState { .. })));
    assert!(matches!(p.create_cq(4), Err(Error::BadState { .. })));
}

#[test]
fn dmabuf_is_refused_and_fifo_is_zeroed() {
    let p = provider();
    assert!(matches!(
        p.reg_mr(
            4096,
            4096,
            Access::ALL,
            RegKind::DmaBuf { fd: 3, offset: 0 }
        ),
        Err(Error::Provider { .. })
    ));
    let f = p.alloc_fifo().unwrap();
    assert_eq!(f.base_addr() % 64, 0);
    let mut out = [ibnet_core::fifo::PostedRecv::default(); ibnet_core::fifo::MAX_RECVS];
    assert_eq!(f.poll(0, &mut out), Ok(None));
    assert_eq!(p.port_info().port, 1);
    assert_eq!(p.device_name(), "soft0");
    assert_eq!(p.dev_name().as_str(), "soft0", "completion errors name it");
}
