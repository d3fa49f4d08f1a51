//! The provider dispatch: a plugin device ([`Dev`]) and what it makes (send and receive comms,
//! registrations) over whichever provider backs it, `verbs` (libibverbs) or `soft`
//! (ibnet-soft, same host only), plus the per-device registration cache's types.

use std::net::SocketAddr;

use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm, Sink};
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::request::ReqId;
use ibnet_core::wire::QpInfo;
use ibnet_core::{Error, Result};

use ibnet_soft::{SoftMr, SoftProvider};

use crate::verbs::provider::{VMr, VerbsPort};

/// A plugin device: one provider port.
#[derive(Clone)]
pub enum Dev {
    /// A libibverbs port.
    Verbs(VerbsPort),
    /// The software provider's `soft0` (same host only, host memory only).
    Soft(SoftProvider),
}

/// A send comm over some provider.
pub enum AnySend {
    /// Over verbs.
    Verbs(SendComm<VerbsPort>),
    /// Over ibnet-soft.
    Soft(SendComm<SoftProvider>),
}

/// A receive comm over some provider.
pub enum AnyRecv {
    /// Over verbs.
    Verbs(RecvComm<VerbsPort>),
    /// Over ibnet-soft.
    Soft(RecvComm<SoftProvider>),
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

/// Nominal speed reported for `soft0` (Mbps): a same-host memory copy, faster than any NIC port
/// NCCL would compare it with.
const SOFT_SPEED_MBPS: i32 = 100_000;
/// QPs one `soft0` provider can hold at once: ibnet-soft's QP table ([`ibnet_soft::MAX_QPS`],
/// filled by soft's own capacity test).
pub const SOFT_QP_BUDGET: i32 = ibnet_soft::MAX_QPS as i32;
/// The most comms (send and receive together) advertised per device, whatever the QP budget:
/// 1024 of each, as many as NCCL opens per peer NIC in practice.
pub const MAX_COMMS: i32 = 2048;
/// `soft0`'s GUID as reported in the properties (it has no hardware GUID).
const SOFT_GUID: u64 = 0x4942_4e45_5453_4f46; // "IBNETSOF"

pub use crate::nccl::props::Props;

impl Dev {
    /// `maxComms`: send and receive comms together that fit in the device's QP budget (verbs:
    /// `max_qp` of the device; soft: [`SOFT_QP_BUDGET`]), each taking `cfg.nqps` QPs plus a
    /// flush QP where `cfg.gdr_flush` (receive comms only; counted for all, to stay true), and
    /// at most [`MAX_COMMS`].
    pub fn max_comms(&self, cfg: &CommConfig) -> i32 {
        let budget = match self {
            Dev::Verbs(p) => p.dev.max_qp,
            Dev::Soft(_) => SOFT_QP_BUDGET,
        };
        let per_comm = i32::from(cfg.nqps.max(1)) + i32::from(cfg.gdr_flush);
        (budget / per_comm).clamp(1, MAX_COMMS)
    }

    /// Properties; `maxComms` for comms made with `cfg` ([`Self::max_comms`]).
    pub fn props(&self, cfg: &CommConfig) -> Props {
        match self {
            Dev::Verbs(p) => {
                let d = &p.dev;
                let mut ptr = crate::nccl::types::NCCL_PTR_HOST;
                let g = crate::gpu::gpu_direct();
                if g.gdr {
                    ptr |= crate::nccl::types::NCCL_PTR_CUDA;
                }
                if d.dmabuf && g.dmabuf_gpu_side {
                    ptr |= crate::nccl::types::NCCL_PTR_DMABUF;
                }
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
                    port: d.port as i32 + d.real_port,
                    latency: 0.0,
                    max_comms: self.max_comms(cfg),
                    max_recvs: ibnet_core::fifo::MAX_RECVS as i32,
                    force_flush: false,
                    vprops: Default::default(),
                }
            }
            // Host memory only: NCCL stages GPU buffers through host memory for this device.
            Dev::Soft(_) => Props {
                name: self.name().as_ptr(),
                pci_path: core::ptr::null(),
                guid: SOFT_GUID,
                ptr_support: crate::nccl::types::NCCL_PTR_HOST,
                reg_is_global: true,
                speed: SOFT_SPEED_MBPS,
                port: 1,
                latency: 0.0,
                max_comms: self.max_comms(cfg),
                max_recvs: ibnet_core::fifo::MAX_RECVS as i32,
                force_flush: false,
                vprops: Default::default(),
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
            Dev::Soft(_) => false,
        }
    }

    /// The device's name (`mlx5_0`, `soft0`).
    pub fn name(&self) -> &std::ffi::CStr {
        match self {
            Dev::Verbs(p) => p.dev.name.as_c_str(),
            Dev::Soft(_) => c"soft0",
        }
    }

    /// The tag for [`ConnectHandle::provider`](ibnet_core::wire::ConnectHandle::provider).
    pub fn provider_tag(&self) -> u8 {
        match self {
            Dev::Verbs(_) => PROVIDER_TAG_VERBS,
            Dev::Soft(_) => PROVIDER_TAG_SOFT,
        }
    }

    /// The local port's description (for the accept-side handshake machine).
    pub fn port_info(&self) -> ibnet_core::provider::PortInfo {
        match self {
            Dev::Verbs(p) => p.port_info(),
            Dev::Soft(p) => p.port_info(),
        }
    }

    /// Creates a send comm.
    pub fn new_send(&self, cfg: CommConfig) -> Result<AnySend> {
        Ok(match self {
            Dev::Verbs(p) => AnySend::Verbs(SendComm::new(p.clone(), cfg)?),
            Dev::Soft(p) => AnySend::Soft(SendComm::new(p.clone(), cfg)?),
        })
    }

    /// Refuses a peer address that cannot name a provider we may reach, before any attach is
    /// tried (so a bogus handshake is named as such, not as a host permission problem). Soft:
    /// the address must decode and name this process or a live process of our own user.
    pub fn check_peer(&self, remote: &QpInfo) -> Result<()> {
        let Dev::Soft(_) = self else { return Ok(()) };
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
            Dev::Soft(p) => AnyRecv::Soft(RecvComm::new(p.clone(), cfg, remote)?),
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
            Dev::Soft(p) => {
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

macro_rules! each {
    ($e:expr, $c:ident => $body:expr) => {
        match $e {
            Self::Verbs($c) => $body,
            Self::Soft($c) => $body,
        }
    };
}

impl AnySend {
    /// Our QP info for the peer.
    pub fn local_info(&self) -> QpInfo {
        each!(self, c => c.local_info())
    }
    /// See `SendComm::set_peer_addr`.
    pub fn set_peer_addr(&mut self, a: SocketAddr) {
        each!(self, c => c.set_peer_addr(a))
    }
    /// QPs to RTS.
    pub fn connect(&mut self, remote: &QpInfo) -> Result<()> {
        each!(self, c => c.connect(remote))
    }
    /// See `SendComm::isend`.
    pub fn isend(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        mr: MrKeys,
        parent: usize,
    ) -> Result<Option<ReqId>> {
        each!(self, c => c.isend_under(addr, size, tag, mr, parent))
    }
    /// See `SendComm::set_events`.
    pub fn set_events(&mut self, sink: Option<Sink>) {
        each!(self, c => c.set_events(sink))
    }
    /// See `SendComm::test`.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        each!(self, c => c.test(id))
    }
    /// Closes.
    pub fn close(self) -> Result<()> {
        each!(self, c => c.close())
    }
}

impl AnyRecv {
    /// Our QP info for the peer.
    pub fn local_info(&self) -> QpInfo {
        each!(self, c => c.local_info())
    }
    /// See `RecvComm::set_peer_addr`.
    pub fn set_peer_addr(&mut self, a: SocketAddr) {
        each!(self, c => c.set_peer_addr(a))
    }
    /// See `RecvComm::irecv`.
    pub fn irecv(&mut self, bufs: &[RecvBuf], parents: &[usize]) -> Result<Option<ReqId>> {
        each!(self, c => c.irecv_under(bufs, parents))
    }
    /// See `RecvComm::set_events`.
    pub fn set_events(&mut self, sink: Option<Sink>) {
        each!(self, c => c.set_events(sink))
    }
    /// See `RecvComm::iflush`.
    pub fn iflush(&mut self, bufs: &[RecvBuf]) -> Result<Option<ReqId>> {
        each!(self, c => c.iflush(bufs))
    }
    /// See `RecvComm::test`.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        each!(self, c => c.test(id))
    }
    /// Closes.
    pub fn close(self) -> Result<()> {
        each!(self, c => c.close())
    }
}
