//! loom models of the MR cache protocol (`ibnet_core::mr_cache`).
//!
//! Run: `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" cargo test -p ibnet-loom --release`.
//! Each model checks conservation: registrations == deregistrations at the end, a range never
//! has two live registrations, a holder's value is never deregistered under it, and every slot
//! is free again. Handles are per registration (the cache's record table): two acquires that
//! share an entry get two handles, a handle is released once, and a released handle reads
//! nothing, also while its record is reused.
#![cfg(loom)]

use ibnet_core::mr_cache::{MrCache, MrRef};
use ibnet_core::Result;
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread::{self, JoinHandle};

const PAGE: u64 = 4096;
const K1: u64 = 0x10_0000;
const K2: u64 = 0x20_0000;
const SERIALS: usize = 4;

/// Counters shared by the threads of one model. Values are registration serials 1, 2, ….
/// `N` cache slots, `R` registration records.
struct World<const N: usize, const R: usize = N> {
    cache: MrCache<u64, N, R>,
    regs: AtomicUsize,
    deregs: AtomicUsize,
    /// Live registrations per key (index 0: K1, 1: K2).
    live: [AtomicUsize; 2],
    /// Whether registration serial `i` has been deregistered.
    dead: [AtomicBool; SERIALS],
}

impl<const N: usize, const R: usize> World<N, R> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            cache: MrCache::new(),
            regs: AtomicUsize::new(0),
            deregs: AtomicUsize::new(0),
            live: [AtomicUsize::new(0), AtomicUsize::new(0)],
            dead: core::array::from_fn(|_| AtomicBool::new(false)),
        })
    }

    /// A registration: the next serial; with `key`, checks that it is the key's only live one.
    fn register(&self, key: Option<usize>) -> Result<u64> {
        if let Some(k) = key {
            assert_eq!(
                self.live[k].fetch_add(1, SeqCst),
                0,
                "two live registrations"
            );
        }
        Ok(self.regs.fetch_add(1, SeqCst) as u64 + 1)
    }

    /// A deregistration of serial `v`, which must not have been deregistered before.
    fn deregister(&self, v: u64) -> Result<()> {
        assert!(
            !self.dead[v as usize].swap(true, SeqCst),
            "deregistered twice"
        );
        self.deregs.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Checks that `r`'s value is not deregistered under its holder.
    fn assert_alive(&self, r: &MrRef<u64>) {
        assert!(
            !self.dead[r.value as usize].load(SeqCst),
            "got a deregistered value"
        );
    }

    fn acquire(&self, addr: u64) -> MrRef<u64> {
        let k = (addr == K2) as usize;
        let r = self
            .cache
            .acquire_or_contained(addr, PAGE, PAGE, |_, _| self.register(Some(k)))
            .unwrap();
        self.assert_alive(&r);
        r
    }

    fn release(&self, r: MrRef<u64>) {
        let k = (r.base == K2) as usize;
        self.cache
            .release(r.handle, |v| {
                assert_eq!(v, r.value);
                assert_eq!(self.live[k].fetch_sub(1, SeqCst), 1);
                self.deregister(v)
            })
            .unwrap();
    }

    fn assert_drained(&self) {
        assert_eq!(self.regs.load(SeqCst), self.deregs.load(SeqCst));
        assert_eq!(self.live[0].load(SeqCst) + self.live[1].load(SeqCst), 0);
        assert_eq!(self.cache.occupied(), 0);
        assert_eq!(self.cache.registrations(), 0);
    }

    /// [`Self::assert_drained`] after a race that registers a range once or twice.
    fn assert_drained_after_one_or_two(&self) {
        let regs = self.regs.load(SeqCst);
        assert!(regs == 1 || regs == 2, "{regs} registrations");
        self.assert_drained();
    }
}

/// Runs `f` on a second thread, with its own handle to the world `w`.
fn spawn<const N: usize, const R: usize, T: Send + 'static>(
    w: &Arc<World<N, R>>,
    f: impl FnOnce(&World<N, R>) -> T + Send + 'static,
) -> JoinHandle<T> {
    let w = w.clone();
    thread::spawn(move || f(&w))
}

/// Two threads acquire one uncached range at once: one registration, shared, refcount 2, under
/// two handles.
#[test]
fn same_range_registers_once() {
    loom::model(|| {
        let w = World::<4>::new();
        let t = spawn(&w, |w2| w2.acquire(K1));
        let a = w.acquire(K1);
        let b = t.join().unwrap();
        assert_eq!(w.regs.load(SeqCst), 1);
        assert_eq!((a.value, a.base, a.len), (b.value, b.base, b.len));
        assert_ne!(a.handle, b.handle);
        assert_eq!(w.cache.refcount(a.handle), Some(2));
        w.release(a);
        assert_eq!(w.deregs.load(SeqCst), 0);
        w.release(b);
        w.assert_drained();
    });
}

/// Two threads acquire and release one range: one or two lives, never overlapping.
#[test]
fn same_range_acquire_release() {
    loom::model(|| {
        let w = World::<4>::new();
        let t = spawn(&w, |w2| {
            let r = w2.acquire(K1);
            w2.release(r);
        });
        let r = w.acquire(K1);
        w.release(r);
        t.join().unwrap();
        w.assert_drained_after_one_or_two();
    });
}

/// One thread takes K1 and K2, the other K2: one registration per range, K2 shared.
#[test]
fn same_and_different_ranges() {
    loom::model(|| {
        let w = World::<4>::new();
        let t = spawn(&w, |w2| w2.acquire(K2));
        let a1 = w.acquire(K1);
        let a2 = w.acquire(K2);
        let b2 = t.join().unwrap();
        assert_eq!(w.regs.load(SeqCst), 2);
        assert_eq!(a2.value, b2.value);
        assert_ne!(a2.handle, b2.handle);
        assert_ne!(a1.handle, a2.handle);
        assert_eq!(w.cache.refcount(a1.handle), Some(1));
        assert_eq!(w.cache.refcount(a2.handle), Some(2));
        w.release(a1);
        w.release(a2);
        w.release(b2);
        w.assert_drained();
    });
}

/// A hit races with the release of the last reference: the hit either shares the old
/// registration (which then stays alive until the hit's release) or registers anew after the
/// old one is deregistered; never resurrects a draining entry.
#[test]
fn hit_races_release_to_zero() {
    loom::model(|| {
        let w = World::<4>::new();
        let first = w.acquire(K1);
        let t = spawn(&w, move |w2| w2.release(first));
        let r = w.acquire(K1); // asserts its value is not deregistered
        w.assert_alive(&r);
        w.release(r);
        t.join().unwrap();
        w.assert_drained_after_one_or_two();
    });
}

/// `get` races with the release of the last reference and the reuse of the slot for another
/// range (N = 1: the same slot): it returns the old value or `None`, and loom checks that the
/// value cell is never read while it is rewritten.
#[test]
fn get_races_release_and_reuse() {
    loom::model(|| {
        let w = World::<1>::new();
        let first = w.acquire(K1);
        let t = spawn(&w, move |w2| {
            w2.release(first);
            let r = w2.acquire(K2);
            assert_eq!(r.handle.index(), first.handle.index());
            w2.release(r);
        });
        let got = w.cache.get(first.handle);
        assert!(got.is_none() || got == Some(first.value), "{got:?}");
        t.join().unwrap();
        assert_eq!(w.cache.get(first.handle), None);
        w.assert_drained();
    });
}

/// Both threads' registration counters stay consistent with a registration failing in one:
/// the slot is freed, and the other thread (waiting or not) registers on its own.
#[test]
fn failed_registration_does_not_stick() {
    loom::model(|| {
        let w = World::<4>::new();
        let regs = Arc::new(AtomicU64::new(0));
        let regs2 = regs.clone();
        let t = spawn(&w, move |w2| {
            w2.cache.acquire(K1, PAGE, PAGE, |_, _| -> Result<u64> {
                regs2.fetch_add(1, SeqCst);
                Err(ibnet_core::Error::Provider {
                    call: "ibv_reg_mr",
                    errno: 12,
                })
            })
        });
        let r = w.acquire(K1);
        let failed = t.join().unwrap();
        match failed {
            Err(e) => assert!(matches!(e, ibnet_core::Error::Provider { errno: 12, .. })),
            // It came after ours: a hit, no registration, under a handle of its own.
            Ok(hit) => assert_eq!((hit.value, hit.base, hit.len), (r.value, r.base, r.len)),
        }
        if let Ok(hit) = failed {
            w.release(hit);
        }
        w.release(r);
        assert_eq!(w.regs.load(SeqCst), 1);
        assert!(regs.load(SeqCst) <= 1);
        w.assert_drained();
    });
}

/// One thread releases the last reference while another registers a different range into the
/// same (only) slot: the new owner's value write must come after the drainer's read of the old
/// value (loom checks the value cell), or the new acquire sees the table full. (Two records:
/// the slot, not the record table, is what fills.)
#[test]
fn slot_reuse_by_another_thread() {
    loom::model(|| {
        let w = World::<1, 2>::new();
        let first = w.acquire(K1);
        let t = spawn(&w, |w2| {
            let res = w2
                .cache
                .acquire(K2, PAGE, PAGE, |_, _| w2.register(Some(1)));
            match res {
                Ok(r) => {
                    assert_eq!(w2.cache.get(r.handle), Some(r.value));
                    w2.release(r);
                }
                Err(e) => assert_eq!(
                    e,
                    ibnet_core::Error::Full {
                        what: "MR cache",
                        cap: 1
                    }
                ),
            }
        });
        w.release(first);
        t.join().unwrap();
        w.assert_drained();
    });
}

/// A contained range is acquired while the last reference of its container is released: the
/// acquirer either shares the container (which then stays registered until the acquirer's
/// release; loom checks the value cell is not read while the slot is drained and reused) or,
/// once the container is draining, registers the range on its own; never a deregistered value.
#[test]
fn contained_acquire_races_container_release() {
    loom::model(|| {
        // No live-per-key check: the range may register on its own while the container drains.
        let w = World::<4>::new();
        let big = w
            .cache
            .acquire_or_contained(K1, 4 * PAGE, PAGE, |_, _| w.register(None))
            .unwrap();
        let t = spawn(&w, move |w2| {
            w2.cache.release(big.handle, |v| w2.deregister(v)).unwrap()
        });
        let sub = w
            .cache
            .acquire_or_contained(K1 + PAGE, PAGE, PAGE, |_, _| w.register(None))
            .unwrap();
        w.assert_alive(&sub);
        assert_ne!(sub.handle, big.handle);
        if sub.value == 1 {
            assert_eq!((sub.base, sub.len), (K1, 4 * PAGE));
        } else {
            assert_eq!((sub.base, sub.len), (K1 + PAGE, PAGE));
        }
        w.cache.release(sub.handle, |v| w.deregister(v)).unwrap();
        t.join().unwrap();
        // Every registration deregistered (none leaked, none twice) and every slot free.
        w.assert_drained_after_one_or_two();
    });
}

/// Two threads release the same handle at once while a second registration shares its entry:
/// exactly one release succeeds, the other is refused, and the other registration keeps its
/// reference (its value stays registered and readable until its own release).
#[test]
fn double_release_is_refused_once() {
    loom::model(|| {
        let w = World::<2>::new();
        let a = w.acquire(K1);
        let b = w.acquire(K1);
        let t = spawn(&w, move |w2| {
            w2.cache
                .release(b.handle, |_| panic!("a shared entry is not deregistered"))
                .is_ok()
        });
        let mine = w
            .cache
            .release(b.handle, |_| panic!("a shared entry is not deregistered"))
            .is_ok();
        let theirs = t.join().unwrap();
        assert!(mine ^ theirs, "exactly one release of one handle succeeds");
        assert_eq!(w.cache.get(a.handle), Some(a.value));
        assert_eq!(w.cache.refcount(a.handle), Some(1));
        assert_eq!(w.cache.get(b.handle), None);
        w.release(a);
        w.assert_drained();
    });
}

/// `get` of a handle races with its release and the reuse of its record (one record) by a
/// registration of another range in another slot: it returns the old value or `None`, never
/// the new registration's value (the record's generation, and its re-check after the pin).
/// (The reader is the spawned thread: loom then also runs it after the whole reuse.)
#[test]
fn get_races_record_reuse() {
    loom::model(|| {
        let w = World::<2, 1>::new();
        let first = w.acquire(K1);
        let t = spawn(&w, move |w2| w2.cache.get(first.handle));
        w.release(first);
        let r = w.acquire(K2);
        assert_eq!(
            r.handle.index(),
            first.handle.index(),
            "the record is reused"
        );
        let got = t.join().unwrap();
        assert!(got.is_none() || got == Some(first.value), "{got:?}");
        assert_eq!(w.cache.get(first.handle), None);
        w.release(r);
        w.assert_drained();
    });
}
