//! `ibnet-info`: what ibnet's plugin sees on this host — providers, devices and ports after
//! `NCCL_IB_HCA`, link layer, speed, MTU, GIDs with their types and the one auto-selection
//! picks, GPU-direct and DMA-BUF, RLIMIT_MEMLOCK, and the plugin file as NCCL would load it.
//! Exits non-zero, with a one-line reason on stderr, when the plugin (as the environment
//! configures it) reports no device.
#![deny(unsafe_code)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ibnet_core::params::ProviderKind as ProviderChoice;
use ibnet_nccl::env::Note;
use ibnet_tools::net::{DevProps, Plugin};
use ibnet_tools::{errln, locate, log, out, outln, Error};
use ibnet_verbs::device::{self, VerbsDev};
use ibnet_verbs::discovery::Discovery as Config;

#[derive(Parser, Debug)]
#[command(
    name = "ibnet-info",
    version,
    about = "What ibnet's NCCL net plugin sees on this host"
)]
struct Args {
    /// Plugin .so to load (default: ibnet's libnccl-net-ibnet.so next to this binary, or $IBNET_PLUGIN).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Show the plugin's INFO lines.
    #[arg(short, long)]
    verbose: bool,
}

fn mtu_bytes(code: u8) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

fn link(l: u8) -> &'static str {
    match l {
        1 => "InfiniBand",
        2 => "Ethernet (RoCE)",
        _ => "unknown",
    }
}

/// One GID table entry from sysfs: index, raw bytes, RoCE version (None: IB or unknown).
type Gid = (i32, [u8; 16], Option<i64>);

/// The index RoCE auto-selection picks among `list` under `cfg` (`None`: no GID matches the
/// `NCCL_IB_ADDR_FAMILY`/`NCCL_IB_ADDR_RANGE` the user set, and the port is not used; with
/// both unset, index 0 as NCCL).
fn auto_index(list: &[Gid], cfg: &Config) -> Option<i32> {
    let cands: Vec<device::Candidate> = list
        .iter()
        .map(|&(index, gid, v)| device::Candidate {
            index,
            gid,
            roce: v.and_then(|v| u8::try_from(v).ok()),
        })
        .collect();
    device::select_gid(&cands, &cfg.gid_auto)
        .ok()
        .map(|c| c.index)
}

fn gids(dev: &str, port: u8) -> Vec<Gid> {
    let base = format!("/sys/class/infiniband/{dev}/ports/{port}");
    let Ok(rd) = std::fs::read_dir(format!("{base}/gids")) else {
        return Vec::new();
    };
    let mut v: Vec<Gid> = rd
        .flatten()
        .filter_map(|e| {
            let idx: i32 = e.file_name().to_str()?.parse().ok()?;
            let s = std::fs::read_to_string(e.path()).ok()?;
            let ip: std::net::Ipv6Addr = s.trim().parse().ok()?;
            let ty = std::fs::read_to_string(format!("{base}/gid_attrs/types/{idx}")).ok();
            let ver = ty.map(|t| {
                if t.contains("RoCE v2") {
                    2
                } else if t.contains("RoCE") {
                    1
                } else {
                    0
                }
            });
            Some((idx, ip.octets(), ver.filter(|&x| x > 0)))
        })
        .filter(|(_, g, _)| g.iter().any(|&b| b != 0))
        .collect();
    v.sort_by_key(|g| g.0);
    v
}

fn gid_text(g: &[u8; 16]) -> (String, &'static str) {
    let v6 = std::net::Ipv6Addr::from(*g);
    match v6.to_ipv4_mapped() {
        Some(v4) => (IpAddr::V4(v4).to_string(), "IPv4"),
        None => (v6.to_string(), "IPv6"),
    }
}

fn show_port(d: &VerbsDev, cfg: &Config) -> Result<(), Error> {
    let name = d.name.to_string_lossy();
    outln!(
        "  {name}:{}  link {}  {} Gb/s  MTU {}  LID {}  GUID {:#018x}  DMA-BUF {}{}",
        d.port,
        link(d.link_layer),
        d.speed / 1000,
        mtu_bytes(d.mtu),
        d.lid,
        d.guid,
        if d.dmabuf { "yes" } else { "no" },
        d.pci_path
            .as_ref()
            .map(|p| format!("  PCI {}", p.to_string_lossy()))
            .unwrap_or_default()
    )?;
    let list = gids(&name, d.port);
    let auto = auto_index(&list, cfg);
    for (i, g, ver) in &list {
        let (ip, fam) = gid_text(g);
        let ty = match ver {
            Some(v) => format!("RoCE v{v}"),
            None => "IB".into(),
        };
        let mut mark = String::new();
        if *i as u8 == d.gid_index {
            mark.push_str("  <- in use");
        }
        if d.link_layer == 2 && Some(*i) == auto {
            mark.push_str("  (auto-selection)");
        }
        outln!("      GID {i:>3}  {ty:<9} {fam:<4}  {ip}{mark}")?;
    }
    if list.is_empty() {
        outln!("      (no GIDs readable in sysfs)")?;
    }
    Ok(())
}

#[allow(unsafe_code)] // getrlimit: the one libc call of this binary.
fn memlock() -> String {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return "unknown".into();
    }
    if r.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else if r.rlim_cur < (1 << 30) {
        format!(
            "{} bytes (low: verbs registrations may fail with ENOMEM; `ulimit -l unlimited`)",
            r.rlim_cur
        )
    } else {
        format!("{} bytes", r.rlim_cur)
    }
}

fn env_line(name: &str) -> Result<(), Error> {
    match ibnet_nccl::env::var(name) {
        Some(v) => outln!("  {name}={v}"),
        None => outln!("  {name} (unset)"),
    }
}

/// One plugin device `d` as NCCL sees it (`pr`: its properties).
fn show_device(d: i32, pr: &DevProps) -> Result<(), Error> {
    let mut ptr = vec!["HOST"];
    if pr.ptr_support & ibnet_nccl::types::NCCL_PTR_CUDA != 0 {
        ptr.push("CUDA");
    }
    if pr.ptr_support & ibnet_nccl::types::NCCL_PTR_DMABUF != 0 {
        ptr.push("DMABUF");
    }
    // v12's railId/planeId, shown when set (from NCCL_IB_HCA's dev:port:rail:plane).
    let ids = match (pr.rail_id, pr.plane_id) {
        (-1, -1) => String::new(),
        (r, p) => format!("  rail {r}  plane {p}"),
    };
    outln!(
        "  {d}: {}  port {}  {} Gb/s  ptrSupport {}  maxComms {}  maxRecvs {}  GUID {:#x}{ids}",
        pr.name,
        pr.port,
        pr.speed_mbps / 1000,
        ptr.join("|"),
        pr.max_comms,
        pr.max_recvs,
        pr.guid
    )?;
    Ok(())
}

/// The GPU runtime found, and whether GPU-direct RDMA is possible.
fn show_gpu() -> Result<(), Error> {
    match ibnet_hip::GpuRuntime::detect_on(
        ibnet_hip::Host::system().with_env(ibnet_hip::Env::Lookup(ibnet_nccl::env::var)),
    ) {
        Ok(rt) => {
            let g = rt.gdr_support();
            outln!(
                "GPU: {}; GPU-direct RDMA {} ({})",
                rt.describe(),
                if g.enabled { "yes" } else { "no" },
                g.reason
            )?;
        }
        Err(e) => outln!("GPU: no GPU runtime ({e}); GPU-direct RDMA no")?,
    }
    Ok(())
}

/// The environment section: the variables that pick devices, then what the plugin and the
/// soft provider will WARN about them (malformed or refused values, malformed `NCCL_IB_HCA`
/// entries, rejected `IBNET_SOFT_*`), and RLIMIT_MEMLOCK.
fn show_env(notes: &[Note], soft_errs: &[ibnet_core::Error]) -> Result<(), Error> {
    outln!("environment:")?;
    for n in [
        "IBNET_PROVIDER",
        "NCCL_IB_HCA",
        "NCCL_IB_DISABLE",
        "NCCL_IB_GID_INDEX",
        "NCCL_IB_ROCE_VERSION_NUM",
        "NCCL_IB_ADDR_FAMILY",
        "NCCL_SOCKET_IFNAME",
    ] {
        env_line(n)?;
    }
    for n in notes.iter().filter(|n| n.is_warn()) {
        outln!("  WARN {n}")?;
    }
    for e in soft_errs {
        outln!("  WARN soft provider: {e}")?;
    }
    outln!("RLIMIT_MEMLOCK: {}", memlock())
}

/// The verbs section: the ports discovery finds under `cfg` (what the plugin would use).
fn show_verbs(cfg: &Config) -> Result<Result<Vec<std::sync::Arc<VerbsDev>>, String>, Error> {
    outln!("verbs provider (libibverbs, after NCCL_IB_HCA):")?;
    let verbs = device::discover(cfg);
    match &verbs {
        Ok(v) if !v.is_empty() => {
            outln!("  {} port(s)", v.len())?;
            for d in v {
                show_port(d, cfg)?;
            }
        }
        Ok(_) => outln!("  0 devices: no usable port")?,
        Err(why) => outln!("  0 devices: {why}")?,
    }
    Ok(verbs)
}

/// The soft section: whether the soft provider can run here as the plugin would configure it
/// (`IBNET_SOFT_PTRACER` included).
fn show_soft(scfg: &ibnet_soft::Config) -> Result<Result<(), ibnet_soft::Unavailable>, Error> {
    let soft = ibnet_soft::probe_with(scfg.set_ptracer);
    match &soft {
        Ok(()) => outln!("soft provider (ibnet-soft, same host only, host memory): usable with IBNET_PROVIDER=soft (device soft0)")?,
        Err(u) => outln!("soft provider (ibnet-soft): not usable here: {u}")?,
    }
    Ok(soft)
}

/// The one-line reason the plugin reported no device, from what the sections found.
fn no_device(
    verbs: &Result<Vec<std::sync::Arc<VerbsDev>>, String>,
    soft: &Result<(), ibnet_soft::Unavailable>,
    provider: ProviderChoice,
) -> Error {
    let verbs_why = match verbs {
        Err(w) => w.clone(),
        Ok(_) => "no usable port".into(),
    };
    let hint = match (soft, provider) {
        (Ok(()), ProviderChoice::Soft) => {
            "the soft provider failed to start (see WARNs)".to_string()
        }
        (Ok(()), _) => {
            "for same-host runs set IBNET_PROVIDER=soft (ibnet-perf does so by itself)".into()
        }
        (Err(u), _) => format!("soft provider unusable: {u}"),
    };
    Error(format!(
        "no usable device: 0 verbs devices ({verbs_why}); {hint}"
    ))
}

fn run(a: &Args) -> Result<(), Error> {
    log::set_verbose(a.verbose);
    let path = match &a.plugin {
        Some(p) => p.clone(),
        None => locate::default_plugin()?,
    };
    let path = locate::absolute(&path);
    // The plugin's own configuration: its variables and the soft provider's, read as it does.
    let (params, notes) = ibnet_nccl::env::load();
    let (scfg, soft_errs) = ibnet_soft::Config::from_lookup(ibnet_nccl::env::var);
    let cfg = Config::from_params(&params);

    show_env(&notes, &soft_errs)?;
    let verbs = show_verbs(&cfg)?;
    let soft = show_soft(&scfg)?;
    show_gpu()?;

    let mut p = Plugin::open(&path)?;
    outln!(
        "plugin: {} ({}, name {}; ibnet-info {})",
        path.display(),
        p.version().symbol(),
        p.name(),
        env!("CARGO_PKG_VERSION")
    )?;
    p.init()?;
    let n = p.devices()?;
    let provider = match params.provider {
        ProviderChoice::Auto => "auto (verbs only; soft only when asked by name)",
        ProviderChoice::Verbs => "verbs",
        ProviderChoice::Soft => "soft",
    };
    outln!("plugin devices (as NCCL would see them, provider {provider}): {n}")?;
    for d in 0..n.max(0) {
        show_device(d, &p.properties(d)?)?;
    }
    if n <= 0 {
        return Err(no_device(&verbs, &soft, params.provider));
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away: end quietly (see `ibnet_tools::out`).
        Err(_) if out::stdout_closed() => ExitCode::SUCCESS,
        Err(e) => {
            errln!("ibnet-info: {e}");
            ExitCode::FAILURE
        }
    }
}
