//! Deterministic hot-path counts: instructions per operation, measured with callgrind (no
//! timing, so a change's cost shows in instructions, not in noise). Driven by
//! `benches/callgrind.sh`, which runs this binary under `valgrind --tool=callgrind` once per
//! case with collection switched on only inside the case's `cg_*` function, and divides the
//! instructions by the operations the binary reports.
//!
//! Cases (`callgrind CASE` runs one, warmed up, then 2000 (or `IBNET_CG_ITERS`) operations
//! inside `cg_CASE`):
//! * `core_cycle`: ibnet-core's comms over the loopback double (`ibnet-testkit`), 8 B:
//!   `irecv` + `isend` + `test` (send) + `test` (recv).
//! * `mr_hit`: an MR-cache hit, `acquire` + `release` of a cached range (256 ranges cached).
//! * `proxy_step`: one SIMPLE step of the proxy engine over the loopback double, 8 B, send and
//!   receive side (a batch of `MSGS` steps per iteration, the inline "GPU" included).
//! * `bare_step`: the same traffic as `proxy_step` through the bare comms with the engine's
//!   depth (`rig::Bare`): `proxy_step − bare_step` is the engine's own cost per step.
//! * `plugin_cycle`: the plugin's C entry points (`ncclNetPlugin_v11`, loaded by path as NCCL
//!   does) over the soft provider, in-process: `irecv` + `isend` + `test` until both are done.
//! * `fused_cycle`: the same 8 B cycle over a virtual NIC that fuses two soft devices
//!   (`makeVDevice`): `fused_cycle − plugin_cycle` is what fusion costs a small message.
//!
//! Without a case it only prints the cases (so `cargo bench` runs it harmlessly).
#![allow(unsafe_code)]

use std::hint::black_box;

use ibnet_benches::rig::{Bare, Engine, MSGS};
use ibnet_core::comm::{CommConfig, RecvBuf, RecvComm, SendComm};
use ibnet_core::mr_cache::MrCache;
use ibnet_core::provider::MrKeys;
use ibnet_testkit::{connect_pair, AlignedBuf, Loopback};

const WARM: u64 = 200;

/// Operations counted per case: 2000, or `IBNET_CG_ITERS` (a larger count lets `perf stat`
/// read the same cases' cycles and instructions on a machine with hardware counters).
fn iters() -> u64 {
    std::env::var("IBNET_CG_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

struct Cycle {
    s: SendComm<Loopback>,
    r: RecvComm<Loopback>,
    src: AlignedBuf,
    buf: [RecvBuf; 1],
    sk: MrKeys,
    _dst: AlignedBuf,
}

impl Cycle {
    fn new() -> Self {
        let dev = Loopback::new();
        let (s, r) = connect_pair(&dev, CommConfig::default()).expect("connect");
        let (src, dst) = (AlignedBuf::new(8), AlignedBuf::new(8));
        let sk = dev.register(src.addr(), 8).expect("reg").0;
        let rk = dev.register(dst.addr(), 8).expect("reg").0;
        let buf = [RecvBuf {
            addr: dst.addr(),
            size: 8,
            tag: 1,
            mr: rk,
        }];
        Self {
            s,
            r,
            src,
            buf,
            sk,
            _dst: dst,
        }
    }

    #[inline(always)]
    fn once(&mut self) {
        let rid = self.r.irecv(&self.buf).expect("irecv").expect("posted");
        let sid = self
            .s
            .isend(self.src.addr(), 8, 1, self.sk)
            .expect("isend")
            .expect("matched");
        while self.s.test(sid).expect("test").is_none() {}
        while self.r.test(rid).expect("test").is_none() {}
    }
}

#[inline(never)]
fn cg_core_cycle(c: &mut Cycle, n: u64) {
    for _ in 0..n {
        c.once();
    }
}

fn core_cycle() -> u64 {
    let mut c = Cycle::new();
    for _ in 0..WARM {
        c.once();
    }
    let n = iters();
    cg_core_cycle(&mut c, n);
    n
}

type Cache = MrCache<u64, 4096>;

#[inline(never)]
fn cg_mr_hit(cache: &Cache, keys: &[(u64, u64)], n: u64) {
    hits(cache, keys, n);
}

#[inline(always)]
fn hits(cache: &Cache, keys: &[(u64, u64)], n: u64) {
    for i in 0..n as usize {
        let (a, l) = keys[i % keys.len()];
        let r = cache
            .acquire(black_box(a), l, 4096, |_, _| unreachable!("cached"))
            .expect("hit");
        cache
            .release(black_box(r.handle), |_| unreachable!("still referenced"))
            .expect("release");
    }
}

fn mr_hit() -> u64 {
    let cache: Box<Cache> = Box::new(MrCache::new());
    // 256 ranges of 1..=64 pages, 1 MiB apart, visited in a scrambled order.
    let keys: Vec<(u64, u64)> = (0..256u64)
        .map(|i| {
            let j = (i * 167) % 256;
            (0x7f00_0000_0000 + j * (1 << 20), (1 + j % 64) * 4096)
        })
        .collect();
    for &(a, l) in &keys {
        cache.acquire(a, l, 4096, |a, _| Ok(a)).expect("register");
    }
    // Warmed outside `cg_mr_hit` (callgrind counts only inside it).
    hits(&cache, &keys, WARM);
    let n = iters() * 4;
    cg_mr_hit(&cache, &keys, n);
    n
}

#[inline(never)]
fn cg_proxy_step(e: &mut Engine<Loopback>, batches: u64) {
    for _ in 0..batches {
        e.batch();
    }
}

fn proxy_step() -> u64 {
    let dev = Loopback::new();
    let mut e = Engine::new(&dev, 8);
    for _ in 0..4 {
        e.batch();
    }
    let batches = iters() / MSGS;
    cg_proxy_step(&mut e, batches);
    batches * MSGS
}

#[inline(never)]
fn cg_bare_step(b: &mut Bare<Loopback>, batches: u64) {
    for _ in 0..batches {
        b.batch();
    }
}

fn bare_step() -> u64 {
    let dev = Loopback::new();
    let mut b = Bare::new(&dev, 8);
    for _ in 0..4 {
        b.batch();
    }
    let batches = iters() / MSGS;
    cg_bare_step(&mut b, batches);
    batches * MSGS
}

mod plugin {
    use ibnet_tools::net::{Comm, Mr, Plugin, RecvSpec};

    pub struct Rig {
        p: Plugin,
        s: Comm,
        r: Comm,
        sm: Mr,
        rm: Mr,
        src: Box<[u64; 8]>,
        dst: Box<[u64; 8]>,
    }

    impl Rig {
        /// A connected pair on device 0, or (`fused`) on a virtual NIC of devices 0 and 1.
        pub fn new(fused: bool) -> Self {
            let path = ibnet_tools::locate::default_plugin().expect("plugin");
            let mut p = Plugin::open(&path).expect("open plugin");
            p.init().expect("init");
            let dev = if fused {
                p.make_vdevice(&[0, 1]).expect("makeVDevice")
            } else {
                0
            };
            let (mut h, l) = p.listen(dev).expect("listen");
            let (mut s, mut r) = (None, None);
            while s.is_none() || r.is_none() {
                if s.is_none() {
                    s = p.connect(dev, &mut h).expect("connect");
                }
                if r.is_none() {
                    r = p.accept(l).expect("accept");
                }
            }
            p.close_listen(l).expect("close listen");
            let (s, r) = (s.expect("send comm"), r.expect("recv comm"));
            let mut src = Box::new([7u64; 8]);
            let mut dst = Box::new([0u64; 8]);
            // SAFETY: both buffers live in the rig until it is dropped (after dereg).
            let sm = unsafe { p.reg_mr(s, src.as_mut_ptr().cast(), 64) }.expect("reg");
            // SAFETY: as above.
            let rm = unsafe { p.reg_mr(r, dst.as_mut_ptr().cast(), 64) }.expect("reg");
            Self {
                p,
                s,
                r,
                sm,
                rm,
                src,
                dst,
            }
        }

        #[inline(always)]
        pub fn once(&mut self) {
            let spec = [RecvSpec {
                data: self.dst.as_mut_ptr().cast(),
                size: 8,
                tag: 1,
                mr: self.rm,
            }];
            // SAFETY: the buffer is registered and outlives the request.
            let rr = loop {
                if let Some(q) = unsafe { self.p.irecv(self.r, &spec) }.expect("irecv") {
                    break q;
                }
            };
            let sr = loop {
                // SAFETY: as above.
                let q = unsafe {
                    self.p
                        .isend(self.s, self.src.as_mut_ptr().cast(), 8, 1, self.sm)
                };
                if let Some(q) = q.expect("isend") {
                    break q;
                }
            };
            let (mut sd, mut rd) = (false, false);
            while !(sd && rd) {
                sd = sd || self.p.test(sr).expect("test").is_some();
                rd = rd || self.p.test(rr).expect("test").is_some();
            }
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            let _ = self.p.dereg_mr(self.s, self.sm);
            let _ = self.p.dereg_mr(self.r, self.rm);
            let _ = self.p.close_send(self.s);
            let _ = self.p.close_recv(self.r);
            let _ = self.p.finalize();
        }
    }
}

#[inline(never)]
fn cg_plugin_cycle(r: &mut plugin::Rig, n: u64) {
    for _ in 0..n {
        r.once();
    }
}

fn plugin_cycle(fused: bool) -> u64 {
    if std::env::var_os("IBNET_PROVIDER").is_none() {
        std::env::set_var("IBNET_PROVIDER", "soft");
    }
    if fused {
        std::env::set_var("IBNET_SOFT_DEVICES", "2");
    }
    let mut r = plugin::Rig::new(fused);
    for _ in 0..WARM {
        r.once();
    }
    let n = iters();
    if fused {
        cg_fused_cycle(&mut r, n);
    } else {
        cg_plugin_cycle(&mut r, n);
    }
    n
}

/// Kept apart from `cg_plugin_cycle` (the `black_box` makes the two differ, so the compiler
/// can't fold them into one symbol and leave callgrind's toggle on the other name).
#[inline(never)]
fn cg_fused_cycle(r: &mut plugin::Rig, n: u64) {
    for _ in 0..black_box(n) {
        r.once();
    }
}

fn main() {
    let case = std::env::args().nth(1).unwrap_or_default();
    let n = match case.as_str() {
        "core_cycle" => core_cycle(),
        "mr_hit" => mr_hit(),
        "proxy_step" => proxy_step(),
        "bare_step" => bare_step(),
        "plugin_cycle" => plugin_cycle(false),
        "fused_cycle" => plugin_cycle(true),
        _ => {
            println!("callgrind cases: core_cycle mr_hit proxy_step bare_step plugin_cycle fused_cycle (run benches/callgrind.sh)");
            return;
        }
    };
    println!("CGOPS {case} {n}");
}
