//! A local QP operation error fails a fused comm's rail over (it does not fail the comm):
//! soft-RoCE completes a send with `IBV_WC_LOC_QP_OP_ERR` when the rail's own link is down
//! (the rxe suite's `fused-failover-linkdown-plugin`, `ip link set dummy1 down`, failed its
//! comm on it once only flush and retry-exceeded failed over). Loopback rails; the message
//! completes at both ends with every byte verified and the failed rail's part written again.

use ibnet_core::comm::CommConfig;
use ibnet_core::fused::{FusedBuf, FusedRecv, FusedSend, Resilience, MAX_DEVS_PER_NIC};
use ibnet_core::provider::{MrKeys, WcStatus};
use ibnet_testkit::{fill_pattern, AlignedBuf, Fault, Loopback};

fn pair(rails: &[Loopback]) -> (Box<FusedSend<Loopback>>, Box<FusedRecv<Loopback>>) {
    let (mut s, mut r) =
        ibnet_testkit::fused_pair(rails, CommConfig::default()).expect("fused pair");
    s.set_resilience(Resilience::default());
    r.set_resilience(Resilience::default());
    (s, r)
}

fn reg(rails: &[Loopback], b: &AlignedBuf) -> [MrKeys; MAX_DEVS_PER_NIC] {
    let mut k = [MrKeys::default(); MAX_DEVS_PER_NIC];
    for (i, d) in rails.iter().enumerate() {
        k[i] = d.register(b.addr(), b.len() as u64).expect("register").0;
    }
    k
}

#[test]
fn a_local_qp_op_error_fails_the_rail_over() {
    let rails: Vec<Loopback> = (0..2).map(|_| Loopback::new()).collect();
    let (mut s, mut r) = pair(&rails);
    let size = 1usize << 20;
    let mut sb = AlignedBuf::new(size);
    fill_pattern(sb.as_mut_slice(), size as u64);
    let rb = AlignedBuf::new(size);
    let (sk, rk) = (reg(&rails, &sb), reg(&rails, &rb));
    let buf = FusedBuf {
        addr: rb.addr(),
        size: size as u64,
        tag: 5,
        mrs: rk,
    };
    let rid = r.irecv(&[buf]).expect("irecv").expect("posted");
    rails[1].inject(Fault::FailWr {
        after: 0,
        status: WcStatus::LocalQpOpError,
    });
    let sid = s
        .isend(sb.addr(), size as u64, 5, &sk[..2])
        .expect("isend")
        .expect("receive posted");
    let (mut sd, mut rd) = (None, None);
    // A bound on a hang, not a timing.
    for _ in 0..10_000 {
        if sd.is_none() {
            sd = s
                .test(sid)
                .expect("the send survives a local QP operation error");
        }
        if rd.is_none() {
            rd = r.test(rid).expect("the receive survives it");
        }
        if sd.is_some() && rd.is_some() {
            break;
        }
    }
    assert!(sd.is_some() && rd.is_some(), "send {sd:?}, receive {rd:?}");
    assert_eq!(rb.as_slice(), sb.as_slice(), "every byte arrives");
    assert!(s.resent_bytes() > 0, "the failed rail's part went again");
}
