//! Process-wide plugin state: configuration, devices (dispatched by [`crate::dev`]), the
//! bootstrap address, and its lifecycle.
//!
//! Providers: `verbs` (libibverbs) and `soft` (ibnet-soft, same host only). `IBNET_PROVIDER=auto`
//! (the default) means verbs devices if any, else none: soft is used only when asked for by name,
//! so a multi-host job never picks a same-host-only device.
//!
//! Lifecycle: each `init` takes a reference and each v11 `finalize` drops one; when the last one
//! goes, connects still in progress are dropped, the soft provider is shut down (its copy-engine
//! and monitor threads are joined; later calls on comms left open fail), and the device table is
//! dropped, which stops and joins the verbs async-event threads once no comm holds a device any
//! more (comms keep their device alive through an `Arc`); registrations NCCL left are
//! deregistered and freed then (`Plugin`'s `Drop`), those of a comm still open when that comm
//! closes ([`crate::dev_cache`]). A later `init` discovers devices again,
//! so the plugin can be finalized and re-initialised in one process. The state lock is taken only
//! on the control path (init, finalize, listen, connect setup).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ibnet_core::comm::CommConfig;
use ibnet_core::params::{Params, ProviderKind};

use ibnet_soft::SoftProvider;

use crate::dev::Dev;
use crate::dev_cache::DevCache;
use ibnet_nccl::{info, warn};
use ibnet_verbs::discovery::Discovery;
use ibnet_verbs::provider::VerbsPort;

/// The initialised plugin.
pub struct Plugin {
    /// The configuration (NCCL's variables and ibnet's own, typed), read from the environment
    /// when the plugin is created (`env::load`).
    pub params: Params,
    /// Devices.
    pub devs: Vec<Dev>,
    /// One registration cache per device (same index as `devs`).
    pub caches: Vec<Arc<DevCache>>,
    /// The bootstrap address (port 0) listeners bind to.
    pub bind: Option<SocketAddr>,
    /// The NICs comms were set up on (made on first use; see [`crate::nic`]).
    pub nics: crate::nic::Nics,
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
            d.gpu_direct() || self.params.force_flush,
        )
    }

    /// Device `d`'s properties ([`Dev::props`]) with the rail and plane of the `NCCL_IB_HCA`
    /// entry that names it (v12's `railId`/`planeId`; -1 when none does). A soft device is
    /// not filtered by `NCCL_IB_HCA` (`IBNET_SOFT_DEVICES` picks them) but takes its ids from
    /// an entry naming it (`soft0:1:0:0`), so tests can give soft devices rails.
    pub fn props(&self, d: &Dev) -> crate::dev::Props {
        let mut out = d.props(&self.comm_config(d, -1));
        let name = d.name().to_string_lossy();
        let ids = self.params.hca.select(&name, d.port_info().port);
        let ids = ids.unwrap_or(ibnet_core::hca::Ids::UNSET);
        (out.rail, out.plane) = (ids.rail, ids.plane);
        out
    }
}

impl Drop for Plugin {
    /// The plugin's last reference (`finalize`, unload, or [`idle`]): the registrations NCCL
    /// left (it may finalize without deregistering everything) are deregistered and freed
    /// here, one INFO saying how many; without this each plugin life leaked them, and with
    /// them their provider (a verbs PD and context, a soft segment's memfd).
    fn drop(&mut self) {
        // The NICs hold their rails' caches (a virtual NIC's own cache holds only handles
        // into those): gone first, so that each device cache is the plugin's alone (a NIC an
        // open comm or listener holds keeps its caches: `drain_left` counts those).
        self.nics = Default::default();
        drain_left(&mut self.caches);
    }
}

/// Deregisters and frees what the device caches `caches` still hold (each one only this
/// plugin holds; a comm still open keeps its device's registrations, deregistered when it
/// closes: `DevCache`'s `Drop`); one INFO when there was any.
fn drain_left(caches: &mut [Arc<DevCache>]) {
    let (mut regs, mut mrs, mut failed, mut kept) = (0, 0, 0, 0);
    for c in caches.iter_mut() {
        let Some(cache) = Arc::get_mut(c) else {
            kept += c.registrations();
            continue;
        };
        let (r, m, f) = cache.deregister_all();
        (regs, mrs, failed) = (regs + r, mrs + m, failed + f);
    }
    if regs > 0 {
        let fail = if failed > 0 {
            format!(" ({failed} of them failed to deregister)")
        } else {
            String::new()
        };
        info!(
            ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
            "finalize: {regs} registration(s) NCCL did not deregister ({mrs} memory region(s)); \
             deregistered them{fail}"
        );
    }
    if kept > 0 {
        info!(
            ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
            "finalize: {kept} registration(s) of comms still open are left to them (deregistered when they close)"
        );
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
    crate::connect_registry::drop_all();
    if let Some(p) = p {
        for d in &p.devs {
            if let Dev::Soft(sp, _) = d {
                sp.shutdown();
            }
        }
        drop(p);
        give_back_heap();
    }
}

/// Returns the freed heap pages to the kernel once the plugin is gone. The soft provider's
/// tables are large (its QP table holds every QP the advertised comms may create); freed, they
/// leave free chunks in the middle of glibc's heap that small allocations of the next
/// plugin's life then split, so that a job that opens and closes its comms again and again
/// would see its RSS climb (measured with `MALLOC_ARENA_MAX=1`: 31 MB to 1.2 GB over 1,600
/// open/close cycles, with 1 MB in use). Not a hot path: only the last close gets here.
#[allow(unsafe_code)]
fn give_back_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only releases free pages of the heap.
    unsafe {
        libc::malloc_trim(0);
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

fn discover(p: &Params) -> Vec<Dev> {
    let qp = Arc::new(ibnet_verbs::qp::QpOpts {
        retry_all: p.ib_mqp_retry_all,
        retry_cnt: p.ib_mqp_retry_cnt,
        retry_sleep_ms: p.ib_mqp_retry_sleep_msec,
        ece: p.ib_ece_enable,
        fault_timeouts: p.fault_mqp_etimedout.into(),
    });
    let cfg = Discovery::from_params(p);
    // IBNET_PROVIDER=verbs asked for verbs devices: none is worth one WARN (auto: INFO). So is
    // a libibverbs named by IBNET_IBVERBS_PATH that cannot be loaded, or one named by
    // NCCL_IBVERBS_LIB when the system's cannot be loaded either (discover tried it already
    // unless NCCL_IB_DISABLE, so `get` returns the cached result).
    let asked = p.provider == ProviderKind::Verbs;
    let named_lib_failed = || {
        let named = ibnet_verbs::loader::named_path();
        named.filter(|_| !p.ib_disable && ibnet_verbs::loader::get().is_err())
    };
    let none = |why: &dyn core::fmt::Display| {
        if asked {
            warn!("IBNET_PROVIDER=verbs: no verbs device ({why}); reporting 0 devices");
        } else if let Some((var, path)) = named_lib_failed() {
            warn!(
                "{var}={}: the libibverbs it names cannot be loaded ({why}); reporting 0 devices",
                path.to_string_lossy()
            );
        } else {
            info!(
                ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
                "no verbs devices: {why}; reporting 0 devices"
            );
        }
    };
    let verbs = || match ibnet_verbs::device::discover(&cfg) {
        Ok(v) if v.is_empty() => {
            none(&"libibverbs lists no usable port");
            Vec::new()
        }
        Ok(v) => v
            .into_iter()
            .map(|d| {
                Dev::Verbs(VerbsPort {
                    gid: (d.gid_index, d.gid),
                    dev: d,
                    relaxed_ordering: cfg.relaxed_ordering != 0,
                    fault_ro_einval: p.fault_ro_einval,
                    qp: qp.clone(),
                })
            })
            .collect(),
        Err(why) => {
            none(&why);
            Vec::new()
        }
    };
    match p.provider {
        ProviderKind::Auto | ProviderKind::Verbs => verbs(),
        ProviderKind::Soft => soft(p),
    }
}

/// `IBNET_PROVIDER=soft`: `soft0` (and up to `soft7` with `IBNET_SOFT_DEVICES`, each its own
/// provider instance, for fused-NIC tests on one host) if the host lets processes of one user
/// attach to each other's memory, else zero devices with a WARN naming the cause and the fix.
/// `IBNET_SOFT_FAULTS` arms every soft device, or with `IBNET_SOFT_FAULTS_DEV=N` only `softN`.
fn soft(p: &Params) -> Vec<Dev> {
    let (scfg, bad) = ibnet_soft::Config::from_lookup(ibnet_nccl::env::var);
    for e in bad {
        warn!("IBNET_PROVIDER=soft: {e}");
    }
    if let Err(u) = ibnet_soft::probe_with(scfg.set_ptracer) {
        warn!("IBNET_PROVIDER=soft: cross-memory attach is not permitted on this host; reporting 0 devices: {u}");
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..p.soft_devices {
        let mut c = scfg;
        if p.soft_faults_dev.is_some_and(|d| d != i) {
            c.faults = ibnet_soft::faults::Faults::OFF;
        }
        match SoftProvider::open_as(c, i) {
            Ok(p) => {
                info!(
                    ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
                    "IBNET_PROVIDER=soft: using soft{i} (software RDMA, same host only, host memory only; {} copy worker(s){})",
                    c.workers,
                    if c.faults == ibnet_soft::faults::Faults::OFF { "" } else { "; faults armed" }
                );
                out.push(Dev::Soft(p, i));
            }
            Err(e) => {
                warn!("IBNET_PROVIDER=soft: cannot open soft{i}: {e}; reporting {i} device(s)");
                break;
            }
        }
    }
    out
}

fn bootstrap_addr(p: &Params) -> Option<SocketAddr> {
    let all = crate::ifaddr::list();
    let ifname = (!p.socket_ifname.trim().is_empty()).then_some(&p.ifname);
    let family = p.socket_family.map(ibnet_verbs::discovery::family);
    let a = crate::ifaddr::choose(&all, ifname, family)?;
    info!(
        ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
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
    s.get_or_create()
}

impl State {
    /// The plugin, created if there is none (the first `init`, or after [`idle`] stopped it).
    fn get_or_create(&mut self) -> Arc<Plugin> {
        if let Some(p) = &self.plugin {
            return p.clone();
        }
        let p = create();
        self.plugin = Some(p.clone());
        self.pid = std::process::id();
        p
    }
}

fn create() -> Arc<Plugin> {
    let (params, notes) = ibnet_nccl::env::load();
    for n in &notes {
        if n.is_warn() {
            warn!("{n}");
        } else {
            info!(ibnet_nccl::log::ENV, "{n}");
        }
    }
    let bind = bootstrap_addr(&params);
    // No IP interface: no device either (`init` then fails, as the seed's does, and NCCL
    // falls back to another transport) rather than devices whose `listen` would fail.
    let devs = if bind.is_some() {
        discover(&params)
    } else {
        let ifname = Some(params.socket_ifname.as_str()).filter(|s| !s.trim().is_empty());
        warn!(
            "No IP interface found for the bootstrap sockets (NCCL_SOCKET_IFNAME={:?}, \
             NCCL_SOCKET_FAMILY={:?}); reporting no device",
            ifname,
            params.socket_family.map(ibnet_verbs::discovery::family)
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
    let caches = devs.iter().map(|_| DevCache::new()).collect();
    Arc::new(Plugin {
        params,
        devs,
        caches,
        bind,
        nics: Default::default(),
    })
}

/// Stops the plugin's threads once nothing uses it: no comm or listen comm open
/// ([`crate::handles::live`]), no connect in progress, no registration left in a device's
/// cache, and no call holding the plugin. The v6–v10 tables have no `finalize`, so without
/// this their threads would outlive the last comm and (their thread-locals pinning the
/// library) keep `dlclose` from unloading it. The references `init` took stay: the next call
/// that needs the plugin creates it again.
///
/// A registration left when its comm closed (NCCL's error paths close comms without
/// `deregMr`) keeps the plugin, as NCCL's own plugin keeps its devices and their MR caches:
/// the registration holds its provider (the soft provider's segment memfd, a verbs PD), so
/// dropping the plugin under it and creating another for the next comm would leak that
/// provider's descriptors on every such cycle (issue 30: one fd per failed run). It is
/// deregistered at `finalize` or unload (`Plugin`'s `Drop`).
pub fn idle() {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    s.forget_if_forked();
    let unused = s
        .plugin
        .as_ref()
        .is_some_and(|p| Arc::strong_count(p) == 1 && p.caches.iter().all(|c| c.occupied() == 0));
    // Every comm-creating call holds a plugin clone until its comm is in the table, so with
    // the count at 1 (ours) under the lock, no comm can appear meanwhile.
    if !unused || crate::handles::live() != 0 || !crate::connect_registry::is_empty() {
        return;
    }
    let p = s.plugin.take();
    drop(s);
    shut_down(p);
}

/// Drops a reference; the last one stops the plugin.
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

/// The current plugin, if initialised (created again if [`idle`] stopped it).
pub fn current() -> Option<Arc<Plugin>> {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    s.forget_if_forked();
    (s.refs > 0).then(|| s.get_or_create())
}
