//! Small WRITE_WITH_IMM payloads carried inline in the target's ring entry (segment version 4 and later):
//! bytes and order when inline and copied writes interleave on one QP, and remote access
//! errors on an inline write surfacing as they do for a copied one (the initiator's check at
//! post) or at the target's re-check (its MR deregistered while the payload was in flight).
//! The two-process variants are in `responder.rs` (role `mixed_writer`).

mod common;

use common::*;
use ibnet_core::provider::{Access, Provider, RegKind, WcOpcode, WcStatus, WrOpcode};

#[test]
fn inline_and_copied_writes_interleaved_on_one_qp_land_in_order() {
    let (pa, pb) = (provider(), provider());
    let (mut a, mut b) = pair(&pa, &pb);
    let span = mixed_span();
    let mut src = Region::new(span);
    fill_pattern(src.bytes_mut(), 5);
    let dst = Region::new(span);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    let seq = mixed_sequence();
    let imms: Vec<usize> = (0..seq.len())
        .filter(|&i| seq[i].2 == WrOpcode::WriteWithImm)
        .collect();
    for &i in &imms {
        b.recv(i as u64);
    }
    let wrs: Vec<_> = seq
        .iter()
        .enumerate()
        .map(|(i, &(o, l, op))| {
            let (sa, da) = (src.addr() + o as u64, dst.addr() + o as u64);
            wr(
                i as u64,
                op,
                sa,
                l as u32,
                a.key(&ms),
                da,
                b.key(&md),
                i as u32,
                true,
            )
        })
        .collect();
    a.post(&wrs).unwrap();
    let ca = a.wait(wrs.len());
    assert!(ca.iter().all(|c| c.status == WcStatus::Success), "{ca:?}");
    // At each receive (in WR order), that WR's bytes and those of every earlier WR are there.
    let mut got = 0;
    while got < imms.len() {
        for c in b.wait(1) {
            let i = imms[got];
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
            assert_eq!((c.wr_id, c.imm), (i as u64, i as u32), "order");
            assert_eq!(c.byte_len as usize, seq[i].1);
            let end = seq[i].0 + seq[i].1;
            for &(o, l, _) in seq.iter().take(i + 1) {
                assert_eq!(
                    &dst.bytes()[o..o + l],
                    &src.bytes()[o..o + l],
                    "WR at {o} (+{l}) missing at receive {i}"
                );
            }
            assert!(end <= span);
            got += 1;
        }
    }
}

/// An inline write the initiator's check refuses (`bad` makes the WR from the target's buffer
/// and key): the WR completes with `RemoteAccessError`, no byte moves, and the target's
/// receives are flushed (its QP is in the error state), as for a copied write.
fn inline_write_refused(access: Access, bad: impl Fn(u64, u32) -> (u64, u32), dereg_first: bool) {
    let (pa, pb) = (provider(), provider());
    let (mut a, mut b) = pair(&pa, &pb);
    let mut src = Region::new(64);
    fill_pattern(src.bytes_mut(), 9);
    let dst = Region::new(64);
    let ms = a.reg(&src);
    let md = pb.reg_mr(dst.addr(), 64, access, RegKind::Plain).unwrap();
    let key = b.key(&md);
    for i in 0..2 {
        b.recv(10 + i);
    }
    if dereg_first {
        pb.dereg_mr(md).unwrap();
    }
    let (ra, rk) = bad(dst.addr(), key);
    let w = wr(
        1,
        WrOpcode::WriteWithImm,
        src.addr(),
        8,
        a.key(&ms),
        ra,
        rk,
        3,
        true,
    );
    a.post(&[w]).unwrap();
    let ca = a.wait(1);
    assert_eq!(ca[0].status, WcStatus::RemoteAccessError, "{ca:?}");
    let cb = b.wait(2);
    assert!(
        cb.iter().all(|c| c.status == WcStatus::WrFlushError),
        "{cb:?}"
    );
    assert!(dst.bytes().iter().all(|&x| x == 0), "a byte moved");
}

#[test]
fn inline_write_with_a_stale_rkey_fails_as_a_copied_one() {
    inline_write_refused(Access::ALL, |a, k| (a, k), true);
}

#[test]
fn inline_write_out_of_range_fails_as_a_copied_one() {
    inline_write_refused(Access::ALL, |a, k| (a + 60, k), false);
}

#[test]
fn inline_write_without_remote_write_access_fails_as_a_copied_one() {
    let ro = Access {
        remote_write: false,
        ..Access::ALL
    };
    inline_write_refused(ro, |a, k| (a, k), false);
}

/// The target re-checks: its MR is deregistered after the initiator's check passed and the
/// payload was delivered, before the target polls. The payload is not copied; the receive (and
/// the next) completes with `WrFlushError`.
#[test]
fn inline_payload_for_an_mr_deregistered_in_flight_is_refused_by_the_target() {
    let (pa, pb) = (provider(), provider());
    let (mut a, mut b) = pair(&pa, &pb);
    let mut src = Region::new(64);
    fill_pattern(src.bytes_mut(), 9);
    let dst = Region::new(64);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    b.recv(1);
    b.recv(2);
    let w = wr(
        1,
        WrOpcode::WriteWithImm,
        src.addr(),
        8,
        a.key(&ms),
        dst.addr(),
        b.key(&md),
        3,
        true,
    );
    a.post(&[w]).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    pb.dereg_mr(md).unwrap();
    let cb = b.wait(2);
    assert!(
        cb.iter().all(|c| c.status == WcStatus::WrFlushError),
        "{cb:?}"
    );
    assert!(dst.bytes().iter().all(|&x| x == 0), "a byte moved");
}
