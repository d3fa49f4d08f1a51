//! The measurement core shared by both roles.
//!
//! Per size the driver sends a [`Step`]; both sides register their buffers, then run
//! - **latency**: ping-pong of one message; one-way latency = round trip / 2 (µs);
//! - **bandwidth**: the driver keeps `window` requests of `multirecv` messages (tags
//!   0..multirecv) in flight; the responder keeps `window` multi-receives posted and sends an
//!   8-byte ack after the last one; bandwidth = bytes / (first isend → ack), message rate =
//!   messages / same time.
//!
//! Polls yield the CPU between attempts. Every wait is bounded by the configured timeout, so a dead or stuck peer is an error. With
//! `check`, every message carries its own pattern ([`crate::buf`]) and every received byte is
//! verified (the fill/verify cost is then inside the timings); sizes reported by `test` are
//! always checked (a multi-receive reports 1 per non-empty buffer, as NCCL's net_ib does).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::buf::{self, AlignedBuf};
use crate::net::{Comm, Mr, Plugin, RecvSpec, Req, MAX_RECVS};
use crate::stats::{self, LatStats};
use crate::Error;

const PING: u8 = 1;
const PONG: u8 = 2;
const STREAM: u8 = 3;

/// The run's options, sent to the responder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Message sizes, bytes.
    pub sizes: Vec<usize>,
    /// Most measured iterations per phase (scaled down for large sizes).
    pub iters: u64,
    /// Most warm-up iterations per phase.
    pub warmup: u64,
    /// Outstanding requests while streaming (1..=32).
    pub window: usize,
    /// Receives per request (1..=8).
    pub multirecv: usize,
    /// Verify every byte.
    pub check: bool,
    /// Bytes one phase of one size may move (bounds each size's run time).
    pub budget: u64,
    /// Most bytes of streaming buffers per side (caps the window for large sizes).
    pub max_mem: u64,
    /// Seconds any single wait may take.
    pub timeout_s: u64,
    /// Device index on each side.
    pub dev: i32,
    /// The physical devices the driver fused into `dev` (`--fuse`; empty: none). The
    /// responder fuses the same ones (its own `--fuse`, if given, instead) and uses the
    /// device number its plugin returns.
    #[serde(default)]
    pub fuse: Vec<i32>,
    /// Run the latency (ping-pong) phase.
    #[serde(default = "yes")]
    pub latency: bool,
    /// Run the bandwidth (streaming) phase.
    #[serde(default = "yes")]
    pub bandwidth: bool,
}

fn yes() -> bool {
    true
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            sizes: sizes(8, 256 << 20),
            iters: 1000,
            warmup: 32,
            window: 16,
            multirecv: 1,
            check: false,
            budget: 1 << 30,
            max_mem: 1 << 30,
            timeout_s: 30,
            dev: 0,
            fuse: Vec::new(),
            latency: true,
            bandwidth: true,
        }
    }
}

/// The doubling sizes `min, 2·min, …` up to and including `max` (and `max` itself).
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        match s.checked_mul(2) {
            Some(n) => s = n,
            None => break,
        }
    }
    if v.last() != Some(&max) && max >= min {
        v.push(max);
    }
    v
}

/// One size's plan, computed by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Message size.
    pub size: usize,
    /// Ping-pong warm-up round trips.
    pub lat_warm: u64,
    /// Measured round trips.
    pub lat_iters: u64,
    /// Streaming warm-up requests.
    pub bw_warm: u64,
    /// Measured streaming requests.
    pub bw_iters: u64,
    /// Effective window.
    pub window: usize,
    /// Receives per request.
    pub multirecv: usize,
    /// Verify bytes.
    pub check: bool,
}

/// Buffer stride of one slot: at least 64 bytes (ack room), page-aligned above a page.
fn stride(size: usize) -> usize {
    if size >= buf::ALIGN {
        size.div_ceil(buf::ALIGN) * buf::ALIGN
    } else {
        size.max(64).next_power_of_two()
    }
}

impl RunConfig {
    /// The plan for `size`: iterations scaled so each phase moves at most `budget` bytes
    /// (at least 3 measured iterations), window capped by `max_mem`; a phase switched off
    /// (`latency`, `bandwidth`) gets no iterations at all.
    pub fn step(&self, size: usize) -> Step {
        let n = self.multirecv.max(1);
        let per = (size.max(1) as u64) * n as u64;
        let lat_iters = (self.budget / (2 * size.max(1) as u64)).clamp(3, self.iters.max(3));
        let bw_iters = (self.budget / per).clamp(3, self.iters.max(3));
        let window = ((self.max_mem / (stride(size) as u64 * n as u64)) as usize)
            .clamp(1, self.window.max(1));
        let (lat_on, bw_on) = (self.latency as u64, self.bandwidth as u64);
        Step {
            size,
            lat_warm: self.warmup.min(lat_iters / 4).max(1) * lat_on,
            lat_iters: lat_iters * lat_on,
            bw_warm: self.warmup.min(bw_iters / 4).max(1) * bw_on,
            bw_iters: bw_iters * bw_on,
            window,
            multirecv: n,
            check: self.check,
        }
    }
}

/// One size's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Message size, bytes.
    pub size: usize,
    /// One-way latency p50, µs.
    pub lat_p50_us: f64,
    /// One-way latency p99, µs.
    pub lat_p99_us: f64,
    /// One-way latency mean, µs.
    pub lat_mean_us: f64,
    /// Measured round trips.
    pub lat_iters: u64,
    /// Bandwidth, GB/s (10^9 bytes/s).
    pub bw_gbps: f64,
    /// Messages per second, millions.
    pub msg_rate_mps: f64,
    /// Measured streaming requests.
    pub bw_iters: u64,
    /// Effective window.
    pub window: usize,
    /// Receives per request.
    pub multirecv: usize,
    /// "ok", "-" (not checked) or "FAIL(n)".
    pub check: String,
}

/// A connected pair of comms (send to the peer, receive from it) on one plugin device.
pub struct Endpoint<'p> {
    /// The plugin.
    pub net: &'p Plugin,
    /// Send comm.
    pub send: Comm,
    /// Receive comm.
    pub recv: Comm,
    listen: Comm,
    timeout: Duration,
}

fn spin(deadline: Instant, what: &str) -> Result<(), Error> {
    if Instant::now() > deadline {
        return Err(Error(format!(
            "timed out waiting for {what} (peer dead or stuck? raise --timeout)"
        )));
    }
    // Yield between polls: on a small host the peer process and the provider's threads need
    // the CPU this poll would burn.
    std::thread::yield_now();
    Ok(())
}

impl<'p> Endpoint<'p> {
    /// Listens on `dev`, swaps handles through `swap` (ours in, the peer's out), then calls
    /// connect and accept until both comms exist.
    pub fn establish(
        net: &'p Plugin,
        dev: i32,
        timeout: Duration,
        swap: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, Error>,
    ) -> Result<Self, Error> {
        let (h, listen) = net.listen(dev)?;
        let peer = swap(h.to_vec())?;
        let mut ph = [0u8; ibnet_nccl::types::NCCL_NET_HANDLE_MAXSIZE];
        if peer.len() != ph.len() {
            return Err(Error(format!("peer handle of {} bytes", peer.len())));
        }
        ph.copy_from_slice(&peer);
        let deadline = Instant::now() + timeout;
        let (mut s, mut r) = (None, None);
        while s.is_none() || r.is_none() {
            if s.is_none() {
                s = net.connect(dev, &mut ph)?;
            }
            if r.is_none() {
                r = net.accept(listen)?;
            }
            if s.is_none() || r.is_none() {
                spin(deadline, "connect/accept")?;
            }
        }
        Ok(Self {
            net,
            send: s.unwrap_or(Comm(core::ptr::null_mut())),
            recv: r.unwrap_or(Comm(core::ptr::null_mut())),
            listen,
            timeout,
        })
    }

    /// Closes the comms.
    pub fn close(self) -> Result<(), Error> {
        let a = self.net.close_send(self.send);
        let b = self.net.close_recv(self.recv);
        let c = self.net.close_listen(self.listen);
        a.and(b).and(c)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn wait(&self, r: Req, what: &str) -> Result<[i32; MAX_RECVS], Error> {
        let d = self.deadline();
        loop {
            if let Some(s) = self.net.test(r)? {
                return Ok(s);
            }
            spin(d, what)?;
        }
    }

    fn post_send(&self, a: &Arena, slot: usize, size: usize, tag: i32) -> Result<Req, Error> {
        let d = self.deadline();
        loop {
            // SAFETY: the slot lies in the arena's registration; callers leave it untouched
            // until the request completes.
            if let Some(r) = unsafe { self.net.isend(self.send, a.ptr(slot), size, tag, a.mr) }? {
                return Ok(r);
            }
            spin(d, "the peer's receive (isend)")?;
        }
    }

    fn try_recv(
        &self,
        a: &Arena,
        first: usize,
        n: usize,
        size: usize,
    ) -> Result<Option<Req>, Error> {
        let mut specs = [RecvSpec {
            data: core::ptr::null_mut(),
            size: 0,
            tag: 0,
            mr: a.mr,
        }; MAX_RECVS];
        for (k, s) in specs.iter_mut().enumerate().take(n) {
            s.data = a.ptr(first + k);
            s.size = size;
            s.tag = k as i32;
        }
        // SAFETY: slots lie in the registration and stay untouched until completion.
        unsafe { self.net.irecv(self.recv, &specs[..n]) }
    }

    fn post_recv(&self, a: &Arena, first: usize, n: usize, size: usize) -> Result<Req, Error> {
        let d = self.deadline();
        loop {
            if let Some(r) = self.try_recv(a, first, n, size)? {
                return Ok(r);
            }
            spin(d, "irecv")?;
        }
    }
}

/// Registered slots of one size.
pub struct Arena {
    buf: AlignedBuf,
    mr: Mr,
    comm: Comm,
    stride: usize,
}

impl Arena {
    fn new(ep: &Endpoint<'_>, comm: Comm, slots: usize, size: usize) -> Result<Self, Error> {
        let stride = stride(size);
        let len = stride * slots.max(1);
        let buf = AlignedBuf::new(len)
            .ok_or_else(|| Error(format!("cannot allocate {len} bytes of buffers")))?;
        // SAFETY: `buf` lives in the arena and is deregistered (in `free`) before it is freed.
        let mr = unsafe { ep.net.reg_mr(comm, buf.as_ptr(), len) }?;
        Ok(Self {
            buf,
            mr,
            comm,
            stride,
        })
    }
    fn ptr(&self, slot: usize) -> *mut u8 {
        // SAFETY: slot < slots (callers index within the arena they sized).
        unsafe { self.buf.as_ptr().add(slot * self.stride) }
    }
    fn free(self, net: &Plugin) -> Result<(), Error> {
        net.dereg_mr(self.comm, self.mr)
    }
}

/// Verification tally.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    /// Bad messages.
    pub bad: u64,
    /// First failure.
    pub first: Option<String>,
}

impl Tally {
    fn note(&mut self, why: impl FnOnce() -> String) {
        self.bad += 1;
        if self.first.is_none() {
            self.first = Some(why());
        }
    }
    fn size(&mut self, got: i32, want: usize, what: &str) {
        if got < 0 || got as usize != want {
            self.note(|| format!("{what}: test() reported {got} bytes, expected {want}"));
        }
    }
    fn data(&mut self, a: &Arena, slot: usize, size: usize, seed: u64, what: &str) {
        if let Some(off) = buf::verify(a.buf.slice(slot * a.stride, size), seed) {
            self.note(|| format!("{what} of {size} bytes: first wrong byte at offset {off}"));
        }
    }
}

/// The driver's side of one step: latency samples (µs), bandwidth time, tally.
pub fn drive_step(ep: &Endpoint<'_>, st: &Step) -> Result<(Option<LatStats>, f64, Tally), Error> {
    let n = st.multirecv;
    let sa = Arena::new(ep, ep.send, st.window * n, st.size)?;
    let mut ra = Arena::new(ep, ep.recv, 1, st.size)?;
    let mut sa = sa;
    let mut t = Tally::default();
    let size = st.size;
    // Latency: ping-pong.
    let mut samples = Vec::with_capacity(st.lat_iters as usize);
    for i in 0..st.lat_warm + st.lat_iters {
        if st.check {
            buf::fill(sa.buf.slice_mut(0, size), buf::seed(size, PING, i, 0));
        }
        let rr = ep.post_recv(&ra, 0, 1, size)?;
        let t0 = Instant::now();
        let sr = ep.post_send(&sa, 0, size, 0)?;
        ep.wait(sr, "the ping's send completion")?;
        let sizes = ep.wait(rr, "the pong")?;
        let dt = t0.elapsed();
        if i >= st.lat_warm {
            samples.push(dt.as_secs_f64() * 1e6 / 2.0);
        }
        t.size(sizes[0], size, "pong");
        if st.check {
            t.data(&ra, 0, size, buf::seed(size, PONG, i, 0), "pong");
        }
    }
    // Bandwidth: warm-up then measured (none when the phase is off).
    let mut secs = 0.0;
    if st.bw_iters > 0 {
        stream_send(ep, &mut sa, &mut ra, st, 0, st.bw_warm, &mut t)?;
        let t0 = Instant::now();
        stream_send(ep, &mut sa, &mut ra, st, st.bw_warm, st.bw_iters, &mut t)?;
        secs = t0.elapsed().as_secs_f64();
    }
    sa.free(ep.net)?;
    ra.free(ep.net)?;
    Ok((stats::summarize(&samples), secs, t))
}

fn stream_send(
    ep: &Endpoint<'_>,
    sa: &mut Arena,
    ra: &mut Arena,
    st: &Step,
    it0: u64,
    iters: u64,
    _t: &mut Tally,
) -> Result<(), Error> {
    let (n, w, size) = (st.multirecv as u64, st.window as u64, st.size);
    let ack = ep.post_recv(ra, 0, 1, 8)?;
    let total = iters * n;
    let mut inflight: VecDeque<Req> = VecDeque::with_capacity((w * n) as usize);
    let (mut next, mut filled, mut completed) = (0u64, u64::MAX, 0u64);
    let mut d = ep.deadline();
    while completed < total {
        while next < total && (inflight.len() as u64) < w * n {
            let (it, k) = (next / n, next % n);
            let slot = ((it % w) * n + k) as usize;
            if st.check && filled != next {
                let s = buf::seed(size, STREAM, it0 + it, k as i32);
                buf::fill(sa.buf.slice_mut(slot * sa.stride, size), s);
                filled = next;
            }
            // SAFETY: the slot is in the registration; its previous message completed
            // (FIFO retirement below keeps at most window*n outstanding).
            match unsafe { ep.net.isend(ep.send, sa.ptr(slot), size, k as i32, sa.mr) }? {
                Some(r) => {
                    inflight.push_back(r);
                    next += 1;
                }
                None => break,
            }
        }
        if let Some(&r) = inflight.front() {
            if ep.net.test(r)?.is_some() {
                inflight.pop_front();
                completed += 1;
                d = ep.deadline();
                continue;
            }
        }
        spin(d, "streaming sends to complete")?;
    }
    ep.wait(ack, "the receiver's ack")?;
    Ok(())
}

fn stream_recv(
    ep: &Endpoint<'_>,
    sa: &Arena,
    ra: &Arena,
    st: &Step,
    it0: u64,
    iters: u64,
    t: &mut Tally,
) -> Result<(), Error> {
    let (n, w, size) = (st.multirecv, st.window as u64, st.size);
    let mut inflight: VecDeque<(u64, Req)> = VecDeque::with_capacity(w as usize);
    let (mut next, mut done) = (0u64, 0u64);
    let mut d = ep.deadline();
    while done < iters {
        while next < iters && (inflight.len() as u64) < w {
            let first = ((next % w) as usize) * n;
            match ep.try_recv(ra, first, n, size)? {
                Some(r) => {
                    inflight.push_back((next, r));
                    next += 1;
                }
                None => break,
            }
        }
        if let Some(&(it, r)) = inflight.front() {
            if let Some(sizes) = ep.net.test(r)? {
                inflight.pop_front();
                let first = ((it % w) as usize) * n;
                for (k, &got) in sizes.iter().enumerate().take(n) {
                    // A multi-receive reports only "received something" (1) or nothing (0)
                    // per buffer, as NCCL's net_ib does; a single receive reports the size.
                    if n > 1 && got == 1 && size > 0 {
                        t.size(size as i32, size, "streamed message");
                    } else {
                        t.size(got, size, "streamed message");
                    }
                    if st.check {
                        let s = buf::seed(size, STREAM, it0 + it, k as i32);
                        t.data(ra, first + k, size, s, "streamed message");
                    }
                }
                done += 1;
                d = ep.deadline();
                continue;
            }
        }
        spin(d, "streamed messages")?;
    }
    let r = ep.post_send(sa, 0, 8, 0)?;
    ep.wait(r, "the ack's send completion")?;
    Ok(())
}

/// The responder's side of one step.
pub fn respond_step(
    ep: &Endpoint<'_>,
    st: &Step,
    ready: impl FnOnce() -> Result<(), Error>,
) -> Result<Tally, Error> {
    let n = st.multirecv;
    let mut sa = Arena::new(ep, ep.send, 1, st.size)?;
    let ra = Arena::new(ep, ep.recv, st.window * n, st.size)?;
    ready()?;
    let mut t = Tally::default();
    let size = st.size;
    for i in 0..st.lat_warm + st.lat_iters {
        let rr = ep.post_recv(&ra, 0, 1, size)?;
        let sizes = ep.wait(rr, "the ping")?;
        t.size(sizes[0], size, "ping");
        if st.check {
            t.data(&ra, 0, size, buf::seed(size, PING, i, 0), "ping");
            buf::fill(sa.buf.slice_mut(0, size), buf::seed(size, PONG, i, 0));
        }
        let sr = ep.post_send(&sa, 0, size, 0)?;
        ep.wait(sr, "the pong's send completion")?;
    }
    if st.bw_iters > 0 {
        stream_recv(ep, &sa, &ra, st, 0, st.bw_warm, &mut t)?;
        stream_recv(ep, &sa, &ra, st, st.bw_warm, st.bw_iters, &mut t)?;
    }
    sa.free(ep.net)?;
    ra.free(ep.net)?;
    Ok(t)
}

/// Builds a result row (NaN for a phase that did not run).
pub fn row(st: &Step, lat: Option<LatStats>, secs: f64, bad: u64) -> Row {
    let msgs = (st.bw_iters * st.multirecv as u64) as f64;
    let secs = if st.bw_iters == 0 {
        f64::NAN
    } else {
        secs.max(1e-9)
    };
    Row {
        size: st.size,
        lat_p50_us: lat.map_or(f64::NAN, |l| l.p50),
        lat_p99_us: lat.map_or(f64::NAN, |l| l.p99),
        lat_mean_us: lat.map_or(f64::NAN, |l| l.mean),
        lat_iters: st.lat_iters,
        bw_gbps: msgs * st.size as f64 / secs / 1e9,
        msg_rate_mps: msgs / secs / 1e6,
        bw_iters: st.bw_iters,
        window: st.window,
        multirecv: st.multirecv,
        check: if bad > 0 {
            format!("FAIL({bad})")
        } else if st.check {
            "ok".into()
        } else {
            "-".into()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_list() {
        assert_eq!(sizes(8, 64), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100), vec![8, 16, 32, 64, 100]);
        assert_eq!(sizes(8, 8), vec![8]);
        assert_eq!(sizes(8, 4), Vec::<usize>::new());
        assert_eq!(sizes(8, 256 << 20).len(), 26);
    }

    #[test]
    fn steps_are_bounded() {
        let c = RunConfig::default();
        let small = c.step(8);
        assert_eq!(
            (small.lat_iters, small.bw_iters, small.window),
            (1000, 1000, 16)
        );
        let big = c.step(256 << 20);
        assert!(big.bw_iters * (256 << 20) <= c.budget.max(3 * (256 << 20)));
        assert_eq!(big.window, 4);
        assert!(big.lat_warm >= 1 && big.bw_warm >= 1);
        let lat_only = RunConfig {
            bandwidth: false,
            ..RunConfig::default()
        }
        .step(8);
        assert_eq!((lat_only.bw_warm, lat_only.bw_iters), (0, 0));
        assert_eq!(lat_only.lat_iters, 1000);
        let r = row(&lat_only, None, 0.0, 0);
        assert!(r.bw_gbps.is_nan() && r.msg_rate_mps.is_nan() && r.lat_p50_us.is_nan());
        let bw_only = RunConfig {
            latency: false,
            ..RunConfig::default()
        }
        .step(8);
        assert_eq!((bw_only.lat_warm, bw_only.lat_iters), (0, 0));
        assert_eq!(bw_only.bw_iters, 1000);
    }

    #[test]
    fn configs_without_the_phase_fields_run_both_phases() {
        let mut v = serde_json::to_value(RunConfig::default()).unwrap();
        let m = v.as_object_mut().unwrap();
        m.remove("latency");
        m.remove("bandwidth");
        let c: RunConfig = serde_json::from_value(v).unwrap();
        assert!(c.latency && c.bandwidth);
    }
}
