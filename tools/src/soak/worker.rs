//! One soak thread: its own plugin `init` (as one NCCL communicator), its lanes to the peer
//! thread of the other process, the traffic loop and the stop agreement.
//!
//! ```text
//!  driver thread t                                  peer thread t
//!   listen (its receive lanes) ── Handles ──▶        listen (its receive lanes)
//!            ◀── Handles ──
//!   connect / accept until every lane has its comm (both sides, non-blocking)
//!   [barrier: start figures]  traffic on every lane …
//!   deadline: freeze ── Stop(started per lane) ──▶   freeze
//!            ◀── Stop(started per lane) ──
//!   both run every lane to the larger count, then   ◀── Done(totals) ──
//!   [barrier: end figures]  close
//! ```
//! Lane `i` is sent by the driver when `i` is even, by the peer when odd.

use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::lane::{Lane, LaneCfg, Role, SizeCheck};
use super::link::{Link, Msg};
use super::plan::LaneId;
use super::stats::Totals;
use crate::net::{Comm, Plugin};
use crate::Error;

/// A thread's part of the run.
#[derive(Debug, Clone)]
pub struct ThreadCfg {
    /// The plugin to load.
    pub plugin: PathBuf,
    /// Plugin device.
    pub dev: i32,
    /// Thread index (the same on both sides).
    pub thread: u32,
    /// Lanes (comms) of this thread.
    pub lanes: u32,
    /// Run seed.
    pub seed: u64,
    /// Most bytes of one request.
    pub max_total: usize,
    /// Widest multi-receive.
    pub max_width: usize,
    /// Requests in flight per lane.
    pub window: usize,
    /// Size rule for multi-receives.
    pub sizes: SizeCheck,
    /// Longest wait without progress.
    pub timeout: Duration,
    /// The driver's end of the run (the peer has none: it stops when told).
    pub deadline: Option<Instant>,
}

impl ThreadCfg {
    fn role(&self, lane: u32) -> Role {
        if lane.is_multiple_of(2) == self.deadline.is_some() {
            Role::Send
        } else {
            Role::Recv
        }
    }
    fn lane_cfg(&self, lane: u32) -> LaneCfg {
        LaneCfg {
            seed: self.seed,
            id: LaneId {
                thread: self.thread,
                lane,
            },
            max_total: self.max_total,
            max_width: self.max_width,
            window: self.window,
            sizes: self.sizes,
            timeout: self.timeout,
        }
    }
}

/// What a thread ends with: its own totals and, on the driver, the peer thread's.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// This thread's counts.
    pub own: Totals,
    /// The peer thread's counts (driver only).
    pub peer: Option<Totals>,
}

/// Every lane's comm: listen for the receive lanes, swap handles, then connect and accept.
fn establish(net: &Plugin, c: &ThreadCfg, link: &mut Link) -> Result<Vec<(Comm, Role)>, Error> {
    let mut listens = Vec::new();
    let mut mine = Vec::new();
    for i in 0..c.lanes {
        if c.role(i) == Role::Recv {
            let (h, l) = net.listen(c.dev)?;
            mine.push((i, h.to_vec()));
            listens.push((i, l));
        }
    }
    let theirs = if c.deadline.is_some() {
        link.send(&Msg::Handles(mine))?;
        link.recv()?
    } else {
        let m = link.recv()?;
        link.send(&Msg::Handles(mine))?;
        m
    };
    let Msg::Handles(theirs) = theirs else {
        return Err(Error(format!(
            "expected the peer's handles, got {theirs:?}"
        )));
    };
    let mut comms: Vec<Option<Comm>> = vec![None; c.lanes as usize];
    let mut handles = Vec::new();
    for (i, h) in theirs {
        let h: [u8; 128] = h
            .try_into()
            .map_err(|_| Error("peer handle of the wrong size".into()))?;
        if i >= c.lanes || c.role(i) != Role::Send {
            return Err(Error(format!(
                "peer handle for lane {i}, not one we send on"
            )));
        }
        handles.push((i, h));
    }
    let deadline = Instant::now() + c.timeout;
    while comms.iter().any(Option::is_none) {
        for (i, h) in &mut handles {
            if comms[*i as usize].is_none() {
                comms[*i as usize] = net.connect(c.dev, h)?;
            }
        }
        for (i, l) in &listens {
            if comms[*i as usize].is_none() {
                comms[*i as usize] = net.accept(*l)?;
            }
        }
        if Instant::now() > deadline {
            return Err(Error(format!(
                "thread {}: comms not connected after {:?}",
                c.thread, c.timeout
            )));
        }
        std::thread::yield_now();
    }
    for (_, l) in listens {
        net.close_listen(l)?;
    }
    Ok(comms
        .into_iter()
        .enumerate()
        .filter_map(|(i, m)| m.map(|m| (m, c.role(i as u32))))
        .collect())
}

/// Agrees with the peer where to stop: freezes every lane, swaps the started counts, and lets
/// each lane run to the larger one. The driver speaks first.
fn agree_stop(
    lanes: &mut [Lane<'_>],
    link: &mut Link,
    peer_first: Option<Vec<u64>>,
) -> Result<(), Error> {
    let ours: Vec<u64> = lanes.iter_mut().map(Lane::freeze).collect();
    let theirs = match peer_first {
        Some(t) => {
            link.send(&Msg::Stop(ours.clone()))?;
            t
        }
        None => {
            link.send(&Msg::Stop(ours.clone()))?;
            match link.recv()? {
                Msg::Stop(t) => t,
                m => return Err(Error(format!("expected Stop, got {m:?}"))),
            }
        }
    };
    if theirs.len() != lanes.len() {
        return Err(Error(format!(
            "peer stopped {} lanes, we have {}",
            theirs.len(),
            lanes.len()
        )));
    }
    for (l, t) in lanes.iter_mut().zip(theirs) {
        l.run_to(t);
    }
    Ok(())
}

/// The traffic loop: every lane steps until the stop is agreed and every lane is drained.
fn traffic(
    c: &ThreadCfg,
    lanes: &mut [Lane<'_>],
    link: &mut Link,
    tot: &mut Totals,
) -> Result<(), Error> {
    let (mut stopped, mut idle, mut spins) = (false, 0u32, 0u64);
    loop {
        let mut progress = false;
        for l in lanes.iter_mut() {
            progress |= l.step(tot)?;
        }
        if stopped && lanes.iter().all(Lane::drained) {
            return Ok(());
        }
        spins += 1;
        if !stopped && c.deadline.is_some_and(|d| Instant::now() >= d) {
            agree_stop(lanes, link, None)?;
            stopped = true;
        } else if spins % 64 == 0 {
            match link.poll()? {
                None => {}
                Some(Msg::Stop(t)) if !stopped && c.deadline.is_none() => {
                    agree_stop(lanes, link, Some(t))?;
                    stopped = true;
                }
                Some(m) => return Err(Error(format!("unexpected control message {m:?}"))),
            }
        }
        idle = if progress { 0 } else { idle + 1 };
        if idle > 1000 {
            std::thread::sleep(Duration::from_micros(100));
        } else if idle > 0 {
            std::thread::yield_now();
        }
    }
}

/// The plugin, opened and initialised for this thread, with device `c.dev`.
fn open(c: &ThreadCfg) -> Result<Plugin, Error> {
    let mut p = Plugin::open(&c.plugin)?;
    p.init()?;
    match p.devices()? {
        n if n > c.dev => Ok(p),
        n => Err(Error(format!(
            "the plugin has {n} devices, no device {}",
            c.dev
        ))),
    }
}

/// Runs one thread: establish, `gate` (start figures), traffic, `gate` twice (end figures
/// read between), close. Every path passes the three gates once, so the process's figures never wait on a failed thread.
/// Failures are counted in the outcome (and sent to the peer), never returned.
pub fn run(c: &ThreadCfg, mut link: Link, gate: &Barrier) -> Outcome {
    let net = open(c);
    let lanes = net.as_ref().map_err(Clone::clone).and_then(|p| {
        establish(p, c, &mut link)?
            .into_iter()
            .enumerate()
            .map(|(i, (m, r))| Lane::new(p, m, r, c.lane_cfg(i as u32)))
            .collect::<Result<Vec<Lane<'_>>, Error>>()
    });
    let mut out = Outcome::default();
    gate.wait();
    let res = match lanes {
        Ok(mut lanes) => {
            let r = traffic(c, &mut lanes, &mut link, &mut out.own)
                .and_then(|()| finish(c, &mut link, &out.own));
            gate.wait(); // the end figures are read between these two
            gate.wait();
            let closed = lanes.into_iter().try_for_each(Lane::close);
            r.and_then(|peer| closed.map(|()| peer))
        }
        Err(e) => {
            gate.wait();
            gate.wait();
            Err(e)
        }
    };
    match res {
        Ok(peer) => out.peer = peer,
        Err(e) => {
            out.own.error(|| format!("thread {}: {e}", c.thread));
            let _ = link.send(&Msg::Fail(e.0));
        }
    }
    out
}

/// Swaps totals: the peer sends its `Done`, the driver receives it.
fn finish(c: &ThreadCfg, link: &mut Link, own: &Totals) -> Result<Option<Totals>, Error> {
    if c.deadline.is_none() {
        link.send(&Msg::Done(own.clone()))?;
        return Ok(None);
    }
    match link.recv()? {
        Msg::Done(t) => Ok(Some(t)),
        m => Err(Error(format!("expected Done, got {m:?}"))),
    }
}
