//! Zero allocations at the plugin boundary (issue 13): after warm-up, the exported C entry
//! points `isend`, `irecv` and `test` (through the `ncclNetPlugin_v9` table, as NCCL calls
//! them) allocate nothing on the calling thread, over the soft provider; nor do they (through
//! `api`, the bodies of the v10/v11 entries) with NCCL's profiler callback set and parents
//! passed, so that QP events start and stop; nor over a fused NIC of two soft devices
//! (`makeVDevice`: each message striped over both rails). Nor do `regMr` cache hits (the
//! same range, and a range inside it) and their `deregMr`, each registration with a handle
//! of its own, on a plain comm and a fused one. A counting global allocator counts the
//! allocations of the thread that is armed.

use crate::util;

use core::ffi::{c_int, c_void};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::abi::exports::ncclNetPlugin_v9 as NET;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if ARMED.with(Cell::get) {
        // Relaxed: a counter read after the measured calls on the same thread.
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; counting has no effect on the memory returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// One transfer of `len` bytes from `s` to `r` through the table's isend/irecv/test.
fn transfer(
    s: *mut c_void,
    r: *mut c_void,
    bufs: (*mut c_void, *mut c_void),
    mhs: (*mut c_void, *mut c_void),
    len: usize,
) {
    let (isend, irecv, test) = (NET.isend.unwrap(), NET.irecv.unwrap(), NET.test.unwrap());
    let mut data = [bufs.1];
    let mut sizes = [len];
    let mut tags = [5 as c_int];
    let mut mh = [mhs.1];
    let mut rreq: *mut c_void = core::ptr::null_mut();
    // SAFETY (all calls): valid comms, buffers registered with these handles, arrays of 1.
    let rc = unsafe {
        irecv(
            r,
            1,
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mh.as_mut_ptr(),
            &mut rreq,
        )
    };
    assert_eq!(rc, ncclResult_t::Success);
    let mut sreq: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while sreq.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30));
        // SAFETY: as above.
        let rc = unsafe { isend(s, bufs.0, len, 5, mhs.0, &mut sreq) };
        assert_eq!(rc, ncclResult_t::Success);
    }
    let (mut sd, mut rd) = (0, 0);
    let mut got: c_int = 0;
    while sd == 0 || rd == 0 {
        assert!(t0.elapsed() < Duration::from_secs(30));
        if sd == 0 {
            // SAFETY: as above.
            assert_eq!(
                unsafe { test(sreq, &mut sd, core::ptr::null_mut()) },
                ncclResult_t::Success
            );
        }
        if rd == 0 {
            // SAFETY: as above.
            assert_eq!(
                unsafe { test(rreq, &mut rd, &mut got) },
                ncclResult_t::Success
            );
        }
    }
    assert_eq!(got as usize, len);
}

/// Profiler events seen (starts, stops); the callback allocates nothing.
static EVENTS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

unsafe extern "C" fn prof(
    eh: *mut *mut c_void,
    kind: c_int,
    _ph: *mut c_void,
    _id: i64,
    _ext: *mut c_void,
) -> ncclResult_t {
    // Relaxed: statistics read after the armed loop on the thread that made the calls.
    let n = EVENTS[(kind == 1) as usize].fetch_add(1, Ordering::Relaxed);
    if kind == 0 {
        // SAFETY: the plugin's handle slot for this call.
        unsafe { *eh = (n + 1) as *mut c_void };
    }
    ncclResult_t::Success
}

/// One transfer through `api` with profiler parents.
fn transfer_profiled(
    s: *mut c_void,
    r: *mut c_void,
    bufs: (*mut c_void, *mut c_void),
    mhs: (*mut c_void, *mut c_void),
    len: usize,
) {
    use nccl_net_ibnet::api;
    let mut parent = 0u8;
    let ph = &mut parent as *mut u8 as *mut c_void;
    let mut data = [bufs.1];
    let sizes = [len];
    let tags = [5 as c_int];
    let mut mh = [mhs.1];
    let mut phs = [ph];
    let mut rreq: *mut c_void = core::ptr::null_mut();
    let rc = api::irecv(
        r,
        1,
        data.as_mut_ptr(),
        api::Sizes::Size(sizes.as_ptr()),
        tags.as_ptr(),
        mh.as_mut_ptr(),
        phs.as_mut_ptr(),
        &mut rreq,
    );
    assert_eq!(rc, ncclResult_t::Success);
    let mut sreq: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while sreq.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30));
        assert_eq!(
            api::isend(s, bufs.0, len as u64, 5, mhs.0, ph, &mut sreq),
            ncclResult_t::Success
        );
    }
    let (mut sd, mut rd, mut got) = (0, 0, 0 as c_int);
    while sd == 0 || rd == 0 {
        assert!(t0.elapsed() < Duration::from_secs(30));
        if sd == 0 {
            assert_eq!(
                api::test(sreq, &mut sd, core::ptr::null_mut()),
                ncclResult_t::Success
            );
        }
        if rd == 0 {
            assert_eq!(api::test(rreq, &mut rd, &mut got), ncclResult_t::Success);
        }
    }
    assert_eq!(got as usize, len);
}

#[test]
fn isend_irecv_test_allocate_nothing() {
    if util::ran_in_child() {
        return;
    }
    if !util::init_soft(&[("NCCL_SOCKET_IFNAME", "lo"), ("IBNET_SOFT_DEVICES", "2")]) {
        return;
    }
    // NCCL's profiler callback (v10/v11 init): comms made from now on get an event table.
    nccl_net_ibnet::profiler::set(Some(prof));
    let (mut h, l) = util::listen();
    let (s, r, _) = util::establish(&mut h, l, Duration::from_secs(20));
    let len = 1 << 16;
    let mut src = vec![0x3cu8; len];
    let mut dst = vec![0u8; len];
    let reg = |c: *mut c_void, b: &mut [u8]| {
        let mut mh = core::ptr::null_mut();
        let rc = nccl_net_ibnet::api::reg_mr(
            c,
            b.as_mut_ptr() as *mut c_void,
            b.len() as u64,
            0,
            None,
            &mut mh,
        );
        assert_eq!(rc, ncclResult_t::Success);
        mh
    };
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let bufs = (
        src.as_mut_ptr() as *mut c_void,
        dst.as_mut_ptr() as *mut c_void,
    );
    for _ in 0..100 {
        transfer(s, r, bufs, (ms, mr), len);
    }
    ARMED.with(|a| a.set(true));
    for i in 0..1000 {
        transfer(s, r, bufs, (ms, mr), if i % 2 == 0 { len } else { 8 });
    }
    ARMED.with(|a| a.set(false));
    // Relaxed: written by this thread only (armed).
    let n = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(n, 0, "{n} allocation(s) in 1000 isend/irecv/test transfers");
    // With parents: QP events start and stop on the data path, still allocating nothing.
    for _ in 0..10 {
        transfer_profiled(s, r, bufs, (ms, mr), len);
    }
    ARMED.with(|a| a.set(true));
    for i in 0..1000 {
        transfer_profiled(s, r, bufs, (ms, mr), if i % 2 == 0 { len } else { 8 });
    }
    ARMED.with(|a| a.set(false));
    // Relaxed: as above, and the event counters were written by this thread.
    let n = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(
        n, 0,
        "{n} allocation(s) in 1000 profiled isend/irecv/test transfers"
    );
    let (starts, stops) = (
        EVENTS[0].load(Ordering::Relaxed),
        EVENTS[1].load(Ordering::Relaxed),
    );
    assert_eq!(starts, 2 * 1010, "one event per send and per receive");
    assert_eq!(stops, starts, "every event stopped once");
    assert_eq!(dst, src);
    reg_hits_allocate_nothing(s, &mut src, "plain");
    assert_eq!(nccl_net_ibnet::api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(nccl_net_ibnet::api::dereg_mr(r, mr), ncclResult_t::Success);
    util::close(s, r, l);

    // A fused NIC of soft0 and soft1: isend/irecv/test stripe every message over both rails
    // (the 8-byte ones go whole on rail 0), still allocating nothing.
    nccl_net_ibnet::profiler::set(None);
    let (s, r, l) = fused_pair();
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    for _ in 0..100 {
        transfer(s, r, bufs, (ms, mr), len);
    }
    // Relaxed: as above.
    let before = ALLOCS.load(Ordering::Relaxed);
    ARMED.with(|a| a.set(true));
    for i in 0..1000 {
        transfer(s, r, bufs, (ms, mr), if i % 2 == 0 { len } else { 8 });
    }
    ARMED.with(|a| a.set(false));
    // Relaxed: as above.
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(
        n, 0,
        "{n} allocation(s) in 1000 fused isend/irecv/test transfers"
    );
    let st = nccl_net_ibnet::api::rail_stats(s).expect("a fused comm");
    assert!(st.rail_bytes[0] > 0 && st.rail_bytes[1] > 0, "{st:?}");
    assert_eq!(dst, src);
    reg_hits_allocate_nothing(s, &mut src, "fused");
    assert_eq!(nccl_net_ibnet::api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(nccl_net_ibnet::api::dereg_mr(r, mr), ncclResult_t::Success);
    util::close(s, r, l);
}

/// `regMr` hits on `buf` (registered on `c` already) and their `deregMr`, armed: each
/// registration takes a record of its own and gives it back, and none allocates.
fn reg_hits_allocate_nothing(c: *mut c_void, buf: &mut [u8], what: &str) {
    use nccl_net_ibnet::api::{dereg_mr, reg_mr};
    let reg = |p: *mut u8, n: usize| {
        let mut mh = core::ptr::null_mut();
        let rc = reg_mr(c, p as *mut c_void, n as u64, 0, None, &mut mh);
        assert_eq!(rc, ncclResult_t::Success);
        mh
    };
    let p = buf.as_mut_ptr();
    // Relaxed: as in the test above.
    let before = ALLOCS.load(Ordering::Relaxed);
    ARMED.with(|a| a.set(true));
    for _ in 0..100 {
        let same = reg(p, buf.len());
        // SAFETY: 4096 < buf.len(): a range inside the registered one.
        let inside = reg(unsafe { p.add(4096) }, 64);
        assert_ne!(same, inside, "one handle per registration");
        assert_eq!(dereg_mr(c, inside), ncclResult_t::Success);
        assert_eq!(dereg_mr(c, same), ncclResult_t::Success);
    }
    ARMED.with(|a| a.set(false));
    // Relaxed: as above.
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(
        n, 0,
        "{n} allocation(s) in 100 {what} regMr hits and deregMrs"
    );
}

/// A connected send/receive pair over the fused NIC of soft0 and soft1, and its listener.
fn fused_pair() -> (*mut c_void, *mut c_void, *mut c_void) {
    use ibnet_nccl::types::NCCL_NET_HANDLE_MAXSIZE;
    use nccl_net_ibnet::api;
    let d = util::fuse_first_two();
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let hp = h.as_mut_ptr() as *mut c_void;
    let mut l = core::ptr::null_mut();
    let rc = api::listen(core::ptr::null_mut(), d, hp, &mut l);
    assert_eq!(rc, ncclResult_t::Success);
    let (mut s, mut r): (*mut c_void, *mut c_void) = (core::ptr::null_mut(), core::ptr::null_mut());
    let t0 = Instant::now();
    while s.is_null() || r.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no connection");
        if s.is_null() {
            let rc = api::connect(core::ptr::null_mut(), d, hp, &mut s, None);
            assert_eq!(rc, ncclResult_t::Success);
        }
        if r.is_null() {
            assert_eq!(api::accept(l, &mut r), ncclResult_t::Success);
        }
    }
    (s, r, l)
}
