//! loom model of the ffi token table's slot lifecycle (`ibnet_atomics::slot`, the plugin's own
//! code): publish under the table's mutex, lock-free
//! lookups and poisoning, free moving the generation on.
//!
//! * A lookup that finds the token's generation sees the box the publisher wrote before
//!   publishing (loom's `UnsafeCell` flags an unsynchronised read).
//! * `poison` racing a lookup: the lookup sees its comm live or poisoned with its own pointer;
//!   after close (`free`) the old token fails, a stale poison changes nothing, and the slot is
//!   reused at the next generation. Close racing a call on the same comm is outside the
//!   plugin contract (documented in `handles`) and not modelled.
//! * Concurrent poisons of one live comm leave it poisoned once, of the same kind.
#![cfg(loom)]

use ibnet_atomics::slot::{Kind, Life, Slot};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

struct Comm(UnsafeCell<u64>);

#[test]
fn lookup_sees_the_published_box() {
    model(|| {
        let s = Arc::new(Slot::new());
        let comm = Arc::new(Comm(UnsafeCell::new(0)));
        let (s2, c2) = (s.clone(), comm.clone());
        let t = thread::spawn(move || {
            // SAFETY: not yet published; no other thread reads it.
            c2.0.with_mut(|p| unsafe { *p = 42 });
            let gen = s2.publish(Kind::Send, Arc::as_ptr(&c2) as *mut ());
            assert_eq!(gen, Some(0));
        });
        if let Some((ptr, kind, life)) = s.lookup(0, u32::MAX) {
            assert_eq!((kind, life), (Kind::Send, Life::Live(Kind::Send)));
            let c = ptr as *const Comm;
            assert_eq!(c, Arc::as_ptr(&comm));
            // SAFETY: `c` points at `comm`, alive (we hold an Arc); the Acquire in lookup
            // orders this read after the publisher's write.
            let v = unsafe { (*c).0.with(|p| *p) };
            assert_eq!(v, 42);
        }
        t.join().unwrap();
    });
}

/// Poison racing a lookup: the lookup sees the comm live or poisoned, never anything else,
/// and always its own pointer. Then close (after the calls, as the contract says) frees the
/// slot: the old token fails from then on and the slot is reused at the next generation.
#[test]
fn poison_then_free_moves_the_generation_on() {
    model(|| {
        let s = Arc::new(Slot::new());
        assert_eq!(s.publish(Kind::Recv, 0x1000 as *mut ()), Some(0));
        let s2 = s.clone();
        let poisoner = thread::spawn(move || s2.poison(0, u32::MAX));
        match s.lookup(0, u32::MAX) {
            Some((p, Kind::Recv, Life::Live(_) | Life::Poisoned(_))) => {
                assert_eq!(p as usize, 0x1000)
            }
            other => panic!("lookup saw {other:?}"),
        }
        poisoner.join().unwrap();
        let (_, _, life) = s.lookup(0, u32::MAX).unwrap();
        assert_eq!(life, Life::Poisoned(Kind::Recv));
        s.free(0);
        assert!(
            s.lookup(0, u32::MAX).is_none(),
            "old generation still found"
        );
        assert!(s.lookup(1, u32::MAX).is_none(), "a free slot looked up");
        s.poison(0, u32::MAX);
        assert!(
            s.lookup(0, u32::MAX).is_none(),
            "poison of a stale token resurrected it"
        );
        assert_eq!(s.publish(Kind::Send, 0x2000 as *mut ()), Some(1));
        let (p, kind, life) = s.lookup(1, u32::MAX).unwrap();
        assert_eq!(
            (p as usize, kind, life),
            (0x2000, Kind::Send, Life::Live(Kind::Send))
        );
    });
}

#[test]
fn concurrent_poisons_poison_once() {
    model(|| {
        let s = Arc::new(Slot::new());
        assert_eq!(s.publish(Kind::Send, 0x1000 as *mut ()), Some(0));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || s.poison(0, 0xffff))
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let (_, kind, life) = s.lookup(0, u32::MAX).unwrap();
        assert_eq!((kind, life), (Kind::Send, Life::Poisoned(Kind::Send)));
    });
}
