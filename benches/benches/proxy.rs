//! The proxy engine's cost: the same transfers through the engine (`ProxyState` + `InProcessNet`)
//! and through the bare comms, over the same provider, in the same run. Two providers:
//! `loop` (the in-process loopback double: a synchronous copy at post time) and `soft`
//! (ibnet-soft, in-process fabric: copies on its engine threads, completions polled).
//!
//! * `bare/<prov>/<size>`: 64 messages of `size` bytes over a send/recv comm pair, with the
//!   engine's pipelining (up to [`STEPS`] receives and sends in flight, 8 slots used in turn:
//!   the same depth and memory footprint as the engine).
//! * `engine/<prov>/<size>`: one send and one receive op of 64 SIMPLE steps of `size` bytes;
//!   the "GPU" of both sides runs inline on the proxy thread (publish size + tail when
//!   credited; consume on tail), so only the engine and the provider are measured.
//!
//! Every buffer is written before measuring: a never-written heap buffer reads from the
//! kernel's shared zero page (always in cache), which made the bare sender look faster than a
//! sender reading real memory.
//!
//! After criterion's runs, a summary (when run with `--bench`; `IBNET_PROXY_SUMMARY=0` skips
//! it) alternates bare and engine batches at 8 B, 64 KiB and 1 MiB per provider and prints
//! the median time per step of each, the throughput ratio engine/bare (= bare time / engine
//! time) and the engine's overhead per step (engine − bare).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::time::Instant;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use ibnet_core::comm::{CommConfig, RecvBuf, RecvComm, SendComm};
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::proxy::{
    ConnId, DeviceRecv, DeviceSend, Dir, InProcessNet, MemKind, MemProvider, Protocol, ProxyConfig,
    ProxyOp, ProxyState, Region, SetupReq, SubArgs, STEPS,
};
use ibnet_core::request::ReqId;
use ibnet_core::{Error, Result};
use ibnet_soft::SoftProvider;
use ibnet_testkit::{connect_pair, Loopback};

const MSGS: u64 = 64;
const SIZES: [usize; 3] = [8, 64 << 10, 1 << 20];

#[derive(Default)]
struct HostMem(Vec<(u64, Layout)>);

// SAFETY: regions are fresh zeroed allocations, 4096-aligned, freed only through `free`.
unsafe impl MemProvider for HostMem {
    fn alloc(&mut self, kind: MemKind, size: usize) -> Result<Region> {
        let l = Layout::from_size_align(size.max(8), 4096)
            .map_err(|_| Error::Missing { what: "layout" })?;
        // SAFETY: non-zero size.
        let p = unsafe { alloc_zeroed(l) };
        if p.is_null() {
            return Err(Error::Provider {
                call: "alloc",
                errno: 12,
            });
        }
        self.0.push((p as u64, l));
        // SAFETY: fresh zeroed allocation, live until `free`.
        Ok(unsafe { Region::new(p as u64, p as u64, size, kind, 0) })
    }
    fn free(&mut self, r: Region) -> Result<()> {
        let i = self
            .0
            .iter()
            .position(|a| a.0 == r.cpu())
            .ok_or(Error::Missing { what: "region" })?;
        let (a, l) = self.0.swap_remove(i);
        // SAFETY: allocated by `alloc` with this layout.
        unsafe { dealloc(a as *mut u8, l) };
        Ok(())
    }
}

/// Writes every page of `[addr, addr + len)` (see the module doc).
fn touch(addr: u64, len: usize) {
    // SAFETY: callers pass live, writable buffers that nothing else uses yet.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0x5a, len) };
}

/// The bare comms with the engine's depth: up to `STEPS` receives and sends in flight.
struct Bare<P: Provider + Clone> {
    dev: P,
    s: SendComm<P>,
    r: RecvComm<P>,
    src: Region,
    dst: Region,
    mem: HostMem,
    mrs: Option<(P::Mr, P::Mr)>,
    keys: (MrKeys, MrKeys),
    size: usize,
}

impl<P: Provider + Clone> Bare<P> {
    fn new(dev: &P, size: usize) -> Self {
        let (s, r) = connect_pair(dev, CommConfig::default()).expect("connect");
        // The same allocator as the engine's buffers (same alignment and placement).
        let slots = STEPS * size.max(4096);
        let mut mem = HostMem::default();
        let src = mem.alloc(MemKind::Host, slots).expect("alloc");
        let dst = mem.alloc(MemKind::Host, slots).expect("alloc");
        touch(src.cpu(), slots);
        touch(dst.cpu(), slots);
        let reg = |a| {
            dev.reg_mr(a, slots as u64, Access::ALL, RegKind::Plain)
                .expect("reg")
        };
        let (sm, rm) = (reg(src.cpu()), reg(dst.cpu()));
        let keys = (dev.mr_keys(&sm), dev.mr_keys(&rm));
        Self {
            dev: dev.clone(),
            s,
            r,
            src,
            dst,
            mem,
            mrs: Some((sm, rm)),
            keys,
            size,
        }
    }

    fn batch(&mut self) {
        let size = self.size as u64;
        let (sk, rk) = self.keys;
        let mut sids = [None::<ReqId>; STEPS];
        let mut rids = [None::<ReqId>; STEPS];
        let (mut posted, mut sent, mut sdone, mut rdone) = (0u64, 0u64, 0u64, 0u64);
        while sdone < MSGS || rdone < MSGS {
            while posted < MSGS && posted < rdone + STEPS as u64 {
                let off = (posted % STEPS as u64) * size;
                let buf = [RecvBuf {
                    addr: self.dst.cpu() + off,
                    size,
                    tag: 1,
                    mr: rk,
                }];
                match self.r.irecv(&buf).expect("irecv") {
                    Some(id) => rids[(posted % STEPS as u64) as usize] = Some(id),
                    None => break,
                }
                posted += 1;
            }
            while sent < posted && sent < sdone + STEPS as u64 {
                let off = (sent % STEPS as u64) * size;
                match self
                    .s
                    .isend(self.src.cpu() + off, size, 1, sk)
                    .expect("isend")
                {
                    Some(id) => sids[(sent % STEPS as u64) as usize] = Some(id),
                    None => break,
                }
                sent += 1;
            }
            while sdone < sent {
                let i = (sdone % STEPS as u64) as usize;
                if self.s.test(sids[i].expect("sent")).expect("test").is_none() {
                    break;
                }
                sdone += 1;
            }
            while rdone < sent {
                let i = (rdone % STEPS as u64) as usize;
                if self
                    .r
                    .test(rids[i].expect("posted"))
                    .expect("test")
                    .is_none()
                {
                    break;
                }
                rdone += 1;
            }
        }
    }
}

impl<P: Provider + Clone> Drop for Bare<P> {
    fn drop(&mut self) {
        if let Some((a, b)) = self.mrs.take() {
            let _ = self.dev.dereg_mr(a);
            let _ = self.dev.dereg_mr(b);
        }
        let _ = self.mem.free(self.src);
        let _ = self.mem.free(self.dst);
    }
}

type Px<P> = ProxyState<InProcessNet<P, 2>, HostMem, 4>;

/// One send and one receive connection of an engine, with an inline "GPU" on each side.
struct Engine<P: Provider + Clone> {
    px: Px<P>,
    sc: ConnId,
    rc: ConnId,
    k_send: u64,
    k_recv: u64,
    size: usize,
}

impl<P: Provider + Clone> Engine<P> {
    fn new(dev: &P, size: usize) -> Self {
        let net = InProcessNet::new(dev.clone(), CommConfig::default());
        let cfg = ProxyConfig {
            buff_sizes: [STEPS * 4096, STEPS * 4096, STEPS * size.max(4096)],
            ..ProxyConfig::default()
        };
        let mut px = Px::new(net, HostMem::default(), cfg);
        let req = SetupReq {
            tp_rank: 1,
            tp_remote_rank: 1,
            ..SetupReq::default()
        };
        let (r, h) = px.setup(Dir::Recv, req).expect("setup");
        let (s, _) = px.setup(Dir::Send, req).expect("setup");
        let h = h.expect("handle");
        let (mut sd, mut rd) = (false, false);
        while !(sd && rd) {
            sd = sd || px.connect_send(s, &h).expect("connect").is_some();
            rd = rd || px.connect_recv(r, 0).expect("accept").is_some();
        }
        for c in [s, r] {
            let v = px.device_view(c).expect("view");
            let p = Protocol::Simple.index();
            touch(v.buffs[p], v.buff_sizes[p]);
        }
        Self {
            px,
            sc: s,
            rc: r,
            k_send: 0,
            k_recv: 0,
            size,
        }
    }

    fn batch(&mut self) {
        let size = self.size;
        let sv = self.px.device_view(self.sc).expect("view");
        let rv = self.px.device_view(self.rc).expect("view");
        // SAFETY: both connections stay connected while `self` lives.
        let gs = unsafe { DeviceSend::from_view(&sv) }.expect("send view");
        // SAFETY: as above.
        let gr = unsafe { DeviceRecv::from_view(&rv) }.expect("recv view");
        let mut so = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1).expect("op");
        let mut ro = ProxyOp::new(Dir::Recv, Protocol::Simple, 1, 1).expect("op");
        so.push(SubArgs::new(self.sc, MSGS, size * MSGS as usize))
            .expect("sub");
        ro.push(SubArgs::new(self.rc, MSGS, size * MSGS as usize))
            .expect("sub");
        let end = self.k_send + MSGS;
        let (mut sd, mut rd) = (false, false);
        while !(sd && rd) {
            // The sending GPU: publish every credited step.
            while self.k_send < end && gs.has_credit(self.k_send) {
                gs.publish(self.k_send, size as u64);
                gs.advance(self.k_send + 1);
                self.k_send += 1;
            }
            sd = sd || self.px.progress(&mut so).expect("send").done;
            rd = rd || self.px.progress(&mut ro).expect("recv").done;
            // The receiving GPU: consume every landed step.
            while gr.arrived(self.k_recv) {
                self.k_recv += 1;
                gr.consume(self.k_recv);
            }
        }
    }
}

impl<P: Provider + Clone> Drop for Engine<P> {
    fn drop(&mut self) {
        let _ = self.px.free(self.sc);
        let _ = self.px.free(self.rc);
    }
}

fn bench_provider<P: Provider + Clone>(c: &mut Criterion, name: &str, dev: &P) {
    let mut g = c.benchmark_group("proxy");
    for size in SIZES {
        g.throughput(Throughput::Bytes(size as u64 * MSGS));
        let mut bare = Bare::new(dev, size);
        g.bench_function(BenchmarkId::new(format!("bare/{name}"), size), |b| {
            b.iter(|| bare.batch())
        });
        drop(bare);
        let mut eng = Engine::new(dev, size);
        g.bench_function(BenchmarkId::new(format!("engine/{name}"), size), |b| {
            b.iter(|| eng.batch())
        });
    }
    g.finish();
}

/// Median nanoseconds per step of bare and engine batches, measured alternately.
fn summary_one<P: Provider + Clone>(name: &str, dev: &P, size: usize) {
    let mut bare = Bare::new(dev, size);
    let mut eng = Engine::new(dev, size);
    // Warm up both (page faults, caches, the provider's threads).
    for _ in 0..4 {
        bare.batch();
        eng.batch();
    }
    let rounds = if size >= 1 << 20 { 15 } else { 41 };
    let per = if size >= 1 << 20 { 1 } else { 8 };
    let (mut tb, mut te) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..per {
            bare.batch();
        }
        tb.push(t.elapsed().as_nanos() as f64 / (per as u64 * MSGS) as f64);
        let t = Instant::now();
        for _ in 0..per {
            eng.batch();
        }
        te.push(t.elapsed().as_nanos() as f64 / (per as u64 * MSGS) as f64);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, e) = (med(&mut tb), med(&mut te));
    println!(
        "proxy summary {name:>4} {size:>8} B: bare {b:>9.0} ns/step ({:>6.2} GiB/s), engine \
         {e:>9.0} ns/step ({:>6.2} GiB/s), engine/bare throughput {:.2}, engine overhead \
         {:>6.0} ns/step",
        size as f64 / b / 1.073_741_824,
        size as f64 / e / 1.073_741_824,
        b / e,
        e - b,
    );
}

fn summary(loopback: &Loopback, soft: &SoftProvider) {
    for size in SIZES {
        summary_one("loop", loopback, size);
        summary_one("soft", soft, size);
    }
}

fn bench(c: &mut Criterion) {
    let lo = Loopback::new();
    bench_provider(c, "loop", &lo);
    let soft = SoftProvider::open().expect("soft provider");
    bench_provider(c, "soft", &soft);
    soft.shutdown();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let bench_mode = std::env::args().any(|a| a == "--bench");
    if bench_mode && std::env::var("IBNET_PROXY_SUMMARY").as_deref() != Ok("0") {
        let lo = Loopback::new();
        let soft = SoftProvider::open().expect("soft provider");
        summary(&lo, &soft);
        soft.shutdown();
    }
}
