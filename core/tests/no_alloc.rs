//! Zero allocations on the hot path: after connect, 10,000 irecv/isend/test cycles (single and
//! 8-way multi-receive, with a profiler sink receiving QP events) run without a single heap
//! allocation, counted by a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use ibnet_core::comm::{CommConfig, QpEvent, QpEvents, RecvBuf, Sink};
use ibnet_testkit::{connect_pair, AlignedBuf, Loopback};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Count only the measuring thread's allocations: the test harness's own threads allocate
    /// at any time (output capture, timers) and are not ibnet's hot path.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn counting() -> bool {
    COUNTING.try_with(Cell::get).unwrap_or(false)
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // Relaxed: a statistic read after the measured loop on the same thread.
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // Relaxed: as in `alloc`.
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A profiler sink that counts starts, and stops of open events, in atomics (per request slot:
/// its open events, so a stop of none counts nothing).
struct Events(AtomicUsize, AtomicUsize, [AtomicUsize; 256]);

impl QpEvents for Events {
    fn start(&self, _ctx: usize, req: u8, _qp: u8, _parent: usize, _ev: &QpEvent) {
        // Relaxed: statistics read after the loop on the same thread.
        self.0.fetch_add(1, Ordering::Relaxed);
        self.2[req as usize].fetch_add(1, Ordering::Relaxed);
    }
    fn stop(&self, _ctx: usize, req: u8, _qp: Option<u8>) {
        // Relaxed: as in `start`. Coarse: any stop counts every open event of the request (the
        // totals still match one stop per start).
        let n = self.2[req as usize].swap(0, Ordering::Relaxed);
        self.1.fetch_add(n, Ordering::Relaxed);
    }
}

static EVENTS: Events = Events(
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    [const { AtomicUsize::new(0) }; 256],
);

#[test]
fn ten_thousand_cycles_allocate_nothing() {
    let dev = Loopback::new();
    let cfg = CommConfig {
        nqps: 2,
        split_data: true,
        gdr_flush: true,
        ..CommConfig::default()
    };
    let (mut s, mut r) = connect_pair(&dev, cfg).unwrap();
    let sink = Sink {
        events: &EVENTS,
        ctx: 0,
        device: 0,
    };
    s.set_events(Some(sink));
    r.set_events(Some(sink));
    let parents = [7usize; 8];
    let src: Vec<AlignedBuf> = (0..8).map(|_| AlignedBuf::new(4096)).collect();
    let dst: Vec<AlignedBuf> = (0..8).map(|_| AlignedBuf::new(4096)).collect();
    let sk: Vec<_> = src
        .iter()
        .map(|b| dev.register(b.addr(), 4096).unwrap().0)
        .collect();
    let bufs: Vec<RecvBuf> = dst
        .iter()
        .enumerate()
        .map(|(i, b)| RecvBuf {
            addr: b.addr(),
            size: 4096,
            tag: i as u32,
            mr: dev.register(b.addr(), 4096).unwrap().0,
        })
        .collect();
    let mut bytes = 0u64;

    COUNTING.with(|c| c.set(true));
    for cycle in 0..10_000usize {
        let n = if cycle % 2 == 0 { 1 } else { 8 };
        let rid = r.irecv_under(&bufs[..n], &parents).unwrap().unwrap();
        let mut sids = [None; 8];
        for (i, slot) in sids.iter_mut().enumerate().take(n) {
            *slot = s
                .isend_under(src[i].addr(), 8 + i as u64, i as u32, sk[i], parents[i])
                .unwrap();
        }
        for sid in sids.iter().take(n) {
            while s.test(sid.unwrap()).unwrap().is_none() {}
        }
        let done = loop {
            if let Some(d) = r.test(rid).unwrap() {
                break d;
            }
        };
        bytes += done.sizes[0];
        if cycle % 1000 == 0 {
            let f = r.iflush(&bufs[..1]).unwrap().unwrap();
            while r.test(f).unwrap().is_none() {}
        }
    }
    COUNTING.with(|c| c.set(false));

    // Relaxed: read after the loop on the thread that counted (`counting` is thread-local).
    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        0,
        "allocations on the hot path"
    );
    // Single receives of 8 bytes, and multi-receives whose first send has 8 bytes.
    assert_eq!(bytes, 10_000 * 8, "every cycle completed");
    // Relaxed: read after the loop on the thread that counted.
    let (starts, stops) = (
        EVENTS.0.load(Ordering::Relaxed),
        EVENTS.1.load(Ordering::Relaxed),
    );
    assert!(starts > 10_000, "{starts} events");
    assert_eq!(starts, stops, "every event stopped once");
}
