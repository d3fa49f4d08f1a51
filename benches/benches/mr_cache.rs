//! MR-cache hit cost: `acquire` + `release` of a range that is already registered (so the
//! reference count never reaches zero and nothing is registered or deregistered), with 16, 256
//! and 1024 ranges cached, in a cache of 4096 slots (the size the ffi uses).
//!
//! `ibnet` is `ibnet_core::mr_cache::MrCache`. `seed_mutex_scan` mimics the seed's
//! `ncclIbRegMrDmaBuf`/`ncclIbDeregMr`: a mutex around an array, scanned linearly by
//! `(addr, pages)` on register and by MR handle on deregister. Lookups visit the cached ranges
//! in a shuffled order, so the seed's scans cover half the array on average.
//!
//! Single-threaded: this measures the cost of a hit, not contention.

use std::hint::black_box;
use std::sync::Mutex;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ibnet_core::mr_cache::MrCache;
use ibnet_core::Result;

const PAGE: u64 = 4096;
const CAP: usize = 4096;
const SIZES: [usize; 3] = [16, 256, 1024];

/// What the ffi stores per registration: the MR pointer and its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mr {
    ptr: u64,
    lkey: u32,
    rkey: u32,
}

/// `n` buffers of 1..=64 pages at scattered page-aligned addresses, listed in a shuffled order.
fn ranges(n: usize) -> Vec<(u64, u64)> {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut v: Vec<(u64, u64)> = (0..n as u64)
        .map(|i| {
            (
                0x7f00_0000_0000 + i * (1 << 20) + (next() % 64) * PAGE,
                (1 + next() % 64) * PAGE,
            )
        })
        .collect();
    for i in (1..v.len()).rev() {
        v.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    v
}

fn no_register(_: u64, _: u64) -> Result<Mr> {
    unreachable!("every benchmarked range is cached")
}
fn no_deregister(_: Mr) -> Result<()> {
    unreachable!("every benchmarked range keeps one reference")
}

/// The seed's cache: a mutex-protected array with linear scans.
struct SeedCache {
    slots: Mutex<Vec<SeedSlot>>,
}

struct SeedSlot {
    addr: u64,
    pages: u64,
    refs: u32,
    mr: Mr,
}

impl SeedCache {
    fn acquire(&self, data: u64, size: u64, register: impl FnOnce(u64, u64) -> Mr) -> Mr {
        let addr = data & !(PAGE - 1);
        let pages = (data + size - addr).div_ceil(PAGE);
        let mut slots = self.slots.lock().unwrap();
        for s in slots.iter_mut() {
            if s.addr == addr && s.pages == pages {
                s.refs += 1;
                return s.mr;
            }
        }
        let mr = register(addr, pages * PAGE);
        slots.push(SeedSlot {
            addr,
            pages,
            refs: 1,
            mr,
        });
        mr
    }

    fn release(&self, mr: Mr) {
        let mut slots = self.slots.lock().unwrap();
        let i = slots.iter().position(|s| s.mr == mr).expect("registered");
        slots[i].refs -= 1;
        if slots[i].refs == 0 {
            slots.swap_remove(i);
        }
    }
}

fn hit(c: &mut Criterion) {
    let mut g = c.benchmark_group("mr_cache_hit");
    for n in SIZES {
        let keys = ranges(n);
        let mask = n - 1;

        let cache: Box<MrCache<Mr, CAP>> = Box::new(MrCache::new());
        for (i, &(a, l)) in keys.iter().enumerate() {
            let mr = Mr {
                ptr: a,
                lkey: i as u32,
                rkey: !(i as u32),
            };
            cache.acquire(a, l, PAGE, |_, _| Ok(mr)).expect("register");
        }
        g.bench_with_input(BenchmarkId::new("ibnet", n), &n, |b, _| {
            let mut i = 0;
            b.iter(|| {
                let (a, l) = keys[i & mask];
                i += 1;
                let r = cache
                    .acquire(black_box(a), l, PAGE, no_register)
                    .expect("hit");
                cache
                    .release(black_box(r.handle), no_deregister)
                    .expect("release");
                r.value
            })
        });

        let seed = SeedCache {
            slots: Mutex::new(Vec::new()),
        };
        for (i, &(a, l)) in keys.iter().enumerate() {
            seed.acquire(a, l, |_, _| Mr {
                ptr: a,
                lkey: i as u32,
                rkey: !(i as u32),
            });
        }
        g.bench_with_input(BenchmarkId::new("seed_mutex_scan", n), &n, |b, _| {
            let mut i = 0;
            b.iter(|| {
                let (a, l) = keys[i & mask];
                i += 1;
                let mr = seed.acquire(black_box(a), l, |_, _| unreachable!("cached"));
                seed.release(black_box(mr));
                mr
            })
        });
    }
    g.finish();
}

criterion_group!(benches, hit);
criterion_main!(benches);
