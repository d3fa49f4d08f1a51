//! The proxy engine's scenario harness: a host-memory `MemProvider`, a pair-connecting helper,
//! and a simulated GPU (one thread per direction) that follows the device side of the ring
//! protocol for SIMPLE, LL and LL128, dedicated and shared buffers, and registered user
//! buffers, verifying every received byte.
//!
//! Generic over the RDMA provider ([`Fabric`]): `ibnet-proxy`'s tests run it over [`Loopback`],
//! `ibnet-soft`'s over the soft provider; both run the one table of
//! [`scenarios`](crate::scenarios).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::in_process::InProcessNet;
use crate::loopback::Loopback;
use crate::{fill_pattern, AlignedBuf};
use ibnet_core::comm::CommConfig;
use ibnet_core::provider::Provider;
use ibnet_core::{Error, Result};
use ibnet_proxy::lines::{ll128_flag, ll_flag, LL128_DATA_ELEMS, LL128_LINE, LL_LINE};
use ibnet_proxy::{
    ConnId, DeviceRecv, DeviceSend, DeviceView, Dir, MemKind, MemProvider, NetProps, Profiler,
    Protocol, ProxyConfig, ProxyOp, ProxyState, Region, SetupReq, SizeReport, SubArgs, STEPS,
};

/// A provider the harness can run over: any cheap-to-clone [`Provider`].
pub trait Fabric: Provider + Clone {}

impl<P: Provider + Clone> Fabric for P {}

/// Live (registrations, QPs) of a provider, when it can tell, for the leak check at the end of
/// a run.
pub type Leaks<D> = fn(&D) -> Option<(usize, usize)>;

/// [`Leaks`] of the loopback double, which counts its objects.
fn loopback_leaks(l: &Loopback) -> Option<(usize, usize)> {
    Some((l.live_mrs(), l.live_qps()))
}

/// [`Leaks`] of a provider that does not count its objects (the engine's own tables are still
/// checked).
fn no_leak_count<D>(_: &D) -> Option<(usize, usize)> {
    None
}

/// Host memory standing in for pinned host and device memory.
#[derive(Default)]
pub struct HostMem {
    live: Vec<(u64, Layout)>,
    /// Offer GDR-copy words.
    pub gdc: bool,
    /// GDR-copy flush reads performed.
    pub flush_reads: Cell<u64>,
    /// Allocations made in total.
    pub allocs: usize,
}

impl HostMem {
    /// Live allocations.
    pub fn live(&self) -> usize {
        self.live.len()
    }
}

// SAFETY: regions are fresh zeroed allocations, 4096-aligned, freed only through `free`.
unsafe impl MemProvider for HostMem {
    fn alloc(&mut self, kind: MemKind, size: usize) -> Result<Region> {
        let layout = Layout::from_size_align(size.max(8), 4096).map_err(|_| Error::Provider {
            call: "alloc",
            errno: 22,
        })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        if p.is_null() {
            return Err(Error::Provider {
                call: "alloc",
                errno: 12,
            });
        }
        self.live.push((p as u64, layout));
        self.allocs += 1;
        // SAFETY: fresh zeroed allocation of `size` bytes, 4096-aligned, live until `free`.
        Ok(unsafe { Region::new(p as u64, p as u64, size, kind, p as u64) })
    }
    fn free(&mut self, r: Region) -> Result<()> {
        let i = self
            .live
            .iter()
            .position(|&(a, _)| a == r.cpu())
            .ok_or(Error::Missing { what: "region" })?;
        let (a, l) = self.live.swap_remove(i);
        // SAFETY: allocated by `alloc` with this layout, freed once.
        unsafe { dealloc(a as *mut u8, l) };
        Ok(())
    }
    fn gdc_alloc(&mut self, words: usize) -> Result<Option<Region>> {
        if !self.gdc {
            return Ok(None);
        }
        self.alloc(MemKind::Device, words * 8).map(Some)
    }
    fn flush_read(&self, w: &ibnet_core::sync::AtomicU64) {
        self.flush_reads.set(self.flush_reads.get() + 1);
        // SeqCst: as in the default `MemProvider::flush_read`: a real load the compiler cannot
        // drop; it pairs with no store (the read is the flush; here it is only counted).
        std::hint::black_box(w.load(Ordering::SeqCst));
    }
}

/// The net of the harness over provider `D`.
pub type NetOn<D> = InProcessNet<D, 16>;
/// The engine of the harness over provider `D` with memory from `M`.
pub type PxWith<D, M> = ProxyState<NetOn<D>, M, 32>;
/// The engine of the harness over provider `D`.
pub type PxOn<D> = PxWith<D, HostMem>;
/// The net over the loopback double.
pub type Net = NetOn<Loopback>;
/// The engine over the loopback double.
pub type Px = PxOn<Loopback>;

/// One test scenario.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// The protocol.
    pub proto: Protocol,
    /// Steps per network operation.
    pub slice: u64,
    /// Alignment of each sub's `base`, in steps.
    pub chunk: u64,
    /// Sub-operations (connection pairs).
    pub nsubs: usize,
    /// Operations to run.
    pub ops: usize,
    /// Shared buffers (and shared comms).
    pub shared: bool,
    /// Registered user buffers.
    pub reg: bool,
    /// GPU-direct: buffers in "device" memory.
    pub use_gdr: bool,
    /// Received data needs a flush.
    pub need_flush: bool,
    /// Offer GDR-copy words.
    pub gdc: bool,
    /// Flush with a GDR-copy read.
    pub gdc_flush: bool,
    /// The net's `max_recvs`.
    pub max_recvs: usize,
    /// Largest payload of one op per sub, in slices (dedicated/shared).
    pub max_slices: usize,
    /// Largest payload of one op per sub, in bytes (registered).
    pub reg_bytes: usize,
    /// The engine's `max_net_size` (registered buffers split at it).
    pub max_net_size: usize,
    /// The GPU side's process ([`SetupReq::gpu_process`]; 0: the engine's own, whose
    /// `process_id` is 0 too).
    pub gpu_process: u64,
}

impl Scenario {
    /// SIMPLE, one dedicated connection pair, 1,000 operations of up to 12 slices.
    pub const fn simple() -> Self {
        Self {
            proto: Protocol::Simple,
            slice: 1,
            chunk: 1,
            nsubs: 1,
            ops: 1000,
            shared: false,
            reg: false,
            use_gdr: false,
            need_flush: false,
            gdc: false,
            gdc_flush: false,
            max_recvs: 8,
            max_slices: 12,
            reg_bytes: 0,
            max_net_size: 1 << 30,
            gpu_process: 0,
        }
    }
}

/// What a run measured.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Operations completed.
    pub ops: usize,
    /// Payload bytes the receiving GPU verified.
    pub bytes_verified: u64,
    /// The largest receive group of the first operation.
    pub groups_max: usize,
    /// GDR-copy flush reads.
    pub flush_reads: u64,
}

/// The engine configuration of every scenario: small buffers, two p2p channels.
pub fn cfg() -> ProxyConfig {
    ProxyConfig {
        buff_sizes: [8 * 2048, 8 * 4096, 8 * 8192],
        p2p_chunk_size: 4096,
        p2p_nchannels: 2,
        ..ProxyConfig::default()
    }
}

/// Connects `n` send/recv connection pairs (shared comms when the scenario allows).
pub fn connect_pairs<D: Fabric, M: MemProvider>(
    px: &mut PxWith<D, M>,
    sc: &Scenario,
) -> Result<(Vec<ConnId>, Vec<ConnId>)> {
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for i in 0..sc.nsubs as u32 {
        let base = SetupReq {
            shared: sc.shared,
            use_gdr: sc.use_gdr,
            channel: 0,
            conn_index: 1,
            gpu_process: sc.gpu_process,
            ..SetupReq::default()
        };
        // Rank 100+i sends to rank 1 (one remote rank: one shared send comm); rank 1 receives
        // from 100+i through proxy rank 5 (one shared recv comm); tags tell the subs apart.
        let (r, h) = px.setup(
            Dir::Recv,
            SetupReq {
                tp_rank: 1,
                tp_remote_rank: 100 + i,
                need_flush: sc.need_flush,
                ..base
            },
        )?;
        let (s, _) = px.setup(
            Dir::Send,
            SetupReq {
                tp_rank: 100 + i,
                tp_remote_rank: 1,
                ..base
            },
        )?;
        let h = h.ok_or(Error::Missing { what: "handle" })?;
        let (mut sd, mut rd) = (false, false);
        for _ in 0..100 {
            if !sd {
                sd = px.connect_send(s, &h)?.is_some();
            }
            if !rd {
                rd = px.connect_recv(r, 5)?.is_some();
            }
            if sd && rd {
                break;
            }
        }
        assert!(sd && rd, "pair {i} never connected");
        sends.push(s);
        recvs.push(r);
    }
    Ok((sends, recvs))
}

/// An engine over a fresh [`Loopback`] for scenario `sc`.
pub fn new_px(sc: &Scenario, comm_flush: bool) -> Px {
    new_px_on(Loopback::new(), sc, comm_flush)
}

/// An engine over `dev` for scenario `sc`.
pub fn new_px_on<D: Fabric>(dev: D, sc: &Scenario, comm_flush: bool) -> PxOn<D> {
    let mem = HostMem {
        gdc: sc.gdc,
        ..HostMem::default()
    };
    new_px_with(dev, mem, sc, comm_flush, cfg())
}

/// An engine over `dev` with memory `mem` for scenario `sc`, from `base` (its GDR-copy flush
/// and `max_net_size` set from the scenario).
pub fn new_px_with<D: Fabric, M: MemProvider>(
    dev: D,
    mem: M,
    sc: &Scenario,
    comm_flush: bool,
    base: ProxyConfig,
) -> PxWith<D, M> {
    let net = NetOn::new(
        dev,
        CommConfig {
            gdr_flush: comm_flush,
            ..CommConfig::default()
        },
    )
    .with_props(NetProps {
        max_recvs: sc.max_recvs,
        dmabuf: false,
        sizes: SizeReport::Bytes,
    });
    let c = ProxyConfig {
        gdr_copy_flush: sc.gdc_flush,
        max_net_size: sc.max_net_size,
        ..base
    };
    ProxyState::new(net, mem, c)
}

/// Payload bytes one slice carries.
pub fn slice_payload(sc: &Scenario, v: &DeviceView) -> usize {
    let p = sc.proto.index();
    let room = if sc.shared && sc.proto == Protocol::Simple {
        cfg().p2p_chunk_size
    } else {
        v.buff_sizes[p] / STEPS * sc.slice as usize
    };
    match sc.proto {
        Protocol::Simple => room,
        Protocol::Ll => room / LL_LINE * 8,
        Protocol::Ll128 => room / LL128_LINE * LL128_DATA_ELEMS * 8,
    }
}

/// Wire bytes for `payload` bytes.
fn wire(proto: Protocol, payload: usize) -> usize {
    match proto {
        Protocol::Simple => payload,
        Protocol::Ll => payload.div_ceil(8) * LL_LINE,
        Protocol::Ll128 => payload.div_ceil(LL128_DATA_ELEMS * 8) * LL128_LINE,
    }
}

/// The payload of op `op`, sub `s` (deterministic, 1..=max bytes).
pub fn op_payload(sc: &Scenario, per_slice: usize, op: usize, s: usize) -> usize {
    let max = if sc.reg {
        sc.reg_bytes
    } else {
        per_slice * sc.max_slices
    };
    let x = (op as u64 * 2654435761 + s as u64 * 40503 + 17) % max as u64;
    // Exercise exact multiples of the slice size too.
    if op % 7 == 3 {
        return per_slice.min(max);
    }
    1 + x as usize
}

fn seed(op: usize, s: usize, j: usize) -> u64 {
    ((op as u64) << 32) ^ ((s as u64) << 16) ^ j as u64 ^ 0xabcdef
}

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

/// Writes `payload` into the slot at `addr` in the protocol's format for ring step `k`.
fn write_slot(proto: Protocol, addr: u64, payload: &[u8], k: u64) {
    match proto {
        Protocol::Simple => {
            // SAFETY: `addr` is the slot's place in a live buffer with room for the payload;
            // the proxy does not touch it until the GPU publishes it.
            unsafe {
                std::ptr::copy_nonoverlapping(payload.as_ptr(), addr as *mut u8, payload.len())
            }
        }
        Protocol::Ll => {
            let flag = ll_flag(k) as u64;
            for (i, c) in payload.chunks(8).enumerate() {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                let d1 = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64;
                let d2 = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as u64;
                // SAFETY: line `i` lies inside the slot; 8-byte aligned; the proxy reads these
                // words atomically.
                let w = unsafe { &*((addr + 16 * i as u64) as *const AtomicU64) };
                let w2 = unsafe { &*((addr + 16 * i as u64 + 8) as *const AtomicU64) };
                // Release (both): pair with the proxy's Acquire `BufView::load` in `ll_ready`
                // (`lines.rs`): each word carries its data and flag together.
                w.store(d1 | flag << 32, Ordering::Release);
                w2.store(d2 | flag << 32, Ordering::Release);
            }
        }
        Protocol::Ll128 => {
            let flag = ll128_flag(k);
            for (i, c) in payload.chunks(LL128_DATA_ELEMS * 8).enumerate() {
                let line = addr + (LL128_LINE * i) as u64;
                let mut b = [0u8; LL128_DATA_ELEMS * 8];
                b[..c.len()].copy_from_slice(c);
                for (e, d) in b.chunks(8).enumerate() {
                    // SAFETY: as for LL: inside the slot, aligned, atomic accesses.
                    let w = unsafe { &*((line + 8 * e as u64) as *const AtomicU64) };
                    // Relaxed: published by the Release store of the line's flag below.
                    w.store(u64::from_le_bytes(d.try_into().unwrap()), Ordering::Relaxed);
                }
                // SAFETY: as above; the flag word is stored last, with Release.
                let f = unsafe { &*((line + 8 * LL128_DATA_ELEMS as u64) as *const AtomicU64) };
                // Release: pairs with the proxy's Acquire `BufView::load` of the flag word in
                // `ll128_ready` (`lines.rs`): the line's data words are visible with it.
                f.store(flag, Ordering::Release);
            }
        }
    }
}

/// Reads `len` payload bytes from the slot at `addr`, checking line flags for step `k`.
fn read_slot(proto: Protocol, addr: u64, len: usize, k: u64) -> Vec<u8> {
    let word = |a: u64| {
        // SAFETY: inside a live receive buffer; the data landed before `tail` (acquired).
        // Acquire: stronger than needed: the net copied these bytes in (plain copies) before
        // the proxy's Release store of `tail`, which `arrived`'s `load_step` acquired.
        unsafe { &*(a as *const AtomicU64) }.load(Ordering::Acquire)
    };
    match proto {
        Protocol::Simple => {
            let mut v = vec![0u8; len];
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
            v
        }
        Protocol::Ll => {
            let mut v = Vec::with_capacity(len + 8);
            for i in 0..len.div_ceil(8) as u64 {
                let (a, b) = (word(addr + 16 * i), word(addr + 16 * i + 8));
                assert_eq!(
                    (a >> 32, b >> 32),
                    (ll_flag(k) as u64, ll_flag(k) as u64),
                    "LL flags"
                );
                v.extend_from_slice(&(a as u32).to_le_bytes());
                v.extend_from_slice(&(b as u32).to_le_bytes());
            }
            v.truncate(len);
            v
        }
        Protocol::Ll128 => {
            let mut v = Vec::with_capacity(len + 128);
            for i in 0..len.div_ceil(LL128_DATA_ELEMS * 8) as u64 {
                let line = addr + LL128_LINE as u64 * i;
                assert_eq!(
                    word(line + 8 * LL128_DATA_ELEMS as u64),
                    ll128_flag(k),
                    "LL128 flag"
                );
                for e in 0..LL128_DATA_ELEMS as u64 {
                    v.extend_from_slice(&word(line + 8 * e).to_le_bytes());
                }
            }
            v.truncate(len);
            v
        }
    }
}

/// Per-sub cursor of a simulated GPU.
#[derive(Clone, Copy, Default)]
struct Cursor {
    op: usize,
    j: usize,
    base: u64,
    started: bool,
}

fn slot_addr(sc: &Scenario, v: &DeviceView, k: u64, offset: u32) -> u64 {
    let p = sc.proto.index();
    if sc.shared && sc.proto == Protocol::Simple {
        v.buffs[p] + offset as u64
    } else {
        v.buffs[p] + (k % STEPS as u64) * (v.buff_sizes[p] / STEPS) as u64
    }
}

/// The sending GPU: fills every slice of every op of every sub, round-robin, never blocking;
/// returns when done or when `stop` is set.
pub fn gpu_send(sc: Scenario, views: Vec<DeviceView>, ubufs: Vec<u64>, stop: &AtomicBool) {
    let devs: Vec<DeviceSend> = views
        .iter()
        // SAFETY: the connections stay connected until the proxy thread joins this thread.
        .map(|v| unsafe { DeviceSend::from_view(v) }.unwrap())
        .collect();
    let per = slice_payload(&sc, &views[0]);
    let mut cur = vec![Cursor::default(); sc.nsubs];
    let mut finished = 0;
    // Relaxed: a bare stop flag; nothing is published through it (the joins order the rest).
    while finished < sc.nsubs && !stop.load(Ordering::Relaxed) {
        let mut moved = false;
        for s in 0..sc.nsubs {
            let c = &mut cur[s];
            if c.op == sc.ops {
                continue;
            }
            let d = &devs[s];
            let total = op_payload(&sc, per, c.op, s);
            if sc.reg {
                if !c.started {
                    if !d.has_credit(c.base) {
                        continue;
                    }
                    let mut data = vec![0u8; total];
                    fill_pattern(&mut data, seed(c.op, s, 0));
                    // SAFETY: the user buffer is ours until we publish it.
                    unsafe {
                        std::ptr::copy_nonoverlapping(data.as_ptr(), ubufs[s] as *mut u8, total)
                    };
                    d.publish(c.base, total as u64);
                    d.advance(c.base + 1);
                    c.started = true;
                    moved = true;
                } else if !d.pending(c.base) {
                    c.started = false;
                    c.op += 1;
                    c.base = round_up(c.base + 1, sc.chunk);
                    moved = true;
                    if c.op == sc.ops {
                        finished += 1;
                    }
                }
                continue;
            }
            let nslices = total.div_ceil(per);
            let k = c.base + c.j as u64 * sc.slice;
            if !d.has_credit(k + sc.slice - 1) {
                continue;
            }
            let len = per.min(total - c.j * per);
            let mut data = vec![0u8; len];
            fill_pattern(&mut data, seed(c.op, s, c.j));
            write_slot(
                sc.proto,
                slot_addr(&sc, &views[s], k, d.offset(k)),
                &data,
                k,
            );
            d.publish(k, wire(sc.proto, len) as u64);
            if sc.proto != Protocol::Ll {
                d.advance(k + sc.slice);
            }
            moved = true;
            c.j += 1;
            if c.j == nslices {
                c.j = 0;
                c.base = round_up(c.base + (nslices as u64) * sc.slice, sc.chunk);
                c.op += 1;
                if c.op == sc.ops {
                    finished += 1;
                }
            }
        }
        if !moved {
            std::thread::yield_now();
        }
    }
}

/// The receiving GPU: waits for each slice, verifies it byte for byte, consumes it; returns
/// the bytes verified when done or when `stop` is set.
pub fn gpu_recv(sc: Scenario, views: Vec<DeviceView>, ubufs: Vec<u64>, stop: &AtomicBool) -> u64 {
    let devs: Vec<DeviceRecv> = views
        .iter()
        // SAFETY: as in `gpu_send`.
        .map(|v| unsafe { DeviceRecv::from_view(v) }.unwrap())
        .collect();
    let per = slice_payload(&sc, &views[0]);
    let mut cur = vec![Cursor::default(); sc.nsubs];
    let mut finished = 0;
    let mut verified = 0u64;
    // Relaxed: a bare stop flag, as in `gpu_send`.
    while finished < sc.nsubs && !stop.load(Ordering::Relaxed) {
        let mut moved = false;
        for s in 0..sc.nsubs {
            let c = &mut cur[s];
            if c.op == sc.ops {
                continue;
            }
            let d = &devs[s];
            let total = op_payload(&sc, per, c.op, s);
            if sc.reg {
                if !c.started {
                    d.ready(c.base, total as u64);
                    c.started = true;
                    moved = true;
                } else if d.arrived(c.base) {
                    assert!(!d.pending(c.base), "size reset before tail");
                    let got = read_slot(Protocol::Simple, ubufs[s], total, c.base);
                    let mut want = vec![0u8; total];
                    fill_pattern(&mut want, seed(c.op, s, 0));
                    assert!(got == want, "op {} sub {s}: registered data differs", c.op);
                    verified += total as u64;
                    d.consume(c.base + 1);
                    c.started = false;
                    c.op += 1;
                    c.base = round_up(c.base + 1, sc.chunk);
                    moved = true;
                    if c.op == sc.ops {
                        finished += 1;
                    }
                }
                continue;
            }
            let nslices = total.div_ceil(per);
            let k = c.base + c.j as u64 * sc.slice;
            if !d.arrived(k) {
                continue;
            }
            let len = per.min(total - c.j * per);
            let got = read_slot(sc.proto, slot_addr(&sc, &views[s], k, d.offset(k)), len, k);
            let mut want = vec![0u8; len];
            fill_pattern(&mut want, seed(c.op, s, c.j));
            assert!(
                got == want,
                "op {} sub {s} slice {}: data differs",
                c.op,
                c.j
            );
            verified += len as u64;
            d.consume(k + sc.slice);
            moved = true;
            c.j += 1;
            if c.j == nslices {
                c.j = 0;
                c.base = round_up(c.base + (nslices as u64) * sc.slice, sc.chunk);
                c.op += 1;
                if c.op == sc.ops {
                    finished += 1;
                }
            }
        }
        if !moved {
            std::thread::yield_now();
        }
    }
    verified
}

/// The connections and user buffers one operation runs over.
#[derive(Clone, Copy)]
pub struct OpIo<'a> {
    /// Send connections, one per sub.
    pub sends: &'a [ConnId],
    /// Receive connections, one per sub.
    pub recvs: &'a [ConnId],
    /// Send user buffers (registered scenarios).
    pub su: &'a [u64],
    /// Receive user buffers (registered scenarios).
    pub ru: &'a [u64],
}

/// Drives operation `op` of `sc` (a send op and a receive op over every sub) to completion
/// on this thread, calling `check` every 1,024 rounds (a watch on the GPU side; its error
/// ends the op). Checks the bytes each sub moved; returns the largest receive group.
/// Allocates nothing.
pub fn drive_op<D: Fabric, M: MemProvider, P: Profiler>(
    px: &mut PxWith<D, M>,
    sc: &Scenario,
    op: usize,
    per: usize,
    io: OpIo<'_>,
    prof: &mut P,
    check: &mut dyn FnMut() -> Result<()>,
) -> Result<usize> {
    let mut so = ProxyOp::new(Dir::Send, sc.proto, sc.slice, sc.chunk)?;
    let mut ro = ProxyOp::new(Dir::Recv, sc.proto, sc.slice, sc.chunk)?;
    for s in 0..sc.nsubs {
        let total = op_payload(sc, per, op, s);
        if sc.reg {
            so.push(SubArgs::registered(io.sends[s], io.su[s], total))?;
            ro.push(SubArgs::registered(io.recvs[s], io.ru[s], total))?;
        } else {
            let nsteps = total.div_ceil(per) as u64 * sc.slice;
            let nbytes = wire(sc.proto, total);
            so.push(SubArgs::new(io.sends[s], nsteps, nbytes))?;
            ro.push(SubArgs::new(io.recvs[s], nsteps, nbytes))?;
        }
    }
    let (mut sd, mut rd) = (false, false);
    let mut spins = 0u64;
    while !(sd && rd) {
        if !sd {
            sd = px.progress_with(&mut so, prof)?.done;
        }
        if !rd {
            rd = px.progress_with(&mut ro, prof)?.done;
        }
        spins += 1;
        if spins & 63 == 0 {
            std::thread::yield_now();
        }
        if spins & 1023 == 0 {
            if let Err(e) = check() {
                let _ = px.abort(&mut so);
                let _ = px.abort(&mut ro);
                return Err(e);
            }
        }
        assert!(spins < 200_000_000, "op {op} stuck");
    }
    let grouped = ro.groups().iter().any(|g| g.1 > 1);
    for s in 0..sc.nsubs {
        if grouped && !sc.reg {
            // A multi-receive over ibnet's comms reports 0/1 per buffer: the engine
            // counts the posted size for a non-empty one.
            assert!(ro.bytes(s) >= so.bytes(s), "op {op} sub {s}: bytes moved");
        } else {
            assert_eq!(so.bytes(s), ro.bytes(s), "op {op} sub {s}: bytes moved");
        }
    }
    Ok(ro.groups().iter().map(|g| g.1).max().unwrap_or(0))
}

/// Runs a scenario end to end over the loopback double on a big-stack thread; returns what it
/// measured.
pub fn run(sc: Scenario) -> Report {
    run_with(sc, &mut ibnet_proxy::NoProfiler)
}

/// [`run`] over the provider `open` returns (called on the run's thread); the provider's own
/// objects are not counted (the engine's, the net's and the memory's are).
pub fn run_on<D: Fabric>(open: impl FnOnce() -> D + Send, sc: Scenario) -> Report {
    run_on_with(open, no_leak_count, sc, &mut ibnet_proxy::NoProfiler)
}

/// [`run`] with a profiler (which must be `Send` to cross into the test thread).
pub fn run_with<P: Profiler + Send>(sc: Scenario, prof: &mut P) -> Report {
    run_on_with(Loopback::new, loopback_leaks, sc, prof)
}

/// [`run_on`] with a leak count of the provider and a profiler.
pub fn run_on_with<D: Fabric, P: Profiler + Send>(
    open: impl FnOnce() -> D + Send,
    leaks: Leaks<D>,
    sc: Scenario,
    prof: &mut P,
) -> Report {
    std::thread::scope(|t| {
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn_scoped(t, move || run_inner(open(), leaks, sc, prof))
            .unwrap()
            .join()
            .unwrap()
    })
}

fn run_inner<D: Fabric, P: Profiler>(
    dev: D,
    leaks: Leaks<D>,
    sc: Scenario,
    prof: &mut P,
) -> Report {
    let mut px = new_px_on(dev, &sc, sc.need_flush && !sc.gdc_flush);
    let (sends, recvs) = connect_pairs(&mut px, &sc).expect("connect");
    let sv: Vec<DeviceView> = sends.iter().map(|&s| px.device_view(s).unwrap()).collect();
    let rv: Vec<DeviceView> = recvs.iter().map(|&r| px.device_view(r).unwrap()).collect();
    let per = slice_payload(&sc, &sv[0]);
    let sbufs: Vec<AlignedBuf> = (0..sc.nsubs)
        .map(|_| AlignedBuf::new(sc.reg_bytes.max(1)))
        .collect();
    let rbufs: Vec<AlignedBuf> = (0..sc.nsubs)
        .map(|_| AlignedBuf::new(sc.reg_bytes.max(1)))
        .collect();
    let su: Vec<u64> = sbufs.iter().map(AlignedBuf::addr).collect();
    let ru: Vec<u64> = rbufs.iter().map(AlignedBuf::addr).collect();
    let stop = AtomicBool::new(false);
    let mut report = Report::default();
    let verified = std::thread::scope(|t| {
        let (sv2, rv2, su2, ru2) = (sv.clone(), rv.clone(), su.clone(), ru.clone());
        let stop = &stop;
        let gs = t.spawn(move || gpu_send(sc, sv2, su2, stop));
        let gr = t.spawn(move || gpu_recv(sc, rv2, ru2, stop));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for op in 0..sc.ops {
                let io = OpIo {
                    sends: &sends,
                    recvs: &recvs,
                    su: &su,
                    ru: &ru,
                };
                let g = drive_op(&mut px, &sc, op, per, io, prof, &mut || Ok(())).expect("op");
                if op == 0 {
                    report.groups_max = g;
                }
                report.ops += 1;
            }
        }));
        if r.is_err() {
            // Relaxed: a bare flag the GPU threads poll; nothing is published through it (the
            // joins below order what they did).
            stop.store(true, Ordering::Relaxed);
        }
        gs.join().unwrap();
        let v = gr.join().unwrap();
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
        v
    });
    report.bytes_verified = verified;
    report.flush_reads = px.mem().flush_reads.get();
    for (&s, &r) in sends.iter().zip(&recvs) {
        px.free(s).expect("free send");
        px.free(r).expect("free recv");
    }
    assert_eq!(
        px.live(),
        (0, 0, 0),
        "connections, pools, shared comms left"
    );
    assert_eq!(px.mem().live(), 0, "memory left");
    assert_eq!(px.net().live_comms(), (0, 0), "comms left");
    assert_eq!(
        px.net().live_listens_and_mrs(),
        (0, 0),
        "listeners/registrations left"
    );
    if let Some(l) = leaks(px.net().provider()) {
        assert_eq!(l, (0, 0), "provider registrations/QPs left");
    }
    report
}
