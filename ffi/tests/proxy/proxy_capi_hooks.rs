//! The C API's hooks, called as C would (the `extern "C"` functions of this library, its own
//! table over the soft provider):
//! * `ibnet_proxy_mem_t` with `gdcAlloc` + `storeFence`: the ring counter the proxy writes lives
//!   in the GDR-copy words (the device view points there) and every store is fenced;
//! * `exportMem` / `importMem`: a connection whose GPU side is "another process" (a different
//!   `gpuProcess`) is exported through the caller's callback, attached through the caller's
//!   `importMem` (and through the library's own import with `mem == NULL`), and 3 SIMPLE steps
//!   move through the attached mappings, byte for byte;
//! * the profiler receives op and step events; `export_map` of a same-process connection and
//!   `attach` of a damaged map are refused.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

use ibnet_nccl::types::ncclResult_t;
use ibnet_proxy::capi::entry::*;
use ibnet_proxy::capi::entry_xproc::*;
use ibnet_proxy::capi::{CMemTable, ShmBank};
use ibnet_proxy::xmap::XMap;
use ibnet_proxy::BankDesc;
use nccl_net_ibnet::proxy::ibnet_proxy_create;

static ENV: Once = Once::new();
/// The tests share the library's process-wide state: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn env() {
    ENV.call_once(|| {
        std::env::set_var("IBNET_PROVIDER", "soft");
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    });
}

fn ok(rc: ncclResult_t, what: &str) {
    assert_eq!(rc, ncclResult_t::Success, "{what}");
}

/// The test's allocator: shared-memory banks (exportable), counters of every hook.
#[derive(Default)]
struct Mem {
    banks: Vec<ShmBank>,
    imported: Vec<ShmBank>,
    gdc: usize,
    fences: AtomicUsize,
    exports: usize,
    imports: usize,
}

fn mem<'a>(ctx: *mut c_void) -> &'a mut Mem {
    // SAFETY: every table of this file passes a live `Mem` as ctx.
    unsafe { &mut *ctx.cast::<Mem>() }
}

unsafe extern "C" fn alloc(
    ctx: *mut c_void,
    _kind: c_int,
    size: usize,
    cpu: *mut *mut c_void,
    gpu: *mut u64,
    handle: *mut u64,
) -> c_int {
    let m = mem(ctx);
    let Ok(b) = ShmBank::create(size) else {
        return 12;
    };
    // SAFETY: valid out-pointers from the library.
    unsafe {
        *cpu = b.addr() as *mut c_void;
        *gpu = b.addr();
        *handle = b.addr();
    }
    m.banks.push(b);
    0
}

unsafe extern "C" fn free(ctx: *mut c_void, cpu: *mut c_void, _handle: u64) -> c_int {
    let m = mem(ctx);
    match m.banks.iter().position(|b| b.addr() == cpu as u64) {
        Some(i) => {
            m.banks.swap_remove(i);
            0
        }
        None => 22,
    }
}

unsafe extern "C" fn gdc_alloc(
    ctx: *mut c_void,
    words: usize,
    cpu: *mut *mut c_void,
    gpu: *mut u64,
    handle: *mut u64,
) -> c_int {
    mem(ctx).gdc += 1;
    // SAFETY: forwarded out-pointers (host memory stands in for mapped device words).
    unsafe { alloc(ctx, 1, words * 8, cpu, gpu, handle) }
}

unsafe extern "C" fn store_fence(ctx: *mut c_void) {
    // Relaxed: a counter, read by the test thread that drove `ibnet_proxy_progress` (which
    // calls this hook); nothing else is read through it.
    mem(ctx).fences.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C" fn export_mem(
    ctx: *mut c_void,
    cpu: *mut c_void,
    _handle: u64,
    _size: usize,
    kind: *mut c_int,
    out: *mut u8,
    offset: *mut u64,
) -> c_int {
    let m = mem(ctx);
    m.exports += 1;
    let Some(b) = m.banks.iter().find(|b| b.addr() == cpu as u64) else {
        return 22;
    };
    let d = b.export().unwrap();
    // SAFETY: valid out-pointers; `out` has 64 bytes.
    unsafe {
        *kind = 1; // IBNET_HANDLE_PROCESS_FD
        core::ptr::copy_nonoverlapping(d.handle.as_ptr(), out, 64);
        *offset = 0;
    }
    0
}

unsafe extern "C" fn import_mem(
    ctx: *mut c_void,
    kind: c_int,
    handle: *const u8,
    owner: u64,
    size: usize,
    offset: u64,
    cpu: *mut *mut c_void,
    gpu: *mut u64,
    token: *mut u64,
) -> c_int {
    let m = mem(ctx);
    m.imports += 1;
    assert_eq!((kind, offset), (1, 0));
    // SAFETY: 64 readable bytes.
    let h = unsafe { std::slice::from_raw_parts(handle, 64) };
    let d =
        ibnet_proxy::BankDesc::new(ibnet_proxy::HandleKind::ProcessFd, size as u64, 0, owner, h)
            .unwrap();
    let Ok(b) = ShmBank::import(&d) else {
        return 5;
    };
    // SAFETY: valid out-pointers.
    unsafe {
        *cpu = b.addr() as *mut c_void;
        *gpu = b.addr();
        *token = 7;
    }
    m.imported.push(b);
    0
}

unsafe extern "C" fn unimport_mem(ctx: *mut c_void, cpu: *mut c_void, token: u64) -> c_int {
    let m = mem(ctx);
    assert_eq!(token, 7);
    match m.imported.iter().position(|b| b.addr() == cpu as u64) {
        Some(i) => {
            m.imported.swap_remove(i);
            0
        }
        None => 22,
    }
}

fn table(m: &mut Mem) -> CMemTable {
    CMemTable {
        ctx: (m as *mut Mem).cast(),
        alloc: Some(alloc),
        free: Some(free),
        gdc_alloc: None,
        store_fence: None,
        flush_read: None,
        dmabuf_fd: None,
        export_mem: None,
        import_mem: None,
        unimport_mem: None,
    }
}

#[derive(Default)]
struct Events {
    op_starts: usize,
    op_states: usize,
    step_stops: u64,
}

unsafe extern "C" fn on_event(ctx: *mut c_void, e: *const CEvent) {
    // SAFETY: ctx is a live `Events`, `e` a valid event.
    let (ev, e) = unsafe { (&mut *ctx.cast::<Events>(), &*e) };
    match e.kind {
        0 => ev.op_starts += 1,
        1 => ev.op_states += 1,
        5 => ev.step_stops += e.to - e.from,
        _ => {}
    }
}

struct Pair {
    px: *mut CProxy,
    s: u32,
    r: u32,
}

/// A proxy over `t` (or the library's memory) with one connected SIMPLE pair whose GPU side
/// is process `gpu` (0: this one).
fn pair(t: Option<&CMemTable>, gpu: u64) -> Pair {
    pair_with(t, gpu, 0)
}

/// [`pair`] with the connections' `shared` flag (1: shared buffers, which registered subs need).
fn pair_with(t: Option<&CMemTable>, gpu: u64, shared: c_int) -> Pair {
    env();
    let cfg = CConfig {
        buff_sizes: [0, 0, 8 << 16],
        ..CConfig::default()
    };
    let mut px = core::ptr::null_mut();
    let tp = t.map_or(core::ptr::null(), |t| t as *const CMemTable);
    // SAFETY: valid pointers; NULL plugin path: the library's own table.
    ok(
        unsafe { ibnet_proxy_create(core::ptr::null(), &cfg, tp, &mut px) },
        "create",
    );
    let rq = CSetup {
        tp_rank: 1,
        gpu_process: gpu,
        shared,
        ..CSetup::default()
    };
    let sq = CSetup {
        tp_remote_rank: 1,
        gpu_process: gpu,
        shared,
        ..CSetup::default()
    };
    let (mut s, mut r, mut h) = (0u32, 0u32, [0u8; 128]);
    // SAFETY: valid pointers, 128-byte handle.
    unsafe {
        ok(
            ibnet_proxy_setup(px, 1, &rq, &mut r, h.as_mut_ptr().cast()),
            "setup recv",
        );
        ok(
            ibnet_proxy_setup(px, 0, &sq, &mut s, core::ptr::null_mut()),
            "setup send",
        );
    }
    let (mut sd, mut rd) = (0, 0);
    for _ in 0..10_000 {
        // SAFETY: as above.
        unsafe {
            if sd == 0 {
                ok(
                    ibnet_proxy_connect_send(px, s, h.as_ptr().cast(), &mut sd),
                    "connect",
                );
            }
            if rd == 0 {
                ok(ibnet_proxy_connect_recv(px, r, 0, &mut rd), "accept");
            }
        }
        if sd == 1 && rd == 1 {
            break;
        }
    }
    assert!(sd == 1 && rd == 1, "connected");
    Pair { px, s, r }
}

fn word<'a>(a: u64) -> &'a AtomicU64 {
    // SAFETY: an 8-byte aligned word of a connection that stays connected while used.
    unsafe { &*(a as *const AtomicU64) }
}

/// 3 SIMPLE steps, the "GPU" playing on views `sv`/`rv` (any mapping of the connections).
fn three_steps(p: &Pair, sv: &CDeviceView, rv: &CDeviceView) {
    let slot = sv.buff_sizes[2] / 8;
    let (mut so, mut ro) = (core::ptr::null_mut(), core::ptr::null_mut());
    // SAFETY: valid pointers throughout; the views' addresses are live mappings.
    unsafe {
        ok(ibnet_proxy_op_create(0, 2, 1, 1, &mut so), "op");
        ok(ibnet_proxy_op_create(1, 2, 1, 1, &mut ro), "op");
        ok(
            ibnet_proxy_op_add(so, p.s, 3, 3 * slot, core::ptr::null_mut()),
            "add",
        );
        ok(
            ibnet_proxy_op_add(ro, p.r, 3, 3 * slot, core::ptr::null_mut()),
            "add",
        );
    }
    let fifo = sv.recv_mem + 64;
    let (mut ks, mut kr, mut sd, mut rd) = (0u64, 0u64, 0, 0);
    let mut spins = 0u64;
    while sd == 0 || rd == 0 || kr < 3 {
        // Acquire: pairs with the proxy's Release `store_step` of the send `head` (credits).
        while ks < 3 && word(sv.head).load(Ordering::Acquire) + 8 > ks {
            let dst = sv.buffs[2] + (ks % 8) * slot as u64;
            // SAFETY: the slot lies in the attached SIMPLE buffer.
            unsafe { core::ptr::write_bytes(dst as *mut u8, b'a' + ks as u8, slot) };
            // Release: the slot's `connFifo` size; pairs with the proxy's Acquire in
            // `ConnFifo::size`.
            word(fifo + 24 * (ks % 8) + 8).store(slot as u64, Ordering::Release);
            ks += 1;
            // Release: pairs with the proxy's Acquire `load_step` of `tail` (send side): the
            // bytes and size above are visible.
            word(sv.tail).store(ks, Ordering::Release);
        }
        // SAFETY: valid pointers.
        unsafe {
            if sd == 0 {
                ok(
                    ibnet_proxy_progress(p.px, so, &mut sd, core::ptr::null_mut()),
                    "progress",
                );
            }
            if rd == 0 {
                ok(
                    ibnet_proxy_progress(p.px, ro, &mut rd, core::ptr::null_mut()),
                    "progress",
                );
            }
        }
        // Acquire: pairs with the proxy's Release `store_step` of the recv `tail`: the landed
        // bytes are visible.
        while kr < word(rv.tail).load(Ordering::Acquire) {
            let src = rv.buffs[2] + (kr % 8) * slot as u64;
            // SAFETY: a landed slot of the attached receive buffer.
            let got = unsafe { std::slice::from_raw_parts(src as *const u8, slot) };
            assert!(got.iter().all(|&b| b == b'a' + kr as u8), "step {kr} bytes");
            kr += 1;
            // Release: pairs with the proxy's Acquire `load_step` of the recv `head`: our reads
            // of the slot are done before it is refilled.
            word(rv.head).store(kr, Ordering::Release);
        }
        spins += 1;
        assert!(spins < 100_000_000, "stuck");
    }
    // SAFETY: ops from op_create, destroyed once.
    unsafe {
        ok(ibnet_proxy_op_destroy(so), "destroy");
        ok(ibnet_proxy_op_destroy(ro), "destroy");
    }
}

fn finish(p: Pair) {
    // SAFETY: live proxy and connections.
    unsafe {
        ok(ibnet_proxy_free(p.px, p.s), "free");
        ok(ibnet_proxy_free(p.px, p.r), "free");
        ok(ibnet_proxy_destroy(p.px), "destroy");
    }
}

fn view(p: &Pair, c: u32) -> CDeviceView {
    let mut v = CDeviceView::default();
    // SAFETY: valid pointers.
    ok(unsafe { ibnet_proxy_device_view(p.px, c, &mut v) }, "view");
    v
}

#[test]
fn gdr_copy_words_hold_the_proxy_counters_and_profiler_sees_steps() {
    let _g = SERIAL.lock().unwrap();
    let mut m = Mem::default();
    let t = CMemTable {
        gdc_alloc: Some(gdc_alloc),
        store_fence: Some(store_fence),
        ..table(&mut m)
    };
    let p = pair(Some(&t), 0);
    assert_eq!(m.gdc, 2, "one GDR-copy allocation per connection");
    let (sv, rv) = (view(&p, p.s), view(&p, p.r));
    // The proxy-written counters (send head, recv tail) are in GDR-copy words, not the
    // RecvMem/SendMem.
    assert_ne!(sv.head & !4095, sv.recv_mem & !4095);
    assert_ne!(rv.tail, rv.recv_mem);
    let mut ev = Events::default();
    let prof = CProfiler {
        ctx: (&mut ev as *mut Events).cast(),
        event: Some(on_event),
    };
    // SAFETY: valid pointers; `ev` outlives the proxy.
    ok(unsafe { ibnet_proxy_set_profiler(p.px, &prof) }, "profiler");
    // Relaxed (both `fences` loads): `store_fence` ran on this thread, inside
    // `three_steps`'s progress calls; program order suffices.
    let before = m.fences.load(Ordering::Relaxed);
    three_steps(&p, &sv, &rv);
    assert!(m.fences.load(Ordering::Relaxed) > before, "credits fenced");
    assert_eq!(ev.op_starts, 2);
    assert!(ev.op_states > 0);
    assert_eq!(ev.step_stops, 6, "3 steps per direction");
    finish(p);
    assert!(m.banks.is_empty(), "everything freed");
}

#[test]
fn export_and_import_hooks_carry_a_cross_process_connection() {
    let _g = SERIAL.lock().unwrap();
    let mut m = Mem::default();
    let t = CMemTable {
        export_mem: Some(export_mem),
        import_mem: Some(import_mem),
        unimport_mem: Some(unimport_mem),
        gdc_alloc: Some(gdc_alloc),
        ..table(&mut m)
    };
    let p = pair(Some(&t), 0x5eed);
    assert_eq!(m.gdc, 0, "no GDR copy across processes");
    assert!(m.exports >= 2, "every bank exported");
    let mut maps = [[0u8; XMap::BYTES]; 2];
    for (c, buf) in [p.s, p.r].into_iter().zip(maps.iter_mut()) {
        // SAFETY: valid pointers.
        let rc = unsafe { ibnet_proxy_export_map(p.px, c, buf.as_mut_ptr().cast(), buf.len()) };
        ok(rc, "export_map");
    }
    // Send side through the caller's importMem, receive side through the library's import.
    let mut atts = [core::ptr::null_mut(); 2];
    let mut views = [CDeviceView::default(); 2];
    for i in 0..2 {
        let tp = if i == 0 {
            &t as *const CMemTable
        } else {
            core::ptr::null()
        };
        // SAFETY: valid pointers; the map has XMap::BYTES bytes.
        let rc = unsafe {
            ibnet_proxy_attach(
                tp,
                maps[i].as_ptr().cast(),
                XMap::BYTES,
                &mut atts[i],
                &mut views[i],
            )
        };
        ok(rc, "attach");
    }
    assert!(m.imports >= 1, "importMem used");
    assert_ne!(
        views[0].recv_mem,
        view(&p, p.s).recv_mem,
        "mapped elsewhere"
    );
    three_steps(&p, &views[0], &views[1]);
    for a in atts {
        // SAFETY: attachments from attach, detached once.
        ok(unsafe { ibnet_proxy_detach(a) }, "detach");
    }
    assert!(m.imported.is_empty(), "unimportMem called for every import");
    // A damaged map is refused; a too-small buffer too.
    let mut bad = maps[0];
    bad[XMap::BYTES - 480 + 8] ^= 0xff; // the first descriptor's size
    let (mut a, mut v) = (core::ptr::null_mut(), CDeviceView::default());
    // SAFETY: valid pointers.
    let rc = unsafe {
        ibnet_proxy_attach(
            core::ptr::null(),
            bad.as_ptr().cast(),
            bad.len(),
            &mut a,
            &mut v,
        )
    };
    assert_ne!(rc, ncclResult_t::Success);
    assert!(a.is_null());
    // A length other than the map's is refused before the map is read, SIZE_MAX too (a slice
    // that long would be undefined behaviour).
    for len in [XMap::BYTES - 1, usize::MAX] {
        // SAFETY: valid pointers; the length is the point of the test (not read).
        let rc = unsafe {
            ibnet_proxy_attach(
                core::ptr::null(),
                maps[1].as_ptr().cast(),
                len,
                &mut a,
                &mut v,
            )
        };
        assert_eq!(rc, ncclResult_t::InvalidArgument, "len {len}");
        assert!(a.is_null());
    }
    // SAFETY: valid pointers.
    let rc = unsafe { ibnet_proxy_export_map(p.px, p.s, maps[0].as_mut_ptr().cast(), 10) };
    assert_ne!(rc, ncclResult_t::Success);
    finish(p);
    assert!(m.banks.is_empty(), "everything freed");
    let _ = BankDesc::NONE;
}

#[test]
fn export_map_of_a_same_process_connection_is_refused() {
    let _g = SERIAL.lock().unwrap();
    let p = pair(None, 0);
    let mut buf = [0u8; XMap::BYTES];
    // SAFETY: valid pointers.
    let rc = unsafe { ibnet_proxy_export_map(p.px, p.s, buf.as_mut_ptr().cast(), buf.len()) };
    assert_ne!(rc, ncclResult_t::Success);
    let mut id = 0u64;
    // SAFETY: valid pointer.
    ok(unsafe { ibnet_proxy_process_id(&mut id) }, "process id");
    assert_ne!(id, 0);
    finish(p);
}

#[test]
fn an_unfinished_op_holding_registrations_is_refused_by_destroy_until_aborted() {
    let _g = SERIAL.lock().unwrap();
    let p = pair_with(None, 0, 1);
    let mut buf = vec![0u8; 1 << 16];
    let mut ro = core::ptr::null_mut();
    let (mut done, mut idle) = (0, 0);
    // SAFETY: valid pointers; `buf` outlives the op (aborted and destroyed below).
    unsafe {
        ok(ibnet_proxy_op_create(1, 2, 1, 1, &mut ro), "op");
        ok(
            ibnet_proxy_op_add(ro, p.r, 1, buf.len(), buf.as_mut_ptr().cast()),
            "add (user buffer)",
        );
        // The first progress registers the user buffer; nothing is sent, so it stays unfinished.
        ok(
            ibnet_proxy_progress(p.px, ro, &mut done, &mut idle),
            "progress",
        );
    }
    assert_eq!(done, 0, "no sender: unfinished");
    // SAFETY: a live op.
    let rc = unsafe { ibnet_proxy_op_destroy(ro) };
    assert_eq!(rc, ncclResult_t::InternalError, "refused, not leaked");
    // SAFETY: live proxy and op; the op is aborted once, then destroyed once.
    unsafe {
        ok(ibnet_proxy_op_abort(p.px, ro), "abort");
        ok(ibnet_proxy_op_destroy(ro), "destroy after abort");
    }
    finish(p);
    drop(buf);
}
