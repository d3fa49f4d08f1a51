//! loom model of the verbs async-event flags (`ibnet_atomics::event_flags`: the plugin's own
//! code, registries and mutexes included).
//!
//! * A QP or CQ error fails only the comm owning it: a poll of that comm racing the event is
//!   fine or failed (and stays failed), a poll of another comm is always fine, and every poll
//!   after the event is handled fails.
//! * A QP's reset (`clear_qp`, on the comm's thread) racing an error event of that QP: it
//!   never clears another QP's error, and afterwards the comm is failed exactly when the
//!   event was handled after the clear (the clear found nothing to take off).
//! * A device-fatal event fails every comm on the device, the same way.
//! * An event for a QP (or CQ) being destroyed never fails the comm that reuses its address
//!   afterwards. The model plays libibverbs' part as its contract says: `ibv_destroy_qp` /
//!   `ibv_destroy_cq` return once every event reported for the object was acknowledged, and
//!   drop the ones not yet reported; the async thread acknowledges after handling.
//! * `NCCL_IB_RETURN_ASYNC_EVENTS=0`: fatal events fail nothing.
//! * The stop request reaches the async thread's loop.
#![cfg(loom)]

use ibnet_atomics::event_flags::{Events, Failure, Handled, Scope};
use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

const CQ_A: usize = 0x1000;
const CQ_B: usize = 0x2000;
const QP_A: usize = 0x1100;
const QP_B: usize = 0x1200;

/// Two polls of one comm: the second is never fine once the first failed; returns both.
fn two_polls(ev: &Events, flag: &AtomicU32) -> [Result<(), Failure>; 2] {
    let a = ev.check(flag);
    let b = ev.check(flag);
    if a.is_err() {
        assert_eq!(b, a, "a failed comm recovered");
    }
    [a, b]
}

#[test]
fn qp_error_fails_only_its_comm() {
    model(|| {
        let ev = Arc::new(Events::default());
        let fa = ev.add_cq(CQ_A);
        let fb = ev.add_cq(CQ_B);
        ev.add_qp(QP_A, CQ_A);
        let (e2, fa2) = (ev.clone(), fa.clone());
        let poller = thread::spawn(move || {
            for r in two_polls(&e2, &fa2) {
                assert!(matches!(r, Ok(()) | Err(Failure::Comm)), "{r:?}");
            }
        });
        let e3 = ev.clone();
        let async_thread = thread::spawn(move || e3.handle(Scope::Qp, QP_A));
        assert_eq!(ev.check(&fb), Ok(()), "another comm failed");
        assert_eq!(async_thread.join().unwrap(), Handled::FailedComm);
        poller.join().unwrap();
        assert_eq!(ev.check(&fa), Err(Failure::Comm));
        assert_eq!(ev.check(&fb), Ok(()));
    });
}

/// QP A's reset races A's error event on the async thread, while a poller checks the comm
/// (QP B of the same CQ failed before, or not).
fn reset_races_a_qp_error(b_failed: bool) {
    model(move || {
        let ev = Arc::new(Events::default());
        let f = ev.add_cq(CQ_A);
        ev.add_qp(QP_A, CQ_A);
        ev.add_qp(QP_B, CQ_A);
        if b_failed {
            assert_eq!(ev.handle(Scope::Qp, QP_B), Handled::FailedComm);
        }
        let e2 = ev.clone();
        let async_thread = thread::spawn(move || e2.handle(Scope::Qp, QP_A));
        let (e3, f3) = (ev.clone(), f.clone());
        let poller = thread::spawn(move || {
            for _ in 0..2 {
                let r = e3.check(&f3);
                if b_failed {
                    assert_eq!(r, Err(Failure::Comm), "B's error was cleared");
                } else {
                    assert!(matches!(r, Ok(()) | Err(Failure::Comm)), "{r:?}");
                }
            }
        });
        let cleared = ev.clear_qp(QP_A);
        assert_eq!(async_thread.join().unwrap(), Handled::FailedComm);
        poller.join().unwrap();
        // Not cleared: the event came after the clear, and A's error stands.
        let a_left = !cleared;
        let want = |failed| if failed { Err(Failure::Comm) } else { Ok(()) };
        assert_eq!(ev.check(&f), want(a_left || b_failed));
        if b_failed {
            assert!(ev.clear_qp(QP_B));
            assert_eq!(ev.check(&f), want(a_left));
        }
    });
}

#[test]
fn reset_races_a_qp_error_alone() {
    reset_races_a_qp_error(false);
}

#[test]
fn reset_races_a_qp_error_next_to_another() {
    reset_races_a_qp_error(true);
}

#[test]
fn device_fatal_fails_every_comm() {
    model(|| {
        let ev = Arc::new(Events::default());
        let fa = ev.add_cq(CQ_A);
        let fb = ev.add_cq(CQ_B);
        let (e2, fa2) = (ev.clone(), fa.clone());
        let poller = thread::spawn(move || {
            for r in two_polls(&e2, &fa2) {
                assert!(matches!(r, Ok(()) | Err(Failure::Device)), "{r:?}");
            }
        });
        let e3 = ev.clone();
        let async_thread = thread::spawn(move || e3.handle(Scope::Device, 0));
        for r in two_polls(&ev, &fb) {
            assert!(matches!(r, Ok(()) | Err(Failure::Device)), "{r:?}");
        }
        assert_eq!(async_thread.join().unwrap(), Handled::FailedDevice);
        poller.join().unwrap();
        assert_eq!(ev.check(&fa), Err(Failure::Device));
        assert_eq!(ev.check(&fb), Err(Failure::Device));
        assert_eq!(ev.fatal_events(), 1);
    });
}

/// libibverbs' side of one async event for one object, as its contract says: reported to the
/// thread at most once; a destroy either drops it (not yet reported) or waits for its ack.
struct Verbs {
    reported: AtomicBool,
    acked: AtomicBool,
}

impl Verbs {
    /// The async thread: `ibv_get_async_event` (if the event still exists), handle, ack.
    fn deliver(&self, ev: &Events, scope: Scope, element: usize) -> Option<Handled> {
        // AcqRel: the one report of the event, decided against `destroy` (test scaffolding).
        if self.reported.swap(true, Ordering::AcqRel) {
            return None;
        }
        let h = ev.handle(scope, element);
        // Release pairs with the Acquire in `destroy`: the handling happens before destroy
        // returns (test scaffolding).
        self.acked.store(true, Ordering::Release);
        Some(h)
    }
    /// `ibv_destroy_qp`/`ibv_destroy_cq`: drop the unreported event or wait for its ack.
    fn destroy(&self) {
        // AcqRel / Acquire: pair with `deliver` (test scaffolding).
        if self.reported.swap(true, Ordering::AcqRel) {
            while !self.acked.load(Ordering::Acquire) {
                thread::yield_now();
            }
        }
    }
}

/// The control path tears down comm A (QP then CQ, each unregistered before its destroy, as
/// `VerbsPort::destroy_qp`/`destroy_cq` do) while an event for it arrives, then a new comm
/// gets the same CQ and QP addresses: the old event never fails the new comm.
fn stale_event_spares_the_successor(scope: Scope, element: usize) {
    model(move || {
        let ev = Arc::new(Events::default());
        let old = ev.add_cq(CQ_A);
        ev.add_qp(QP_A, CQ_A);
        let verbs = Arc::new(Verbs {
            reported: AtomicBool::new(false),
            acked: AtomicBool::new(false),
        });
        let (e2, v2) = (ev.clone(), verbs.clone());
        let async_thread = thread::spawn(move || v2.deliver(&e2, scope, element));
        ev.remove_qp(QP_A);
        if scope == Scope::Qp {
            verbs.destroy();
        }
        ev.remove_cq(CQ_A);
        if scope == Scope::Cq {
            verbs.destroy();
        }
        let new = ev.add_cq(CQ_A);
        ev.add_qp(QP_A, CQ_A);
        let h = async_thread.join().unwrap();
        assert!(
            matches!(h, None | Some(Handled::FailedComm | Handled::Unknown)),
            "{h:?}"
        );
        assert_eq!(
            ev.check(&new),
            Ok(()),
            "the old comm's event failed its successor"
        );
        if h == Some(Handled::FailedComm) {
            assert_eq!(ev.check(&old), Err(Failure::Comm));
        }
    });
}

#[test]
fn stale_qp_event_spares_the_successor() {
    stale_event_spares_the_successor(Scope::Qp, QP_A);
}

#[test]
fn stale_cq_event_spares_the_successor() {
    stale_event_spares_the_successor(Scope::Cq, CQ_A);
}

#[test]
fn return_async_events_0_fails_nothing() {
    model(|| {
        let ev = Arc::new(Events::default());
        ev.set_return_events(false);
        let fa = ev.add_cq(CQ_A);
        ev.add_qp(QP_A, CQ_A);
        let e2 = ev.clone();
        let async_thread =
            thread::spawn(move || [e2.handle(Scope::Device, 0), e2.handle(Scope::Qp, QP_A)]);
        assert_eq!(ev.check(&fa), Ok(()));
        assert_eq!(async_thread.join().unwrap(), [Handled::WarnOnly; 2]);
        assert_eq!(ev.check(&fa), Ok(()));
    });
}

#[test]
fn stop_reaches_the_thread() {
    model(|| {
        let ev = Arc::new(Events::default());
        let e2 = ev.clone();
        // The loop of the async thread: one `poll` period (a yield here) per stop check.
        let t = thread::spawn(move || {
            while !e2.stopping() {
                thread::yield_now();
            }
        });
        ev.request_stop();
        t.join().unwrap();
    });
}
