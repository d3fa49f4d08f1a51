//! The provider dispatch: a plugin device ([`Dev`]) and what it makes (send and receive comms,
//! registrations) over whichever provider backs it, `verbs` (libibverbs) or `soft`
//! (ibnet-soft, same host only), plus the per-device registration cache's types.

use std::net::SocketAddr;

use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm, Sink, Truncation};
use ibnet_core::fused::{FusedBuf, RailEvent};
use ibnet_core::fused::{FusedRecv, FusedSend, Resilience, Weights, MAX_DEVS_PER_NIC};
use ibnet_core::policy::props as props_policy;
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::request::ReqId;
use ibnet_core::wire::{QpInfo, RailInfo, RailList, RemoteBuf};
use ibnet_core::{Error, Result};

use ibnet_soft::{SoftMr, SoftProvider};

use crate::verbs::provider::{VMr, VerbsPort};

/// A plugin device: one provider port.
#[derive(Clone)]
pub enum Dev {
    /// A libibverbs port.
    Verbs(VerbsPort),
    /// One of the software provider's devices, `soft0`.. (same host only, host memory only),
    /// with its number (`IBNET_SOFT_DEVICES` opens several, each its own provider instance).
    Soft(SoftProvider, u8),
}

/// The names of the soft devices (`IBNET_SOFT_DEVICES` ≤ 8, a v12 vNIC's devices).
const SOFT_NAMES: [&std::ffi::CStr; 8] = [
    c"soft0", c"soft1", c"soft2", c"soft3", c"soft4", c"soft5", c"soft6", c"soft7",
];

/// A send comm over some provider.
pub enum AnySend {
    /// Over verbs.
    Verbs(SendComm<VerbsPort>),
    /// Over ibnet-soft.
    Soft(SendComm<SoftProvider>),
    /// Fused over verbs devices (boxed: one comm per rail).
    FusedVerbs(Box<FusedSend<VerbsPort>>),
    /// Fused over soft devices.
    FusedSoft(Box<FusedSend<SoftProvider>>),
}

/// A receive comm over some provider.
pub enum AnyRecv {
    /// Over verbs.
    Verbs(RecvComm<VerbsPort>),
    /// Over ibnet-soft.
    Soft(RecvComm<SoftProvider>),
    /// Fused over verbs devices (boxed: one comm per rail).
    FusedVerbs(Box<FusedRecv<VerbsPort>>),
    /// Fused over soft devices.
    FusedSoft(Box<FusedRecv<SoftProvider>>),
}

/// A registration over some provider.
pub enum AnyMr {
    /// Over verbs.
    Verbs(VerbsPort, VMr),
    /// Over ibnet-soft.
    Soft(SoftProvider, SoftMr),
}

/// Slots of a device's registration cache (properties say `regIsGlobal = 1`): 1 MiB. A
/// range may live only in the probe window of [`PROBE`](ibnet_core::mr_cache::PROBE) slots
/// around its hash, so the cache is sized at four times what it promises,
/// [`MR_CACHE_LIVE`], keeping a full window rare (and honestly reported when it happens).
/// It is also how many registrations (`mhandle`s not yet deregistered, each with a record
/// of its own, however many share a range) a device holds at once; one more is an error.
pub const MR_CACHE_CAPACITY: usize = 16384;

/// Live registrations a device's cache holds at least (checked by the `capacity` test).
pub const MR_CACHE_LIVE: usize = 4096;

/// What the registration cache keeps per range: the keys, and the provider's registration,
/// boxed and held as a raw pointer (the cache's values are `Copy`), reclaimed by the
/// cache's `deregister` closure exactly once.
#[derive(Debug, Clone, Copy)]
pub struct CachedMr {
    /// The registration's keys.
    pub keys: MrKeys,
    /// `Box<AnyMr>` as a raw pointer.
    pub raw: usize,
    /// The registered (page-aligned) range.
    pub base: u64,
    /// Its length.
    pub len: u64,
}

/// A device's registration cache.
pub type MrCacheT = ibnet_core::mr_cache::MrCache<CachedMr, MR_CACHE_CAPACITY>;

/// The provider family tag written into connect handles ([`ConnectHandle::provider`]), so a
/// connector on another provider fails at once instead of mid-handshake.
///
/// [`ConnectHandle::provider`]: ibnet_core::wire::ConnectHandle::provider
pub const PROVIDER_TAG_VERBS: u8 = 1;
/// See [`PROVIDER_TAG_VERBS`].
pub const PROVIDER_TAG_SOFT: u8 = 2;

/// QPs one `soft0` provider can hold at once: ibnet-soft's QP table ([`ibnet_soft::MAX_QPS`],
/// filled by soft's own capacity test).
pub const SOFT_QP_BUDGET: i32 = ibnet_soft::MAX_QPS as i32;
/// The most comms (send and receive together) advertised per device
/// ([`ibnet_core::policy::props::MAX_COMMS`]). A soft device refuses the comm past it (its CQ
/// cap, one CQ per comm).
pub const MAX_COMMS: i32 = props_policy::MAX_COMMS;
const _: () = assert!(ibnet_soft::budget::MAX_CQS as i32 == MAX_COMMS);
// Core's pointer kinds are NCCL's.
const _: () = assert!(
    props_policy::PTR_HOST == crate::nccl::types::NCCL_PTR_HOST
        && props_policy::PTR_CUDA == crate::nccl::types::NCCL_PTR_CUDA
        && props_policy::PTR_DMABUF == crate::nccl::types::NCCL_PTR_DMABUF
);
/// `soft0`'s GUID as reported in the properties (it has no hardware GUID).
const SOFT_GUID: u64 = 0x4942_4e45_5453_4f46; // "IBNETSOF"

pub use crate::nccl::props::Props;

impl Dev {
    /// `maxComms`: send and receive comms together that fit in the device's QP budget (verbs:
    /// `max_qp` of the device; soft: [`SOFT_QP_BUDGET`]), each taking `cfg.nqps` QPs plus a
    /// flush QP where `cfg.gdr_flush` (receive comms only; counted for all, to stay true), and
    /// at most [`MAX_COMMS`]. Soft: also no more than fit in the provider's QP memory budget
    /// (`IBNET_SOFT_MEM`) at [`Self::comm_bytes`] each, which the provider enforces: the comm
    /// after that many fails to open (`Error::Full`), before the host runs out of memory (and
    /// the one past [`MAX_COMMS`] too: the provider's CQ cap). The rule is core's
    /// ([`props_policy::max_comms`]).
    pub fn max_comms(&self, cfg: &CommConfig) -> i32 {
        let (qps, memory) = match self {
            Dev::Verbs(p) => (p.dev.max_qp, None),
            Dev::Soft(p, _) => (
                SOFT_QP_BUDGET,
                Some((p.qp_memory().0, self.comm_bytes(cfg))),
            ),
        };
        props_policy::max_comms(&props_policy::CommBudget {
            qps,
            nqps: cfg.nqps,
            gdr_flush: cfg.gdr_flush,
            memory,
        })
    }

    /// Soft: the most bytes of the provider's QP memory budget one comm made with `cfg` holds
    /// (`cfg.nqps` data QPs, and the flush QP where `cfg.gdr_flush`: as [`Self::max_comms`]
    /// counts it); verbs: 0 (the NIC's `max_qp` bounds it; the driver's memory is not ours).
    pub fn comm_bytes(&self, cfg: &CommConfig) -> u64 {
        use ibnet_core::fifo::MAX_REQUESTS;
        use ibnet_soft::budget::qp_bytes;
        match self {
            Dev::Verbs(_) => 0,
            Dev::Soft(..) => {
                // The QP attributes of `SendComm::new` / `RecvComm::new` (data QPs) and of the
                // receive side's flush QP.
                let data = qp_bytes(2 * MAX_REQUESTS as u32, MAX_REQUESTS as u32);
                let flush = qp_bytes(MAX_REQUESTS as u32, 1);
                u64::from(cfg.nqps.max(1)) * data + u64::from(cfg.gdr_flush) * flush
            }
        }
    }

    /// The port's speed in Mb/s (a soft device's is `ibnet_soft::DEFAULT_SPEED_MBPS` unless
    /// set with `SoftProvider::set_speed_mbps`).
    pub fn speed_mbps(&self) -> i32 {
        match self {
            Dev::Verbs(p) => p.dev.speed,
            Dev::Soft(p, _) => i32::try_from(p.speed_mbps()).unwrap_or(i32::MAX),
        }
    }

    /// Properties; `maxComms` for comms made with `cfg` ([`Self::max_comms`]).
    pub fn props(&self, cfg: &CommConfig) -> Props {
        match self {
            Dev::Verbs(p) => {
                let d = &p.dev;
                let g = crate::gpu::gpu_direct();
                let ptr = props_policy::ptr_support(g.gdr, d.dmabuf, g.dmabuf_gpu_side);
                Props {
                    name: d.name.as_ptr(),
                    pci_path: d
                        .pci_path
                        .as_ref()
                        .map_or(core::ptr::null(), |c| c.as_ptr()),
                    guid: d.guid,
                    ptr_support: ptr,
                    reg_is_global: true,
                    speed: d.speed,
                    port: props_policy::exported_port(d.port, d.real_port),
                    latency: 0.0,
                    max_comms: self.max_comms(cfg),
                    max_recvs: ibnet_core::fifo::MAX_RECVS as i32,
                    force_flush: false,
                    vprops: Default::default(),
                    // From NCCL_IB_HCA: `Plugin::props`.
                    rail: crate::nccl::types::NCCL_NET_ID_UNDEF,
                    plane: crate::nccl::types::NCCL_NET_ID_UNDEF,
                }
            }
            // Host memory only: NCCL stages GPU buffers through host memory for this device.
            Dev::Soft(..) => Props {
                name: self.name().as_ptr(),
                pci_path: core::ptr::null(),
                guid: SOFT_GUID,
                ptr_support: crate::nccl::types::NCCL_PTR_HOST,
                reg_is_global: true,
                speed: self.speed_mbps(),
                port: 1,
                latency: 0.0,
                max_comms: self.max_comms(cfg),
                max_recvs: ibnet_core::fifo::MAX_RECVS as i32,
                force_flush: false,
                vprops: Default::default(),
                rail: crate::nccl::types::NCCL_NET_ID_UNDEF,
                plane: crate::nccl::types::NCCL_NET_ID_UNDEF,
            },
        }
    }

    /// Whether receives on this device may land in GPU memory through GPU-direct RDMA (and so
    /// need the RDMA READ flush): verbs devices on a host where GPU-direct works through a
    /// peer-memory module or through DMA-BUF alone (the NIC's DMA-BUF probe and the GPU side
    /// agree), as the seed and NCCL 2.28 enable the flush.
    pub fn gpu_direct(&self) -> bool {
        match self {
            Dev::Verbs(p) => crate::gpu::gpu_direct().possible(p.dev.dmabuf),
            Dev::Soft(..) => false,
        }
    }

    /// This device for one new comm, with the GID chosen for it now (verbs:
    /// [`VerbsDev::choose_gid`](crate::verbs::device::VerbsDev::choose_gid), which fails with
    /// `Error::NoGid` when no GID matches the `NCCL_IB_ADDR_FAMILY`/`_RANGE` the user set any
    /// more; soft: nothing to choose). The comm is made from the returned copy, so a
    /// concurrent connect's choice never reaches it.
    pub fn choose_gid(&self) -> Result<Dev> {
        match self {
            Dev::Verbs(p) => Ok(Dev::Verbs(p.with_gid(p.dev.choose_gid()?))),
            Dev::Soft(..) => Ok(self.clone()),
        }
    }

    /// The device's name (`mlx5_0`, `soft0`).
    pub fn name(&self) -> &std::ffi::CStr {
        match self {
            Dev::Verbs(p) => p.dev.name.as_c_str(),
            Dev::Soft(_, i) => SOFT_NAMES[usize::from(*i) % SOFT_NAMES.len()],
        }
    }

    /// The tag for [`ConnectHandle::provider`](ibnet_core::wire::ConnectHandle::provider).
    pub fn provider_tag(&self) -> u8 {
        match self {
            Dev::Verbs(_) => PROVIDER_TAG_VERBS,
            Dev::Soft(..) => PROVIDER_TAG_SOFT,
        }
    }

    /// The local port's description (for the accept-side handshake machine).
    pub fn port_info(&self) -> ibnet_core::provider::PortInfo {
        match self {
            Dev::Verbs(p) => p.port_info(),
            Dev::Soft(p, _) => p.port_info(),
        }
    }

    /// Creates a send comm.
    pub fn new_send(&self, cfg: CommConfig) -> Result<AnySend> {
        Ok(match self {
            Dev::Verbs(p) => AnySend::Verbs(SendComm::new(p.clone(), cfg)?),
            Dev::Soft(p, _) => AnySend::Soft(SendComm::new(p.clone(), cfg)?),
        })
    }

    /// Refuses a peer address that cannot name a provider we may reach, before any attach is
    /// tried (so a bogus handshake is named as such, not as a host permission problem). Soft:
    /// the address must decode and name this process or a live process of our own user.
    pub fn check_peer(&self, remote: &QpInfo) -> Result<()> {
        let Dev::Soft(..) = self else { return Ok(()) };
        let a = ibnet_soft::SoftAddr::decode(&remote.addr).ok_or(Error::Wire {
            what: "soft peer address (undecodable)",
            value: 0,
        })?;
        if a.pid as u32 == std::process::id() {
            return Ok(());
        }
        use std::os::unix::fs::MetadataExt;
        let bogus = |what| Error::Wire {
            what,
            value: a.pid as u64,
        };
        let m = std::fs::metadata(format!("/proc/{}", a.pid))
            .map_err(|_| bogus("soft peer address names no live process (pid)"))?;
        let me = std::fs::metadata("/proc/self").map_or(m.uid(), |s| s.uid());
        if m.uid() != me {
            return Err(bogus(
                "soft peer address names a process of another user (pid; bogus handshake?)",
            ));
        }
        Ok(())
    }

    /// Creates a receive comm connected to `remote`.
    pub fn new_recv(&self, cfg: CommConfig, remote: &QpInfo) -> Result<AnyRecv> {
        Ok(match self {
            Dev::Verbs(p) => AnyRecv::Verbs(RecvComm::new(p.clone(), cfg, remote)?),
            Dev::Soft(p, _) => AnyRecv::Soft(RecvComm::new(p.clone(), cfg, remote)?),
        })
    }

    /// Registers memory.
    pub fn reg(&self, addr: u64, len: u64, kind: RegKind) -> Result<(AnyMr, MrKeys)> {
        // NCCL's buffers may use relaxed ordering (the provider applies
        // NCCL_IB_PCI_RELAXED_ORDERING); the comms' own rings never ask for it.
        let access = Access {
            relaxed_ordering: true,
            ..Access::ALL
        };
        Ok(match self {
            Dev::Verbs(p) => {
                let mr = p.reg_mr(addr, len, access, kind)?;
                let k = p.mr_keys(&mr);
                (AnyMr::Verbs(p.clone(), mr), k)
            }
            Dev::Soft(p, _) => {
                let mr = p.reg_mr(addr, len, access, kind)?;
                let k = p.mr_keys(&mr);
                (AnyMr::Soft(p.clone(), mr), k)
            }
        })
    }
}

impl AnyMr {
    /// Deregisters.
    pub fn dereg(self) -> Result<()> {
        match self {
            AnyMr::Verbs(p, mr) => p.dereg_mr(mr),
            AnyMr::Soft(p, mr) => p.dereg_mr(mr),
        }
    }
}

/// A plain-comm method on a comm that is fused (the callers dispatch on the comm's kind
/// first, so this is a caller bug, reported as one).
fn not_plain(op: &'static str) -> Error {
    Error::BadState {
        op,
        state: "comm is fused (use the rail-aware call)",
    }
}

/// A fused-comm method on a plain comm (a caller bug, as [`not_plain`]).
fn not_fused(op: &'static str) -> Error {
    Error::BadState {
        op,
        state: "comm is not fused",
    }
}

/// `$plain` on a plain comm (`$c`), `$fused` on a fused one (`$f`).
macro_rules! split {
    ($e:expr, $c:ident => $plain:expr, $f:ident => $fused:expr) => {
        match $e {
            Self::Verbs($c) => $plain,
            Self::Soft($c) => $plain,
            Self::FusedVerbs($f) => $fused,
            Self::FusedSoft($f) => $fused,
        }
    };
}

/// The same `$body` on every kind of comm (`$c` is each arm's own comm type).
macro_rules! all {
    ($e:expr, $c:ident => $body:expr) => {
        split!($e, $c => $body, $c => $body)
    };
}

/// `$body` on a plain comm; a fused one is refused ([`not_plain`]).
macro_rules! each {
    ($e:expr, $op:literal, $c:ident => $body:expr) => {
        split!($e, $c => $body, _f => Err(not_plain($op)))
    };
}

/// `$body` on a fused comm; a plain one is refused ([`not_fused`]).
macro_rules! fused {
    ($e:expr, $op:literal, $c:ident => $body:expr) => {
        split!($e, _c => Err(not_fused($op)), $c => $body)
    };
}

/// What a fused comm's rails did, for tests and tools (`api::fused_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FusedStats {
    /// Rails of the comm.
    pub rails: usize,
    /// Bytes each rail carried (sender; 0 at the receiver).
    pub rail_bytes: [u64; ibnet_core::fused::MAX_DEVS_PER_NIC],
    /// Whether each rail is still in use.
    pub live: [bool; ibnet_core::fused::MAX_DEVS_PER_NIC],
    /// Bytes written again on another rail after their rail failed (sender).
    pub resent: u64,
}

/// Feeds a fused send comm the clock when it needs one (a probe delay set): a vDSO read of
/// the monotonic clock, no system call.
#[inline]
fn tick<P: Provider + Clone>(c: &mut FusedSend<P>) {
    if c.wants_clock() {
        c.tick(now_ms());
    }
}

/// Milliseconds of the monotonic clock since the first call (the core's `tick` unit).
pub fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Rails returned to striping since the last call, for the caller to log.
pub type Returned = heapless::Vec<u8, { ibnet_core::fused::MAX_DEVS_PER_NIC }>;

/// Rails taken out of use since the last call, for the caller to log.
pub type RailEvents = heapless::Vec<RailEvent, { ibnet_core::fused::MAX_DEVS_PER_NIC }>;

impl AnySend {
    /// Each rail's QP info for the peer and this side's rail list (devices `devs`, rail
    /// order; a fused comm adds its back ring on each rail).
    pub fn rail_infos(&self, devs: &[u16]) -> Result<(Infos, RailList)> {
        Ok(split!(self,
            c => plain_infos(devs, c.local_info()),
            c => fused_infos(devs, |i| c.local_info(i), &c.back_ring(), |i| c.rail_weight(i))))
    }
    /// See `SendComm::set_peer_addr` (a fused comm's rails name no peer address).
    pub fn set_peer_addr(&mut self, a: SocketAddr) {
        split!(self, c => c.set_peer_addr(a), _f => {})
    }
    /// Connects every rail to the acceptor's (`infos`, rail order; `peer` its rail list with
    /// a fused comm's notice rings).
    pub fn connect_rails(&mut self, infos: &[QpInfo], peer: &RailList) -> Result<()> {
        fn fused<P: Provider + Clone>(
            c: &mut FusedSend<P>,
            infos: &[QpInfo],
            peer: &RailList,
        ) -> Result<()> {
            for (i, info) in infos.iter().enumerate() {
                c.connect(i, info)?;
            }
            c.set_rail_weights(&agreed(|i| c.rail_weight(i), peer));
            c.set_notice_ring(&rings(peer))
        }
        split!(self, c => c.connect(first(infos)?), c => fused(c, infos, peer))
    }
    /// See `SendComm::isend`.
    #[inline]
    pub fn isend(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        mr: MrKeys,
        parent: usize,
    ) -> Result<Option<ReqId>> {
        each!(self, "isend", c => c.isend_under(addr, size, tag, mr, parent))
    }
    /// See `FusedSend::isend` (`mrs`: the buffer's keys on each rail).
    #[inline]
    pub fn isend_fused(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        mrs: &[MrKeys],
    ) -> Result<Option<ReqId>> {
        fused!(self, "isend", c => {
            tick(&mut **c);
            c.isend(addr, size, tag, mrs)
        })
    }
    /// See `FusedSend::set_resilience` (nothing for a plain comm).
    pub fn set_resilience(&mut self, r: Resilience) {
        split!(self, _c => {}, c => c.set_resilience(r))
    }
    /// See `SendComm::set_events` (a fused comm sends no profiler events).
    pub fn set_events(&mut self, sink: Option<Sink>) {
        split!(self, c => c.set_events(sink), _f => {})
    }
    /// See `SendComm::test` / `FusedSend::test`.
    #[inline(always)]
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        split!(self, c => c.test(id), c => {
            tick(&mut **c);
            c.test(id)
        })
    }
    /// See `SendComm::fail` / `RecvComm::fail`: later data calls are refused, reported as `e`.
    pub fn fail(&mut self, e: &Error) {
        all!(self, c => c.fail(e))
    }
    /// Rails taken out of use since the last call (always none for a plain comm).
    pub fn take_events(&mut self) -> RailEvents {
        split!(self, _c => RailEvents::new(), c => c.take_events())
    }
    /// Rails returned to striping since the last call (always none for a plain comm).
    pub fn take_returned(&mut self) -> Returned {
        split!(self, _c => Returned::new(), c => c.take_returned())
    }
    /// Whether `take_events` or `take_returned` has anything (always false for a plain comm).
    #[inline]
    pub fn has_rail_news(&self) -> bool {
        split!(self, _c => false, c => c.has_rail_news())
    }

    /// The comm's first send cut to its receive's size, once (see
    /// `SendComm::take_truncation`).
    #[inline(always)]
    pub fn take_truncation(&mut self) -> Option<Truncation> {
        all!(self, c => c.take_truncation())
    }
    /// The rails' counters of a fused comm (`None`: plain).
    pub fn fused_stats(&self) -> Option<FusedStats> {
        fn stats<P: Provider + Clone>(c: &FusedSend<P>) -> FusedStats {
            let mut s = FusedStats {
                rails: c.rails(),
                resent: c.resent_bytes(),
                ..FusedStats::default()
            };
            for i in 0..s.rails {
                s.rail_bytes[i] = c.rail_bytes(i);
                s.live[i] = c.rail_live(i);
            }
            s
        }
        split!(self, _c => None, c => Some(stats(c)))
    }
    /// Closes.
    pub fn close(self) -> Result<()> {
        all!(self, c => c.close())
    }
}

impl AnyRecv {
    /// Each rail's QP info for the peer and this side's rail list (devices `devs`; a fused
    /// comm adds its notice ring on each rail).
    pub fn rail_infos(&self, devs: &[u16]) -> Result<(Infos, RailList)> {
        Ok(split!(self,
            c => plain_infos(devs, c.local_info()),
            c => fused_infos(devs, |i| c.local_info(i), &c.notice_ring(), |i| c.rail_weight(i))))
    }
    /// See `RecvComm::set_peer_addr` (a fused comm's rails name no peer address).
    pub fn set_peer_addr(&mut self, a: SocketAddr) {
        split!(self, c => c.set_peer_addr(a), _f => {})
    }
    /// See `RecvComm::irecv`.
    #[inline]
    pub fn irecv(&mut self, bufs: &[RecvBuf], parents: &[usize]) -> Result<Option<ReqId>> {
        each!(self, "irecv", c => c.irecv_under(bufs, parents))
    }
    /// See `FusedRecv::set_resilience` (nothing for a plain comm).
    pub fn set_resilience(&mut self, r: Resilience) {
        split!(self, _c => {}, c => c.set_resilience(r))
    }
    /// See `FusedRecv::irecv`.
    #[inline]
    pub fn irecv_fused(&mut self, bufs: &[FusedBuf]) -> Result<Option<ReqId>> {
        fused!(self, "irecv", c => {
            if c.wants_clock() {
                c.tick(now_ms());
            }
            c.irecv(bufs)
        })
    }
    /// See `RecvComm::set_events` (a fused comm sends no profiler events).
    pub fn set_events(&mut self, sink: Option<Sink>) {
        split!(self, c => c.set_events(sink), _f => {})
    }
    /// See `RecvComm::iflush`.
    pub fn iflush(&mut self, bufs: &[RecvBuf]) -> Result<Option<ReqId>> {
        each!(self, "iflush", c => c.iflush(bufs))
    }
    /// See `FusedRecv::iflush`.
    pub fn iflush_fused(&mut self, bufs: &[FusedBuf]) -> Result<Option<ReqId>> {
        fused!(self, "iflush", c => c.iflush(bufs))
    }
    /// See `RecvComm::test` / `FusedRecv::test`.
    #[inline(always)]
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        split!(self, c => c.test(id), c => {
            if c.wants_clock() {
                c.tick(now_ms());
            }
            c.test(id)
        })
    }
    /// See `SendComm::fail` / `RecvComm::fail`: later data calls are refused, reported as `e`.
    pub fn fail(&mut self, e: &Error) {
        all!(self, c => c.fail(e))
    }
    /// Rails taken out of use since the last call (always none for a plain comm).
    pub fn take_events(&mut self) -> RailEvents {
        split!(self, _c => RailEvents::new(), c => c.take_events())
    }
    /// Rails returned to striping since the last call (always none for a plain comm).
    pub fn take_returned(&mut self) -> Returned {
        split!(self, _c => Returned::new(), c => c.take_returned())
    }
    /// Whether `take_events` or `take_returned` has anything (always false for a plain comm).
    #[inline]
    pub fn has_rail_news(&self) -> bool {
        split!(self, _c => false, c => c.has_rail_news())
    }
    /// The rails' state of a fused comm (`None`: plain).
    pub fn fused_stats(&self) -> Option<FusedStats> {
        fn stats<P: Provider + Clone>(c: &FusedRecv<P>, n: usize) -> FusedStats {
            let mut s = FusedStats {
                rails: n,
                ..FusedStats::default()
            };
            for i in 0..n {
                s.live[i] = c.rail_live(i);
            }
            s
        }
        split!(self, _c => None, c => Some(stats(c, c.notice_ring().len())))
    }
    /// Closes.
    pub fn close(self) -> Result<()> {
        all!(self, c => c.close())
    }
}

/// QP infos of a comm's rails, rail order.
pub type Infos = heapless::Vec<QpInfo, { ibnet_core::fused::MAX_DEVS_PER_NIC }>;

/// A plain comm's rail infos: its one QP's `info`, on the first device of `devs`.
fn plain_infos(devs: &[u16], info: QpInfo) -> (Infos, RailList) {
    let mut v = Infos::new();
    // Cannot fail: capacity ≥ 1.
    let _ = v.push(info);
    (v, RailList::single(devs.first().copied().unwrap_or(0)))
}

/// A fused comm's rail infos (`info(i)` per rail of `devs`) and rail list (`ring` and the
/// stripe weight `weight(i)`, the rail's speed in 100 Mb/s, per rail).
fn fused_infos(
    devs: &[u16],
    info: impl Fn(usize) -> Option<QpInfo>,
    ring: &[RemoteBuf],
    weight: impl Fn(usize) -> u32,
) -> (Infos, RailList) {
    let mut v = Infos::new();
    let mut l = RailList::default();
    for (i, (&d, r)) in devs.iter().zip(ring).enumerate() {
        if let Some(q) = info(i) {
            // Cannot fail: at most MAX_DEVS_PER_NIC rails.
            let _ = v.push(q);
            let _ = l.0.push(RailInfo {
                dev: d,
                ring: Some(*r),
                speed: u16::try_from(weight(i)).unwrap_or(u16::MAX),
            });
        }
    }
    (v, l)
}

/// A rail's stripe weight: its speed in units of 100 Mb/s, as the rail list carries it (0:
/// unknown; at least 1 for any known speed, at most `u16::MAX`).
fn speed_units(mbps: i32) -> u32 {
    match u32::try_from(mbps) {
        Ok(m) if m > 0 => m.div_ceil(100).min(u32::from(u16::MAX)),
        _ => 0,
    }
}

/// This side's stripe weights of `devs` (rail order).
fn local_weights(devs: &[Dev]) -> Weights {
    let mut w = [0; MAX_DEVS_PER_NIC];
    for (d, s) in w.iter_mut().zip(devs) {
        *d = speed_units(s.speed_mbps());
    }
    w
}

/// The stripe weights both ends of a fused comm use: per rail, the smaller of this side's
/// (`local(i)`) and the peer's speed from its rail list (so both compute the same; a 0, an
/// unknown speed, makes the shares equal).
fn agreed(local: impl Fn(usize) -> u32, peer: &RailList) -> Weights {
    let mut w = [0; MAX_DEVS_PER_NIC];
    for (i, (d, r)) in w.iter_mut().zip(&peer.0).enumerate() {
        *d = local(i).min(u32::from(r.speed));
    }
    w
}

/// The rings a peer's rail list names (rail order; a ring missing on a fused list was refused
/// by the handshake).
fn rings(peer: &RailList) -> heapless::Vec<RemoteBuf, { ibnet_core::fused::MAX_DEVS_PER_NIC }> {
    peer.0.iter().map(|r| r.ring.unwrap_or_default()).collect()
}

/// The only rail's info of a plain comm.
fn first(infos: &[QpInfo]) -> Result<&QpInfo> {
    infos.first().ok_or(Error::Missing {
        what: "the peer's QP info",
    })
}

/// Makes fused comms over the rails `devs` (all of one provider).
pub fn fused_send(devs: &[Dev], cfg: CommConfig) -> Result<AnySend> {
    let w = local_weights(devs);
    if let Some(v) = verbs_rails(devs) {
        let mut c = crate::boxed::send(&v, cfg)?;
        c.set_rail_weights(&w);
        return Ok(AnySend::FusedVerbs(c));
    }
    let s = soft_rails(devs)?;
    let mut c = crate::boxed::send(&s, cfg)?;
    c.set_rail_weights(&w);
    Ok(AnySend::FusedSoft(c))
}

/// The receive side of [`fused_send`], connected to the sender's rails (`remote`) whose back
/// rings and speeds `peer` names (the stripe weights: `agreed`).
pub fn fused_recv(
    devs: &[Dev],
    cfg: CommConfig,
    remote: &[QpInfo],
    peer: &RailList,
) -> Result<AnyRecv> {
    // Its rail list then announces these weights, from which the sender takes the same.
    let local = local_weights(devs);
    let w = agreed(|i| local[i], peer);
    if let Some(v) = verbs_rails(devs) {
        let mut r = crate::boxed::recv(&v, cfg, remote)?;
        r.set_back_ring(&rings(peer))?;
        r.set_rail_weights(&w);
        return Ok(AnyRecv::FusedVerbs(r));
    }
    let s = soft_rails(devs)?;
    let mut r = crate::boxed::recv(&s, cfg, remote)?;
    r.set_back_ring(&rings(peer))?;
    r.set_rail_weights(&w);
    Ok(AnyRecv::FusedSoft(r))
}

fn verbs_rails(devs: &[Dev]) -> Option<Vec<VerbsPort>> {
    devs.iter()
        .map(|d| match d {
            Dev::Verbs(p) => Some(p.clone()),
            Dev::Soft(..) => None,
        })
        .collect()
}

fn soft_rails(devs: &[Dev]) -> Result<Vec<SoftProvider>> {
    devs.iter()
        .map(|d| match d {
            Dev::Soft(p, _) => Ok(p.clone()),
            Dev::Verbs(_) => Err(Error::BadState {
                op: "fused comm",
                state: "rails of different providers (verbs and soft)",
            }),
        })
        .collect()
}
