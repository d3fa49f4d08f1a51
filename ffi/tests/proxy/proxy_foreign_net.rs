//! The proxy engine driving ibnet's own `.so` through its C table: the built
//! `libnccl_net_ibnet.so` is `dlopen`ed with `IBNET_PROVIDER=soft` and
//! * the Rust engine runs over it as a [`ForeignNet`] (`ncclNetPlugin_v12`, and `ncclNetPlugin_v8`,
//!   found with `dlsym`);
//! * the C API (`ibnet_proxy_*`, found with `dlsym` in the same `.so`) runs over the library's
//!   own table (`pluginPath = NULL`).
//!
//! A "GPU" runs inline on the test thread between progress calls, following the device side of
//! the ring protocol (credits, slot fill in the protocol's format, size + `tail`; on receive,
//! `tail`, verification byte for byte, `head`). Scenarios: SIMPLE, LL and LL128 over dedicated
//! buffers, SIMPLE over shared buffers with 1–8 subs grouped into one multi-receive through
//! the C table, and registered user buffers.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use ibnet_nccl::foreign::Version;
use ibnet_proxy::capi::entry::{CConfig, CDeviceView, COp, CProxy, CSetup};
use ibnet_proxy::capi::{CMemTable, ForeignNet, ProxyMem};
use ibnet_proxy::lines::{ll128_flag, ll_flag, LL128_DATA_ELEMS, LL128_LINE, LL_LINE};
use ibnet_proxy::{
    ConnId, DeviceRecv, DeviceSend, DeviceView, Dir, NetHandle, Protocol, ProxyConfig, ProxyOp,
    ProxyState, SetupReq, SubArgs, STEPS,
};

fn so_path() -> String {
    if let Ok(p) = std::env::var("IBNET_TEST_PLUGIN_SO") {
        return p;
    }
    // Cargo builds the cdylib next to this test: target/<profile>/deps/libnccl_net_ibnet.so
    // (the copy in target/<profile>/ is refreshed only by `cargo build`).
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir");
    let so = deps.join("libnccl_net_ibnet.so");
    assert!(so.exists(), "{} not built", so.display());
    so.to_str().expect("UTF-8 path").to_owned()
}

static ENV: Once = Once::new();

/// Sets the plugin's environment once, before any thread loads it.
fn env() {
    ENV.call_once(|| {
        std::env::set_var("IBNET_PROVIDER", "soft");
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    });
}

fn cfg() -> ProxyConfig {
    ProxyConfig {
        buff_sizes: [8 * 2048, 8 * 4096, 8 * 8192],
        p2p_chunk_size: 4096,
        p2p_nchannels: 2,
        ..ProxyConfig::default()
    }
}

/// The engine as the scenarios use it: the Rust API or the C API.
trait Eng {
    type Op;
    fn setup(&mut self, dir: Dir, req: SetupReq) -> (u32, Option<NetHandle>);
    fn connect_send(&mut self, c: u32, h: &NetHandle) -> bool;
    fn connect_recv(&mut self, c: u32, rank: u32) -> bool;
    fn view(&mut self, c: u32) -> DeviceView;
    fn op(&mut self, dir: Dir, p: Protocol, subs: &[(u32, u64, usize, Option<u64>)]) -> Self::Op;
    fn progress(&mut self, op: &mut Self::Op) -> bool;
    fn bytes(&mut self, op: &mut Self::Op, s: usize) -> u64;
    fn done_op(&mut self, op: Self::Op);
    fn free(&mut self, c: u32);
}

struct RustEng(ProxyState<ForeignNet, ProxyMem, 32>);

impl Eng for RustEng {
    type Op = ProxyOp<ForeignNet>;
    fn setup(&mut self, dir: Dir, req: SetupReq) -> (u32, Option<NetHandle>) {
        let (c, h) = self.0.setup(dir, req).expect("setup");
        (c.to_bits(), h)
    }
    fn connect_send(&mut self, c: u32, h: &NetHandle) -> bool {
        self.0
            .connect_send(ConnId::from_bits(c), h)
            .expect("connect_send")
            .is_some()
    }
    fn connect_recv(&mut self, c: u32, rank: u32) -> bool {
        self.0
            .connect_recv(ConnId::from_bits(c), rank)
            .expect("connect_recv")
            .is_some()
    }
    fn view(&mut self, c: u32) -> DeviceView {
        self.0.device_view(ConnId::from_bits(c)).expect("view")
    }
    fn op(&mut self, dir: Dir, p: Protocol, subs: &[(u32, u64, usize, Option<u64>)]) -> Self::Op {
        let mut op = ProxyOp::new(dir, p, 1, 1).expect("op");
        for &(c, n, b, reg) in subs {
            let c = ConnId::from_bits(c);
            let a = match reg {
                Some(buf) => SubArgs::registered(c, buf, b),
                None => SubArgs::new(c, n, b),
            };
            op.push(a).expect("push");
        }
        op
    }
    fn progress(&mut self, op: &mut Self::Op) -> bool {
        self.0.progress(op).expect("progress").done
    }
    fn bytes(&mut self, op: &mut Self::Op, s: usize) -> u64 {
        op.bytes(s)
    }
    fn done_op(&mut self, _op: Self::Op) {}
    fn free(&mut self, c: u32) {
        self.0.free(ConnId::from_bits(c)).expect("free");
    }
}

/// The C API, resolved with `dlsym` from the loaded `.so`.
#[allow(clippy::type_complexity)]
struct CApi {
    create: unsafe extern "C" fn(
        *const c_char,
        *const CConfig,
        *const CMemTable,
        *mut *mut CProxy,
    ) -> c_int,
    setup: unsafe extern "C" fn(*mut CProxy, c_int, *const CSetup, *mut u32, *mut c_void) -> c_int,
    connect_send: unsafe extern "C" fn(*mut CProxy, u32, *const c_void, *mut c_int) -> c_int,
    connect_recv: unsafe extern "C" fn(*mut CProxy, u32, u32, *mut c_int) -> c_int,
    view: unsafe extern "C" fn(*mut CProxy, u32, *mut CDeviceView) -> c_int,
    op_create: unsafe extern "C" fn(c_int, c_int, u32, u32, *mut *mut COp) -> c_int,
    op_add: unsafe extern "C" fn(*mut COp, u32, u64, usize, *mut c_void) -> c_int,
    progress: unsafe extern "C" fn(*mut CProxy, *mut COp, *mut c_int, *mut c_int) -> c_int,
    op_bytes: unsafe extern "C" fn(*mut COp, u32, *mut u64) -> c_int,
    op_destroy: unsafe extern "C" fn(*mut COp) -> c_int,
    free: unsafe extern "C" fn(*mut CProxy, u32) -> c_int,
    destroy: unsafe extern "C" fn(*mut CProxy) -> c_int,
}

fn sym<T: Copy>(lib: *mut c_void, name: &str) -> T {
    let n = CString::new(name).unwrap();
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, n.as_ptr()) };
    assert!(!p.is_null(), "{name} not exported");
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `T` is the function pointer type of the exported symbol (include/ibnet.h).
    unsafe { std::mem::transmute_copy(&p) }
}

impl CApi {
    fn load() -> Self {
        env();
        let p = CString::new(so_path()).unwrap();
        // SAFETY: loading the built plugin.
        let lib = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!lib.is_null(), "dlopen {}", so_path());
        Self {
            create: sym(lib, "ibnet_proxy_create"),
            setup: sym(lib, "ibnet_proxy_setup"),
            connect_send: sym(lib, "ibnet_proxy_connect_send"),
            connect_recv: sym(lib, "ibnet_proxy_connect_recv"),
            view: sym(lib, "ibnet_proxy_device_view"),
            op_create: sym(lib, "ibnet_proxy_op_create"),
            op_add: sym(lib, "ibnet_proxy_op_add"),
            progress: sym(lib, "ibnet_proxy_progress"),
            op_bytes: sym(lib, "ibnet_proxy_op_bytes"),
            op_destroy: sym(lib, "ibnet_proxy_op_destroy"),
            free: sym(lib, "ibnet_proxy_free"),
            destroy: sym(lib, "ibnet_proxy_destroy"),
        }
    }
}

struct CEng {
    api: CApi,
    px: *mut CProxy,
}

fn ok(rc: c_int, what: &str) {
    assert_eq!(rc, 0, "{what} failed");
}

impl Eng for CEng {
    type Op = *mut COp;
    fn setup(&mut self, dir: Dir, req: SetupReq) -> (u32, Option<NetHandle>) {
        let r = CSetup {
            tp_rank: req.tp_rank,
            tp_local_rank: req.tp_local_rank,
            tp_remote_rank: req.tp_remote_rank,
            net_dev: req.net_dev,
            channel: req.channel,
            conn_index: req.conn_index,
            shared: req.shared as c_int,
            use_gdr: req.use_gdr as c_int,
            need_flush: req.need_flush as c_int,
            gpu_process: 0,
        };
        let mut c = 0u32;
        let mut h: NetHandle = [0; 128];
        let d = (dir == Dir::Recv) as c_int;
        // SAFETY: valid pointers; 128-byte handle buffer.
        ok(
            unsafe { (self.api.setup)(self.px, d, &r, &mut c, h.as_mut_ptr().cast()) },
            "setup",
        );
        (c, (dir == Dir::Recv).then_some(h))
    }
    fn connect_send(&mut self, c: u32, h: &NetHandle) -> bool {
        let mut done = 0;
        // SAFETY: valid pointers.
        ok(
            unsafe { (self.api.connect_send)(self.px, c, h.as_ptr().cast(), &mut done) },
            "connect_send",
        );
        done != 0
    }
    fn connect_recv(&mut self, c: u32, rank: u32) -> bool {
        let mut done = 0;
        // SAFETY: valid pointers.
        ok(
            unsafe { (self.api.connect_recv)(self.px, c, rank, &mut done) },
            "connect_recv",
        );
        done != 0
    }
    fn view(&mut self, c: u32) -> DeviceView {
        let mut v = CDeviceView::default();
        // SAFETY: valid pointers.
        ok(unsafe { (self.api.view)(self.px, c, &mut v) }, "view");
        DeviceView {
            dir: if v.dir == 0 { Dir::Send } else { Dir::Recv },
            head: v.head,
            tail: v.tail,
            recv_mem: v.recv_mem,
            buffs: v.buffs,
            buff_sizes: v.buff_sizes,
            shared: v.shared != 0,
        }
    }
    fn op(&mut self, dir: Dir, p: Protocol, subs: &[(u32, u64, usize, Option<u64>)]) -> Self::Op {
        let mut op = std::ptr::null_mut();
        let d = (dir == Dir::Recv) as c_int;
        // SAFETY: valid out-pointer.
        ok(
            unsafe { (self.api.op_create)(d, p as c_int, 1, 1, &mut op) },
            "op_create",
        );
        for &(c, n, b, reg) in subs {
            let r = reg.map_or(std::ptr::null_mut(), |a| a as *mut c_void);
            // SAFETY: a live op; `r` stays valid until the op is done.
            ok(unsafe { (self.api.op_add)(op, c, n, b, r) }, "op_add");
        }
        op
    }
    fn progress(&mut self, op: &mut Self::Op) -> bool {
        let mut done = 0;
        // SAFETY: live proxy and op; NULL idle is allowed.
        ok(
            unsafe { (self.api.progress)(self.px, *op, &mut done, std::ptr::null_mut()) },
            "progress",
        );
        done != 0
    }
    fn bytes(&mut self, op: &mut Self::Op, s: usize) -> u64 {
        let mut b = 0;
        // SAFETY: live op, valid out-pointer.
        ok(
            unsafe { (self.api.op_bytes)(*op, s as u32, &mut b) },
            "op_bytes",
        );
        b
    }
    fn done_op(&mut self, op: Self::Op) {
        // SAFETY: a live op, destroyed once.
        ok(unsafe { (self.api.op_destroy)(op) }, "op_destroy");
    }
    fn free(&mut self, c: u32) {
        // SAFETY: live proxy.
        ok(unsafe { (self.api.free)(self.px, c) }, "free");
    }
}

#[derive(Clone, Copy, Debug)]
struct Sc {
    proto: Protocol,
    nsubs: usize,
    ops: usize,
    shared: bool,
    /// Registered user buffers of this many bytes at most.
    reg: usize,
}

fn fill(b: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for c in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

fn word<'a>(a: u64) -> &'a AtomicU64 {
    // SAFETY: callers pass 8-byte-aligned addresses inside a live connection buffer.
    unsafe { &*(a as *const AtomicU64) }
}

fn write_slot(p: Protocol, addr: u64, data: &[u8], k: u64) {
    match p {
        // SAFETY: the slot is ours until published and has room for `data`.
        Protocol::Simple => unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len())
        },
        Protocol::Ll => {
            let f = (ll_flag(k) as u64) << 32;
            for (i, c) in data.chunks(8).enumerate() {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                let a = addr + (LL_LINE * i) as u64;
                let lo = u32::from_le_bytes(b[..4].try_into().unwrap()) as u64;
                let hi = u32::from_le_bytes(b[4..].try_into().unwrap()) as u64;
                // Release (both): pair with the proxy's Acquire `BufView::load` in `ll_ready`
                // (`lines.rs`): each word carries its data and flag together.
                word(a).store(lo | f, Ordering::Release);
                word(a + 8).store(hi | f, Ordering::Release);
            }
        }
        Protocol::Ll128 => {
            for (i, c) in data.chunks(LL128_DATA_ELEMS * 8).enumerate() {
                let line = addr + (LL128_LINE * i) as u64;
                let mut b = [0u8; LL128_DATA_ELEMS * 8];
                b[..c.len()].copy_from_slice(c);
                for (e, d) in b.chunks(8).enumerate() {
                    // Relaxed: published by the Release store of the line's flag below.
                    word(line + 8 * e as u64)
                        .store(u64::from_le_bytes(d.try_into().unwrap()), Ordering::Relaxed);
                }
                // Release: pairs with the proxy's Acquire `BufView::load` of the flag word in
                // `ll128_ready` (`lines.rs`): the line's data words are visible with it.
                word(line + 8 * LL128_DATA_ELEMS as u64).store(ll128_flag(k), Ordering::Release);
            }
        }
    }
}

fn read_slot(p: Protocol, addr: u64, len: usize, k: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 128);
    match p {
        Protocol::Simple => {
            v.resize(len, 0);
            // SAFETY: the data landed before `tail` (acquired by `arrived`).
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
        }
        Protocol::Ll => {
            for i in 0..len.div_ceil(8) as u64 {
                // Acquire (both): stronger than needed: the net copied these bytes in before
                // the proxy's Release store of `tail`, which `arrived` acquired.
                let (a, b) = (
                    word(addr + 16 * i).load(Ordering::Acquire),
                    word(addr + 16 * i + 8).load(Ordering::Acquire),
                );
                let f = ll_flag(k) as u64;
                assert_eq!((a >> 32, b >> 32), (f, f), "LL flags");
                v.extend_from_slice(&(a as u32).to_le_bytes());
                v.extend_from_slice(&(b as u32).to_le_bytes());
            }
        }
        Protocol::Ll128 => {
            for i in 0..len.div_ceil(LL128_DATA_ELEMS * 8) as u64 {
                let line = addr + LL128_LINE as u64 * i;
                // Acquire (the flag and data loads): stronger than needed, as for LL above.
                let f = word(line + 8 * LL128_DATA_ELEMS as u64).load(Ordering::Acquire);
                assert_eq!(f, ll128_flag(k), "LL128 flag");
                for e in 0..LL128_DATA_ELEMS as u64 {
                    v.extend_from_slice(&word(line + 8 * e).load(Ordering::Acquire).to_le_bytes());
                }
            }
        }
    }
    v.truncate(len);
    v
}

fn wire(p: Protocol, n: usize) -> usize {
    match p {
        Protocol::Simple => n,
        Protocol::Ll => n.div_ceil(8) * LL_LINE,
        Protocol::Ll128 => n.div_ceil(LL128_DATA_ELEMS * 8) * LL128_LINE,
    }
}

/// Runs a scenario over `e`; returns the bytes verified on the receiving side.
fn run<E: Eng>(e: &mut E, sc: Sc) -> u64 {
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    for i in 0..sc.nsubs as u32 {
        let base = SetupReq {
            shared: sc.shared,
            conn_index: 1,
            ..SetupReq::default()
        };
        let (r, h) = e.setup(
            Dir::Recv,
            SetupReq {
                tp_rank: 1,
                tp_remote_rank: 100 + i,
                ..base
            },
        );
        let (s, _) = e.setup(
            Dir::Send,
            SetupReq {
                tp_rank: 100 + i,
                tp_remote_rank: 1,
                ..base
            },
        );
        let h = h.expect("handle");
        let (mut sd, mut rd) = (false, false);
        for _ in 0..1_000_000 {
            sd = sd || e.connect_send(s, &h);
            rd = rd || e.connect_recv(r, 5);
            if sd && rd {
                break;
            }
        }
        assert!(sd && rd, "pair {i} never connected");
        sends.push(s);
        recvs.push(r);
    }
    let sv: Vec<DeviceView> = sends.iter().map(|&c| e.view(c)).collect();
    let rv: Vec<DeviceView> = recvs.iter().map(|&c| e.view(c)).collect();
    // SAFETY: the connections stay connected until freed at the end of this function.
    let gs: Vec<DeviceSend> = sv
        .iter()
        .map(|v| unsafe { DeviceSend::from_view(v) }.unwrap())
        .collect();
    // SAFETY: as above.
    let gr: Vec<DeviceRecv> = rv
        .iter()
        .map(|v| unsafe { DeviceRecv::from_view(v) }.unwrap())
        .collect();
    let pi = sc.proto.index();
    let shared_simple = sc.shared && sc.proto == Protocol::Simple;
    let room = if shared_simple {
        cfg().p2p_chunk_size
    } else {
        sv[0].buff_sizes[pi] / STEPS
    };
    let per = match sc.proto {
        Protocol::Simple => room,
        Protocol::Ll => room / LL_LINE * 8,
        Protocol::Ll128 => room / LL128_LINE * LL128_DATA_ELEMS * 8,
    };
    let slot = |v: &DeviceView, k: u64, off: u32| {
        if shared_simple {
            v.buffs[pi] + off as u64
        } else {
            v.buffs[pi] + (k % STEPS as u64) * (v.buff_sizes[pi] / STEPS) as u64
        }
    };
    let mut ubufs: Vec<(Vec<u8>, Vec<u8>)> = (0..sc.nsubs)
        .map(|_| (vec![0u8; sc.reg + 1], vec![0u8; sc.reg + 1]))
        .collect();
    let (mut ks, mut kr) = (vec![0u64; sc.nsubs], vec![0u64; sc.nsubs]);
    let mut verified = 0u64;
    for op in 0..sc.ops {
        let size = |s: usize| {
            let max = if sc.reg > 0 { sc.reg } else { per * 5 };
            if op % 7 == 3 {
                return per.min(max);
            }
            1 + (op * 2_654_435_761 + s * 40_503 + 17) % max
        };
        let mut ssubs = Vec::new();
        let mut rsubs = Vec::new();
        for s in 0..sc.nsubs {
            let n = size(s);
            if sc.reg > 0 {
                fill(&mut ubufs[s].0[..n], (op * 64 + s) as u64);
                ssubs.push((sends[s], 1, n, Some(ubufs[s].0.as_ptr() as u64)));
                rsubs.push((recvs[s], 1, n, Some(ubufs[s].1.as_mut_ptr() as u64)));
            } else {
                let steps = n.div_ceil(per) as u64;
                ssubs.push((sends[s], steps, wire(sc.proto, n), None));
                rsubs.push((recvs[s], steps, wire(sc.proto, n), None));
            }
        }
        let mut so = e.op(Dir::Send, sc.proto, &ssubs);
        let mut ro = e.op(Dir::Recv, sc.proto, &rsubs);
        let (mut sj, mut rj) = (vec![0usize; sc.nsubs], vec![0usize; sc.nsubs]);
        let (mut sd, mut rd) = (false, false);
        let mut spins = 0u64;
        while !(sd && rd) {
            for s in 0..sc.nsubs {
                let n = size(s);
                if sc.reg > 0 {
                    // Registered: one step at `ks`; the sender's kernel hands over the buffer.
                    if sj[s] == 0 && gs[s].has_credit(ks[s]) {
                        gs[s].publish(ks[s], n as u64);
                        gs[s].advance(ks[s] + 1);
                        sj[s] = 1;
                    }
                    if rj[s] == 0 {
                        gr[s].ready(kr[s], n as u64);
                        rj[s] = 1;
                    }
                    continue;
                }
                let slices = n.div_ceil(per);
                while sj[s] < slices && gs[s].has_credit(ks[s] + sj[s] as u64) {
                    let k = ks[s] + sj[s] as u64;
                    let len = per.min(n - sj[s] * per);
                    let mut d = vec![0u8; len];
                    fill(&mut d, ((op * 64 + s) * 64 + sj[s]) as u64);
                    write_slot(sc.proto, slot(&sv[s], k, gs[s].offset(k)), &d, k);
                    gs[s].publish(k, wire(sc.proto, len) as u64);
                    if sc.proto != Protocol::Ll {
                        gs[s].advance(k + 1);
                    }
                    sj[s] += 1;
                }
            }
            sd = sd || e.progress(&mut so);
            rd = rd || e.progress(&mut ro);
            for s in 0..sc.nsubs {
                let n = size(s);
                if sc.reg > 0 {
                    if rj[s] == 1 && gr[s].arrived(kr[s]) {
                        let mut want = vec![0u8; n];
                        fill(&mut want, (op * 64 + s) as u64);
                        assert!(
                            ubufs[s].1[..n] == want[..],
                            "op {op} sub {s}: registered data"
                        );
                        verified += n as u64;
                        gr[s].consume(kr[s] + 1);
                        rj[s] = 2;
                    }
                    continue;
                }
                let slices = n.div_ceil(per);
                while rj[s] < slices && gr[s].arrived(kr[s] + rj[s] as u64) {
                    let k = kr[s] + rj[s] as u64;
                    let len = per.min(n - rj[s] * per);
                    let got = read_slot(sc.proto, slot(&rv[s], k, gr[s].offset(k)), len, k);
                    let mut want = vec![0u8; len];
                    fill(&mut want, ((op * 64 + s) * 64 + rj[s]) as u64);
                    assert!(got == want, "op {op} sub {s} slice {}: data differs", rj[s]);
                    verified += len as u64;
                    gr[s].consume(k + 1);
                    rj[s] += 1;
                }
            }
            spins += 1;
            assert!(spins < 50_000_000, "op {op} stuck");
        }
        for s in 0..sc.nsubs {
            let n = size(s);
            let steps = if sc.reg > 0 {
                assert!(!gs[s].pending(ks[s]), "registered send buffer handed back");
                1
            } else {
                n.div_ceil(per) as u64
            };
            ks[s] += steps;
            kr[s] += steps;
            let (sb, rb) = (e.bytes(&mut so, s), e.bytes(&mut ro, s));
            // Grouped multi-receives too: ibnet reports each receive's bytes (the sizes FIFO),
            // and the engine over ibnet's table counts them as reported.
            assert_eq!(sb, rb, "op {op} sub {s}: bytes moved");
        }
        e.done_op(so);
        e.done_op(ro);
    }
    for (&s, &r) in sends.iter().zip(&recvs) {
        e.free(s);
        e.free(r);
    }
    verified
}

fn rust_engine() -> RustEng {
    env();
    let net = ForeignNet::load(&so_path()).expect("load the plugin");
    assert_eq!(net.version(), Version::V12, "the newest table is preferred");
    assert_eq!(net.name(), "IBNet");
    assert!(
        net.devices().expect("devices") >= 1,
        "IBNET_PROVIDER=soft gives soft0"
    );
    RustEng(ProxyState::new(net, ProxyMem::host(), cfg()))
}

#[test]
fn rust_engine_over_the_plugin_c_table() {
    let mut e = rust_engine();
    let simple = Sc {
        proto: Protocol::Simple,
        nsubs: 1,
        ops: 1000,
        shared: false,
        reg: 0,
    };
    assert!(run(&mut e, simple) > 1000 * 4096);
    for proto in [Protocol::Ll, Protocol::Ll128] {
        run(
            &mut e,
            Sc {
                proto,
                nsubs: 2,
                ops: 300,
                ..simple
            },
        );
    }
    for n in [1, 4, 8] {
        run(
            &mut e,
            Sc {
                nsubs: n,
                ops: 200,
                shared: true,
                ..simple
            },
        );
    }
    run(
        &mut e,
        Sc {
            nsubs: 3,
            ops: 200,
            shared: true,
            reg: 200 << 10,
            ..simple
        },
    );
    assert_eq!(
        e.0.live(),
        (0, 0, 0),
        "connections, pools, shared comms left"
    );
    assert_eq!(e.0.mem().live(), 0, "memory left");
}

#[test]
fn rust_engine_over_the_plugin_v8_table() {
    env();
    let net = ForeignNet::load_version(&so_path(), Version::V8).expect("load the v8 table");
    assert_eq!(net.version(), Version::V8);
    let mut e = RustEng(ProxyState::new(net, ProxyMem::host(), cfg()));
    let simple = Sc {
        proto: Protocol::Simple,
        nsubs: 1,
        ops: 300,
        shared: false,
        reg: 0,
    };
    run(&mut e, simple);
    run(
        &mut e,
        Sc {
            proto: Protocol::Ll,
            nsubs: 2,
            ops: 100,
            ..simple
        },
    );
    run(
        &mut e,
        Sc {
            nsubs: 4,
            ops: 100,
            shared: true,
            ..simple
        },
    );
    assert_eq!(e.0.live(), (0, 0, 0));
}

#[test]
fn c_api_over_the_library_own_table() {
    let api = CApi::load();
    let mut px = std::ptr::null_mut();
    let c = CConfig {
        buff_sizes: cfg().buff_sizes,
        p2p_chunk_size: cfg().p2p_chunk_size,
        p2p_nchannels: cfg().p2p_nchannels as c_int,
        ..CConfig::default()
    };
    // SAFETY: valid pointers; NULL path: the library's own table; NULL mem: host memory.
    ok(
        unsafe { (api.create)(std::ptr::null(), &c, std::ptr::null(), &mut px) },
        "create",
    );
    assert!(!px.is_null());
    let destroy = api.destroy;
    let mut e = CEng { api, px };
    let simple = Sc {
        proto: Protocol::Simple,
        nsubs: 1,
        ops: 1000,
        shared: false,
        reg: 0,
    };
    assert!(run(&mut e, simple) > 1000 * 4096);
    run(
        &mut e,
        Sc {
            nsubs: 4,
            ops: 200,
            shared: true,
            ..simple
        },
    );
    // Bad input is an error code, not a crash.
    let mut done = 0;
    // SAFETY: deliberately bad arguments: a NULL handle, a stale connection id.
    unsafe {
        assert_ne!((e.api.connect_send)(px, 0, std::ptr::null(), &mut done), 0);
        assert_ne!((e.api.free)(px, 12345), 0);
        assert_ne!(
            (e.api.progress)(px, std::ptr::null_mut(), &mut done, std::ptr::null_mut()),
            0
        );
    }
    // Destroy is refused while a connection is open, and works once it is freed.
    let (r, _) = e.setup(
        Dir::Recv,
        SetupReq {
            tp_rank: 1,
            ..SetupReq::default()
        },
    );
    // SAFETY: the live proxy.
    assert_ne!(unsafe { destroy(px) }, 0, "destroy with an open connection");
    e.free(r);
    // SAFETY: the live proxy, destroyed once.
    ok(unsafe { destroy(px) }, "destroy");
}
