//! # ibnet-soft
//!
//! A software RDMA provider: the core's [`Provider`] trait with the semantics of RC queue pairs,
//! for hosts without an RDMA NIC. One device, `soft0`, port 1, link layer Ethernet (RoCE-like),
//! GID `::ffff:127.0.0.1` (another with `IBNET_SOFT_GIDS`, [`gids`]), MTU 4096. Same host only.
//!
//! ```text
//!  SoftProvider (Arc handle) ── segment (memfd): registration table + QP receive blocks
//!     │                           ▲ mapped read-write by connected peers
//!     ├─ copy engine: worker threads for chunks of large WRs
//!     └─ monitor thread: pidfds of cross-process peers (liveness)
//!
//!  initiator QP ──post_send──▶ lease(local lkey) + lease(remote rkey) ──▶ copy
//!                       in-process: atomic word copy (≤ 16 KiB) or process_vm_writev into our
//!                       own pid │ cross-process: process_vm_writev/readv, or word stores
//!                       through the peer's mapped segment for its FIFO rings (`alloc_fifo`)
//!              ──combiner──▶ WRITE_WITH_IMM: ring entry + recv_tail in the target's QP block
//!  target  CQ  ──poll_cq──▶ harvests its QPs: retired sends, delivered receives
//! ```
//!
//! ## Quick start (what `ibnet-ffi` does)
//! ```no_run
//! use ibnet_core::provider::Provider;
//! ibnet_soft::probe().map_err(|u| u.to_string())?; // cross-process fabric usable?
//! // ffi passes its one reader of the environment; log `warnings` as WARNs
//! let (cfg, warnings) = ibnet_soft::Config::from_lookup(|k| std::env::var(k).ok());
//! let p = ibnet_soft::SoftProvider::open_with(cfg).map_err(|e| e.to_string())?;
//! let info = p.port_info(); // LID/GID/MTU and the opaque address for the handshake
//! // ... comms over `p.clone()` ...
//! p.shutdown(); // joins every thread; also done when the last handle drops
//! # Ok::<(), String>(())
//! ```
//!
//! ## Fabrics
//! The fabric is chosen at `connect_qp` from the peer's address: same pid → **in-process**
//! (memory copies; the peer's segment is found in a process-wide registry), otherwise
//! **cross-process** through cross-memory attach, with the peer's segment mapped through
//! `/proc/<pid>/fd/<fd>`.
//!
//! ## Memory safety
//! `reg_mr` prefaults the range (`MADV_POPULATE_WRITE`/`READ`, as verbs pins pages): an
//! unmapped range, or one without the access asked for, fails with `Error::Provider` and
//! `EFAULT`. Every copy runs under *leases* on the local registration (lkey) and the remote one (rkey),
//! taken from the owners' registration tables in shared memory (see `segment`): key, range and
//! access are checked before any byte moves, and deregistration waits until no lease is held.
//! Leases of a peer process that has exited (killed mid-copy) are void: `dereg_mr` finds the
//! process gone (pidfd) and succeeds at once. A live peer holding a lease past 1 s (stopped,
//! stuck) makes the slot quarantined and `dereg_mr` fail with `EBUSY`: the memory must then
//! never be reused, since that peer may still write into it. A failed check completes the WR
//! with `LocalProtectionError` / `RemoteAccessError` and moves the QP to the error state; a
//! failure on the target's side (remote access: stale or deregistered rkey, range, access)
//! moves the target's QP to the error state too, as RC does: its posted receives complete with
//! `WrFlushError`.
//! Copies never race with concurrent atomic readers of the destination (a FIFO ring): in-process
//! copies of up to 16 KiB and writes into a peer's FIFO rings (which live in its shared segment)
//! use atomic word stores; bounce payloads (whose readers learn of them through a later
//! Release store, never by watching the bytes) are one opaque bulk copy (`rep movsb` on
//! x86-64); all other copies go through the kernel. Registered memory must stay
//! mapped until it is deregistered (as with verbs, where an MR pins the pages): a kernel copy
//! over memory unmapped meanwhile fails with `EFAULT` (`RemoteAccessError`), but a small
//! in-process copy would fault.
//!
//! ## Liveness
//! A monitor thread polls the pidfds of cross-process peers every 50 ms. Once a peer is dead
//! every outstanding WR of the QPs connected to it, sends and receives, completes with
//! `RetryExceeded` at the next `poll_cq`; later WRs complete with `WrFlushError`. A copy that
//! hits a vanished process (`ESRCH`) does the same at once.
//!
//! ## Cross-memory attach permission
//! With Yama `ptrace_scope = 1` sibling processes (torchrun ranks) may not attach to each
//! other. Unless `IBNET_SOFT_PTRACER=0`, [`SoftProvider::open_with`] calls
//! `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`: **security trade-off** — any process of the
//! same user may then ptrace this process (as with `ptrace_scope = 0`); processes of other
//! users still may not. [`probe`] tells whether the fabric can work, naming cause and fix.
//!
//! ## Threads and cleanup
//! `open` starts the copy-engine workers ([`Config::workers`]); the monitor starts with the
//! first cross-process peer. [`SoftProvider::shutdown`] joins all of them; dropping the last
//! handle does the same. Objects (QPs, MRs) release their resources on drop.
//!
//! ## Capacity
//! [`MAX_QPS`] QPs per provider (2 × 1024 comms × 129 QPs: the plugin's `maxComms` as send
//! and receive comms at `NCCL_IB_QPS_PER_CONNECTION=128`, plus a flush QP each); 65,535 memory
//! registrations. The segment is sparse: an idle QP costs its 192-byte head there (and ~1 KiB
//! of heap), its 16 KiB receive ring only once used, and nothing after it is destroyed.
//!
//! ## Fault injection
//! `IBNET_SOFT_FAULTS` (off by default) arms seeded faults for tests: failed WRs with a chosen
//! status, delayed or reordered completions, corrupted FIFO elements, failed registrations,
//! and a process that kills itself; see [`faults`] for the grammar and what each fault does.
//!
//! ## Not supported
//! DMA-BUF registrations (host memory only), other hosts, sends/receives with SGEs (only
//! zero-SGE receives consumed by writes with immediate, as ibnet uses).
#![warn(missing_docs)]
#![deny(unsafe_code)]

mod addr;
pub mod budget;
mod config;
#[cfg(loom)]
#[doc(hidden)]
pub mod cq;
#[cfg(not(loom))]
mod cq;
mod engine;
pub mod faults;
mod fifo;
pub mod gids;
mod hint;
mod idx;
mod inject;
#[cfg(loom)]
#[doc(hidden)]
pub mod lease;
#[cfg(not(loom))]
mod lease;
mod peer;
mod probe;
mod qp;
#[cfg(loom)]
#[doc(hidden)]
pub mod ring;
#[cfg(not(loom))]
mod ring;
mod segment;
#[cfg(loom)]
#[doc(hidden)]
pub mod sq;
#[cfg(not(loom))]
mod sq;
mod sys;
mod zeroed;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ibnet_core::provider::{
    Access, AsyncFailure, Completion, ConnectAttr, DevName, Gid, LinkLayer, MrKeys, Mtu, PortInfo,
    Provider, ProviderAddr, QpAttr, RegKind, SendWr,
};
use ibnet_core::{Error, Result};

pub use addr::SoftAddr;
pub use config::Config;
pub use cq::SoftCq;
pub use fifo::SoftFifo;
use idx::IdxAlloc;
pub use peer::CMA_REFUSED;
pub use probe::{probe, probe_with, ptrace_scope, Unavailable};
pub use segment::BOUNCE_MAX;

use crate::engine::Engine;
use crate::peer::{Monitor, Peer};
use crate::qp::{QpShared, Remote};
use crate::segment::{Segment, FIFO_SLOTS, MR_SLOTS, QP_IDX_BITS, QP_SLOTS, RING};

/// The first device's name (device `i` of [`SoftProvider::open_as`] is `soft{i}`).
pub const DEVICE_NAME: &str = "soft0";
/// The speed a soft device reports by default (Mb/s): a same-host memory copy, faster than
/// any NIC port NCCL would compare it with.
pub const DEFAULT_SPEED_MBPS: u32 = 100_000;
/// Largest `max_send_wr`.
pub const MAX_SEND_WR: u32 = 1 << 16;
/// Largest `max_recv_wr`.
pub const MAX_RECV_WR: u32 = RING as u32;
/// Largest `max_inline`.
pub const MAX_INLINE: u32 = 1024;
/// QPs one provider holds at once: 2 × 1024 comms (the plugin's `maxComms`, send and receive
/// comms) × 129 QPs each (`NCCL_IB_QPS_PER_CONNECTION` ≤ 128, plus a flush QP), as far as the
/// memory budget (`IBNET_SOFT_MEM`, [`budget`]) allows. An idle QP costs ~1.5 KiB of heap and a
/// 192-byte head in the segment; its queues (64 KiB of send queue at 512 WRs, lazily
/// committed) and its 16 KiB receive ring only as far as they are used.
pub const MAX_QPS: usize = QP_SLOTS - 1;
/// Largest CQ depth.
pub const MAX_CQ_DEPTH: u32 = 1 << 20;
/// Generations of a QP slot (5 bits above the index: QP numbers stay within 24 bits).
const QP_GEN_MASK: u8 = (1 << (24 - QP_IDX_BITS)) - 1;
/// How long `dereg_mr` waits for peers' in-flight copies.
const DEREG_WAIT: Duration = Duration::from_secs(1);

struct Inner {
    /// `soft0`.. (see [`SoftProvider::open_as`]).
    name: DevName,
    seg: Arc<Segment>,
    addr: ProviderAddr,
    host: u64,
    cfg: Config,
    qps: Arc<Mutex<IdxAlloc>>,
    mrs: Arc<Mutex<IdxAlloc>>,
    fifos: Arc<Mutex<IdxAlloc>>,
    engine: Engine<QpShared>,
    monitor: Monitor,
    peers: Mutex<Vec<std::sync::Weak<Peer>>>,
    shut: AtomicBool,
    /// A device-fatal event was raised ([`SoftProvider::raise_device_fatal`]).
    fatal: AtomicBool,
    /// The speed the device reports, Mb/s ([`SoftProvider::set_speed_mbps`]).
    speed: AtomicU32,
    /// Armed `IBNET_SOFT_FAULTS`, if any.
    inject: Option<Arc<inject::Inject>>,
    /// The QPs' memory budget (`IBNET_SOFT_MEM`).
    budget: Arc<budget::Budget>,
    /// The GID the device reports (`IBNET_SOFT_GIDS`).
    gid: Gid,
}

impl Inner {
    fn shutdown(&self) {
        // Release: pairs with the Acquire in `check_open`.
        self.shut.store(true, Ordering::Release);
        self.engine.shutdown();
        self.monitor.stop();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The soft provider: a cheap, clonable handle to one opened `soft0` port.
///
/// Thread safety: the handle is `Send + Sync`; per-object exclusivity follows the trait's
/// `&mut` (a QP is posted to by one thread at a time, a CQ polled by one thread at a time).
#[derive(Clone)]
pub struct SoftProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SoftProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftProvider({}, {:?})", self.inner.name, self.inner.seg)
    }
}

/// A queue pair of the soft provider. Dropping it destroys it.
pub struct SoftQp {
    sh: Arc<QpShared>,
    qps: Arc<Mutex<IdxAlloc>>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.sh.destroy();
        self.sh.cq.detach(&self.sh);
        let mut a = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        a.free(self.sh.idx as u32);
    }
}

/// Registrations of every soft provider of the process not yet deregistered (or dropped).
static LIVE_MRS: AtomicUsize = AtomicUsize::new(0);

/// How many registrations of any soft provider of this process are live: made by `reg_mr`
/// and not yet deregistered or dropped (a snapshot, for tests and diagnostics: a plugin that
/// leaves registrations behind across its lives shows here).
pub fn live_registrations() -> usize {
    // Relaxed: a statistics counter; nothing is read through it.
    LIVE_MRS.load(Ordering::Relaxed)
}

/// A memory registration of the soft provider. Dropping it deregisters it.
pub struct SoftMr {
    seg: Arc<Segment>,
    mrs: Arc<Mutex<IdxAlloc>>,
    idx: u32,
    key: u32,
}

impl SoftMr {
    fn release(&mut self) -> bool {
        if self.idx == 0 {
            return true;
        }
        // Relaxed: a statistics counter (`live_registrations`); nothing is read through it.
        LIVE_MRS.fetch_sub(1, Ordering::Relaxed);
        let drained = self.seg.dereg(self.idx as usize, DEREG_WAIT);
        if drained {
            self.mrs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .free(self.idx);
        } // else: quarantined, never reused (a peer died holding a lease, or is stopped)
        self.idx = 0;
        drained
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.release();
    }
}

fn random_nonce() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    // Relaxed: only uniqueness matters.
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_i32(sys::getpid());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

fn io_err(call: &'static str, e: std::io::Error) -> Error {
    Error::Provider {
        call,
        errno: e.raw_os_error().unwrap_or(0),
    }
}

impl SoftProvider {
    /// Opens `soft0` with the default configuration (the plugin passes the environment's
    /// through [`Config::from_lookup`] and [`SoftProvider::open_with`]).
    pub fn open() -> Result<Self> {
        Self::open_with(Config::default())
    }

    /// Opens `soft0` with `cfg`: creates the shared segment, starts the copy engine and, unless
    /// `cfg.set_ptracer` is false, allows same-user processes to attach (see the crate doc).
    pub fn open_with(cfg: Config) -> Result<Self> {
        Self::open_as(cfg, 0)
    }

    /// Opens device `soft{index}` with `cfg`, as [`open_with`](Self::open_with) (the plugin
    /// opens several, each its own provider, with `IBNET_SOFT_DEVICES`). The index only names
    /// the device: [`device_name`](Self::device_name) and the `hca` of completion errors.
    pub fn open_as(cfg: Config, index: u8) -> Result<Self> {
        if cfg.set_ptracer {
            // EINVAL without Yama: nothing to relax, fine.
            let _ = sys::set_ptracer_any();
        }
        let nonce = random_nonce();
        let seg = Arc::new(Segment::create(nonce).map_err(|e| io_err("memfd segment", e))?);
        peer::register_local(&seg);
        let host = addr::host_id();
        let addr = SoftAddr {
            host,
            pid: seg.pid,
            fd: seg.fd_num(),
            nonce,
            magic_addr: seg.magic_addr(),
        }
        .encode();
        let engine = Engine::start(cfg.workers, Duration::from_micros(cfg.spin_us))?;
        Ok(Self {
            inner: Arc::new(Inner {
                name: DevName::new(&format!("soft{index}")),
                seg,
                addr,
                host,
                cfg,
                qps: Arc::new(Mutex::new(IdxAlloc::new(QP_SLOTS))),
                mrs: Arc::new(Mutex::new(IdxAlloc::new(MR_SLOTS))),
                fifos: Arc::new(Mutex::new(IdxAlloc::new(FIFO_SLOTS))),
                engine,
                monitor: Monitor::default(),
                peers: Mutex::new(Vec::new()),
                shut: AtomicBool::new(false),
                fatal: AtomicBool::new(false),
                speed: AtomicU32::new(DEFAULT_SPEED_MBPS),
                inject: inject::Inject::new(cfg.faults),
                budget: Arc::new(budget::Budget::new(cfg.mem, cfg.bounce_max)),
                gid: gids::of(&cfg.gids, index),
            }),
        })
    }

    /// The device name, `soft0` (or `soft{index}` of [`open_as`](Self::open_as)).
    pub fn device_name(&self) -> &str {
        self.inner.name.as_str()
    }

    /// The configuration in force.
    pub fn config(&self) -> Config {
        self.inner.cfg
    }

    /// The QPs' memory budget (`IBNET_SOFT_MEM`, less the bounce slots) and what live QPs
    /// hold of it now, in bytes.
    pub fn qp_memory(&self) -> (u64, u64) {
        let b = &self.inner.budget;
        (b.cap(), b.held())
    }

    /// The speed this device reports (Mb/s; [`DEFAULT_SPEED_MBPS`] unless set): the plugin's
    /// `speed` property and a fused comm's stripe weight for the rail.
    pub fn speed_mbps(&self) -> u32 {
        // Relaxed: pairs with the Relaxed store in `set_speed_mbps`; a value with nothing
        // behind it, read on the control path (properties, comm setup).
        self.inner.speed.load(Ordering::Relaxed)
    }

    /// Makes this device report `mbps` (a knob: soft devices of unequal speeds stand in for
    /// unequal NICs, e.g. to test weighted striping). Comms made before keep their weights.
    pub fn set_speed_mbps(&self, mbps: u32) {
        // Relaxed: see `speed_mbps`.
        self.inner.speed.store(mbps, Ordering::Relaxed);
    }

    /// Raises a device-fatal event on this device, as `IBV_EVENT_DEVICE_FATAL` does on a real
    /// NIC (a test hook): from now on [`Provider::async_failure`] reports
    /// [`AsyncFailure::Device`] for every comm on it, so each comm's next data call fails. It
    /// cannot be undone (a fatal device stays dead, as in verbs).
    pub fn raise_device_fatal(&self) {
        // Release: pairs with the Acquire load in `async_failure`; no data rides on it.
        self.inner.fatal.store(true, Ordering::Release);
    }

    /// Stops and joins every thread of the provider (copy engine, monitor). Idempotent. Call it
    /// after every comm is closed (the ffi's finalize); afterwards posts fail with `BadState`.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    #[inline]
    fn check_open(&self, op: &'static str) -> Result<()> {
        // Acquire: pairs with the Release in `shutdown`.
        if self.inner.shut.load(Ordering::Acquire) {
            return Err(Error::BadState {
                op,
                state: "provider shut down",
            });
        }
        Ok(())
    }

    fn peer_for(&self, a: &SoftAddr) -> Result<Arc<Peer>> {
        let mut peers = self.inner.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|w| w.strong_count() > 0);
        if let Some(p) = peers
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .find(|p| p.seg.nonce == a.nonce && p.seg.pid == a.pid && !p.is_dead())
        {
            return Ok(p);
        }
        let p = peer::resolve(a, self.inner.seg.nonce)?;
        self.inner.monitor.watch(&p)?;
        peers.push(Arc::downgrade(&p));
        Ok(p)
    }
}

fn range(what: &'static str, v: u32, min: u32, max: u32) -> Result<()> {
    if v < min || v > max {
        return Err(Error::OutOfRange {
            what,
            value: v as i64,
            min: min as i64,
            max: max as i64,
        });
    }
    Ok(())
}

impl Provider for SoftProvider {
    type Cq = SoftCq;
    type Qp = SoftQp;
    type Mr = SoftMr;
    type Fifo = SoftFifo;

    fn dev_name(&self) -> DevName {
        self.inner.name
    }

    fn port_info(&self) -> PortInfo {
        PortInfo {
            port: 1,
            link_layer: LinkLayer::Ethernet,
            lid: 0,
            gid: self.inner.gid,
            gid_index: 0,
            mtu: Mtu::M4096,
            addr: self.inner.addr,
        }
    }

    fn alloc_fifo(&self) -> Result<Self::Fifo> {
        Ok(SoftFifo::alloc(&self.inner.seg, &self.inner.fifos))
    }

    fn create_cq(&self, depth: u32) -> Result<Self::Cq> {
        self.check_open("create_cq")?;
        range("CQ depth", depth, 1, MAX_CQ_DEPTH)?;
        let slot = self.inner.budget.take_cq()?;
        let mut cq = SoftCq::new(depth, self.inner.inject.clone());
        cq._slot = Some(slot);
        Ok(cq)
    }

    fn create_qp(&self, cq: &Self::Cq, attr: &QpAttr) -> Result<Self::Qp> {
        self.check_open("create_qp")?;
        range("max_send_wr", attr.max_send_wr, 1, MAX_SEND_WR)?;
        range("max_recv_wr", attr.max_recv_wr, 1, MAX_RECV_WR)?;
        range("max_inline", attr.max_inline, 0, MAX_INLINE)?;
        let i = &self.inner;
        // Before anything is allocated: past the budget, nothing is.
        let held = i
            .budget
            .take(budget::qp_bytes(attr.max_send_wr, attr.max_recv_wr))?;
        let (idx, gen) = {
            let mut a = i.qps.lock().unwrap_or_else(|e| e.into_inner());
            let idx = a.alloc("soft QP table")?;
            let g = &mut a.gens[idx as usize];
            *g = (g.wrapping_add(1) & QP_GEN_MASK).max(1);
            (idx, *g)
        };
        let qpn = ((gen as u32) << QP_IDX_BITS) | idx;
        let b = i.seg.qp_block(idx as usize);
        // Relaxed: published by the Release store of `state` below.
        b.recv_posted.store(0, Ordering::Relaxed);
        b.error.store(0, Ordering::Relaxed);
        b.bounce_done.store(0, Ordering::Relaxed);
        i.seg.clear_ring(idx as usize); // reads as zeros; no page touched
                                        // Release: pairs with the initiator's Acquire of `state` (connect and `deliver`).
        b.state.store(qpn as u64, Ordering::Release);
        let sh = Arc::new(
            QpShared::new(
                qpn,
                idx as usize,
                i.seg.clone(),
                cq.sh.clone(),
                attr,
                &i.cfg,
            )
            .with_faults(i.inject.clone())
            .with_budget(held),
        );
        cq.sh.attach(sh.clone());
        Ok(SoftQp {
            sh,
            qps: i.qps.clone(),
        })
    }

    fn qp_num(&self, qp: &Self::Qp) -> u32 {
        qp.sh.qpn
    }

    /// RESET → RTS again: the QP is made anew in its own slot, with its own QP number (so the
    /// peer's `remote_qpn` still names it), its queues empty, and connected as `attr` says;
    /// what the old one had outstanding is dropped (its CQ reservations given back) and the
    /// old one is destroyed as `destroy_qp` would (`QpShared::destroy`). A peer still using
    /// the old QP's counters must reset its own QP too before they exchange anything.
    fn reset_qp(&self, qp: &mut Self::Qp, attr: &ConnectAttr) -> Result<()> {
        self.check_open("reset_qp")?;
        let i = &self.inner;
        let qattr = qp.sh.attr();
        let held = i
            .budget
            .take(budget::qp_bytes(qattr.max_send_wr, qattr.max_recv_wr))?;
        let (qpn, idx, cq) = (qp.sh.qpn, qp.sh.idx, qp.sh.cq.clone());
        qp.sh.destroy();
        cq.detach(&qp.sh);
        let b = i.seg.qp_block(idx);
        // Relaxed: published by the Release store of `state` below.
        b.recv_posted.store(0, Ordering::Relaxed);
        b.error.store(0, Ordering::Relaxed);
        b.bounce_done.store(0, Ordering::Relaxed);
        i.seg.clear_ring(idx);
        // Release: pairs with the initiator's Acquire of `state` (connect and `deliver`).
        b.state.store(qpn as u64, Ordering::Release);
        let sh = Arc::new(
            QpShared::new(qpn, idx, i.seg.clone(), cq.clone(), &qattr, &i.cfg)
                .with_faults(i.inject.clone())
                .with_budget(held),
        );
        cq.attach(sh.clone());
        qp.sh = sh;
        self.connect_qp(qp, attr)
    }

    fn connect_qp(&self, qp: &mut Self::Qp, attr: &ConnectAttr) -> Result<()> {
        self.check_open("connect_qp")?;
        let a = SoftAddr::decode(&attr.remote_addr).ok_or(Error::Wire {
            what: "remote address is not an ibnet-soft address",
            value: attr.remote_addr.as_bytes().len() as u64,
        })?;
        if a.host != self.inner.host {
            return Err(Error::Wire {
                what: "peer is on another host (ibnet-soft reaches processes of this host only)",
                value: a.host,
            });
        }
        if attr.link_layer != LinkLayer::Ethernet {
            return Err(Error::Wire {
                what: "link layer (soft0 is Ethernet)",
                value: attr.link_layer as u64,
            });
        }
        let block = (attr.remote_qpn & ((1 << QP_IDX_BITS) - 1)) as usize;
        if block == 0 || block >= QP_SLOTS || attr.remote_qpn >> 24 != 0 {
            return Err(Error::Wire {
                what: "remote QP number",
                value: attr.remote_qpn as u64,
            });
        }
        let peer = self.peer_for(&a)?;
        // Acquire: pairs with the Release store of the QP number at the peer's create_qp.
        if peer.seg.qp_block(block).state.load(Ordering::Acquire) != attr.remote_qpn as u64 {
            return Err(Error::Wire {
                what: "remote QP does not exist",
                value: attr.remote_qpn as u64,
            });
        }
        qp.sh.connect(Remote {
            peer,
            qpn: attr.remote_qpn,
            block,
        })
    }

    #[inline]
    fn post_send(&self, qp: &mut Self::Qp, wrs: &[SendWr]) -> Result<()> {
        self.check_open("post_send")?;
        qp.sh.post(wrs, &self.inner.engine)
    }

    #[inline]
    fn post_recv(&self, qp: &mut Self::Qp, wr_id: u64) -> Result<()> {
        self.check_open("post_recv")?;
        qp.sh.post_recv(wr_id)
    }

    #[inline]
    fn async_failure(&self, _cq: &Self::Cq) -> Option<AsyncFailure> {
        // Acquire: pairs with the Release store in `raise_device_fatal`.
        self.inner
            .fatal
            .load(Ordering::Acquire)
            .then_some(AsyncFailure::Device)
    }

    #[inline]
    fn poll_cq(&self, cq: &mut Self::Cq, out: &mut [Completion]) -> Result<usize> {
        Ok(cq.poll(out))
    }

    fn reg_mr(&self, addr: u64, len: u64, access: Access, kind: RegKind) -> Result<Self::Mr> {
        self.check_open("reg_mr")?;
        if let RegKind::DmaBuf { .. } = kind {
            return Err(Error::Provider {
                call:
                    "reg_mr: DMA-BUF registration is not supported by ibnet-soft (host memory only)",
                errno: libc::EOPNOTSUPP,
            });
        }
        if addr == 0 && len != 0 {
            return Err(Error::Missing {
                what: "reg_mr address",
            });
        }
        if addr.checked_add(len).is_none() {
            return Err(Error::OutOfRange {
                what: "reg_mr length",
                value: len as i64,
                min: 0,
                max: (u64::MAX - addr) as i64,
            });
        }
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        let bits = bit(access.local_write, segment::ACC_LOCAL_WRITE)
            | bit(access.remote_write, segment::ACC_REMOTE_WRITE)
            | bit(access.remote_read, segment::ACC_REMOTE_READ);
        // Like verbs pinning the pages: an unmapped range (a bogus address from C) is a
        // registration error, never a fault in a later copy.
        sys::probe_range(addr, len, access.local_write || access.remote_write).map_err(|e| {
            io_err(
                "reg_mr (range not mapped, or not readable/writable as the access requires)",
                e,
            )
        })?;
        if let Some(f) = &self.inner.inject {
            if f.reg_fails() {
                return Err(Error::Provider {
                    call: "reg_mr (fault injected: IBNET_SOFT_FAULTS reg_fail)",
                    errno: libc::ENOMEM,
                });
            }
        }
        let idx = self
            .inner
            .mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc("soft MR table")?;
        let key = self.inner.seg.reg(idx as usize, addr, len, bits);
        // Relaxed: a statistics counter (`live_registrations`); nothing is read through it.
        LIVE_MRS.fetch_add(1, Ordering::Relaxed);
        Ok(SoftMr {
            seg: self.inner.seg.clone(),
            mrs: self.inner.mrs.clone(),
            idx,
            key,
        })
    }

    fn mr_keys(&self, mr: &Self::Mr) -> MrKeys {
        MrKeys {
            lkey: mr.key,
            rkey: mr.key,
        }
    }

    /// Deregisters `mr`, waiting (≤ 1 s) for copies that hold a lease on it.
    ///
    /// `Err(Error::Provider { call: "dereg_mr (peer still copying)", errno: EBUSY })` when a
    /// lease was still held at the deadline (a stopped or dead peer, or one stuck in a copy):
    /// the key is invalid (no new copy starts) and the slot is quarantined, but a copy already
    /// under way may still write into the memory. **The memory must not be freed or reused**:
    /// treat it as leaked.
    fn dereg_mr(&self, mut mr: Self::Mr) -> Result<()> {
        if mr.release() {
            Ok(())
        } else {
            Err(Error::Provider {
                call: "dereg_mr (peer still copying)",
                errno: libc::EBUSY,
            })
        }
    }

    fn destroy_qp(&self, qp: Self::Qp) -> Result<()> {
        drop(qp);
        Ok(())
    }

    fn destroy_cq(&self, cq: Self::Cq) -> Result<()> {
        if cq.has_qps() {
            return Err(Error::BadState {
                op: "destroy_cq",
                state: "QPs still use this CQ",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dereg_with_a_lease_held_past_the_deadline_is_ebusy_and_quarantines() {
        let p = SoftProvider::open_with(Config {
            workers: 0,
            ..Config::default()
        })
        .unwrap();
        let buf = vec![0u8; 4096];
        let addr = buf.as_ptr() as u64;
        let mr = p.reg_mr(addr, 4096, Access::ALL, RegKind::Plain).unwrap();
        let (key, idx) = (mr.key, mr.idx);
        // A peer's copy in flight, as a stopped (SIGSTOP) peer would leave it.
        let lease = p
            .inner
            .seg
            .lease(key, addr, 8, segment::ACC_REMOTE_WRITE, false)
            .ok()
            .unwrap();
        match p.dereg_mr(mr) {
            Err(Error::Provider { call, errno }) => {
                assert_eq!(errno, libc::EBUSY);
                assert_eq!(call, "dereg_mr (peer still copying)");
            }
            r => panic!("expected EBUSY, got {r:?}"),
        }
        // The key is dead for new copies even though the old lease still exists.
        assert!(p
            .inner
            .seg
            .lease(key, addr, 8, segment::ACC_REMOTE_WRITE, false)
            .is_err());
        drop(lease);
        // The slot stays quarantined: no later registration reuses it.
        let later: Vec<SoftMr> = (0..4)
            .map(|_| p.reg_mr(addr, 4096, Access::ALL, RegKind::Plain).unwrap())
            .collect();
        assert!(later.iter().all(|m| m.idx != idx));
        // Without a lease, deregistration succeeds.
        for m in later {
            p.dereg_mr(m).unwrap();
        }
        drop(buf);
    }
}
