//! A registration that contains the requested range is a cache hit (NCCL 2.28 behaviour).

use core::cell::Cell;

use ibnet_core::mr_cache::MrCache;
use ibnet_core::{Error, Result};

const PAGE: u64 = 4096;

#[test]
fn a_containing_registration_is_a_hit() {
    let cache: MrCache<u64, 64> = MrCache::new();
    let regs = Cell::new(0u64);
    let reg = |_: u64, _: u64| -> Result<u64> {
        regs.set(regs.get() + 1);
        Ok(regs.get())
    };
    // One registration of 16 pages at 0x10_0000.
    let big = cache
        .acquire_or_contained(0x10_0000, 16 * PAGE, PAGE, reg)
        .unwrap();
    assert_eq!((big.base, big.len, regs.get()), (0x10_0000, 16 * PAGE, 1));

    // A sub-range, unaligned at both ends: served by the container, no new registration.
    let sub = cache
        .acquire_or_contained(0x10_0000 + 3 * PAGE + 17, 5 * PAGE, PAGE, reg)
        .unwrap();
    assert_eq!(regs.get(), 1, "a contained range must not register again");
    // Its own handle (issue 30: one per registration), on the container's entry.
    assert_ne!(sub.handle, big.handle);
    assert_eq!((sub.value, sub.base, sub.len), (1, 0x10_0000, 16 * PAGE));
    assert_eq!(cache.refcount(big.handle), Some(2));

    // The last page exactly, and the whole range: hits as well.
    let last = cache
        .acquire_or_contained(0x10_0000 + 15 * PAGE, PAGE, PAGE, reg)
        .unwrap();
    assert_eq!((last.value, last.base, regs.get()), (1, 0x10_0000, 1));
    assert_eq!(cache.refcount(big.handle), Some(3));

    // Overlapping the end, or starting before: not contained, registered on their own.
    let over = cache
        .acquire_or_contained(0x10_0000 + 15 * PAGE, 2 * PAGE, PAGE, reg)
        .unwrap();
    assert_ne!(over.handle, big.handle);
    assert_eq!(
        (over.base, over.len, regs.get()),
        (0x10_0000 + 15 * PAGE, 2 * PAGE, 2)
    );
    let before = cache
        .acquire_or_contained(0x10_0000 - PAGE, 2 * PAGE, PAGE, reg)
        .unwrap();
    assert_ne!(before.handle, big.handle);
    assert_eq!(regs.get(), 3);

    // Releasing through the sub-range's handle releases the container's references; the
    // container is deregistered once, with the last of them.
    let deregs = Cell::new(Vec::new());
    let dereg = |v: u64| -> Result<()> {
        let mut d = deregs.take();
        d.push(v);
        deregs.set(d);
        Ok(())
    };
    cache.release(sub.handle, dereg).unwrap();
    cache.release(last.handle, dereg).unwrap();
    assert_eq!(cache.refcount(big.handle), Some(1));
    assert!(deregs.take().is_empty());
    cache.release(big.handle, dereg).unwrap();
    assert_eq!(deregs.take(), vec![1]);
    assert_eq!(cache.refcount(big.handle), None);

    // With the container gone, the sub-range registers anew.
    let again = cache
        .acquire_or_contained(0x10_0000 + 3 * PAGE, PAGE, PAGE, reg)
        .unwrap();
    assert_eq!(
        (again.base, again.len, regs.get()),
        (0x10_0000 + 3 * PAGE, PAGE, 4)
    );
    for r in [again, over, before] {
        cache.release(r.handle, |_| Ok(())).unwrap();
    }
    assert_eq!(cache.occupied(), 0);
}

#[test]
fn an_exact_entry_wins_over_a_container() {
    let cache: MrCache<u64, 64> = MrCache::new();
    let small = cache
        .acquire_or_contained(0x20_1000, PAGE, PAGE, |_, _| Ok(1))
        .unwrap();
    let big = cache
        .acquire_or_contained(0x20_0000, 8 * PAGE, PAGE, |_, _| Ok(2))
        .unwrap();
    let hit = cache
        .acquire_or_contained(0x20_1000, PAGE, PAGE, |_, _| -> Result<u64> {
            panic!("cached: must not register")
        })
        .unwrap();
    assert_eq!((hit.value, hit.base, hit.len), (1, 0x20_1000, PAGE));
    assert_ne!(
        hit.handle, small.handle,
        "each registration has its own handle"
    );
    assert_eq!(cache.refcount(small.handle), Some(2));
    for r in [small, big, hit] {
        cache.release(r.handle, |_| Ok(())).unwrap();
    }
    assert_eq!(cache.live(), 0);
}

#[test]
fn a_draining_container_is_not_used() {
    let cache: MrCache<u64, 16> = MrCache::new();
    let big = cache
        .acquire_or_contained(0x30_0000, 4 * PAGE, PAGE, |_, _| Ok(7))
        .unwrap();
    // While the container deregisters, a contained acquire must register on its own.
    cache
        .release(big.handle, |v| {
            assert_eq!(v, 7);
            let sub = cache
                .acquire_or_contained(0x30_1000, PAGE, PAGE, |_, _| Ok(8))
                .unwrap();
            assert_eq!((sub.value, sub.base), (8, 0x30_1000));
            cache.release(sub.handle, |_| Ok(())).unwrap();
            Ok(())
        })
        .unwrap();
    assert_eq!(cache.occupied(), 0);
    // Errors from a contained acquire's refcount limit stay errors (never a wrong hit).
    let e = cache
        .acquire_or_contained(0, 0, PAGE, |_, _| Ok(1))
        .unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }));
}
