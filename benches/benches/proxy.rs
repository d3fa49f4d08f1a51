//! The proxy engine's cost: the same transfers through the engine (`ProxyState` + `CommNet`)
//! and through the bare comms, over the same provider (the in-process loopback: a synchronous
//! copy at post time), in the same run.
//!
//! * `bare/<size>`: 64 messages of `size` bytes: `irecv` + `isend` + `test` on both comms,
//!   cycling through 8 slots as the engine does (same memory footprint).
//! * `engine/<size>`: one send and one receive op of 64 SIMPLE steps of `size` bytes; the
//!   "GPU" of both sides runs inline on the proxy thread (publish size + tail when credited;
//!   consume on tail), so only the engine and the provider are measured.
//!
//! Ratio = bare time / engine time (throughput ratio). Engine cost per step =
//! (engine − bare) / 64, best read at 8 bytes where the copy is negligible.

use std::alloc::{alloc_zeroed, dealloc, Layout};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ibnet_core::comm::{CommConfig, RecvBuf};
use ibnet_core::proxy::{
    CommNet, DeviceRecv, DeviceSend, Dir, MemKind, MemProvider, Protocol, ProxyConfig, ProxyOp,
    ProxyState, Region, SetupReq, SubArgs, STEPS,
};
use ibnet_core::{Error, Result};
use ibnet_testkit::{connect_pair, AlignedBuf, Loopback};

const MSGS: u64 = 64;

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

type Px = ProxyState<CommNet<Loopback, 2>, HostMem, 4>;

fn engine(size: usize) -> (Px, ibnet_core::proxy::ConnId, ibnet_core::proxy::ConnId) {
    let net = CommNet::new(Loopback::new(), CommConfig::default());
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
    (px, s, r)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("proxy");
    for size in [8usize, 64 << 10, 1 << 20] {
        g.throughput(Throughput::Bytes(size as u64 * MSGS));

        // The same memory footprint as the engine: 8 slots on each side, used in turn.
        let dev = Loopback::new();
        let (mut s, mut r) = connect_pair(&dev, CommConfig::default()).expect("connect");
        let slots = STEPS * size;
        let src = AlignedBuf::new(slots);
        let dst = AlignedBuf::new(slots);
        let sk = dev.register(src.addr(), slots as u64).expect("reg").0;
        let rk = dev.register(dst.addr(), slots as u64).expect("reg").0;
        g.bench_with_input(BenchmarkId::new("bare", size), &size, |b, &size| {
            b.iter(|| {
                for m in 0..MSGS {
                    let off = (m % STEPS as u64) * size as u64;
                    let buf = [RecvBuf {
                        addr: dst.addr() + off,
                        size: size as u64,
                        tag: 1,
                        mr: rk,
                    }];
                    let rid = r.irecv(&buf).expect("irecv").expect("posted");
                    let sid = s
                        .isend(src.addr() + off, size as u64, 1, sk)
                        .expect("isend")
                        .expect("matched");
                    while s.test(sid).expect("test").is_none() {}
                    while r.test(rid).expect("test").is_none() {}
                }
            })
        });
        drop((s, r));

        let (mut px, sc, rc) = engine(size);
        let sv = px.device_view(sc).expect("view");
        let rv = px.device_view(rc).expect("view");
        // SAFETY: both connections stay connected for the whole benchmark.
        let gs = unsafe { DeviceSend::from_view(&sv) }.expect("send view");
        // SAFETY: as above.
        let gr = unsafe { DeviceRecv::from_view(&rv) }.expect("recv view");
        let mut k_send = 0u64;
        let mut k_recv = 0u64;
        g.bench_with_input(BenchmarkId::new("engine", size), &size, |b, &size| {
            b.iter(|| {
                let mut so = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1).expect("op");
                let mut ro = ProxyOp::new(Dir::Recv, Protocol::Simple, 1, 1).expect("op");
                so.push(SubArgs::new(sc, MSGS, size * MSGS as usize))
                    .expect("sub");
                ro.push(SubArgs::new(rc, MSGS, size * MSGS as usize))
                    .expect("sub");
                let end = k_send + MSGS;
                let (mut sd, mut rd) = (false, false);
                while !(sd && rd) {
                    // The sending GPU: publish every credited step.
                    while k_send < end && gs.has_credit(k_send) {
                        gs.publish(k_send, size as u64);
                        gs.advance(k_send + 1);
                        k_send += 1;
                    }
                    sd = sd || px.progress(&mut so).expect("send").done;
                    rd = rd || px.progress(&mut ro).expect("recv").done;
                    // The receiving GPU: consume every landed step.
                    while gr.arrived(k_recv) {
                        k_recv += 1;
                        gr.consume(k_recv);
                    }
                }
            })
        });
        px.free(sc).expect("free");
        px.free(rc).expect("free");
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
