//! `ibnet-perf`: bandwidth/latency sweep through any NCCL net plugin's C API.
//!
//! Modes: `--loopback` (default: re-executes itself as the peer on this host), `--server`
//! and `--client HOST:PORT` (two hosts). Output: a table (default), `--json`, `--csv`, and a
//! `--png` plot. With ibnet's plugin and no RDMA NIC it runs on the soft provider.
#![deny(unsafe_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Parser};
use ibnet_tools::ctrl::{Ctrl, Msg};
use ibnet_tools::net::{DevProps, Plugin};
use ibnet_tools::report::{self, Meta};
use ibnet_tools::sweep::{self, Endpoint, RunConfig};
use ibnet_tools::{errln, locate, log, out, outln, parse_bytes, Error};

/// Default TCP port of `--server` (the control connection only).
const DEFAULT_PORT: u16 = 18515;

#[derive(Parser, Debug)]
#[command(
    name = "ibnet-perf",
    version,
    about = "Bandwidth/latency sweep through an NCCL net plugin's C API (default: ibnet's own)",
    group(ArgGroup::new("mode").args(["loopback", "server", "client"])),
    group(ArgGroup::new("fmt").args(["json", "csv"]))
)]
struct Args {
    /// Plugin .so to measure (default: ibnet's libnccl-net-ibnet.so next to this binary, or $IBNET_PLUGIN).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Spawn the peer on this host (default).
    #[arg(long)]
    loopback: bool,
    /// Wait for one --client on --port (two-host mode).
    #[arg(long)]
    server: bool,
    /// Connect to a --server at HOST:PORT (two-host mode).
    #[arg(long, value_name = "HOST:PORT")]
    client: Option<String>,
    /// --server's control port.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Smallest message size (K, M, G suffixes).
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    min_bytes: u64,
    /// Largest message size.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    max_bytes: u64,
    /// Outstanding requests while streaming (1..=32).
    #[arg(short, long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=32))]
    window: u16,
    /// Receives per request: one irecv of N buffers, matched by N tagged isends (1..=8).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    multirecv: u8,
    /// Most measured iterations per size and phase (fewer for large sizes, see --budget).
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Most warm-up iterations per size and phase.
    #[arg(long, default_value_t = 32)]
    warmup: u64,
    /// Bytes one phase of one size may move: bounds each size's run time.
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    budget: u64,
    /// Most bytes of streaming buffers per side (caps the window for large sizes).
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    max_mem: u64,
    /// Verify every received byte (the fill/verify cost is then inside the timings).
    #[arg(short, long)]
    check: bool,
    /// Plugin device index (on both sides).
    #[arg(long, default_value_t = 0)]
    dev: i32,
    /// Fuse these physical devices (comma-separated, 2 to 4, e.g. `0,1`) into one virtual NIC
    /// with the plugin's makeVDevice (NCCL net ABI v9+) and measure it instead of --dev. The
    /// peer fuses the same devices, or on a --server its own --fuse if given.
    #[arg(long, value_name = "DEVS", value_delimiter = ',', num_args = 1.., conflicts_with = "dev")]
    fuse: Vec<i32>,
    /// Seconds any single wait may take before the run fails.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Print CSV instead of the table.
    #[arg(long)]
    csv: bool,
    /// Also write a PNG plot of bandwidth and latency against size.
    #[arg(long, value_name = "PATH")]
    png: Option<PathBuf>,
    /// Show the plugin's INFO lines.
    #[arg(short, long)]
    verbose: bool,
    /// Measure only latency (ping-pong); the bandwidth columns show "-".
    #[arg(long, conflicts_with = "bw_only")]
    latency_only: bool,
    /// Measure only bandwidth (streaming); the latency columns show "-".
    #[arg(long)]
    bw_only: bool,
    /// Internal: the loopback peer role, connecting its control socket to ADDR.
    #[arg(long, hide = true, value_name = "ADDR")]
    peer: Option<String>,
}

/// Kills the loopback peer if the driver fails before it exits.
struct PeerGuard(Option<Child>);

impl PeerGuard {
    fn finish(&mut self, timeout: Duration) -> Result<(), Error> {
        let Some(mut c) = self.0.take() else {
            return Ok(());
        };
        let d = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait()? {
                return if st.success() {
                    Ok(())
                } else {
                    Err(Error(format!("the loopback peer exited with {st}")))
                };
            }
            if Instant::now() > d {
                let _ = c.kill();
                let _ = c.wait();
                return Err(Error("the loopback peer did not exit; killed it".into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether ibnet's verbs discovery (the same code the plugin runs, through ibnet-ffi's Rust
/// API) finds a usable RDMA port under the current `NCCL_IB_*` settings: the count, or why not.
fn rdma_nic() -> Result<usize, String> {
    // The notes (malformed or refused variables) are not printed here: the plugin's `init`,
    // which follows at once, WARNs each of them through this tool's logger (stderr, always).
    let (params, _notes) = ibnet_nccl::env::load();
    let cfg = ibnet_verbs::discovery::Discovery::from_params(&params);
    match ibnet_verbs::device::discover(&cfg) {
        Ok(v) if !v.is_empty() => Ok(v.len()),
        Ok(_) => Err("no usable RDMA port".into()),
        Err(why) => Err(why),
    }
}

/// Opens and initialises the plugin; with ibnet and no device, falls back to the soft provider
/// unless the user chose one. Returns the plugin, its device count and the provider note.
fn load(path: &std::path::Path) -> Result<(Plugin, i32, Option<String>), Error> {
    let mut p = Plugin::open(path)?;
    let mut note = None;
    if p.is_ibnet() {
        // Set to nothing counts as unset, as the plugin reads it.
        note = Some(match ibnet_nccl::env::var("IBNET_PROVIDER") {
            Some(v) => format!("{v} (IBNET_PROVIDER)"),
            None => match rdma_nic() {
                Ok(n) => format!("auto: verbs ({n} port(s))"),
                Err(why) => {
                    // Single-threaded here (no peer, no progress bar yet); the loopback peer
                    // inherits the variable. Decided before `init`, which reads it.
                    std::env::set_var("IBNET_PROVIDER", "soft");
                    format!("soft (IBNET_PROVIDER=soft set by ibnet-perf: no RDMA NIC: {why})")
                }
            },
        });
    }
    p.init()?;
    let n = p.devices()?;
    if n <= 0 {
        let hint = if p.is_ibnet() {
            " (ibnet: no RDMA device and the soft provider is unavailable; see `ibnet-info`)"
        } else {
            ""
        };
        return Err(Error(format!("the plugin reports {n} devices{hint}")));
    }
    Ok((p, n, note))
}

/// The device to measure: `dev`, or the virtual NIC fusing `fuse` (made here through the
/// plugin's makeVDevice), with its properties and a description naming its rails.
fn choose(
    p: &Plugin,
    n: i32,
    dev: i32,
    fuse: &[i32],
    multirecv: usize,
) -> Result<(i32, DevProps, String), Error> {
    if fuse.is_empty() {
        let props = pick(p, n, dev, multirecv)?;
        let desc = format!("{dev} {}", props.name);
        return Ok((dev, props, desc));
    }
    if let Some(d) = fuse.iter().find(|&&d| d < 0 || d >= n) {
        return Err(Error(format!(
            "--fuse {d}: the plugin has devices 0..{}",
            n - 1
        )));
    }
    let v = p.make_vdevice(fuse)?;
    let props = pick(p, p.devices()?, v, multirecv)?;
    let mut rails = Vec::new();
    for &r in &props.rails {
        let rp = p.properties(r)?;
        rails.push(format!("{r} {} {} Gb/s", rp.name, rp.speed_mbps / 1000));
    }
    let desc = format!("{v} {} [fused: rails {}]", props.name, rails.join(", "));
    Ok((v, props, desc))
}

fn pick(p: &Plugin, n: i32, dev: i32, multirecv: usize) -> Result<DevProps, Error> {
    if dev < 0 || dev >= n {
        return Err(Error(format!(
            "--dev {dev}: the plugin has devices 0..{}",
            n - 1
        )));
    }
    let props = p.properties(dev)?;
    if multirecv > props.max_recvs.max(1) as usize {
        return Err(Error(format!(
            "--multirecv {multirecv}: device {} accepts at most {} receives per request",
            props.name, props.max_recvs
        )));
    }
    Ok(props)
}

fn plugin_path(a: &Args) -> Result<PathBuf, Error> {
    let p = match &a.plugin {
        Some(p) => p.clone(),
        None => locate::default_plugin()?,
    };
    if !p.exists() {
        return Err(Error(format!("plugin {} does not exist", p.display())));
    }
    Ok(locate::absolute(&p))
}

fn responder(a: &Args, stream: TcpStream) -> Result<(), Error> {
    let timeout = Duration::from_secs(a.timeout);
    let mut ctrl = Ctrl::new(stream, timeout * 4)?;
    let res = (|| -> Result<(), Error> {
        let Msg::Hello(cfg) = ctrl.recv()? else {
            return Err(Error("expected Hello from the driver".into()));
        };
        let (p, n, _) = load(&plugin_path(a)?)?;
        let fuse = if a.fuse.is_empty() {
            &cfg.fuse
        } else {
            &a.fuse
        };
        let (dev, _, desc) = choose(&p, n, cfg.dev, fuse, cfg.multirecv)?;
        if a.server && !fuse.is_empty() {
            errln!("ibnet-perf: device {desc}");
        }
        ctrl.send(&Msg::Info {
            plugin: p.name().into(),
            device: desc,
        })?;
        let ep = Endpoint::establish(&p, dev, timeout, |h| {
            ctrl.send(&Msg::Handle(h))?;
            match ctrl.recv()? {
                Msg::Handle(h) => Ok(h),
                m => Err(Error(format!("expected Handle, got {m:?}"))),
            }
        })?;
        loop {
            match ctrl.recv()? {
                Msg::Step(st) => {
                    let t = sweep::respond_step(&ep, &st, || ctrl.send(&Msg::Ready))?;
                    ctrl.send(&Msg::Done {
                        bad: t.bad,
                        first: t.first,
                    })?;
                }
                Msg::Bye => break,
                m => return Err(Error(format!("unexpected control message {m:?}"))),
            }
        }
        ep.close()
    })();
    if let Err(e) = &res {
        let _ = ctrl.send(&Msg::Fail(e.0.clone()));
    }
    res
}

fn spawn_peer(a: &Args, plugin: &std::path::Path) -> Result<(TcpStream, PeerGuard), Error> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--peer")
        .arg(addr.to_string())
        .arg("--plugin")
        .arg(plugin)
        .arg("--timeout")
        .arg(a.timeout.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if a.verbose {
        cmd.arg("--verbose");
    }
    let mut guard = PeerGuard(Some(cmd.spawn()?));
    l.set_nonblocking(true)?;
    let d = Instant::now() + Duration::from_secs(a.timeout);
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok((s, guard));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(c) = &mut guard.0 {
            if let Some(st) = c.try_wait()? {
                guard.0 = None;
                return Err(Error(format!("the loopback peer exited early ({st})")));
            }
        }
        if Instant::now() > d {
            return Err(Error("the loopback peer did not connect".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The sweep `a` asks for, its options checked.
fn run_config(a: &Args) -> Result<RunConfig, Error> {
    if a.min_bytes > a.max_bytes {
        return Err(Error(format!(
            "--min-bytes {} is larger than --max-bytes {}",
            a.min_bytes, a.max_bytes
        )));
    }
    if a.max_bytes > 1 << 30 {
        return Err(Error("--max-bytes is limited to 1G".into()));
    }
    Ok(RunConfig {
        sizes: sweep::sizes(a.min_bytes.max(1) as usize, a.max_bytes as usize),
        iters: a.iters,
        warmup: a.warmup,
        window: a.window as usize,
        multirecv: a.multirecv as usize,
        check: a.check,
        budget: a.budget.max(1),
        max_mem: a.max_mem.max(1),
        timeout_s: a.timeout,
        dev: a.dev,
        fuse: a.fuse.clone(),
        latency: !a.bw_only,
        bandwidth: !a.latency_only,
    })
}

/// The driver's side of the sweep over `ctrl`: the peer told the config, comms over device
/// `dev` established, then every size stepped with the peer; one row per size.
fn sweep_with_peer(
    a: &Args,
    cfg: &RunConfig,
    p: &Plugin,
    dev: i32,
    ctrl: &mut Ctrl,
) -> Result<Vec<sweep::Row>, Error> {
    let timeout = Duration::from_secs(a.timeout);
    ctrl.send(&Msg::Hello(cfg.clone()))?;
    let Msg::Info { device, .. } = ctrl.recv()? else {
        return Err(Error("expected Info from the peer".into()));
    };
    if !a.fuse.is_empty() {
        errln!("ibnet-perf: peer device {device}");
    }
    let ep = Endpoint::establish(p, dev, timeout, |h| {
        ctrl.send(&Msg::Handle(h))?;
        match ctrl.recv()? {
            Msg::Handle(h) => Ok(h),
            m => Err(Error(format!("expected Handle, got {m:?}"))),
        }
    })?;
    let pb = indicatif::ProgressBar::new(cfg.sizes.len() as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} sizes {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        pb.set_message(ibnet_tools::fmt_bytes(size as u64));
        let st = cfg.step(size);
        ctrl.send(&Msg::Step(st))?;
        match ctrl.recv()? {
            Msg::Ready => {}
            m => return Err(Error(format!("expected Ready, got {m:?}"))),
        }
        let (lat, secs, mut t) = sweep::drive_step(&ep, &st)?;
        match ctrl.recv()? {
            Msg::Done { bad, first } => {
                t.bad += bad;
                if t.first.is_none() {
                    t.first = first;
                }
            }
            m => return Err(Error(format!("expected Done, got {m:?}"))),
        }
        if let Some(f) = &t.first {
            pb.suspend(|| errln!("ibnet-perf: {}: {f}", ibnet_tools::fmt_bytes(size as u64)));
        }
        rows.push(sweep::row(&st, lat, secs, t.bad));
        pb.inc(1);
    }
    pb.finish_and_clear();
    ctrl.send(&Msg::Bye)?;
    ep.close()?;
    Ok(rows)
}

/// Prints `rows` as `a` asks (JSON, CSV or a table; a PNG too) and fails if any size's data
/// was not verified.
fn report_rows(a: &Args, meta: &Meta, rows: &[sweep::Row]) -> Result<(), Error> {
    if a.json {
        outln!("{}", report::json(meta, rows)?)?;
    } else if a.csv {
        out::text(&report::csv(rows)?)?;
    } else {
        outln!("{}", report::table(rows))?;
    }
    if let Some(png) = &a.png {
        ibnet_tools::plot::png(png, &meta.title(), rows)?;
        errln!("ibnet-perf: wrote {}", png.display());
    }
    let bad: usize = rows.iter().filter(|r| r.check.starts_with("FAIL")).count();
    if bad > 0 {
        return Err(Error(format!("data verification failed at {bad} sizes")));
    }
    Ok(())
}

fn driver(a: &Args) -> Result<(), Error> {
    let cfg = run_config(a)?;
    let path = plugin_path(a)?;
    let (p, n, note) = load(&path)?;
    let (dev, props, desc) = choose(&p, n, a.dev, &a.fuse, cfg.multirecv)?;
    let timeout = Duration::from_secs(a.timeout);
    let mode = match &a.client {
        Some(hp) => format!("client of {hp}"),
        None => "loopback (peer process on this host)".to_string(),
    };
    let meta = Meta {
        plugin_path: path.display().to_string(),
        plugin_name: p.name().into(),
        abi: p.version().symbol().into(),
        device: desc,
        speed_mbps: props.speed_mbps,
        provider: note,
        mode,
        window: cfg.window,
        multirecv: cfg.multirecv,
        check: cfg.check,
    };
    // Before the peer exists: a closed stdout ends the run here, with nothing to tear down.
    let quiet = a.json || a.csv;
    if quiet {
        errln!("{}", meta.header());
    } else {
        outln!("{}", meta.header())?;
    }
    let (stream, mut guard) = match &a.client {
        Some(hp) => (
            TcpStream::connect(hp).map_err(|e| Error(format!("cannot reach server {hp}: {e}")))?,
            PeerGuard(None),
        ),
        None => spawn_peer(a, &path)?,
    };
    let mut ctrl = Ctrl::new(stream, timeout * 4)?;
    let rows = match sweep_with_peer(a, &cfg, &p, dev, &mut ctrl) {
        Ok(r) => r,
        Err(e) => {
            let _ = ctrl.send(&Msg::Fail(e.0.clone()));
            return Err(e);
        }
    };
    guard.finish(timeout)?;
    report_rows(a, &meta, &rows)
}

fn run(a: &Args) -> Result<(), Error> {
    log::set_verbose(a.verbose);
    if let Some(addr) = &a.peer {
        let s = TcpStream::connect(addr)?;
        return responder(a, s);
    }
    if a.server {
        let l = TcpListener::bind(("0.0.0.0", a.port))
            .map_err(|e| Error(format!("cannot listen on port {}: {e}", a.port)))?;
        errln!("ibnet-perf: server waiting for a client on port {}", a.port);
        let (s, from) = l.accept()?;
        errln!("ibnet-perf: client {from}");
        return responder(a, s);
    }
    driver(a)
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away: end quietly (see `ibnet_tools::out`).
        Err(_) if out::stdout_closed() => ExitCode::SUCCESS,
        Err(e) => {
            let role = if a.peer.is_some() { " (peer)" } else { "" };
            errln!("ibnet-perf{role}: error: {e}");
            ExitCode::FAILURE
        }
    }
}
