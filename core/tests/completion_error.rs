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
