//! The provider dispatch: a plugin device ([`Dev`]) and what it makes (send and receive comms,
//! registrations) over whichever provider backs it, `verbs` (libibverbs) or `soft`
//! (ibnet-soft, same host only), plus the per-device registration cache's types.

use std::net::SocketAddr;

use ibnet_core::comm::{CommConfig, Done, RecvComm, SendComm, Sink, Truncation};
use ibnet_core::fused::{FusedRecv, FusedSend, Resilience, Weights};
use ibnet_core::policy::props as props_policy;
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
pub use ibnet_core::rails::Infos;
use ibnet_core::rails::{RailBuf, RailNews, RailRecv, RailSend, RailStats};
use ibnet_core::request::ReqId;
use ibnet_core::wire::{QpInfo, RailList};
use ibnet_core::{Error, Result};

use ibnet_soft::{SoftMr, SoftProvider};

use ibnet_verbs::provider::{VMr, VerbsPort};

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

/// A NIC's send comm (`ibnet_core::rails`: 1..=8 rails) over provider `P`; several rails
/// live in a box (a comm per rail and the message table: too large to move through a stack).
pub type Send<P> = RailSend<P, Box<FusedSend<P>>>;
/// A NIC's receive comm over provider `P` (see [`Send`]).
pub type Recv<P> = RailRecv<P, Box<FusedRecv<P>>>;

/// A send comm over some provider.
pub enum AnySend {
    /// Over verbs.
    Verbs(Send<VerbsPort>),
    /// Over ibnet-soft.
    Soft(Send<SoftProvider>),
}

/// A receive comm over some provider.
pub enum AnyRecv {
    /// Over verbs.
    Verbs(Recv<VerbsPort>),
    /// Over ibnet-soft.
    Soft(Recv<SoftProvider>),
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
    props_policy::PTR_HOST == ibnet_nccl::types::NCCL_PTR_HOST
        && props_policy::PTR_CUDA == ibnet_nccl::types::NCCL_PTR_CUDA
        && props_policy::PTR_DMABUF == ibnet_nccl::types::NCCL_PTR_DMABUF
);
/// `soft0`'s GUID as reported in the properties (it has no hardware GUID).
const SOFT_GUID: u64 = 0x4942_4e45_5453_4f46; // "IBNETSOF"

pub use ibnet_nccl::props::Props;

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
                    rail: ibnet_nccl::types::NCCL_NET_ID_UNDEF,
                    plane: ibnet_nccl::types::NCCL_NET_ID_UNDEF,
                }
            }
            // Host memory only: NCCL stages GPU buffers through host memory for this device.
            Dev::Soft(..) => Props {
                name: self.name().as_ptr(),
                pci_path: core::ptr::null(),
                guid: SOFT_GUID,
                ptr_support: ibnet_nccl::types::NCCL_PTR_HOST,
                reg_is_global: true,
                speed: self.speed_mbps(),
                port: 1,
                latency: 0.0,
                max_comms: self.max_comms(cfg),
                max_recvs: ibnet_core::fifo::MAX_RECVS as i32,
                force_flush: false,
                vprops: Default::default(),
                rail: ibnet_nccl::types::NCCL_NET_ID_UNDEF,
                plane: ibnet_nccl::types::NCCL_NET_ID_UNDEF,
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
    /// [`VerbsDev::choose_gid`](ibnet_verbs::device::VerbsDev::choose_gid), which fails with
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

/// `$body` on the comm, whichever provider it is over (`$c` is each arm's own comm type).
macro_rules! on {
    ($e:expr, $c:ident => $body:expr) => {
        match $e {
            Self::Verbs($c) => $body,
            Self::Soft($c) => $body,
        }
    };
}

/// Milliseconds of the monotonic clock since the first call (the core's clock for probe
/// delays): a vDSO read, no system call; read only when a comm of several rails asks.
pub fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// The providers of `devs` (all the same kind): verbs ports, or soft providers.
enum Rails {
    Verbs(Vec<VerbsPort>),
    Soft(Vec<SoftProvider>),
}

impl Rails {
    fn of(devs: &[Dev]) -> Result<Self> {
        let verbs: Option<Vec<VerbsPort>> = devs
            .iter()
            .map(|d| match d {
                Dev::Verbs(p) => Some(p.clone()),
                Dev::Soft(..) => None,
            })
            .collect();
        if let Some(v) = verbs {
            return Ok(Self::Verbs(v));
        }
        devs.iter()
            .map(|d| match d {
                Dev::Soft(p, _) => Ok(p.clone()),
                Dev::Verbs(_) => Err(Error::BadState {
                    op: "comm",
                    state: "rails of different providers (verbs and soft)",
                }),
            })
            .collect::<Result<_>>()
            .map(Self::Soft)
    }
}

/// A send comm over `devs` (one rail: a plain comm; several: striped, on the heap).
fn send_over<P: Provider + Clone>(devs: &[P], cfg: CommConfig) -> Result<Send<P>> {
    Ok(match devs {
        [one] => RailSend::One(SendComm::new(one.clone(), cfg)?),
        _ => RailSend::Striped(crate::boxed::send(devs, cfg)?),
    })
}

/// A receive comm over `devs`, connected to the sender's rails `remote`.
fn recv_over<P: Provider + Clone>(
    devs: &[P],
    cfg: CommConfig,
    remote: &[QpInfo],
) -> Result<Recv<P>> {
    Ok(match devs {
        [one] => {
            let first = remote.first().ok_or(Error::Missing {
                what: "the peer's QP info",
            })?;
            RailRecv::One(RecvComm::new(one.clone(), cfg, first)?)
        }
        _ => RailRecv::Striped(crate::boxed::recv(devs, cfg, remote)?),
    })
}

impl AnySend {
    /// A send comm over the rails `devs` (1..=8, one provider).
    pub fn new(devs: &[Dev], cfg: CommConfig) -> Result<Self> {
        Ok(match Rails::of(devs)? {
            Rails::Verbs(v) => Self::Verbs(send_over(&v, cfg)?),
            Rails::Soft(s) => Self::Soft(send_over(&s, cfg)?),
        })
    }
    /// Each rail's QP info for the peer and this side's rail list (devices `devs`).
    pub fn rail_infos(&self, devs: &[u16]) -> (Infos, RailList) {
        on!(self, c => c.local_infos(devs))
    }
    /// See `RailSend::set_rail_weights`.
    pub fn set_rail_weights(&mut self, w: &Weights) {
        on!(self, c => c.set_rail_weights(w))
    }
    /// See `RailSend::set_peer_addr`.
    pub fn set_peer_addr(&mut self, a: SocketAddr) {
        on!(self, c => c.set_peer_addr(a))
    }
    /// See `RailSend::connect`.
    pub fn connect_rails(&mut self, infos: &[QpInfo], peer: &RailList) -> Result<()> {
        on!(self, c => c.connect(infos, peer))
    }
    /// See `RailSend::isend` (`keys`: the buffer's keys on each rail).
    #[inline(always)]
    pub fn isend(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        keys: &[MrKeys],
        parent: usize,
    ) -> Result<Option<ReqId>> {
        on!(self, c => c.isend(addr, size, tag, keys, parent, now_ms))
    }
    /// How many rails.
    pub fn rails(&self) -> usize {
        on!(self, c => c.rails())
    }
    /// See `RailSend::set_resilience`.
    pub fn set_resilience(&mut self, r: Resilience) {
        on!(self, c => c.set_resilience(r))
    }
    /// See `RailSend::set_events`.
    pub fn set_events(&mut self, sink: Option<Sink>) {
        on!(self, c => c.set_events(sink))
    }
    /// See `RailSend::test`.
    #[inline(always)]
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        on!(self, c => c.test(id, now_ms))
    }
    /// Later data calls are refused, reported as `e`.
    pub fn fail(&mut self, e: &Error) {
        on!(self, c => c.fail(e))
    }
    /// See `RailSend::take_news`.
    pub fn take_news(&mut self) -> RailNews {
        on!(self, c => c.take_news())
    }
    /// See `RailSend::has_rail_news`.
    #[inline(always)]
    pub fn has_rail_news(&self) -> bool {
        on!(self, c => c.has_rail_news())
    }
    /// The comm's first send cut to its receive's size, once.
    #[inline(always)]
    pub fn take_truncation(&mut self) -> Option<Truncation> {
        on!(self, c => c.take_truncation())
    }
    /// See `RailSend::stats`.
    pub fn stats(&self) -> Option<RailStats> {
        on!(self, c => c.stats())
    }
    /// Closes.
    pub fn close(self) -> Result<()> {
        on!(self, c => c.close())
    }
}

impl AnyRecv {
    /// A receive comm over the rails `devs` (1..=8, one provider), connected to the sender's
    /// rails `remote`.
    pub fn new(devs: &[Dev], cfg: CommConfig, remote: &[QpInfo]) -> Result<Self> {
        Ok(match Rails::of(devs)? {
            Rails::Verbs(v) => Self::Verbs(recv_over(&v, cfg, remote)?),
            Rails::Soft(s) => Self::Soft(recv_over(&s, cfg, remote)?),
        })
    }
    /// See `RailRecv::join`.
    pub fn join(&mut self, peer: &RailList, local: &Weights) -> Result<()> {
        on!(self, c => c.join(peer, local))
    }
    /// Each rail's QP info for the peer and this side's rail list (devices `devs`).
    pub fn rail_infos(&self, devs: &[u16]) -> (Infos, RailList) {
        on!(self, c => c.local_infos(devs))
    }
    /// See `RailRecv::set_peer_addr`.
    pub fn set_peer_addr(&mut self, a: SocketAddr) {
        on!(self, c => c.set_peer_addr(a))
    }
    /// See `RailRecv::irecv`.
    #[inline(always)]
    pub fn irecv(&mut self, bufs: &[RailBuf], parents: &[usize]) -> Result<Option<ReqId>> {
        on!(self, c => c.irecv(bufs, parents, now_ms))
    }
    /// See `RailRecv::set_resilience`.
    pub fn set_resilience(&mut self, r: Resilience) {
        on!(self, c => c.set_resilience(r))
    }
    /// See `RailRecv::set_events`.
    pub fn set_events(&mut self, sink: Option<Sink>) {
        on!(self, c => c.set_events(sink))
    }
    /// See `RailRecv::iflush`.
    pub fn iflush(&mut self, bufs: &[RailBuf]) -> Result<Option<ReqId>> {
        on!(self, c => c.iflush(bufs))
    }
    /// See `RailRecv::test`.
    #[inline(always)]
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        on!(self, c => c.test(id, now_ms))
    }
    /// Later data calls are refused, reported as `e`.
    pub fn fail(&mut self, e: &Error) {
        on!(self, c => c.fail(e))
    }
    /// See `RailRecv::take_news`.
    pub fn take_news(&mut self) -> RailNews {
        on!(self, c => c.take_news())
    }
    /// See `RailRecv::has_rail_news`.
    #[inline(always)]
    pub fn has_rail_news(&self) -> bool {
        on!(self, c => c.has_rail_news())
    }
    /// See `RailRecv::stats`.
    pub fn stats(&self) -> Option<RailStats> {
        on!(self, c => c.stats())
    }
    /// Closes.
    pub fn close(self) -> Result<()> {
        on!(self, c => c.close())
    }
}
