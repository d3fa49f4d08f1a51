//! Verbs device discovery, as NCCL 2.28's `ncclIbInit` does it.
//!
//! For every device (filtered by `NCCL_IB_HCA`), every ACTIVE port with an InfiniBand or
//! Ethernet (RoCE) link layer becomes one plugin device, with: speed from
//! `ibv_query_port_speed` where libibverbs has it (`NCCL_IB_QUERY_PORT_SPEED`, default on), else
//! from width × lane speed (SDR … NDR, XDR through `active_speed_ex`), the PCI path (ports and, with
//! `NCCL_IB_MERGE_VFS`, virtual functions merged), `realPort`, the system image GUID, the GID
//! chosen by `NCCL_IB_GID_INDEX` (-1: auto-selection by RoCE version, address family and range)
//! and the DMA-BUF probe result. With `NCCL_IB_DEVICE_PCI_ORDER` (default on) the devices are
//! numbered in PCI order ([`ibnet_core::policy::order`]), and `realPort` is counted after
//! that. The rules are core's ([`ibnet_core::policy::merge`],
//! [`ibnet_core::policy::gid`]); this module reads sysfs and queries verbs for them. When the
//! user set `NCCL_IB_ADDR_FAMILY` or `NCCL_IB_ADDR_RANGE`, a RoCE port on which no GID matches
//! them is not used (one WARN), and a connection on a port whose matching GID has gone fails
//! (one WARN, the failed call's): ibnet never falls back to a GID outside what the user set.
//! With both unset it falls back as NCCL does (GID index 0, named in the port's INFO line).
//! Each opened context gets one async-event thread, stopped and joined when the last port
//! using the context is dropped.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use std::ffi::CStr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::loader::{self, Verbs};
use super::sys::*;
use crate::discovery::Discovery as Config;
use ibnet_core::hca::HcaFilter;
use ibnet_core::policy::gid::{self as gid_policy, Auto, NoMatch};
use ibnet_core::policy::merge;
use ibnet_core::provider::DevName;
use ibnet_core::Error;
use ibnet_nccl::{info, warn};

pub use ibnet_core::policy::gid::{select_auto as select_gid, Candidate};

/// An opened device context shared by its ports, with its protection domain and async thread.
pub struct Context {
    /// libibverbs.
    pub verbs: &'static Verbs,
    /// The context.
    pub raw: *mut ibv_context,
    /// The protection domain all comms and registrations on this device use.
    pub pd: *mut ibv_pd,
    /// Device name (`mlx5_0`).
    pub name: String,
    /// State shared with the async-event thread.
    pub events: Arc<Events>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

pub use super::events::Events;

// SAFETY: libibverbs contexts and PDs may be used from any thread; the raw pointers are owned by
// this struct and released once in Drop.
unsafe impl Send for Context {}
// SAFETY: as above; shared use goes through thread-safe libibverbs calls and atomics.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // The join below is the synchronisation point with the async thread.
        self.events.request_stop();
        if let Some(t) = self.thread.lock().ok().and_then(|mut g| g.take()) {
            let _ = t.join();
        }
        // SAFETY: the PD and context were created by us, are released once, and nothing else
        // references them (every comm holds an Arc to this Context).
        unsafe {
            if !self.pd.is_null() {
                (self.verbs.dealloc_pd)(self.pd);
            }
            (self.verbs.close_device)(self.raw);
        }
    }
}

/// One discovered (device, port).
pub struct VerbsDev {
    /// The shared context.
    pub ctx: Arc<Context>,
    /// `mlx5_0`-style name, for properties.
    pub name: std::ffi::CString,
    /// PCI path in sysfs (ports/VFs merged), if found.
    pub pci_path: Option<std::ffi::CString>,
    /// Port number (1-based).
    pub port: u8,
    /// Which physical port of the PCI device this is.
    pub real_port: i32,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Speed in Mbps.
    pub speed: i32,
    /// System image GUID.
    pub guid: u64,
    /// Maximum QPs.
    pub max_qp: i32,
    /// LID.
    pub lid: u16,
    /// Active MTU (`ibv_mtu`).
    pub mtu: u8,
    /// GID index chosen at discovery (for display; each comm chooses again:
    /// [`VerbsDev::choose_gid`]).
    pub gid_index: u8,
    /// The GID at that index at discovery.
    pub gid: [u8; 16],
    /// What GID selection needs, to choose again per connection.
    gid_sel: GidSel,
    /// The last choice logged ([`VerbsDev::choose_gid`] logs a choice that differs from it).
    /// Only for that INFO line: a comm uses the choice `choose_gid` returned to it.
    logged_gid: Mutex<(u8, [u8; 16])>,
    /// Adaptive routing in effect.
    pub adaptive_routing: bool,
    /// The DMA-BUF probe succeeded.
    pub dmabuf: bool,
    /// The device's place in PCI order ([`ibnet_core::policy::order::pci_key`] of its full
    /// sysfs path; `None` without one).
    pci_key: Option<i64>,
}

const WIDTHS: [i32; 5] = [1, 4, 8, 12, 2];
const SPEEDS: [i32; 9] = [
    2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000,
];

fn first_bit(v: u32, max: usize) -> usize {
    (0..max).find(|&i| v & (1 << i) != 0).unwrap_or(max)
}

/// Port speed in Mbps from `active_width` and `active_speed` (or `active_speed_ex` when set).
pub fn speed_mbps(width: u8, speed: u8, speed_ex: u32) -> i32 {
    let s = if speed_ex != 0 {
        speed_ex
    } else {
        speed as u32
    };
    SPEEDS[first_bit(s, SPEEDS.len() - 1)] * WIDTHS[first_bit(width as u32, WIDTHS.len() - 1)]
}

/// The inputs of GID selection, kept per port to choose again per connection.
#[derive(Debug, Clone, Copy)]
struct GidSel {
    link_layer: u8,
    gid_tbl_len: i32,
    gid_index: i64,
    flid_index: u8,
    auto: Auto,
}

impl GidSel {
    fn new(pa: &ibv_port_attr, cfg: &Config) -> Self {
        Self {
            link_layer: pa.link_layer,
            gid_tbl_len: pa.gid_tbl_len,
            gid_index: cfg.gid_index,
            flid_index: cfg.routable_flid_gid_index,
            auto: cfg.gid_auto,
        }
    }
}

/// The GID chosen for a port: its index, the GID there, and whether it is NCCL's fallback to
/// index 0 (nothing matched, `NCCL_IB_ADDR_FAMILY`/`_RANGE` unset).
type Pick = (u8, [u8; 16], bool);

/// What a fallback adds to a GID's INFO line (empty when the GID matched).
fn fallback_note(fallback: bool, auto: &Auto) -> &'static str {
    match (fallback, auto.family) {
        (false, _) => "",
        (true, ibnet_core::params::AddrFamily::Inet) => {
            "; no valid GID of AF_INET: index 0, as NCCL does with NCCL_IB_ADDR_FAMILY and \
             NCCL_IB_ADDR_RANGE unset"
        }
        (true, ibnet_core::params::AddrFamily::Inet6) => {
            "; no valid GID of AF_INET6: index 0, as NCCL does with NCCL_IB_ADDR_FAMILY and \
             NCCL_IB_ADDR_RANGE unset"
        }
    }
}

impl VerbsDev {
    /// Chooses the GID for a new connection now: the GID table can change after init (an
    /// address added or moved), so each comm runs the selection again, as NCCL 2.28 does at
    /// every connect, and is made with the choice returned here (`VerbsPort::with_gid`). A
    /// choice that differs from the last one logged is an INFO line. None matching the
    /// `NCCL_IB_ADDR_FAMILY`/`_RANGE` the user set any more is [`Error::NoGid`], logged by
    /// the caller (the failed call's one WARN; `accept` fails with it).
    pub fn choose_gid(&self) -> Result<(u8, [u8; 16]), Error> {
        let name = &self.ctx.name;
        let (idx, gid, fallback) =
            select_port_gid(self.ctx.verbs, self.ctx.raw, name, self.port, &self.gid_sel)
                .map_err(|e| e.to_error(DevName::new(name), self.port))?;
        let mut last = self.logged_gid.lock().unwrap_or_else(|e| e.into_inner());
        if *last != (idx, gid) {
            info!(
                ibnet_nccl::log::NET,
                "{name}:{} GID for new connections: index {idx} {} (was index {} {}){}",
                self.port,
                std::net::Ipv6Addr::from(gid),
                last.0,
                std::net::Ipv6Addr::from(last.1),
                fallback_note(fallback, &self.gid_sel.auto)
            );
            *last = (idx, gid);
        }
        Ok((idx, gid))
    }
}

/// The device's sysfs path: full (for PCI order) and merged as NCCL does
/// ([`merge::merge_pci_path`]).
fn pci_paths(dev: &str, merge_vfs: bool) -> Option<(String, String)> {
    let p = std::fs::canonicalize(format!("/sys/class/infiniband/{dev}/device")).ok()?;
    let full = p.to_string_lossy().into_owned();
    let mut b = full.clone().into_bytes();
    merge::merge_pci_path(&mut b, merge_vfs);
    let merged = String::from_utf8(b).unwrap_or_else(|_| full.clone());
    Some((full, merged))
}

/// The RoCE version of GID `idx` of `dev`:`port`, from its sysfs type
/// ([`gid_policy::roce_version`]).
fn roce_version(dev: &str, port: u8, idx: i32) -> Option<u8> {
    let s = std::fs::read_to_string(format!(
        "/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{idx}"
    ))
    .ok()?;
    gid_policy::roce_version(&s)
}

fn probe_dmabuf(v: &Verbs, pd: *mut ibv_pd) -> bool {
    let Some(reg) = v.reg_dmabuf_mr else {
        return false;
    };
    // SAFETY: fd = -1 makes the kernel fail the call; a driver with DMA-BUF support reports EBADF.
    let mr = unsafe { reg(pd, 0, 0, 0, -1, 0) };
    let e = loader::last_errno();
    if !mr.is_null() {
        // SAFETY: unexpectedly created; release it.
        unsafe { (v.dereg_mr)(mr) };
        return false;
    }
    e != libc::EOPNOTSUPP && e != libc::EPROTONOSUPPORT
}

fn check_memlock() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0
        && r.rlim_cur != libc::RLIM_INFINITY
        && r.rlim_cur < (1 << 30)
    {
        warn!(
            "RLIMIT_MEMLOCK is {} bytes: memory registration may fail with ENOMEM; \
             raise it (ulimit -l unlimited, or --ulimit memlock=-1 for containers)",
            r.rlim_cur
        );
    }
}

struct SendCtx(*mut ibv_context);
// SAFETY: the context outlives the thread (Context::drop joins it before closing the device).
unsafe impl Send for SendCtx {}

fn async_thread(
    verbs: &'static Verbs,
    raw: SendCtx,
    name: String,
    ev: Arc<Events>,
) -> impl FnOnce() {
    move || {
        let raw = raw;
        let raw = raw.0;
        // SAFETY: the context is live until Context::drop, which joins this thread first.
        let fd = unsafe { (*raw).async_fd };
        let mut ports = super::events::Ports::default();
        loop {
            if ev.stopping() {
                break;
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut p, 1, 100) };
            if rc <= 0 {
                continue;
            }
            let mut e = ibv_async_event {
                element: core::ptr::null_mut(),
                event_type: 0,
            };
            // SAFETY: the fd is non-blocking, so this returns at once.
            if unsafe { (verbs.get_async_event)(raw, &mut e) } != 0 {
                continue;
            }
            // SAFETY: event_type_str returns a static string.
            let s =
                unsafe { CStr::from_ptr((verbs.event_type_str)(e.event_type)) }.to_string_lossy();
            let (ty, element) = (e.event_type, e.element as usize);
            let h = ev.handle(super::events::classify(ty), element);
            super::events::log(&name, &s, (ty, element), h, &mut ports);
            // SAFETY: every event obtained is acked once.
            unsafe { (verbs.ack_async_event)(&mut e) };
        }
    }
}

/// Why discovery found nothing (for the one INFO line).
pub type Why = String;

/// Discovers verbs devices. `Err(why)` when libibverbs is missing or there is no usable port.
pub fn discover(cfg: &Config) -> Result<Vec<Arc<VerbsDev>>, Why> {
    if cfg.ib_disable {
        return Err("NCCL_IB_DISABLE=1".into());
    }
    let v = loader::get().map_err(|e| format!("libibverbs not available: {e}"))?;
    // SAFETY: ibv_fork_init only sets up madvise handling; NCCL calls it the same way.
    unsafe { (v.fork_init)() };
    // NCCL_IB_HCA as Params::set parsed it (the one parse, in ibnet_core::params).
    let filter = &cfg.hca;
    let mut n = 0;
    // SAFETY: returns an array of `n` device pointers, freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(format!(
            "ibv_get_device_list failed (errno {})",
            loader::last_errno()
        ));
    }
    let mut out: Vec<VerbsDev> = Vec::new();
    for d in 0..n.max(0) as usize {
        // SAFETY: `d < n`.
        let dev = unsafe { *list.add(d) };
        // SAFETY: a device from the list; the name is a static string of the device.
        let name = unsafe { CStr::from_ptr((v.get_device_name)(dev)) }
            .to_string_lossy()
            .into_owned();
        open_ports(v, dev, &name, cfg, filter, &mut out);
    }
    // SAFETY: frees the list from get_device_list once (opened contexts stay valid).
    unsafe { (v.free_device_list)(list) };
    let out = number(out, cfg);
    if out.is_empty() {
        return Err(if n == 0 {
            "no RDMA device found".into()
        } else {
            format!("{n} RDMA device(s) but no active port selected")
        });
    }
    check_memlock();
    let line: Vec<String> = out
        .iter()
        .enumerate()
        .map(|(i, d)| {
            format!(
                "[{i}]{}:{}{}/{}",
                d.ctx.name,
                d.port,
                ids_suffix(filter.select(&d.ctx.name, d.port)),
                if d.link_layer == IBV_LINK_LAYER_INFINIBAND {
                    "IB"
                } else {
                    "RoCE"
                }
            )
        })
        .collect();
    let ro = cfg.relaxed_ordering != 0 && v.reg_mr_iova2.is_some();
    info!(
        ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
        "Using {}{}",
        line.join(" "),
        if ro { " [RO]" } else { "" }
    );
    Ok(out)
}

/// A port's rail and plane from `NCCL_IB_HCA` as NCCL 2.30's "Using" line shows them:
/// `:rail`, `:rail:plane`, `::plane`, or nothing when neither is set.
fn ids_suffix(ids: Option<ibnet_core::hca::Ids>) -> String {
    let Some(i) = ids else {
        return String::new();
    };
    match (i.rail, i.plane) {
        (-1, -1) => String::new(),
        (r, -1) => format!(":{r}"),
        (-1, p) => format!("::{p}"),
        (r, p) => format!(":{r}:{p}"),
    }
}

/// The discovered devices numbered as NCCL numbers them: in PCI order with
/// `NCCL_IB_DEVICE_PCI_ORDER` (a stable sort: ports of one function keep their order), then
/// each one's `realPort` counted over the devices before it.
fn number(mut devs: Vec<VerbsDev>, cfg: &Config) -> Vec<Arc<VerbsDev>> {
    use ibnet_core::policy::order::pci_order;
    if cfg.device_pci_order {
        devs.sort_by(|a, b| pci_order(a.pci_key, b.pci_key));
    }
    for i in 0..devs.len() {
        let (earlier, rest) = devs.split_at_mut(i);
        let d = &mut rest[0];
        // Earlier devices on the same NIC, by NCCL's prefix match.
        d.real_port = merge::real_port(
            d.pci_path.as_deref().and_then(|c| c.to_str().ok()),
            earlier
                .iter()
                .map(|e| e.pci_path.as_deref().and_then(|c| c.to_str().ok())),
            cfg.merge_vfs,
        );
    }
    devs.into_iter().map(Arc::new).collect()
}

/// Opens `dev` and appends its usable ports (the context closes again when none is used).
fn open_ports(
    v: &'static Verbs,
    dev: *mut ibv_device,
    name: &str,
    cfg: &Config,
    filter: &HcaFilter,
    out: &mut Vec<VerbsDev>,
) {
    let Some((ctx, attr)) = open_context(v, dev, name) else {
        return;
    };
    let dmabuf = cfg.dmabuf_enable && probe_dmabuf(v, ctx.pd);
    let mut used = false;
    for port in 1..=attr.phys_port_cnt {
        if let Some(d) = port_dev(&ctx, &attr, port, cfg, filter, dmabuf) {
            out.push(d);
            used = true;
        }
    }
    if used {
        start_async_thread(&ctx);
    }
}

/// Opens `dev`: its context (async fd non-blocking), attributes and protection domain; `None`
/// (one WARN, nothing left open) when a step fails.
fn open_context(
    v: &'static Verbs,
    dev: *mut ibv_device,
    name: &str,
) -> Option<(Arc<Context>, ibv_device_attr)> {
    // SAFETY: `dev` comes from the device list.
    let raw = unsafe { (v.open_device)(dev) };
    if raw.is_null() {
        warn!(
            "unable to open device {name} (errno {})",
            loader::last_errno()
        );
        return None;
    }
    // SAFETY: all-zero is a valid ibv_device_attr.
    let mut attr: ibv_device_attr = unsafe { core::mem::zeroed() };
    // SAFETY: live context, writable attr.
    if unsafe { (v.query_device)(raw, &mut attr) } != 0 {
        warn!(
            "unable to query device {name} (errno {})",
            loader::last_errno()
        );
        // SAFETY: opened above, unused.
        unsafe { (v.close_device)(raw) };
        return None;
    }
    // SAFETY: live context.
    let pd = unsafe { (v.alloc_pd)(raw) };
    if pd.is_null() {
        warn!(
            "ibv_alloc_pd failed on {name} (errno {})",
            loader::last_errno()
        );
        // SAFETY: opened above, unused.
        unsafe { (v.close_device)(raw) };
        return None;
    }
    // SAFETY: the async fd belongs to the context; non-blocking lets the thread poll and stop.
    unsafe {
        let fd = (*raw).async_fd;
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    let ctx = Arc::new(Context {
        verbs: v,
        raw,
        pd,
        name: name.to_string(),
        events: Arc::default(),
        thread: Mutex::new(None),
    });
    Some((ctx, attr))
}

/// Port `port` of the opened device as a plugin device, or `None` when it is not used: not
/// ACTIVE, another link layer, filtered out by `NCCL_IB_HCA`, unqueryable, or (RoCE) no GID
/// matching `NCCL_IB_ADDR_FAMILY`/`_RANGE` (one WARN). `realPort` is left 0 ([`number`]
/// counts it).
fn port_dev(
    ctx: &Arc<Context>,
    attr: &ibv_device_attr,
    port: u8,
    cfg: &Config,
    filter: &HcaFilter,
    dmabuf: bool,
) -> Option<VerbsDev> {
    let (v, raw, name) = (ctx.verbs, ctx.raw, ctx.name.as_str());
    // SAFETY: live context.
    let pa = match unsafe { v.query_port(raw, port) } {
        Ok(p) => p,
        Err(e) => {
            warn!("unable to query port {name}:{port} (errno {e})");
            return None;
        }
    };
    let link_ok =
        pa.link_layer == IBV_LINK_LAYER_INFINIBAND || pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    if pa.state != IBV_PORT_ACTIVE || !link_ok || !filter.matches(name, port) {
        return None;
    }
    let sel = GidSel::new(&pa, cfg);
    let (gid_index, gid, fallback) = match select_port_gid(v, raw, name, port, &sel) {
        Ok(p) => p,
        Err(e) => {
            warn!(
                "{}; the port is not used",
                e.to_error(DevName::new(name), port)
            );
            return None;
        }
    };
    log_gid(
        name,
        port,
        (gid_index, &gid),
        pa.link_layer,
        fallback_note(fallback, &sel.auto),
    );
    let paths = pci_paths(name, cfg.merge_vfs);
    if paths.is_none() {
        warn!("could not find the real path of {name} (/sys/class/infiniband/{name}/device)");
    }
    let pci_key = paths
        .as_ref()
        .and_then(|(full, _)| ibnet_core::policy::order::pci_key(full));
    let pci = paths.map(|(_, merged)| merged);
    let speed = ibnet_core::policy::props::port_speed(
        query_speed(v, raw, port, cfg.query_port_speed),
        speed_mbps(pa.active_width, pa.active_speed, pa.active_speed_ex),
    );
    let ar = if cfg.adaptive_routing == -2 {
        pa.link_layer == IBV_LINK_LAYER_INFINIBAND
    } else {
        cfg.adaptive_routing == 1
    };
    Some(VerbsDev {
        ctx: ctx.clone(),
        name: std::ffi::CString::new(name).unwrap_or_default(),
        pci_path: pci.and_then(|p| std::ffi::CString::new(p).ok()),
        port,
        real_port: 0,
        link_layer: pa.link_layer,
        speed,
        guid: attr.sys_image_guid,
        max_qp: attr.max_qp,
        lid: pa.lid,
        mtu: pa.active_mtu as u8,
        gid_index,
        gid,
        gid_sel: sel,
        logged_gid: Mutex::new((gid_index, gid)),
        adaptive_routing: ar,
        dmabuf,
        pci_key,
    })
}

/// `ibv_query_port_speed`'s answer (units of 100 Mbps) when `enabled`
/// (`NCCL_IB_QUERY_PORT_SPEED`) and libibverbs has the call; `None` otherwise or on failure.
fn query_speed(v: &Verbs, raw: *mut ibv_context, port: u8, enabled: bool) -> Option<u64> {
    let f = v.query_port_speed.filter(|_| enabled)?;
    let mut speed = 0u64;
    // SAFETY: live context, writable u64; the symbol has this signature at IBVERBS_1.16.
    (unsafe { f(raw, port, &mut speed) } == 0).then_some(speed)
}

/// Starts the async-event thread of a context some port uses (a failure is one WARN).
fn start_async_thread(ctx: &Arc<Context>) {
    let name = &ctx.name;
    let body = async_thread(
        ctx.verbs,
        SendCtx(ctx.raw),
        name.clone(),
        ctx.events.clone(),
    );
    let t = std::thread::Builder::new()
        .name(format!("ibnet-async-{name}"))
        .spawn(body);
    match t {
        Ok(t) => {
            if let Ok(mut g) = ctx.thread.lock() {
                *g = Some(t);
            }
        }
        Err(e) => warn!("cannot start the async event thread for {name}: {e}"),
    }
}

/// GID selection as NCCL 2.28's `ncclIbGetGidIndex` on `dev`:`port` ([`select_gid_in`] over
/// the port's GID table and sysfs types).
fn select_port_gid(
    v: &Verbs,
    raw: *mut ibv_context,
    name: &str,
    port: u8,
    sel: &GidSel,
) -> Result<Pick, NoMatch> {
    let query = |i: i32| {
        let mut g = ibv_gid::default();
        // SAFETY: live context, writable gid.
        (unsafe { (v.query_gid)(raw, port, i, &mut g) } == 0).then_some(g.raw)
    };
    select_gid_in(sel, query, |i| roce_version(name, port, i))
}

/// GID selection by core's rules ([`ibnet_core::policy::gid`]) over a GID table read through
/// `query` (`None`: unreadable) with RoCE versions from `roce`: InfiniBand takes
/// `NCCL_IB_ROUTABLE_FLID_GID_INDEX` when that GID carries a routable FLID, else index 0;
/// RoCE takes `NCCL_IB_GID_INDEX`, or auto-selects by family, range and RoCE version
/// ([`NoMatch`] when no GID qualifies and the user set the family or range; index 0 with
/// both unset, as NCCL).
fn select_gid_in(
    sel: &GidSel,
    query: impl Fn(i32) -> Option<[u8; 16]>,
    roce: impl Fn(i32) -> Option<u8>,
) -> Result<Pick, NoMatch> {
    let (idx, fallback) = if sel.link_layer == IBV_LINK_LAYER_INFINIBAND {
        let f = i32::from(sel.flid_index);
        let flid = query(f).map(|g| super::qp::flid(&g));
        let i = gid_policy::infiniband_index(sel.flid_index, sel.gid_tbl_len, flid);
        (i, false)
    } else if sel.gid_index >= 0 {
        (sel.gid_index as i32, false)
    } else {
        let gids: Vec<Candidate> = (0..sel.gid_tbl_len.min(256))
            .filter_map(|index| {
                query(index).map(|gid| Candidate {
                    index,
                    gid,
                    roce: roce(index),
                })
            })
            .collect();
        let c = gid_policy::select_auto(&gids, &sel.auto)?;
        (c.index, c.fallback)
    };
    let idx = u8::try_from(idx).unwrap_or(0);
    Ok((idx, query(i32::from(idx)).unwrap_or_default(), fallback))
}

/// The port's GID INFO line at discovery: index, GID, link layer and, for a fallback, `note`.
fn log_gid(name: &str, port: u8, (idx, gid): (u8, &[u8; 16]), link_layer: u8, note: &str) {
    let kind = if link_layer == IBV_LINK_LAYER_INFINIBAND {
        format!("IB, FLID {:#x}", super::qp::flid(gid))
    } else {
        format!(
            "RoCE v{}",
            roce_version(name, port, i32::from(idx)).map_or("?".to_string(), |v| v.to_string())
        )
    };
    info!(
        ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
        "{name}:{port} using GID index {idx}: {} ({kind}){note}",
        std::net::Ipv6Addr::from(*gid)
    );
}

/// Tests only: a RoCE port (`fake_gid0:1`, a GID table of 4) of the fake libibverbs
/// (`super::fake`), selecting its GID under `cfg`.
#[cfg(test)]
pub(crate) fn fake_dev(cfg: &Config) -> VerbsDev {
    let ctx = Arc::new(Context {
        verbs: &super::fake::VERBS,
        raw: core::ptr::NonNull::dangling().as_ptr(),
        pd: core::ptr::null_mut(),
        name: "fake_gid0".into(),
        events: Arc::default(),
        thread: Mutex::new(None),
    });
    let pa = ibv_port_attr {
        link_layer: IBV_LINK_LAYER_ETHERNET,
        gid_tbl_len: 4,
        ..Default::default()
    };
    VerbsDev {
        ctx,
        name: c"fake_gid0".into(),
        pci_path: None,
        port: 1,
        real_port: 0,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        speed: 0,
        guid: 0,
        max_qp: 0,
        lid: 0,
        mtu: 5,
        gid_index: 0,
        gid: [0; 16],
        gid_sel: GidSel::new(&pa, cfg),
        logged_gid: Mutex::new((0, [0; 16])),
        adaptive_routing: false,
        dmabuf: false,
        pci_key: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The "Using" line shows a port's NCCL_IB_HCA rail and plane as NCCL 2.30 does.
    #[test]
    fn ids_in_the_using_line() {
        use ibnet_core::hca::HcaFilter;
        let f = HcaFilter::parse("mlx5_0:1:0:0,mlx5_1::4,mlx5_2:::7,mlx5_3");
        let s = |d| ids_suffix(f.select(d, 1));
        assert_eq!(s("mlx5_0"), ":0:0");
        assert_eq!(s("mlx5_1"), ":4");
        assert_eq!(s("mlx5_2"), "::7");
        assert_eq!(s("mlx5_3"), "");
        assert_eq!(s("mlx5_9"), "");
    }

    /// A fake RoCE port's GID table: (GID, RoCE version) by index.
    fn roce_port(cfg: &Config, table: &[([u8; 16], u8)]) -> Result<Pick, NoMatch> {
        let pa = ibv_port_attr {
            link_layer: IBV_LINK_LAYER_ETHERNET,
            gid_tbl_len: table.len() as i32,
            ..Default::default()
        };
        let sel = GidSel::new(&pa, cfg);
        let at = |i: i32| table.get(usize::try_from(i).ok()?).copied();
        select_gid_in(&sel, |i| at(i).map(|e| e.0), |i| at(i).map(|e| e.1))
    }

    /// Discovery with nothing set keeps a RoCE port whose GIDs are only IPv6 / link-local, on
    /// GID index 0 as NCCL 2.30's `ncclIbGetGidIndex` does (it was "not used"); the user's
    /// `NCCL_IB_ADDR_FAMILY` makes the same table a refusal naming the port.
    #[test]
    fn a_roce_port_without_ipv4_gids_keeps_index_0_when_nothing_is_set() {
        let mut ll = [0u8; 16];
        ll[..2].copy_from_slice(&[0xfe, 0x80]);
        ll[15] = 1;
        let mut v6 = [0u8; 16];
        v6[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        v6[15] = 7;
        let table = [(ll, 1), (ll, 2), (v6, 2)];
        let cfg = Config::default();
        assert_eq!(roce_port(&cfg, &table), Ok((0, ll, true)));
        assert!(fallback_note(true, &cfg.gid_auto).contains("index 0, as NCCL does"));
        assert_eq!(fallback_note(false, &cfg.gid_auto), "");
        let mut p = ibnet_core::params::Params::default();
        p.set("NCCL_IB_ADDR_FAMILY", "AF_INET").unwrap();
        let strict = Config::from_params(&p);
        let e = roce_port(&strict, &table).unwrap_err();
        let line = e.to_error(DevName::new("mlx5_0"), 1).to_string();
        assert!(line.starts_with("mlx5_0:1: no valid GID"), "{line}");
        // AF_INET6 set: the global IPv6 GID, no fallback.
        p.set("NCCL_IB_ADDR_FAMILY", "AF_INET6").unwrap();
        let six = Config::from_params(&p);
        assert_eq!(roce_port(&six, &table), Ok((2, v6, false)));
    }

    #[test]
    fn speeds() {
        assert_eq!(speed_mbps(2, 32, 0), 4 * 25000); // 4x EDR
        assert_eq!(speed_mbps(2, 128, 0), 4 * 100000); // 4x NDR
        assert_eq!(speed_mbps(2, 0, 256), 4 * 200000); // 4x XDR (active_speed_ex)
        assert_eq!(speed_mbps(1, 1, 0), 2500);
    }
}
