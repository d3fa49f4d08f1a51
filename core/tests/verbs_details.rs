//! What the comms ask of the provider when they connect: the traffic class of the QPs that
//! post the clear-to-send writes (`NCCL_IB_FIFO_TC`) and the ECE exchange
//! (`NCCL_IB_ECE_ENABLE`), seen through a recording wrapper around the loopback provider.

use std::cell::RefCell;
use std::rc::Rc;

use ibnet_core::comm::{CommConfig, RecvBuf};
use ibnet_core::error::Result;
use ibnet_core::params::{fifo_qp_tc, Params};
use ibnet_core::provider::*;
use ibnet_testkit::{connect_pair, fill_pattern, AlignedBuf, Loopback};

#[derive(Default)]
struct Log {
    /// (local qpn, traffic class) per connect_qp.
    tc: Vec<(u32, u8)>,
    /// (local qpn, options) per set_ece.
    set: Vec<(u32, u32)>,
    /// Options applied per QP (what a later query reports).
    applied: Vec<(u32, u32)>,
    /// ('S' set_ece | 'C' connect_qp, local qpn), in call order.
    events: Vec<(char, u32)>,
    /// The access of every registration the comms made themselves.
    regs: Vec<Access>,
}

/// Loopback, recording connects, with ECE: a QP reports `OFFER` until the peer's options are
/// applied, then the intersection.
#[derive(Clone)]
struct Rec {
    lo: Loopback,
    log: Rc<RefCell<Log>>,
    ece: bool,
}

const OFFER: u32 = 0b1111;
const VENDOR: u32 = 0x02c9;

impl Provider for Rec {
    type Cq = <Loopback as Provider>::Cq;
    type Qp = <Loopback as Provider>::Qp;
    type Mr = <Loopback as Provider>::Mr;
    type Fifo = <Loopback as Provider>::Fifo;

    fn port_info(&self) -> PortInfo {
        PortInfo {
            link_layer: LinkLayer::Ethernet,
            ..self.lo.port_info()
        }
    }
    fn alloc_fifo(&self) -> Result<Self::Fifo> {
        self.lo.alloc_fifo()
    }
    fn create_cq(&self, depth: u32) -> Result<Self::Cq> {
        self.lo.create_cq(depth)
    }
    fn create_qp(&self, cq: &Self::Cq, attr: &QpAttr) -> Result<Self::Qp> {
        self.lo.create_qp(cq, attr)
    }
    fn qp_num(&self, qp: &Self::Qp) -> u32 {
        self.lo.qp_num(qp)
    }
    fn connect_qp(&self, qp: &mut Self::Qp, attr: &ConnectAttr) -> Result<()> {
        let n = self.lo.qp_num(qp);
        let mut log = self.log.borrow_mut();
        log.tc.push((n, attr.tc));
        log.events.push(('C', n));
        drop(log);
        self.lo.connect_qp(qp, attr)
    }
    fn query_ece(&self, qp: &Self::Qp) -> Result<Option<Ece>> {
        if !self.ece {
            return Ok(None);
        }
        let n = self.lo.qp_num(qp);
        let log = self.log.borrow();
        let options = log
            .applied
            .iter()
            .find(|(q, _)| *q == n)
            .map_or(OFFER, |(_, o)| o & OFFER);
        Ok(Some(Ece {
            vendor_id: VENDOR,
            options,
            comp_mask: 0,
        }))
    }
    fn set_ece(&self, qp: &mut Self::Qp, ece: &Ece) -> Result<bool> {
        if !self.ece {
            return Ok(false);
        }
        let n = self.lo.qp_num(qp);
        let mut log = self.log.borrow_mut();
        log.set.push((n, ece.options));
        log.events.push(('S', n));
        log.applied.push((n, ece.options));
        Ok(true)
    }
    fn post_send(&self, qp: &mut Self::Qp, wrs: &[SendWr]) -> Result<()> {
        self.lo.post_send(qp, wrs)
    }
    fn post_recv(&self, qp: &mut Self::Qp, wr_id: u64) -> Result<()> {
        self.lo.post_recv(qp, wr_id)
    }
    fn poll_cq(&self, cq: &mut Self::Cq, out: &mut [Completion]) -> Result<usize> {
        self.lo.poll_cq(cq, out)
    }
    fn reg_mr(&self, addr: u64, len: u64, access: Access, kind: RegKind) -> Result<Self::Mr> {
        self.log.borrow_mut().regs.push(access);
        self.lo.reg_mr(addr, len, access, kind)
    }
    fn mr_keys(&self, mr: &Self::Mr) -> MrKeys {
        self.lo.mr_keys(mr)
    }
    fn dereg_mr(&self, mr: Self::Mr) -> Result<()> {
        self.lo.dereg_mr(mr)
    }
    fn destroy_qp(&self, qp: Self::Qp) -> Result<()> {
        self.lo.destroy_qp(qp)
    }
    fn destroy_cq(&self, cq: Self::Cq) -> Result<()> {
        self.lo.destroy_cq(cq)
    }
}

fn rec(ece: bool) -> Rec {
    Rec {
        lo: Loopback::new(),
        log: Rc::default(),
        ece,
    }
}

/// One verified 4 KiB message over the pair.
fn one_message(dev: &Rec, cfg: CommConfig) {
    let (mut s, mut r) = connect_pair(dev, cfg).unwrap();
    let mut src = AlignedBuf::new(4096);
    let dst = AlignedBuf::new(4096);
    fill_pattern(src.as_mut_slice(), 9);
    let sk = dev.lo.register(src.addr(), 4096).unwrap().0;
    let rk = dev.lo.register(dst.addr(), 4096).unwrap().0;
    let rid = r
        .irecv(&[RecvBuf {
            addr: dst.addr(),
            size: 4096,
            tag: 1,
            mr: rk,
        }])
        .unwrap()
        .unwrap();
    let sid = loop {
        if let Some(id) = s.isend(src.addr(), 4096, 1, sk).unwrap() {
            break id;
        }
    };
    while s.test(sid).unwrap().is_none() {}
    while r.test(rid).unwrap().is_none() {}
    assert_eq!(dst.as_slice(), src.as_slice());
}

#[test]
fn fifo_tc_goes_on_the_receivers_qps_only() {
    let mut p = Params::default();
    p.set("NCCL_IB_TC", "106").unwrap();
    p.set("NCCL_IB_FIFO_TC", "96").unwrap();
    p.set("NCCL_IB_QPS_PER_CONNECTION", "2").unwrap();
    let cfg = CommConfig::from_params(&p, LinkLayer::Ethernet, None, false);
    assert_eq!((cfg.tc, cfg.fifo_tc), (106, Some(96)));
    let dev = rec(false);
    one_message(&dev, cfg);
    let log = dev.log.borrow();
    // connect_pair: the receiver connects its 2 QPs first, then the sender its 2.
    let tcs: Vec<u8> = log.tc.iter().map(|&(_, tc)| tc).collect();
    assert_eq!(
        tcs,
        [96, 96, 106, 106],
        "receiver (FIFO writes): 96, sender (data): 106"
    );
}

#[test]
fn fifo_tc_unset_or_on_infiniband_is_the_data_class() {
    assert_eq!(fifo_qp_tc(LinkLayer::Ethernet, None, 106), 106);
    assert_eq!(fifo_qp_tc(LinkLayer::Infiniband, Some(96), 106), 106);
    assert_eq!(fifo_qp_tc(LinkLayer::Ethernet, Some(0), 106), 0);
    let dev = rec(false);
    let cfg = CommConfig {
        tc: 5,
        ..CommConfig::default()
    };
    one_message(&dev, cfg);
    assert!(dev.log.borrow().tc.iter().all(|&(_, tc)| tc == 5));
}

#[test]
fn ece_is_exchanged_and_set_before_connecting() {
    let dev = rec(true);
    let cfg = CommConfig {
        nqps: 2,
        ..CommConfig::default()
    };
    let (s, r) = connect_pair(&dev, cfg).unwrap();
    let si = s.local_info();
    assert_eq!(si.ece.len(), 2, "the requester offers its QPs' options");
    assert!(si
        .ece
        .iter()
        .all(|e| e.options == OFFER && e.vendor_id == VENDOR));
    let ri = r.local_info();
    assert_eq!(
        ri.ece.len(),
        2,
        "the responder answers with what its QPs settled on"
    );
    let log = dev.log.borrow();
    // The receiver applied the offer to its 2 QPs, then the sender applied the answer to its 2,
    // each before that QP connected.
    assert_eq!(log.set.len(), 4);
    for (q, _) in &log.set {
        let at = |k: char| log.events.iter().position(|&e| e == (k, *q)).unwrap();
        assert!(at('S') < at('C'), "qp {q}: set_ece after connect");
    }
    drop(log);
    drop((s, r));
    one_message(&dev, cfg);
}

#[test]
fn ece_off_or_unsupported_sends_none() {
    let dev = rec(true);
    let cfg = CommConfig {
        ece: false,
        ..CommConfig::default()
    };
    let (s, r) = connect_pair(&dev, cfg).unwrap();
    assert!(s.local_info().ece.is_empty() && r.local_info().ece.is_empty());
    assert!(dev.log.borrow().set.is_empty());
    let dev = rec(false);
    let (s, r) = connect_pair(&dev, CommConfig::default()).unwrap();
    assert!(s.local_info().ece.is_empty() && r.local_info().ece.is_empty());
    drop((s, r));
    one_message(&dev, CommConfig::default());
}

#[test]
fn the_fifo_and_flush_rings_never_ask_for_relaxed_ordering() {
    let dev = rec(false);
    let cfg = CommConfig {
        gdr_flush: true,
        ..CommConfig::default()
    };
    let (s, r) = connect_pair(&dev, cfg).unwrap();
    let regs = dev.log.borrow().regs.clone();
    assert!(
        regs.len() >= 2,
        "the sender's FIFO and the receiver's staging/flush ring"
    );
    assert!(regs.iter().all(|a| !a.relaxed_ordering), "{regs:?}");
    drop((s, r));
}
