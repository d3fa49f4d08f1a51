//! Loom models of the shared segment's lock-free protocols, running the crate's own code
//! (`ibnet_soft::lease`, `ibnet_soft::cq`, built on loom's atomics under `--cfg loom`): the
//! registration lease against deregistration (the Dekker pair), a dead lane's voiding, the
//! header's publication, the CQ's slot reservation, and the inbound ring entry with an inline
//! payload, a delivery racing the flush of an errored target, and the reuse of a bounce slot
//! (`ibnet_soft::ring`).
//!
//! `LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg loom" cargo test -p ibnet-soft --release
//! --target-dir target/loom --test loom_seg`
#![cfg(loom)]

use ibnet_soft::cq::CqShared;
use ibnet_soft::lease::{Header, MrSlot};
use ibnet_soft::ring::{bytes, pack, Body, Inline, RingEntry};
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
            body: Body::Words(pack(&[1, 2, 3, 4, 5, 6, 7, 8, 9])),
        };
        let (ei, pi) = (e.clone(), posted.clone());
        let init = thread::spawn(move || {
            assert!(ei.publish(0, 77, 9, Some(&p)));
            // Acquire: pairs with the target's Release below (as `recv_posted`).
            while pi.load(loom::sync::atomic::Ordering::Acquire) < 2 {
                thread::yield_now();
            }
            assert!(ei.publish(1, 78, 4096, None));
        });
        let d = loop {
            if let Some(d) = e.take(0) {
                break d;
            }
            thread::yield_now();
        };
        assert_eq!((d.imm, d.len), (77, 9));
        assert_eq!(d.inline, Some(p));
        let Some(Inline {
            body: Body::Words(w),
            ..
        }) = d.inline
        else {
            panic!("an inline payload: {d:?}");
        };
        assert_eq!(&bytes(&w)[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
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

/// A target QP in the error state flushes the receives it has not been delivered: a delivery
/// racing that flush is either taken by the target (whole, and acknowledged at the initiator)
/// or refused at the initiator (`publish` fails: no acknowledgement, as an RC responder in
/// error), never acknowledged and then dropped, nor taken twice; the next lap of the entry
/// works as before.
#[test]
fn a_delivery_racing_a_flush_is_taken_or_refused_never_acknowledged_and_dropped() {
    loom::model(|| {
        let e = Arc::new(RingEntry::new());
        let p = Inline {
            raddr: 0x1000,
            rkey: 5,
            body: Body::Words(pack(&[9, 8, 7])),
        };
        let ei = e.clone();
        let init = thread::spawn(move || ei.publish(0, 77, 3, Some(&p)));
        // The target's poller in the error state: take it, else flush it; a lost flush means
        // the delivery is there now.
        let taken = loop {
            if let Some(d) = e.take(0) {
                assert_eq!((d.imm, d.len, d.inline), (77, 3, Some(p)));
                break true;
            }
            if e.flush(0) {
                break false;
            }
            thread::yield_now();
        };
        let acked = init.join().unwrap();
        assert_eq!(acked, taken, "acknowledged exactly when the target took it");
        assert!(
            !taken || !e.flush(0),
            "a taken delivery is not flushed after"
        );
        assert!(
            e.take(0).is_some() == taken,
            "a flushed receive shows no delivery"
        );
        // The receive re-posted: the next delivery into the entry lands as usual.
        assert!(e.publish(1, 78, 0, None));
        assert_eq!(e.take(1).map(|d| d.imm), Some(78));
    });
}

/// A bounce slot is never written by the initiator while the target copies out of it: with one
/// slot, the second payload is written only after `bounce_free` saw the target's
/// `bounce_release` of the first, which happens after the target's read of it (the slot is a
/// non-atomic cell here: loom reports any overlap as a data race); each delivery shows its own
/// payload.
#[test]
fn a_bounce_slot_is_reused_only_after_the_target_copied_it_out() {
    use ibnet_core::sync::AtomicU64;
    loom::model(|| {
        let e = Arc::new(RingEntry::new());
        let slot = Arc::new(UnsafeCell::new(0u64));
        let done = Arc::new(AtomicU64::new(0));
        let posted = Arc::new(AtomicU64::new(1));
        let bounce = |b| Inline {
            raddr: 0x1000,
            rkey: 7,
            body: Body::Bounce(b),
        };
        let (ei, si, di, pi) = (e.clone(), slot.clone(), done.clone(), posted.clone());
        let init = thread::spawn(move || {
            let mut seen = 0;
            for b in 0..2u64 {
                while !ibnet_soft::ring::bounce_free(b, &mut seen, &di, 1) {
                    thread::yield_now();
                }
                // SAFETY: the slot is ours to write (what is checked).
                si.with_mut(|p| unsafe { *p = 100 + b });
                // Acquire: pairs with the target's Release below (as `recv_posted`).
                while pi.load(loom::sync::atomic::Ordering::Acquire) <= b {
                    thread::yield_now();
                }
                assert!(ei.publish(b, b as u32, 64, Some(&bounce(b))));
            }
        });
        for t in 0..2u64 {
            let d = loop {
                if let Some(d) = e.take(t) {
                    break d;
                }
                thread::yield_now();
            };
            assert_eq!(d.inline, Some(bounce(t)));
            // SAFETY: published to us by the entry (what is checked).
            let v = slot.with(|p| unsafe { *p });
            assert_eq!(v, 100 + t, "delivery {t} shows its own payload");
            ibnet_soft::ring::bounce_release(&done, t);
            // Release: pairs with the initiator's Acquire above.
            posted.store(t + 2, loom::sync::atomic::Ordering::Release);
        }
        init.join().unwrap();
    });
}
