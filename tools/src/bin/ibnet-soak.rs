//! `ibnet-soak`: two processes, several threads and comms, random sizes, multi-receive widths
//! and tags, every byte verified, for a bounded time; prints messages, bytes, errors,
//! corruptions, RSS and open descriptors at start and end. Exits non-zero on any error or
//! corruption. With ibnet's plugin it runs on the soft provider unless `IBNET_PROVIDER` is set.
#![deny(unsafe_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Parser;
use ibnet_tools::soak::lane::SizeCheck;
use ibnet_tools::soak::link::{Link, Msg};
use ibnet_tools::soak::procstat::{self, ProcStat};
use ibnet_tools::soak::stats::Totals;
use ibnet_tools::soak::worker::{self, Outcome, ThreadCfg};
use ibnet_tools::{errln, fmt_bytes, locate, log, out, outln, parse_bytes, Error};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "ibnet-soak",
    version,
    about = "Two-process, byte-verified soak through an NCCL net plugin's C API (default: ibnet's own, soft provider)"
)]
struct Args {
    /// Plugin .so (default: ibnet's libnccl-net-ibnet.so next to this binary, or $IBNET_PLUGIN).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// How long to run traffic before draining.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// Thread pairs (each thread inits the plugin once, as a communicator).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    threads: u32,
    /// Comms per thread, half sent by each process.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    comms: u32,
    /// Most bytes of one request (one message, or a multi-receive's messages together).
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    max_bytes: u64,
    /// Widest multi-receive (1..=8).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u8).range(1..=8))]
    max_width: u8,
    /// Requests in flight per comm.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=16))]
    window: u8,
    /// Run seed (default: from the clock); printed so that a run can be repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Accept a multi-receive's reported sizes as 0/1 "had data" flags too (never above the
    /// posted size), for a plugin without a sizes FIFO; by default each must equal the sent size.
    #[arg(long)]
    loose_sizes: bool,
    /// Plugin device index.
    #[arg(long, default_value_t = 0)]
    dev: i32,
    /// Seconds a comm may go without progress before the run fails.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Show the plugin's INFO lines.
    #[arg(short, long)]
    verbose: bool,
    /// Internal: the peer process, connecting its control links to ADDR.
    #[arg(long, hide = true, value_name = "ADDR")]
    peer: Option<String>,
}

/// Kills the peer process if the driver fails before it exits.
struct PeerGuard(Option<Child>);

impl Drop for PeerGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl PeerGuard {
    /// Waits for the peer to exit (up to `t`); its failure is an error.
    fn finish(&mut self, t: Duration) -> Result<(), Error> {
        let Some(mut c) = self.0.take() else {
            return Ok(());
        };
        let d = Instant::now() + t;
        while Instant::now() < d {
            if let Some(st) = c.try_wait()? {
                return match st.success() {
                    true => Ok(()),
                    false => Err(Error(format!("the peer process exited with {st}"))),
                };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
        Err(Error("the peer process did not exit; killed it".into()))
    }
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

/// Thread `t`'s configuration (`deadline`: the driver's end of traffic; `None` on the peer).
fn thread_cfg(
    a: &Args,
    plugin: &std::path::Path,
    seed: u64,
    t: u32,
    deadline: Option<Instant>,
) -> ThreadCfg {
    ThreadCfg {
        plugin: plugin.to_path_buf(),
        dev: a.dev,
        thread: t,
        lanes: a.comms,
        seed,
        max_total: a.max_bytes as usize,
        max_width: a.max_width as usize,
        window: a.window as usize,
        sizes: if a.loose_sizes {
            SizeCheck::Loose
        } else {
            SizeCheck::Exact
        },
        timeout: Duration::from_secs(a.timeout),
        deadline,
    }
}

/// Runs every thread on its link; prints this process's start line (`who`).
/// Returns the outcomes and the closing figures, or the start line's write error (a closed
/// stdout) once the threads have ended.
fn run_threads(
    who: &str,
    cfgs: Vec<(ThreadCfg, Link)>,
) -> Result<(Vec<Outcome>, [ProcStat; 3]), Error> {
    let gate = Barrier::new(cfgs.len() + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = cfgs
            .into_iter()
            .map(|(c, l)| {
                let g = &gate;
                s.spawn(move || worker::run(&c, l, g))
            })
            .collect();
        gate.wait();
        let start = procstat::now();
        let said = outln!("ibnet-soak {who}: start: {}, {start}", Totals::default());
        gate.wait();
        let end = procstat::now();
        gate.wait();
        let outs: Vec<Outcome> = hs
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    let mut o = Outcome::default();
                    o.own.error(|| "a soak thread panicked".into());
                    o
                })
            })
            .collect();
        said.map(|()| (outs, [start, end, procstat::now()]))
    })
}

/// The peer process: one link per thread to the driver, then the same threads.
fn peer(a: &Args, addr: &str) -> Result<Totals, Error> {
    let plugin = plugin_path(a)?;
    let seed = a
        .seed
        .ok_or_else(|| Error("the peer needs --seed".into()))?;
    let mut cfgs = Vec::new();
    for t in 0..a.threads {
        let mut l = Link::new(TcpStream::connect(addr)?, Duration::from_secs(a.timeout))?;
        l.send(&Msg::Join(t))?;
        cfgs.push((thread_cfg(a, &plugin, seed, t, None), l));
    }
    let (outs, [_, end, closed]) = run_threads("peer", cfgs)?;
    let mut tot = Totals::default();
    outs.iter().for_each(|o| tot.add(&o.own));
    outln!("ibnet-soak peer: end: {tot}, {end}")?;
    outln!("ibnet-soak peer: closed: {closed}")?;
    Ok(tot)
}

/// Spawns the peer and accepts its `threads` links, ordered by thread.
fn spawn_peer(
    a: &Args,
    plugin: &std::path::Path,
    seed: u64,
) -> Result<(Vec<Link>, PeerGuard), Error> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--peer")
        .arg(l.local_addr()?.to_string())
        .arg("--plugin")
        .arg(plugin);
    for (k, v) in [
        ("--seed", seed.to_string()),
        ("--threads", a.threads.to_string()),
        ("--comms", a.comms.to_string()),
        ("--max-bytes", a.max_bytes.to_string()),
        ("--max-width", a.max_width.to_string()),
        ("--window", a.window.to_string()),
        ("--dev", a.dev.to_string()),
        ("--timeout", a.timeout.to_string()),
    ] {
        cmd.arg(k).arg(v);
    }
    if a.loose_sizes {
        cmd.arg("--loose-sizes");
    }
    if a.verbose {
        cmd.arg("--verbose");
    }
    let guard = PeerGuard(Some(cmd.stdin(Stdio::null()).spawn()?));
    let mut links: Vec<Option<Link>> = (0..a.threads).map(|_| None).collect();
    for _ in 0..a.threads {
        let (s, _) = l.accept()?;
        let mut link = Link::new(s, Duration::from_secs(a.timeout))?;
        match link.recv()? {
            Msg::Join(t) if t < a.threads && links[t as usize].is_none() => {
                links[t as usize] = Some(link)
            }
            m => return Err(Error(format!("expected Join from the peer, got {m:?}"))),
        }
    }
    Ok((links.into_iter().flatten().collect(), guard))
}

fn driver(a: &Args) -> Result<(), Error> {
    let plugin = plugin_path(a)?;
    // Unset or set to nothing (which the plugin reads as unset): the soft provider.
    if ibnet_nccl::env::var("IBNET_PROVIDER").is_none() {
        // Single-threaded here; the peer inherits it. The plugin reads it at init.
        std::env::set_var("IBNET_PROVIDER", "soft");
    }
    let seed = a.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    });
    outln!(
        "ibnet-soak: seed {seed}, {} s, {} thread pairs x {} comms, requests up to {} (width 1..={}), window {}, sizes {}, provider {}, plugin {}",
        a.seconds,
        a.threads,
        a.comms,
        fmt_bytes(a.max_bytes),
        a.max_width,
        a.window,
        if a.loose_sizes { "loose (multi-receive: <= posted, exact if > 1)" } else { "exact" },
        ibnet_nccl::env::var("IBNET_PROVIDER").unwrap_or_default(),
        plugin.display()
    )?;
    let (links, mut guard) = spawn_peer(a, &plugin, seed)?;
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let cfgs = links
        .into_iter()
        .enumerate()
        .map(|(t, l)| (thread_cfg(a, &plugin, seed, t as u32, Some(deadline)), l))
        .collect();
    let t0 = Instant::now();
    let (outs, [_, end, closed]) = run_threads("driver", cfgs)?;
    let secs = t0.elapsed().as_secs_f64();
    let (mut own, mut all) = (Totals::default(), Totals::default());
    for o in &outs {
        own.add(&o.own);
        all.add(&o.own);
        if let Some(p) = &o.peer {
            all.add(p);
        }
    }
    outln!("ibnet-soak driver: end: {own}, {end}")?;
    outln!("ibnet-soak driver: closed: {closed}")?;
    let peer = guard.finish(Duration::from_secs(a.timeout));
    outln!(
        "ibnet-soak: total (both processes' receives): {all} in {secs:.1} s ({:.2} GB/s), seed {seed}",
        all.bytes as f64 / secs / 1e9
    )?;
    for why in [&all.first_error, &all.first_corruption]
        .into_iter()
        .flatten()
    {
        outln!("ibnet-soak: first failure: {why}")?;
    }
    peer?;
    if !all.clean() {
        return Err(Error(format!(
            "{} errors, {} corruptions (repeat with --seed {seed})",
            all.errors, all.corruptions
        )));
    }
    outln!("ibnet-soak: OK")?;
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    log::set_verbose(a.verbose);
    let res = match &a.peer {
        Some(addr) => peer(&a, addr).and_then(|t| match t.clean() {
            true => Ok(()),
            false => Err(Error(format!(
                "{} errors, {} corruptions",
                t.errors, t.corruptions
            ))),
        }),
        None => driver(&a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away: end quietly (see `ibnet_tools::out`).
        Err(_) if out::stdout_closed() => ExitCode::SUCCESS,
        Err(e) => {
            let role = if a.peer.is_some() { " (peer)" } else { "" };
            errln!("ibnet-soak{role}: error: {e}");
            ExitCode::FAILURE
        }
    }
}
