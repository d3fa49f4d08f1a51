//! A failed completion is reported as NCCL 2.28 prints it, and more: status and opcode names,
//! the HCA, the local QP, the peer's socket address and GID, the request's size.

use ibnet_core::comm::{CommConfig, RecvBuf};
use ibnet_core::error::{Error, PeerId, ReqType};
use ibnet_core::provider::{DevName, Gid, WcOpcode, WcStatus};
use ibnet_testkit::{connect_pair, AlignedBuf, Loopback};

#[test]
fn status_and_opcode_names_cover_verbs() {
    assert_eq!(WcStatus::from_raw(12).name(), "IBV_WC_RETRY_EXC_ERR");
    assert_eq!(WcStatus::from_raw(5).name(), "IBV_WC_WR_FLUSH_ERR");
    assert_eq!(WcStatus::from_raw(20).name(), "IBV_WC_RESP_TIMEOUT_ERR");
    assert_eq!(WcStatus::from_raw(999), WcStatus::General);
    for v in 0..=21u32 {
        assert_eq!(
            WcStatus::from_raw(v) as u32,
            v,
            "every verbs status keeps its number"
        );
    }
    assert_eq!(WcOpcode::RdmaRead.name(), "IBV_WC_RDMA_READ");
    assert_eq!(WcOpcode::Unknown.name(), "UNKNOWN_OPCODE");
    assert_eq!(DevName::new("mlx5_0").as_str(), "mlx5_0");
    assert_eq!(DevName::new(&"é".repeat(20)).as_str().len(), 16);
}

#[test]
fn the_line_names_everything() {
    let e = Error::Completion {
        status: WcStatus::RetryExceeded,
        opcode: WcOpcode::RdmaWrite,
        vendor_err: 129,
        req: ReqType::Send,
        peer: PeerId {
            gid: Gid([0xfe; 16]),
            lid: 0,
            qpn: 0x11,
            addr: Some("10.1.2.3:45678".parse().unwrap()),
        },
        local_gid: Gid([0; 16]),
        hca: DevName::new("rxe0"),
        local_qpn: 0x2a,
        size: 1 << 20,
    };
    let s = e.to_string();
    for want in [
        "peer 10.1.2.3:45678 gid fefe:",
        "status=IBV_WC_RETRY_EXC_ERR(12)",
        "opcode=IBV_WC_RDMA_WRITE(1)",
        "reqSize=1048576",
        "vendor_err=129",
        "req_type=Send",
        "hca rxe0",
        "qpn 0x2a",
    ] {
        assert!(s.contains(want), "{want:?} missing from {s:?}");
    }
}

#[test]
fn a_failed_send_reports_its_size_and_peer_address() {
    let dev = Loopback::new();
    let (mut s, mut r) = connect_pair(&dev, CommConfig::default()).unwrap();
    s.set_peer_addr("127.0.0.1:4242".parse().unwrap());
    let src = AlignedBuf::new(4096);
    let dst = AlignedBuf::new(4096);
    let sk = dev.register(src.addr(), 4096).unwrap().0;
    let mut rk = dev.register(dst.addr(), 4096).unwrap().0;
    rk.rkey ^= 0xff;
    r.irecv(&[RecvBuf {
        addr: dst.addr(),
        size: 4096,
        tag: 3,
        mr: rk,
    }])
    .unwrap()
    .unwrap();
    let sid = loop {
        if let Some(id) = s.isend(src.addr(), 3000, 3, sk).unwrap() {
            break id;
        }
    };
    let e = loop {
        match s.test(sid) {
            Ok(None) => continue,
            Ok(Some(d)) => panic!("completed: {d:?}"),
            Err(e) => break e,
        }
    };
    match e {
        Error::Completion {
            status: WcStatus::RemoteAccessError,
            req: ReqType::Send,
            size: 3000,
            peer,
            ..
        } => assert_eq!(peer.addr, Some("127.0.0.1:4242".parse().unwrap())),
        e => panic!("{e}"),
    }
    assert!(e.to_string().contains("127.0.0.1:4242"), "{e}");
}

/// A failed completion and good ones in one poll: every good one is applied before the error
/// is reported, none dropped with it, so after a failure the comm still says which receives
/// completed (`completed`, after `drain`): a fused receiver counts those parts (the sender had
/// them acknowledged and tells nothing of them; issue 29).
#[test]
fn a_receive_completed_behind_a_failure_in_one_poll_still_counts() {
    use ibnet_core::provider::WcStatus;
    use ibnet_testkit::Fault;
    let dev = Loopback::new();
    let cfg = CommConfig {
        nqps: 2,
        ..CommConfig::default()
    };
    let (mut s, mut r) = connect_pair(&dev, cfg).unwrap();
    let src = AlignedBuf::new(4096);
    let dst: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::new(4096)).collect();
    let sk = dev.register(src.addr(), 4096).unwrap().0;
    let post = |r: &mut ibnet_core::comm::RecvComm<Loopback>, b: &AlignedBuf| {
        let mr = dev.register(b.addr(), 4096).unwrap().0;
        let buf = RecvBuf {
            addr: b.addr(),
            size: 4096,
            tag: 3,
            mr,
        };
        r.irecv(&[buf]).unwrap().unwrap()
    };
    let r0 = post(&mut r, &dst[0]); // on QP 0
    let r1 = post(&mut r, &dst[1]); // on QP 1
                                    // The clear-to-send of the third receive (QP 0) fails: QP 0 of the receiver is in error.
    dev.inject(Fault::FailWr {
        after: 0,
        status: WcStatus::RetryExceeded,
    });
    let _r2 = post(&mut r, &dst[2]);
    // The first send goes on QP 0 (not acknowledged: the target is in error), the second on
    // QP 1: placed, acknowledged, its completion queued behind the receiver's error.
    let s0 = s.isend(src.addr(), 1000, 3, sk).unwrap().unwrap();
    let s1 = s.isend(src.addr(), 2000, 3, sk).unwrap().unwrap();
    assert!(s.test(s0).is_err(), "the first send was not acknowledged");
    assert_eq!(s.completed(s1).unwrap().map(|d| d.sizes[0]), Some(2000));
    // One poll of the receiver takes the error and the second receive's completion.
    assert!(r.test(r0).is_err(), "the receiver's failure");
    r.drain().unwrap();
    assert_eq!(
        r.completed(r1).unwrap().map(|d| d.sizes[0]),
        Some(2000),
        "the receive the sender had acknowledged completed"
    );
    assert_eq!(r.completed(r0).unwrap(), None, "the other one did not");
}
