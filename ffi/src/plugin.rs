//! Process-wide plugin state: configuration, devices, the bootstrap address, and the provider
//! dispatch (`Dev`, `AnySend`, `AnyRecv`, `AnyMr`).
//!
//! Lifecycle: each `init` takes a reference and each v11 `finalize` drops one; when the last one
//! goes, the device table is dropped, which stops and joins the async-event threads once no comm
//! holds a device any more (comms keep their device alive through an `Arc`). A later `init`
//! discovers devices again, so the plugin can be finalized and re-initialised in one process.
//! The state lock is taken only on the control path (init, finalize, listen, connect setup).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm};
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::request::ReqId;
use ibnet_core::wire::QpInfo;
use ibnet_core::Result;

use crate::env::{Config, ProviderChoice};
use crate::verbs::provider::{VMr, VerbsPort};
use crate::{info, warn};

/// A plugin device: one provider port.
#[derive(Clone)]
pub enum Dev {
    /// A libibverbs port.
    Verbs(VerbsPort),
}

/// A send comm over some provider.
pub enum AnySend {
    /// Over verbs.
    Verbs(SendComm<VerbsPort>),
}

/// A receive comm over some provider.
pub enum AnyRecv {
    /// Over verbs.
    Verbs(RecvComm<VerbsPort>),
}

/// A registration over some provider.
pub enum AnyMr {
    /// Over verbs.
    Verbs(VerbsPort, VMr),
}

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
                if crate::verbs::device::gdr_supported() {
                    ptr |= crate::abi::types::NCCL_PTR_CUDA;
                }
                if d.dmabuf {
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
        }
    }

    /// Adaptive routing in effect on this device.
    pub fn adaptive_routing(&self) -> bool {
        match self {
            Dev::Verbs(p) => p.dev.adaptive_routing,
        }
    }

    /// Creates a send comm.
    pub fn new_send(&self, cfg: CommConfig) -> Result<AnySend> {
        Ok(match self {
            Dev::Verbs(p) => AnySend::Verbs(SendComm::new(p.clone(), cfg)?),
        })
    }

    /// Creates a receive comm connected to `remote`.
    pub fn new_recv(&self, cfg: CommConfig, remote: &QpInfo) -> Result<AnyRecv> {
        Ok(match self {
            Dev::Verbs(p) => AnyRecv::Verbs(RecvComm::new(p.clone(), cfg, remote)?),
        })
    }

    /// Registers memory.
    pub fn reg(&self, addr: u64, len: u64, kind: RegKind) -> Result<(AnyMr, MrKeys)> {
        let access = Access::ALL;
        Ok(match self {
            Dev::Verbs(p) => {
                let mr = p.reg_mr(addr, len, access, kind)?;
                let k = p.mr_keys(&mr);
                (AnyMr::Verbs(p.clone(), mr), k)
            }
        })
    }
}

impl AnyMr {
    /// Deregisters.
    pub fn dereg(self) -> Result<()> {
        match self {
            AnyMr::Verbs(p, mr) => p.dereg_mr(mr),
        }
    }
}

macro_rules! each {
    ($e:expr, $c:ident => $body:expr) => {
        match $e {
            Self::Verbs($c) => $body,
        }
    };
}

impl AnySend {
    /// Our QP info for the peer.
    pub fn local_info(&self) -> QpInfo {
        each!(self, c => c.local_info())
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
    /// The bootstrap address (port 0) listeners bind to.
    pub bind: Option<SocketAddr>,
}

impl Plugin {
    /// The comm settings for device `d` with traffic class `tc` (-1: undefined).
    pub fn comm_config(&self, d: &Dev, tc: i32) -> CommConfig {
        let link = match d {
            Dev::Verbs(p) => p.port_info().link_layer,
        };
        let tc = u8::try_from(tc).ok();
        CommConfig::from_params(&self.params, link, tc, false)
    }
}

struct State {
    refs: usize,
    plugin: Option<Arc<Plugin>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    refs: 0,
    plugin: None,
});

fn discover(cfg: &Config) -> Vec<Dev> {
    let verbs = || match crate::verbs::device::discover(cfg) {
        Ok(v) => v
            .into_iter()
            .map(|d| {
                Dev::Verbs(VerbsPort {
                    dev: d,
                    relaxed_ordering: cfg.relaxed_ordering != 0,
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
        ProviderChoice::Soft => {
            info!(crate::log::INIT | crate::log::NET, "IBNET_PROVIDER=soft: the software provider is not built into this plugin yet; reporting 0 devices");
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
    s.refs += 1;
    if let Some(p) = &s.plugin {
        return p.clone();
    }
    let (cfg, params) = Config::from_env();
    let bind = bootstrap_addr(&cfg);
    if bind.is_none() {
        warn!(
            "no usable IP interface for the bootstrap sockets (NCCL_SOCKET_IFNAME={:?})",
            cfg.socket_ifname
        );
    }
    let devs = discover(&cfg);
    let p = Arc::new(Plugin {
        cfg,
        params,
        devs,
        bind,
    });
    s.plugin = Some(p.clone());
    p
}

/// Drops a reference; the last one releases the devices.
pub fn release() {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if s.refs == 0 {
        return;
    }
    s.refs -= 1;
    if s.refs == 0 {
        s.plugin = None;
    }
}

/// The current plugin, if initialised.
pub fn current() -> Option<Arc<Plugin>> {
    STATE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .plugin
        .clone()
}
