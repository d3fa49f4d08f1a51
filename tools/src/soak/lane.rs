//! One lane: a comm in one direction and its registered buffer, driven without waiting.
//!
//! A lane runs the requests of [`plan::request`] in order, up to `window` in flight. The
//! sender fills each message with its seed's pattern and issues the request's `isend`s in the
//! plan's (shuffled) order; the receiver posts one `irecv` of the request's `n` buffers, with a
//! guard of [`GUARD`] poisoned bytes after each sent size. On completion the receiver checks the
//! sizes `test` reports ([`SizeCheck`]), every byte of every message and that the guard is
//! untouched. Requests retire in order, so request `k` uses buffer slot `k % window`.
//!
//! The only `unsafe` here is passing the lane's own buffer to the plugin: each message region
//! lies inside the lane's registration and is touched by us only while no request on its slot
//! is outstanding.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::plan::{self, LaneId, Request};
use super::stats::Totals;
use super::MAX_WIDTH;
use crate::buf::{self, AlignedBuf};
use crate::net::{Comm, Mr, Plugin, RecvSpec, Req};
use crate::Error;

/// Poisoned bytes after each received message: a write past the sent size shows there.
pub const GUARD: usize = 64;
/// The poison.
const POISON: u8 = 0xA5;

/// Which end of the comm this lane is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `isend`s on a send comm.
    Send,
    /// `irecv`s on a receive comm.
    Recv,
}

/// What a receiver requires of the sizes `test` reports for a multi-receive (width > 1).
/// A single receive (width 1) must always report the sent size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeCheck {
    /// Each reported size is ≤ the posted size and, if above 1, equal to the sent size (a
    /// plugin may report 0/1 "had data" flags per receive, as ibnet does without the sizes FIFO).
    Loose,
    /// Each reported size equals the sent size.
    Exact,
}

impl SizeCheck {
    /// Whether `got` is acceptable for a message of `sent` bytes posted as `posted`, in a
    /// request of width `n`.
    pub fn ok(self, n: usize, got: usize, sent: usize, posted: usize) -> bool {
        match self {
            _ if n == 1 => got == sent,
            SizeCheck::Exact => got == sent,
            SizeCheck::Loose => got <= posted && (got <= 1 || got == sent),
        }
    }
}

/// What a lane runs.
#[derive(Debug, Clone, Copy)]
pub struct LaneCfg {
    /// Run seed.
    pub seed: u64,
    /// Lane identity (the same on both sides).
    pub id: LaneId,
    /// Most bytes of one request (all its messages together).
    pub max_total: usize,
    /// Widest multi-receive.
    pub max_width: usize,
    /// Requests in flight.
    pub window: usize,
    /// Size rule for multi-receives.
    pub sizes: SizeCheck,
    /// Longest time without progress before the lane fails.
    pub timeout: Duration,
}

impl LaneCfg {
    /// Bytes of one slot: the largest request plus alignment and guards.
    pub fn slot_bytes(&self) -> usize {
        (self.max_total + MAX_WIDTH * (GUARD + 64)).next_multiple_of(buf::ALIGN)
    }
}

/// Offsets of a request's messages within its slot (64-byte aligned, a guard after each).
fn offsets(q: &Request) -> [usize; MAX_WIDTH] {
    let mut o = [0; MAX_WIDTH];
    for j in 1..q.n {
        o[j] = (o[j - 1] + q.posted[j - 1] + GUARD).next_multiple_of(64);
    }
    o
}

/// One request in flight.
struct Flight {
    k: u64,
    q: Request,
    /// Outstanding plugin requests: per message for a sender, `[0]` for a receiver.
    reqs: [Option<Req>; MAX_WIDTH],
    /// Messages issued so far (sender; in `q.order`).
    issued: usize,
}

impl Flight {
    fn complete(&self) -> bool {
        self.issued == self.q.n && self.reqs.iter().all(Option::is_none)
    }
}

/// A lane.
pub struct Lane<'p> {
    net: &'p Plugin,
    /// The comm.
    pub comm: Comm,
    /// Send or receive.
    pub role: Role,
    cfg: LaneCfg,
    mr: Mr,
    buf: AlignedBuf,
    flights: VecDeque<Flight>,
    started: u64,
    limit: u64,
    last_progress: Instant,
}

impl<'p> Lane<'p> {
    /// Allocates and registers the lane's buffer on `comm`.
    pub fn new(net: &'p Plugin, comm: Comm, role: Role, cfg: LaneCfg) -> Result<Self, Error> {
        let len = cfg.slot_bytes() * cfg.window;
        let buf = AlignedBuf::new(len)
            .ok_or_else(|| Error(format!("cannot allocate {len} bytes for a lane")))?;
        // SAFETY: `buf` is owned by the lane and deregistered in `close` before it is freed.
        let mr = unsafe { net.reg_mr(comm, buf.as_ptr(), len) }?;
        Ok(Self {
            net,
            comm,
            role,
            cfg,
            mr,
            buf,
            flights: VecDeque::with_capacity(cfg.window),
            started: 0,
            limit: u64::MAX,
            last_progress: Instant::now(),
        })
    }

    /// Starts no further request; returns how many were started.
    pub fn freeze(&mut self) -> u64 {
        self.limit = self.started;
        self.started
    }
    /// Runs until `n` requests are started and retired.
    pub fn run_to(&mut self, n: u64) {
        self.limit = n.max(self.started);
    }
    /// Whether every request up to the limit has retired.
    pub fn drained(&self) -> bool {
        self.started == self.limit && self.flights.is_empty()
    }

    fn name(&self) -> String {
        let r = if self.role == Role::Send {
            "send"
        } else {
            "recv"
        };
        format!("lane {}.{} ({r})", self.cfg.id.thread, self.cfg.id.lane)
    }

    fn ptr(&self, k: u64, off: usize) -> *mut u8 {
        let slot = (k % self.cfg.window as u64) as usize * self.cfg.slot_bytes();
        self.buf.as_ptr().wrapping_add(slot + off)
    }

    /// Starts request `started` if the window allows: fills (sender) or poisons guards and
    /// posts (receiver). `Ok(false)` when nothing could start.
    fn start(&mut self) -> Result<bool, Error> {
        let unsent = self.flights.back().is_some_and(|f| f.issued < f.q.n);
        if unsent || self.started >= self.limit || self.flights.len() >= self.cfg.window {
            return Ok(false);
        }
        let k = self.started;
        let c = &self.cfg;
        let q = plan::request(c.seed, c.id, k, c.max_total, c.max_width);
        let off = offsets(&q);
        let base = (k % c.window as u64) as usize * c.slot_bytes();
        let mut reqs = [None; MAX_WIDTH];
        let issued = match self.role {
            Role::Send => {
                for (j, o) in off.iter().enumerate().take(q.n) {
                    buf::fill(self.buf.slice_mut(base + o, q.sent[j]), q.seeds[j]);
                }
                0
            }
            Role::Recv => {
                for (j, o) in off.iter().enumerate().take(q.n) {
                    self.buf.slice_mut(base + o + q.sent[j], GUARD).fill(POISON);
                }
                let mut specs = [RecvSpec {
                    data: core::ptr::null_mut(),
                    size: 0,
                    tag: 0,
                    mr: self.mr,
                }; MAX_WIDTH];
                for j in 0..q.n {
                    specs[j].data = self.ptr(k, off[j]);
                    specs[j].size = q.posted[j];
                    specs[j].tag = q.tags[j];
                }
                // SAFETY: each buffer lies in slot k % window of the registered `buf`, which no
                // other outstanding request uses and which we leave alone until completion.
                match unsafe { self.net.irecv(self.comm, &specs[..q.n]) }? {
                    Some(r) => reqs[0] = Some(r),
                    None => return Ok(false),
                }
                q.n
            }
        };
        self.flights.push_back(Flight { k, q, reqs, issued });
        self.started += 1;
        Ok(true)
    }

    /// Issues the newest request's next sends (sender). `Ok(true)` if one went out.
    fn issue(&mut self) -> Result<bool, Error> {
        let Some(f) = self.flights.back() else {
            return Ok(false);
        };
        if f.issued == f.q.n {
            return Ok(false);
        }
        let (k, j) = (f.k, f.q.order[f.issued]);
        let (size, tag) = (f.q.sent[j], f.q.tags[j]);
        let p = self.ptr(k, offsets(&f.q)[j]);
        // SAFETY: the message lies in slot k % window of the registered `buf`, filled above and
        // left alone until this request completes.
        let r = unsafe { self.net.isend(self.comm, p, size, tag, self.mr) }?;
        let (Some(r), Some(f)) = (r, self.flights.back_mut()) else {
            return Ok(false);
        };
        f.reqs[j] = Some(r);
        f.issued += 1;
        Ok(true)
    }

    /// Checks a completed receive: sizes, content, guards.
    fn check_recv(&self, f: &Flight, sizes: &[i32; MAX_WIDTH], tot: &mut Totals) {
        let (q, off) = (&f.q, offsets(&f.q));
        let base = (f.k % self.cfg.window as u64) as usize * self.cfg.slot_bytes();
        for j in 0..q.n {
            let got = usize::try_from(sizes[j]).unwrap_or(usize::MAX);
            if !self.cfg.sizes.ok(q.n, got, q.sent[j], q.posted[j]) {
                tot.error(|| {
                    format!(
                        "{} request {} (width {}) message {j} tag {}: test() reported {} bytes; sent {}, posted {}",
                        self.name(), f.k, q.n, q.tags[j], sizes[j], q.sent[j], q.posted[j]
                    )
                });
            }
            let data = self.buf.slice(base + off[j], q.sent[j]);
            let guard = self.buf.slice(base + off[j] + q.sent[j], GUARD);
            let bad = buf::verify(data, q.seeds[j])
                .map(|at| format!("wrong byte at offset {at} of {}", q.sent[j]))
                .or_else(|| {
                    guard
                        .iter()
                        .position(|&b| b != POISON)
                        .map(|at| format!("written {at} bytes past the sent size {}", q.sent[j]))
                });
            match bad {
                Some(why) => tot.corruption(|| {
                    format!(
                        "{} request {} (width {}) message {j} tag {} (posted {}): {why}",
                        self.name(),
                        f.k,
                        q.n,
                        q.tags[j],
                        q.posted[j]
                    )
                }),
                None => {
                    tot.messages += 1;
                    tot.bytes += q.sent[j] as u64;
                }
            }
        }
    }

    /// Tests every outstanding request once; retires completed ones in order.
    fn test_all(&mut self, tot: &mut Totals) -> Result<bool, Error> {
        let mut progress = false;
        for i in 0..self.flights.len() {
            for j in 0..MAX_WIDTH {
                let Some(r) = self.flights[i].reqs[j] else {
                    continue;
                };
                let Some(sizes) = self.net.test(r).map_err(|e| {
                    Error(format!(
                        "{}: test of request {}: {e}",
                        self.name(),
                        self.flights[i].k
                    ))
                })?
                else {
                    continue;
                };
                progress = true;
                let f = &self.flights[i];
                match self.role {
                    Role::Recv => self.check_recv(f, &sizes, tot),
                    Role::Send if usize::try_from(sizes[0]).ok() != Some(f.q.sent[j]) => {
                        tot.error(|| {
                            format!(
                                "{} request {} message {j}: test() reported {} bytes sent, not {}",
                                self.name(),
                                f.k,
                                sizes[0],
                                f.q.sent[j]
                            )
                        })
                    }
                    Role::Send => {}
                }
                self.flights[i].reqs[j] = None;
            }
        }
        while self.flights.front().is_some_and(Flight::complete) {
            self.flights.pop_front();
            tot.requests += 1;
        }
        Ok(progress)
    }

    /// One non-blocking pass: start, issue, test. `Ok(true)` if anything moved; an error
    /// after `timeout` without progress.
    pub fn step(&mut self, tot: &mut Totals) -> Result<bool, Error> {
        let mut progress = false;
        loop {
            let moved = match self.role {
                Role::Send => self.issue()? || self.start()?,
                Role::Recv => self.start()?,
            };
            if !moved {
                break;
            }
            progress = true;
        }
        progress |= self.test_all(tot)?;
        if progress {
            self.last_progress = Instant::now();
        } else if !self.drained() && self.last_progress.elapsed() > self.cfg.timeout {
            let what = self.flights.front().map_or("no request".into(), |f| {
                format!(
                    "request {} (width {}, {} of {} issued)",
                    f.k, f.q.n, f.issued, f.q.n
                )
            });
            return Err(Error(format!(
                "{}: no progress for {:?}, waiting for {what}",
                self.name(),
                self.cfg.timeout
            )));
        }
        Ok(progress)
    }

    /// Deregisters the buffer and closes the comm.
    pub fn close(self) -> Result<(), Error> {
        let d = self.net.dereg_mr(self.comm, self.mr);
        let c = match self.role {
            Role::Send => self.net.close_send(self.comm),
            Role::Recv => self.net.close_recv(self.comm),
        };
        d.and(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_rules() {
        // Width 1: always exact.
        assert!(SizeCheck::Loose.ok(1, 5, 5, 9));
        assert!(!SizeCheck::Loose.ok(1, 1, 5, 9));
        // Width > 1, loose: 0/1 flags or the exact size, never above the posted size.
        assert!(SizeCheck::Loose.ok(3, 1, 5, 9));
        assert!(SizeCheck::Loose.ok(3, 0, 0, 9));
        assert!(SizeCheck::Loose.ok(3, 5, 5, 9));
        assert!(!SizeCheck::Loose.ok(3, 9, 5, 9));
        assert!(!SizeCheck::Loose.ok(3, 10, 10, 9));
        // Exact.
        assert!(!SizeCheck::Exact.ok(3, 1, 5, 9));
        assert!(SizeCheck::Exact.ok(3, 5, 5, 9));
    }

    #[test]
    fn offsets_fit_the_slot() {
        let c = LaneCfg {
            seed: 1,
            id: LaneId { thread: 0, lane: 0 },
            max_total: 1 << 20,
            max_width: 8,
            window: 2,
            sizes: SizeCheck::Loose,
            timeout: Duration::from_secs(1),
        };
        for k in 0..2000 {
            let q = plan::request(c.seed, c.id, k, c.max_total, c.max_width);
            let o = offsets(&q);
            let end = o[q.n - 1] + q.posted[q.n - 1] + GUARD;
            assert!(
                end <= c.slot_bytes(),
                "request {k}: {end} > {}",
                c.slot_bytes()
            );
            for j in 1..q.n {
                assert!(o[j] >= o[j - 1] + q.posted[j - 1] + GUARD);
            }
        }
    }
}
