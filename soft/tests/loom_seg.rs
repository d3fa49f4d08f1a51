//! Loom models of the shared segment's lock-free protocols, running the crate's own code
//! (`ibnet_soft::lease`, `ibnet_soft::cq`, built on loom's atomics under `--cfg loom`): the
//! registration lease against deregistration (the Dekker pair), a dead lane's voiding, the
//! header's publication, the CQ's slot reservation, and the inbound ring entry with an inline
//! payload (`ibnet_soft::ring`).
//!
//! `LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg loom" cargo test -p ibnet-soft --release
//! --target-dir target/loom --test loom_seg`
#![cfg(loom)]

use ibnet_soft::cq::CqShared;
use ibnet_soft::lease::{Header, MrSlot};
use ibnet_soft::ring::{pack, Inline, RingEntry};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

const WRITE: u32 = 2; // ACC_REMOTE_WRITE

/// A peer's copy under a lease never overlaps the owner's reuse of the memory after dereg.
#[test]
fn a_lease_and_deregistration_never_overlap() {
    loom::model(|| {
        let slot = Arc::new(MrSlot::new());
        let mem = Arc::new(UnsafeCell::new(0u8));
        let key = slot.reg(1, 0x1000, 64, WRITE);
        let (s, m) = (slot.clone(), mem.clone());
        let peer = thread::spawn(move || {
            if let Ok(lease) = s.lease(key, 0x1000, 8, WRITE, 3) {
                // SAFETY: the lease keeps the owner from reusing the memory (what is checked).
                m.with_mut(|p| unsafe { *p = 1 });
                drop(lease);
            }
        });
        slot.invalidate();
        while !slot.drained() {
            thread::yield_now();
        }
        // SAFETY: drained: no lease is held, none can start (what is checked).
        mem.with_mut(|p| unsafe { *p = 2 });
        peer.join().unwrap();
        assert!(s_lease_refused_after(&slot, key));
    });
}

fn s_lease_refused_after(slot: &MrSlot, key: u32) -> bool {
    slot.lease(key, 0x1000, 8, WRITE, 3).is_err()
}

/// A lease whose holder died is voided by its lane, and only that lane.
#[test]
fn a_dead_lane_is_voided_and_a_live_one_kept() {
    loom::model(|| {
        let slot = Arc::new(MrSlot::new());
        let key = slot.reg(1, 0x1000, 64, WRITE);
        let s = slot.clone();
        let dead = thread::spawn(move || {
            if let Ok(l) = s.lease(key, 0x1000, 8, WRITE, 5) {
                std::mem::forget(l); // killed mid-copy: never released
                true
            } else {
                false
            }
        });
        slot.invalidate();
        let leaked = dead.join().unwrap();
        assert_eq!(slot.drained(), !leaked);
        assert_eq!(
            slot.busy_lanes().collect::<Vec<_>>(),
            if leaked { vec![5] } else { vec![] }
        );
        slot.void_lane(5);
        assert!(slot.drained());
    });
}

/// A peer that sees the header's magic sees the identity published with it.
#[test]
fn the_header_is_seen_whole() {
    loom::model(|| {
        let h = Arc::new(Header::new());
        let h2 = h.clone();
        let owner = thread::spawn(move || h2.publish(2, 42, 7));
        if h.published() {
            assert!(h.is(2, 42, 7), "magic seen without the identity");
        }
        owner.join().unwrap();
        assert!(h.is(2, 42, 7));
        assert!(!h.is(2, 42, 8));
    });
}

/// Concurrent reservations never exceed the depth; released slots can be taken again.
#[test]
fn cq_reservations_never_exceed_the_depth() {
    loom::model(|| {
        let cq = Arc::new(CqShared::new(2));
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let c = cq.clone();
                thread::spawn(move || c.reserve(1).is_ok() as u32 + c.reserve(1).is_ok() as u32)
            })
            .collect();
        let got: u32 = ts.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(got, 2, "exactly the depth was reserved");
        assert!(cq.reserve(1).is_err());
        cq.release(1);
        assert!(cq.reserve(1).is_ok());
    });
}

/// The target sees a ring entry whole once its `seq` is published (payload, address, key,
/// immediate, length), never a torn one; and when the initiator reuses the entry (after the
/// target re-posted its receive: `posted`, Release/Acquire as `recv_posted`), a delivery
/// without payload never shows the earlier payload's flag.
#[test]
fn a_ring_entry_with_an_inline_payload_is_seen_whole_and_reused_clean() {
    loom::model(|| {
        let e = Arc::new(RingEntry::new());
        let posted = Arc::new(loom::sync::atomic::AtomicU64::new(1));
        let p = Inline {
            raddr: 0x1234_5678,
            rkey: 0x0102_0304,
            words: pack(&[1, 2, 3, 4, 5, 6, 7, 8, 9]),
        };
        let (ei, pi) = (e.clone(), posted.clone());
        let init = thread::spawn(move || {
            ei.publish(0, 77, 9, Some(&p));
            // Acquire: pairs with the target's Release below (as `recv_posted`).
            while pi.load(loom::sync::atomic::Ordering::Acquire) < 2 {
                thread::yield_now();
            }
            ei.publish(1, 78, 4096, None);
        });
        let d = loop {
            if let Some(d) = e.take(0) {
                break d;
            }
            thread::yield_now();
        };
        assert_eq!((d.imm, d.len), (77, 9));
        assert_eq!(d.inline, Some(p));
        assert_eq!(
            &d.inline.unwrap().bytes()[..9],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9]
        );
        assert!(
            e.take(1).is_none(),
            "delivery 1 before the receive was re-posted"
        );
        // Release: pairs with the initiator's Acquire above.
        posted.store(2, loom::sync::atomic::Ordering::Release);
        let d = loop {
            if let Some(d) = e.take(1) {
                break d;
            }
            thread::yield_now();
        };
        assert_eq!((d.imm, d.len, d.inline), (78, 4096, None));
        init.join().unwrap();
    });
}
