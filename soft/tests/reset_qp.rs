//! `Provider::reset_qp` on the soft provider (a fused comm's failback): two connected QPs put
//! in the error state by a remote access error are reset, keep their QP numbers, drop what
//! they had posted (a receive of before completes never), and then carry a write with
//! immediate, bytes verified, as new.

mod common;

use std::time::Duration;

use common::*;
use ibnet_core::provider::{Provider, WcOpcode, WcStatus, WrOpcode};

#[test]
fn reset_qps_work_again_towards_the_same_peer() {
    let p = provider();
    let (mut a, mut b) = pair(&p, &p);
    let (qa, qb) = (a.info(), b.info());
    let mut src = Region::new(8192);
    src.fill(11);
    let dst = Region::new(8192);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    // A bad rkey: the initiator and the target both go to the error state.
    b.recv(7);
    let bad = wr(
        1,
        WrOpcode::WriteWithImm,
        src.addr(),
        64,
        a.key(&ms),
        dst.addr(),
        0xdead,
        1,
        true,
    );
    a.post(&[bad]).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::RemoteAccessError);
    let flushed = b.wait(1);
    assert_eq!(flushed[0].status, WcStatus::WrFlushError, "{flushed:?}");
    b.recv(8); // posted in the error state: flushed, or dropped by the reset
    let _ = b.drain_for(Duration::from_millis(20));
    // Both reset, towards each other as connected before.
    p.reset_qp(&mut a.qp, &connect_attr(qb.0, qb.1)).unwrap();
    p.reset_qp(&mut b.qp, &connect_attr(qa.0, qa.1)).unwrap();
    assert_eq!((a.info(), b.info()), (qa, qb), "same QP numbers");
    assert!(
        b.drain_for(Duration::from_millis(20)).is_empty(),
        "nothing of before"
    );
    b.recv(9);
    let good = wr(
        2,
        WrOpcode::WriteWithImm,
        src.addr(),
        8192,
        a.key(&ms),
        dst.addr(),
        b.key(&md),
        42,
        true,
    );
    a.post(&[good]).unwrap();
    let sc = a.wait(1);
    assert_eq!((sc[0].status, sc[0].wr_id), (WcStatus::Success, 2));
    let rc = b.wait(1);
    assert_eq!(
        (
            rc[0].status,
            rc[0].opcode,
            rc[0].wr_id,
            rc[0].imm,
            rc[0].byte_len
        ),
        (WcStatus::Success, WcOpcode::RecvRdmaWithImm, 9, 42, 8192),
        "the receive posted after the reset, not one of before"
    );
    assert_eq!(dst.bytes(), src.bytes(), "every byte");
}
