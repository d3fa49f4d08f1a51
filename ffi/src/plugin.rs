//! Process-wide plugin state: configuration, devices, the bootstrap address, and the provider
//! dispatch (`Dev`, `AnySend`, `AnyRecv`, `AnyMr`).
//!
//! Providers: `verbs` (libibverbs) and `soft` (ibnet-soft, same host only). `IBNET_PROVIDER=auto`
//! (the default) means verbs devices if any, else none: soft is used only when asked for by name,
//! so a multi-host job never picks a same-host-only device.
//!
//! Lifecycle: each `init` takes a reference and each v11 `finalize` drops one; when the last one
//! goes, connects still in progress are dropped, the soft provider is shut down (its copy-engine
//! and monitor threads are joined; later calls on comms left open fail), and the device table is
//! dropped, which stops and joins the verbs async-event threads once no comm holds a device any
//! more (comms keep their device alive through an `Arc`). A later `init` discovers devices again,
//! so the plugin can be finalized and re-initialised in one process. The state lock is taken only
//! on the control path (init, finalize, listen, connect setup).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm};
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::request::ReqId;
use ibnet_core::wire::QpInfo;
use ibnet_core::Result;

use ibnet_soft::{SoftMr, SoftProvider};

use crate::env::{Config, ProviderChoice};
use crate::verbs::provider::{VMr, VerbsPort};
use crate::{info, warn};

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

/// Registrations cached per device (properties say `regIsGlobal = 1`).
pub const MR_CACHE_CAPACITY: usize = 4096;

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
/// Comms reported for `soft0` (its segment has 2048 QP slots; a comm uses at least one, plus
/// one for a flush QP it never needs).
const SOFT_MAX_COMMS: i32 = 1024;
/// `soft0`'s GUID as reported in the properties (it has no hardware GUID).
const SOFT_GUID: u64 = 0x4942_4e45_5453_4f46; // "IBNETSOF"

/// Static properties of a device, version-agnostic.
#[derive(Debug, Clone, Copy)]
pub struct Props {
    /// Device name (NUL-terminated, owned by the device).
    pub name: *const core::ffi::c_char,
    /// PCI path or NULL.
    pub pci_path: *const core::ffi::c_char,
    /// GUID.
    pub guid: u64,
    /// `NCCL_PTR_*` mask.
    pub ptr_support: i32,
    /// Mbps.
    pub speed: i32,
    /// Port.
    pub port: i32,
    /// µs.
    pub latency: f32,
    /// Max comms.
    pub max_comms: i32,
    /// Max receives per multi-receive.
    pub max_recvs: i32,
    /// Force a flush.
    pub force_flush: bool,
}

impl Dev {
    /// Properties.
    pub fn props(&self) -> Props {
        match self {
            Dev::Verbs(p) => {
                let d = &p.dev;
                let mut ptr = crate::abi::types::NCCL_PTR_HOST;
                let g = crate::gpu::gpu_direct();
                if g.gdr {
                    ptr |= crate::abi::types::NCCL_PTR_CUDA;
                }
                if d.dmabuf && g.dmabuf_gpu_side {
                    ptr |= crate::abi::types::NCCL_PTR_DMABUF;
                }
                Props {
                    name: d.name.as_ptr(),
                    pci_path: d
                        .pci_path
                        .as_ref()
                        .map_or(core::ptr::null(), |c| c.as_ptr()),
                    guid: d.guid,
                    ptr_support: ptr,
                    speed: d.speed,
                    port: d.port as i32 + d.real_port,
                    latency: 0.0,
                    max_comms: d.max_qp,
                    max_recvs: ibnet_core::fifo::MAX_RECVS as i32,
                    force_flush: false,
                }
            }
            // Host memory only: NCCL stages GPU buffers through host memory for this device.
            Dev::Soft(_) => Props {
                name: c"soft0".as_ptr(),
                pci_path: core::ptr::null(),
                guid: SOFT_GUID,
                ptr_support: crate::abi::types::NCCL_PTR_HOST,
                speed: SOFT_SPEED_MBPS,
                port: 1,
                latency: 0.0,
                max_comms: SOFT_MAX_COMMS,
                max_recvs: ibnet_core::fifo::MAX_RECVS as i32,
                force_flush: false,
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
    pub fn isend(&mut self, addr: u64, size: u64, tag: u32, mr: MrKeys) -> Result<Option<ReqId>> {
        each!(self, c => c.isend(addr, size, tag, mr))
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
    pub fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<ReqId>> {
        each!(self, c => c.irecv(bufs))
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

/// The initialised plugin.
pub struct Plugin {
    /// Configuration read at init.
    pub cfg: Config,
    /// The core's parameters (NCCL's variables, typed), read at init.
    pub params: ibnet_core::params::Params,
    /// Devices.
    pub devs: Vec<Dev>,
    /// One registration cache per device (same index as `devs`).
    pub caches: Vec<Arc<MrCacheT>>,
    /// The bootstrap address (port 0) listeners bind to.
    pub bind: Option<SocketAddr>,
}

impl Plugin {
    /// The comm settings for device `d` with traffic class `tc` (-1: undefined).
    pub fn comm_config(&self, d: &Dev, tc: i32) -> CommConfig {
        let link = d.port_info().link_layer;
        let tc = u8::try_from(tc).ok();
        CommConfig::from_params(
            &self.params,
            link,
            tc,
            d.gpu_direct() || self.cfg.force_flush,
        )
    }
}

struct State {
    refs: usize,
    plugin: Option<Arc<Plugin>>,
    /// The process that initialised `plugin`. A child forked after `init` inherits a copy of
    /// the state whose threads do not exist in it: that copy is never used (nor dropped).
    pid: u32,
}

static STATE: Mutex<State> = Mutex::new(State {
    refs: 0,
    plugin: None,
    pid: 0,
});

impl State {
    /// Forgets state inherited across `fork` (its provider threads live in the parent only;
    /// joining or using them here would hang or corrupt the parent's shared segment).
    fn forget_if_forked(&mut self) {
        if self.plugin.is_some() && self.pid != std::process::id() {
            core::mem::forget(self.plugin.take());
            self.refs = 0;
        }
    }
}

/// Stops what a plugin instance runs: connects in progress are dropped and the soft provider's
/// threads are joined (comms left open fail from then on).
fn shut_down(p: Option<Arc<Plugin>>) {
    crate::api::drop_pending_connects();
    if let Some(p) = p {
        for d in &p.devs {
            if let Dev::Soft(sp) = d {
                sp.shutdown();
            }
        }
    }
}

/// Runs when the library is unloaded (`dlclose`) or the process exits: a caller of the v6–v10
/// tables has no `finalize`, so this is where the soft provider's threads are stopped before
/// their code is unmapped. Never blocks on the state lock.
extern "C" fn on_unload() {
    let p = match STATE.try_lock() {
        Ok(mut s) => {
            s.forget_if_forked();
            s.refs = 0;
            s.plugin.take()
        }
        Err(_) => return,
    };
    shut_down(p);
}

// SAFETY: `.fini_array` holds plain `extern "C" fn()` pointers that the dynamic loader calls at
// `dlclose` or exit; `on_unload` takes no arguments, never unwinds (it only stops our threads).
#[allow(unsafe_code)]
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

fn discover(cfg: &Config) -> Vec<Dev> {
    let qp = Arc::new(crate::verbs::qp::QpOpts {
        retry_all: cfg.mqp_retry_all,
        retry_cnt: cfg.mqp_retry_cnt,
        retry_sleep_ms: cfg.mqp_retry_sleep_ms,
        ece: cfg.ece_enable,
        fault_timeouts: cfg.fault_mqp_etimedout.into(),
    });
    let verbs = || match crate::verbs::device::discover(cfg) {
        Ok(v) => v
            .into_iter()
            .map(|d| {
                Dev::Verbs(VerbsPort {
                    dev: d,
                    relaxed_ordering: cfg.relaxed_ordering != 0,
                    fault_ro_einval: cfg.fault_ro_einval,
                    qp: qp.clone(),
                })
            })
            .collect(),
        Err(why) => {
            info!(
                crate::log::INIT | crate::log::NET,
                "no verbs devices: {why}; reporting 0 devices"
            );
            Vec::new()
        }
    };
    match cfg.provider {
        ProviderChoice::Auto | ProviderChoice::Verbs => verbs(),
        ProviderChoice::Soft => soft(),
    }
}

/// `IBNET_PROVIDER=soft`: `soft0` if the host lets processes of one user attach to each
/// other's memory, else zero devices with a WARN naming the cause and the fix.
fn soft() -> Vec<Dev> {
    let (scfg, bad) = ibnet_soft::Config::from_env();
    for e in bad {
        warn!("IBNET_PROVIDER=soft: {e}");
    }
    if let Err(u) = ibnet_soft::probe_with(scfg.set_ptracer) {
        warn!("IBNET_PROVIDER=soft: cross-memory attach is not permitted on this host; reporting 0 devices: {u}");
        return Vec::new();
    }
    match SoftProvider::open_with(scfg) {
        Ok(p) => {
            info!(
                crate::log::INIT | crate::log::NET,
                "IBNET_PROVIDER=soft: using soft0 (software RDMA, same host only, host memory only; {} copy worker(s))",
                scfg.workers
            );
            vec![Dev::Soft(p)]
        }
        Err(e) => {
            warn!("IBNET_PROVIDER=soft: cannot open soft0: {e}; reporting 0 devices");
            Vec::new()
        }
    }
}

fn bootstrap_addr(cfg: &Config) -> Option<SocketAddr> {
    let all = crate::ifaddr::list();
    let a = crate::ifaddr::choose(&all, cfg.socket_ifname.as_deref(), cfg.socket_family)?;
    info!(
        crate::log::INIT | crate::log::NET,
        "bootstrap on {} {}",
        a.name,
        a.addr.ip()
    );
    Some(a.addr)
}

/// Takes a reference, initialising the plugin on the first one.
pub fn acquire() -> Arc<Plugin> {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    s.forget_if_forked();
    s.refs += 1;
    if let Some(p) = &s.plugin {
        return p.clone();
    }
    let (cfg, params) = Config::from_env();
    let bind = bootstrap_addr(&cfg);
    // No IP interface: no device either (`init` then fails, as the seed's does, and NCCL
    // falls back to another transport) rather than devices whose `listen` would fail.
    let devs = if bind.is_some() {
        discover(&cfg)
    } else {
        warn!(
            "No IP interface found for the bootstrap sockets (NCCL_SOCKET_IFNAME={:?}, \
             NCCL_SOCKET_FAMILY={:?}); reporting no device",
            cfg.socket_ifname, cfg.socket_family
        );
        Vec::new()
    };
    for d in &devs {
        if let Dev::Verbs(v) = d {
            v.dev
                .ctx
                .events
                .set_return_events(params.ib_return_async_events);
        }
    }
    let caches = devs.iter().map(|_| Arc::new(MrCacheT::new())).collect();
    let p = Arc::new(Plugin {
        cfg,
        params,
        devs,
        caches,
        bind,
    });
    s.plugin = Some(p.clone());
    s.pid = std::process::id();
    p
}

/// Drops a reference; the last one releases the devices.
pub fn release() {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    s.forget_if_forked();
    if s.refs == 0 {
        return;
    }
    s.refs -= 1;
    if s.refs == 0 {
        let p = s.plugin.take();
        drop(s);
        shut_down(p);
    }
}

/// The current plugin, if initialised.
pub fn current() -> Option<Arc<Plugin>> {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    s.forget_if_forked();
    s.plugin.clone()
}
