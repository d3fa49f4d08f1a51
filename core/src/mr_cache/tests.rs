//! Unit tests of the registration cache: hits, misses, eviction, invalidation, capacity.

use super::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64 as StdU64, Ordering as O};
use std::vec::Vec;

const PAGE: u64 = 4096;
type Cache<const N: usize> = MrCache<u64, N>;

/// `register` that counts calls and returns `base ^ len` as the value.
fn reg(count: &Cell<u32>) -> impl FnOnce(u64, u64) -> Result<u64> + '_ {
    move |b, l| {
        count.set(count.get() + 1);
        Ok(b ^ l)
    }
}
fn dereg(count: &Cell<u32>) -> impl FnOnce(u64) -> Result<()> + '_ {
    move |_| {
        count.set(count.get() + 1);
        Ok(())
    }
}
fn never_reg(_: u64, _: u64) -> Result<u64> {
    panic!("register must not be called on a hit")
}
fn never_dereg(_: u64) -> Result<()> {
    panic!("deregister must not be called before the last release")
}

#[test]
fn miss_registers_hit_shares() {
    let c = Cache::<64>::new();
    let regs = Cell::new(0);
    let a = c.acquire(0x10_0000, 100, PAGE, reg(&regs)).unwrap();
    assert_eq!(regs.get(), 1);
    assert_eq!(
        (a.base, a.len, a.value),
        (0x10_0000, PAGE, 0x10_0000 ^ PAGE)
    );
    assert_eq!(c.refcount(a.handle), Some(1));
    // Another address inside the same page is the same key: a hit, with a handle of its own.
    let b = c.acquire(0x10_0800, 0x800, PAGE, never_reg).unwrap();
    assert_eq!((b.value, b.base, b.len), (a.value, a.base, a.len));
    assert_ne!(b.handle, a.handle, "one handle per registration");
    assert_eq!(c.refcount(a.handle), Some(2));
    assert_eq!(c.refcount(b.handle), Some(2));
    assert_eq!(c.registrations(), 2);
    // A different range is a miss.
    let d = c.acquire(0x20_0000, 100, PAGE, reg(&regs)).unwrap();
    assert_eq!(regs.get(), 2);
    assert_ne!(d.handle, a.handle);
    assert_eq!(c.get(a.handle), Some(a.value));
    assert_eq!(c.get(d.handle), Some(d.value));
    assert_eq!(c.live(), 2);
}

/// `drain_all` (teardown) deregisters every live entry once, whatever its references (a
/// shared entry, a contained range), ends every registration (their handles read as stale),
/// and leaves an empty cache that works again.
#[test]
fn drain_all_deregisters_what_was_left_once() {
    let mut c = Cache::<64>::new();
    let regs = Cell::new(0);
    let a = c.acquire(0x10_0000, 3 * PAGE, PAGE, reg(&regs)).unwrap();
    let shared = c.acquire(0x10_0000, 3 * PAGE, PAGE, never_reg).unwrap();
    let inner = c
        .acquire_or_contained(0x10_1000, PAGE, PAGE, never_reg)
        .unwrap();
    let b = c.acquire(0x40_0000, 1, PAGE, reg(&regs)).unwrap();
    let gone = c.acquire(0x80_0000, 1, PAGE, reg(&regs)).unwrap();
    c.release(gone.handle, |_| Ok(())).unwrap();
    assert_eq!((regs.get(), c.registrations(), c.live()), (3, 4, 2));

    let mut seen = Vec::new();
    assert_eq!(c.drain_all(|v| seen.push(v)), (4, 2));
    seen.sort_unstable();
    let mut want = [a.value, b.value];
    want.sort_unstable();
    assert_eq!(
        seen, want,
        "each live entry once, the released one not again"
    );
    assert_eq!((c.registrations(), c.live(), c.occupied()), (0, 0, 0));
    for h in [a.handle, shared.handle, inner.handle, b.handle] {
        assert_eq!(c.get(h), None);
        assert!(
            c.release(h, never_dereg).is_err(),
            "a drained handle released"
        );
    }
    assert_eq!(c.drain_all(|_| panic!("drained twice")), (0, 0));

    let again = c.acquire(0x10_0000, 1, PAGE, reg(&regs)).unwrap();
    assert_eq!((regs.get(), c.refcount(again.handle)), (4, Some(1)));
}

#[test]
fn ranges_round_out_to_whole_pages() {
    let c = Cache::<64>::new();
    let regs = Cell::new(0);
    let r = c.acquire(0x1234, 0x10, PAGE, reg(&regs)).unwrap();
    assert_eq!((r.base, r.len), (0x1000, 0x1000));
    // Straddling a page boundary by two bytes takes two pages: a different key.
    let r2 = c.acquire(0x1fff, 2, PAGE, reg(&regs)).unwrap();
    assert_eq!((r2.base, r2.len), (0x1000, 0x2000));
    assert_ne!(r2.value, r.value);
    // Exactly one page at its start, and a sub-range of it, hit the first key.
    assert_eq!(
        c.acquire(0x1000, 0x1000, PAGE, never_reg).unwrap().value,
        r.value
    );
    assert_eq!(
        c.acquire(0x1ffe, 1, PAGE, never_reg).unwrap().value,
        r.value
    );
    // One byte more is two pages: hits the second key.
    assert_eq!(
        c.acquire(0x1000, 0x1001, PAGE, never_reg).unwrap().value,
        r2.value
    );
    // Other page sizes.
    let h = c.acquire(0x20_1234, 1, 1 << 21, reg(&regs)).unwrap();
    assert_eq!((h.base, h.len), (0x20_0000, 1 << 21));
    let one = c.acquire(0x77, 1, 1, reg(&regs)).unwrap();
    assert_eq!((one.base, one.len), (0x77, 1));
    // The last page of the address space.
    let top = c.acquire(u64::MAX - 6, 6, PAGE, reg(&regs)).unwrap();
    assert_eq!((top.base, top.len), (u64::MAX - (PAGE - 1), PAGE));
    assert_eq!(regs.get(), 5);
}

#[test]
fn bad_ranges_are_errors_and_register_nothing() {
    let c = Cache::<8>::new();
    let e = c.acquire(0x1000, 0, PAGE, never_reg).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                what: "MR length",
                value: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = c.acquire(u64::MAX - 1, 3, PAGE, never_reg).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                what: "MR length",
                value: 3,
                max: 1,
                ..
            }
        ),
        "{e}"
    );
    let e = c.acquire(0, u64::MAX, PAGE, never_reg).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfRange {
                what: "MR length",
                ..
            }
        ),
        "{e}"
    );
    for page in [0, 3, 4095] {
        let e = c.acquire(0x1000, 1, page, never_reg).unwrap_err();
        assert!(matches!(
            e,
            Error::OutOfRange {
                what: "MR page size (a power of two)",
                ..
            }
        ));
    }
    assert_eq!(c.occupied(), 0);
}

#[test]
fn release_to_zero_deregisters_exactly_once() {
    let c = Cache::<16>::new();
    let (regs, deregs) = (Cell::new(0), Cell::new(0));
    let r = c.acquire(0x40_0000, 3 * PAGE, PAGE, reg(&regs)).unwrap();
    let r1 = c.acquire(0x40_0000, 3 * PAGE, PAGE, never_reg).unwrap();
    let r2 = c.acquire(0x40_0000, 3 * PAGE, PAGE, never_reg).unwrap();
    assert_eq!(c.refcount(r.handle), Some(3));
    c.release(r1.handle, never_dereg).unwrap();
    c.release(r2.handle, never_dereg).unwrap();
    assert_eq!(c.refcount(r.handle), Some(1));
    let seen = Cell::new(0);
    c.release(r.handle, |v| {
        seen.set(v);
        deregs.set(deregs.get() + 1);
        Ok(())
    })
    .unwrap();
    assert_eq!((regs.get(), deregs.get(), seen.get()), (1, 1, r.value));
    assert_eq!(
        (c.refcount(r.handle), c.get(r.handle), c.occupied()),
        (None, None, 0)
    );
    // The range registers again after that.
    let r2 = c.acquire(0x40_0000, 3 * PAGE, PAGE, reg(&regs)).unwrap();
    assert_eq!(regs.get(), 2);
    assert_ne!(r2.handle, r.handle, "a new life gets a new generation");
}

#[test]
fn stale_and_unknown_handles_are_errors() {
    let c = Cache::<8>::new();
    let deregs = Cell::new(0);
    let r = c.acquire(0x1000, 1, PAGE, |_, _| Ok(7)).unwrap();
    assert_ne!(r.handle.to_bits(), 0);
    assert_eq!(MrHandle::from_bits(r.handle.to_bits()), r.handle);
    c.release(r.handle, dereg(&deregs)).unwrap();
    let stale = Error::BadState {
        op: "MR cache release",
        state: "stale or unknown handle",
    };
    assert_eq!(c.release(r.handle, never_dereg), Err(stale));
    assert_eq!(c.get(r.handle), None);
    for bits in [0, u64::MAX, 5, r.handle.to_bits() + (1 << 32)] {
        let h = MrHandle::from_bits(bits);
        assert_eq!(c.release(h, never_dereg), Err(stale), "bits {bits:#x}");
        assert_eq!(c.get(h), None);
    }
    assert_eq!(deregs.get(), 1);
}

#[test]
fn full_window_is_an_error_and_freed_slots_are_reused() {
    // N = 4: the window is the whole table (16 records, so that the window fills first).
    let c = MrCache::<u64, 4, 16>::new();
    let regs = Cell::new(0);
    let refs: Vec<_> = (0..4)
        .map(|i| c.acquire(i * PAGE, PAGE, PAGE, reg(&regs)).unwrap())
        .collect();
    let e = c.acquire(9 * PAGE, PAGE, PAGE, never_reg).unwrap_err();
    assert_eq!(
        e,
        Error::Full {
            what: "MR cache",
            cap: 4
        }
    );
    // A full table still serves hits.
    assert_eq!(
        c.acquire(2 * PAGE, 1, PAGE, never_reg).unwrap().value,
        refs[2].value
    );
    c.release(refs[1].handle, |_| Ok(())).unwrap();
    assert_eq!(c.occupied(), 3);
    let n = c.acquire(9 * PAGE, PAGE, PAGE, reg(&regs)).unwrap();
    assert_eq!(c.occupied(), 4, "the freed slot is reused");
    assert_eq!(c.get(refs[1].handle), None, "its old handle is stale");
    assert_eq!(c.get(n.handle), Some(n.value));
    assert_eq!(regs.get(), 5);
}

#[test]
fn churn_leaves_no_tombstones() {
    let c = Box::new(Cache::<4096>::new());
    let (regs, deregs) = (Cell::new(0), Cell::new(0));
    for round in 0..20u64 {
        let refs: Vec<_> = (0..1024u64)
            .map(|i| {
                let addr = (round * 4096 + i) * 16 * PAGE;
                c.acquire(addr, (1 + i % 7) * PAGE, PAGE, reg(&regs))
                    .unwrap()
            })
            .collect();
        assert_eq!(c.live(), 1024);
        for r in &refs {
            assert_eq!(c.get(r.handle), Some(r.value));
        }
        for r in refs {
            c.release(r.handle, dereg(&deregs)).unwrap();
        }
        assert_eq!(c.occupied(), 0);
    }
    assert_eq!((regs.get(), deregs.get()), (20 * 1024, 20 * 1024));
}

#[test]
fn many_distinct_ranges_each_register_once() {
    let c = Box::new(Cache::<4096>::new());
    let regs = Cell::new(0);
    let ranges: Vec<(u64, u64)> = (0..1024u64).map(|i| (i * PAGE, 1 + i % 3)).collect();
    let first: Vec<_> = ranges
        .iter()
        .map(|&(a, p)| c.acquire(a, p * PAGE, PAGE, reg(&regs)).unwrap())
        .collect();
    assert_eq!(regs.get(), 1024);
    for (r, &(a, p)) in first.iter().zip(&ranges) {
        let again = c.acquire(a + 8, p * PAGE - 8, PAGE, never_reg).unwrap();
        assert_eq!(
            (again.value, again.base, again.len),
            (r.value, r.base, r.len)
        );
        assert_ne!(again.handle, r.handle);
        assert_eq!((r.base, r.len), (a, p * PAGE));
        assert_eq!(c.refcount(r.handle), Some(2));
    }
    assert_eq!(c.live(), 1024);
}

#[test]
fn failed_registration_frees_the_slot() {
    let c = Cache::<8>::new();
    let boom = Error::Provider {
        call: "ibv_reg_mr",
        errno: 12,
    };
    assert_eq!(c.acquire(0x1000, 1, PAGE, |_, _| Err(boom)), Err(boom));
    assert_eq!((c.occupied(), c.registrations()), (0, 0));
    let regs = Cell::new(0);
    c.acquire(0x1000, 1, PAGE, reg(&regs)).unwrap();
    assert_eq!(regs.get(), 1);
}

#[test]
fn panicking_register_frees_the_slot() {
    let c = Cache::<8>::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.acquire(0x1000, 1, PAGE, |_, _| -> Result<u64> {
            panic!("driver bug")
        })
    }));
    assert!(r.is_err());
    assert_eq!((c.occupied(), c.registrations()), (0, 0));
    assert!(c.acquire(0x1000, 1, PAGE, |_, _| Ok(1)).is_ok());
}

#[test]
fn failed_deregistration_is_returned_and_frees_the_slot() {
    let c = Cache::<8>::new();
    let r = c.acquire(0x1000, 1, PAGE, |_, _| Ok(1)).unwrap();
    let boom = Error::Provider {
        call: "ibv_dereg_mr",
        errno: 16,
    };
    assert_eq!(c.release(r.handle, |_| Err(boom)), Err(boom));
    assert_eq!(c.occupied(), 0);
    assert_eq!(c.get(r.handle), None);
}

#[test]
fn refcount_saturation_is_an_error() {
    // Enough records (2^20, 8 MiB, built in place) to reach the entry's reference limit.
    let c = boxed::<8, { 1 << 20 }>();
    let r = c.acquire(0x1000, 1, PAGE, |_, _| Ok(1)).unwrap();
    for _ in 1..MAX_REFS {
        c.acquire(0x1000, 1, PAGE, never_reg).unwrap();
    }
    assert_eq!(c.refcount(r.handle), Some(MAX_REFS));
    let e = c.acquire(0x1000, 1, PAGE, never_reg).unwrap_err();
    assert_eq!(
        e,
        Error::Full {
            what: "MR cache refcount",
            cap: MAX_REFS as usize
        }
    );
    assert_eq!(c.refcount(r.handle), Some(MAX_REFS));
    assert_eq!(
        c.registrations(),
        MAX_REFS as usize,
        "the refused acquire took no record"
    );
}

/// A cache built in place on the heap (too large for a test thread's stack).
fn boxed<const N: usize, const R: usize>() -> std::boxed::Box<MrCache<u64, N, R>> {
    let mut b = std::boxed::Box::<MrCache<u64, N, R>>::new_uninit();
    // SAFETY: a fresh allocation, valid and aligned for one cache; `init_in_place` initialises
    // all of it.
    unsafe {
        MrCache::init_in_place(b.as_mut_ptr());
        b.assume_init()
    }
}

/// Two registrations of one range share its entry but not their handles: releasing one twice
/// is refused the second time (the other keeps its reference), and its handle reads nothing.
#[test]
fn each_registration_has_its_own_handle() {
    let c = Cache::<8>::new();
    let deregs = Cell::new(0);
    let a = c.acquire(0x1000, 1, PAGE, |_, _| Ok(7)).unwrap();
    let b = c.acquire(0x1000, 1, PAGE, never_reg).unwrap();
    assert_ne!(a.handle, b.handle);
    let stale = Err(Error::BadState {
        op: "MR cache release",
        state: "stale or unknown handle",
    });
    c.release(b.handle, never_dereg).unwrap();
    assert_eq!(c.release(b.handle, never_dereg), stale, "second release");
    assert_eq!(c.get(b.handle), None, "a released handle reads nothing");
    assert_eq!(c.refcount(b.handle), None);
    assert_eq!((c.get(a.handle), c.refcount(a.handle)), (Some(7), Some(1)));
    c.release(a.handle, dereg(&deregs)).unwrap();
    assert_eq!(c.release(a.handle, never_dereg), stale);
    assert_eq!((deregs.get(), c.occupied(), c.registrations()), (1, 0, 0));
}

/// A registration served by a containing entry has its own handle: its release, once, leaves
/// the container registered and readable; its second release and its reads are refused.
#[test]
fn contained_registration_has_its_own_handle() {
    let c = Cache::<8>::new();
    let (regs, deregs) = (Cell::new(0), Cell::new(0));
    let big = c
        .acquire_or_contained(0x10_0000, 4 * PAGE, PAGE, reg(&regs))
        .unwrap();
    let sub = c
        .acquire_or_contained(0x10_0000 + PAGE, 8, PAGE, never_reg)
        .unwrap();
    assert_eq!(
        (sub.value, sub.base, sub.len),
        (big.value, big.base, big.len)
    );
    assert_ne!(sub.handle, big.handle);
    assert_eq!(c.refcount(big.handle), Some(2));
    c.release(sub.handle, never_dereg).unwrap();
    assert!(
        c.release(sub.handle, never_dereg).is_err(),
        "second release"
    );
    assert_eq!(c.get(sub.handle), None);
    assert_eq!(c.get(big.handle), Some(big.value));
    assert_eq!(c.refcount(big.handle), Some(1));
    c.release(big.handle, dereg(&deregs)).unwrap();
    assert_eq!((regs.get(), deregs.get(), c.occupied()), (1, 1, 0));
}

/// `R` registrations live: the next acquire (hit or miss) is `Full` and registers nothing;
/// one release makes room again. A record reused after a release gets a new generation, so
/// the old handle stays stale.
#[test]
fn full_record_table_is_an_error_and_records_are_reused() {
    let c = MrCache::<u64, 8, 2>::new();
    let regs = Cell::new(0);
    let a = c.acquire(0x1000, 1, PAGE, reg(&regs)).unwrap();
    let b = c.acquire(0x1000, 1, PAGE, never_reg).unwrap();
    let full = Error::Full {
        what: "MR registrations",
        cap: 2,
    };
    assert_eq!(c.acquire(0x1000, 1, PAGE, never_reg), Err(full), "a hit");
    assert_eq!(c.acquire(0x9000, 1, PAGE, never_reg), Err(full), "a miss");
    assert_eq!((c.occupied(), c.refcount(a.handle)), (1, Some(2)));
    c.release(b.handle, never_dereg).unwrap();
    let d = c.acquire(0x9000, 1, PAGE, reg(&regs)).unwrap();
    assert_eq!(
        d.handle.index(),
        b.handle.index(),
        "the freed record is reused"
    );
    assert_ne!(d.handle, b.handle, "with a new generation");
    assert_eq!(c.get(b.handle), None);
    assert!(c.release(b.handle, never_dereg).is_err());
    assert_eq!(c.get(d.handle), Some(d.value));
    assert_eq!((regs.get(), c.registrations()), (2, 2));
}

/// 4 threads acquire and release overlapping ranges at random, holding up to 4 at a time.
/// Checks that a range never has two live registrations, that a holder's value is the live
/// registration of its range, and that everything returns to zero.
#[test]
fn threads_register_each_live_range_once() {
    const KEYS: usize = 12;
    static LIVE: [AtomicU32; KEYS] = [const { AtomicU32::new(0) }; KEYS];
    static CURRENT: [StdU64; KEYS] = [const { StdU64::new(0) }; KEYS];
    static SERIAL: StdU64 = StdU64::new(1);
    static DEREGS: StdU64 = StdU64::new(0);
    let cache = Cache::<16>::new();
    let key_of = |k: usize| ((k as u64 + 1) * 64 * PAGE, (1 + k as u64 % 3) * PAGE);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let cache = &cache;
            s.spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (t + 1).wrapping_mul(0x1234_5678_9abc);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut held: Vec<(usize, MrRef<u64>)> = Vec::new();
                for _ in 0..20_000 {
                    if held.len() < 4 && (held.is_empty() || next() % 2 == 0) {
                        let k = (next() % KEYS as u64) as usize;
                        let (addr, len) = key_of(k);
                        let r = cache
                            .acquire(addr + next() % (PAGE / 2), len - PAGE / 2, PAGE, |_, _| {
                                // SeqCst (LIVE, CURRENT): stronger than needed; the cache itself
                                // orders a range's deregistration before its next registration
                                // (Release store of FREE, Acquire claim CAS). Relaxed (SERIAL):
                                // unique numbers need only the RMW's atomicity.
                                assert_eq!(LIVE[k].fetch_add(1, O::SeqCst), 0, "two live");
                                let v = ((k as u64) << 48) | SERIAL.fetch_add(1, O::Relaxed);
                                CURRENT[k].store(v, O::SeqCst);
                                Ok(v)
                            })
                            .unwrap();
                        assert_eq!(r.value >> 48, k as u64);
                        // SeqCst: stronger than needed; a hit sees the registrar's CURRENT store
                        // through the cache's Release store of READY and its Acquire hit CAS
                        // (what this checks).
                        assert_eq!(CURRENT[k].load(O::SeqCst), r.value, "stale value");
                        assert_eq!(cache.get(r.handle), Some(r.value));
                        held.push((k, r));
                    } else {
                        let (k, r) = held.swap_remove((next() % held.len() as u64) as usize);
                        cache
                            .release(r.handle, |v| {
                                assert_eq!(v, r.value);
                                // SeqCst: stronger than needed, as in the register closure.
                                // Relaxed (DEREGS): a counter read after the scope's joins.
                                assert_eq!(LIVE[k].fetch_sub(1, O::SeqCst), 1);
                                DEREGS.fetch_add(1, O::Relaxed);
                                Ok(())
                            })
                            .unwrap();
                    }
                }
                for (k, r) in held {
                    cache
                        .release(r.handle, |_| {
                            // SeqCst / Relaxed: as in the release closure above.
                            LIVE[k].fetch_sub(1, O::SeqCst);
                            DEREGS.fetch_add(1, O::Relaxed);
                            Ok(())
                        })
                        .unwrap();
                }
            });
        }
    });
    // SeqCst (here and in the two asserts below): stronger than needed; the scope's joins order
    // every thread's updates before these loads.
    assert!(LIVE.iter().all(|l| l.load(O::SeqCst) == 0));
    assert_eq!(
        SERIAL.load(O::SeqCst) - 1,
        DEREGS.load(O::SeqCst),
        "regs == deregs"
    );
    assert!(
        DEREGS.load(O::SeqCst) > KEYS as u64,
        "ranges went through several lives"
    );
    assert_eq!(cache.occupied(), 0);
}
