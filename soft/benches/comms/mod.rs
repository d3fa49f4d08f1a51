//! Third section of the bench: the core's comms (`SendComm` / `RecvComm`) over the soft
//! provider, between the two processes of the run.
//!
//! After the provider section the peer process keeps its provider and its registered buffer and
//! switches to this protocol, over the same stdin/stdout line channel:
//!
//! ```text
//!   parent (this process)                          peer (IBNET_SOFT_BENCH_CHILD=1)
//!   SendComm A  --- QPINFO a ------------------->  RecvComm A' = new(a)
//!               <-- QPINFO a' -------------------  SendComm B
//!               <-- QPINFO b --------------------
//!   A.connect(a'); RecvComm B' = new(b)
//!               --- QPINFO b' ------------------>  B.connect(b')
//!   latency:    --- LAT n ---------------------->  posts 1 irecv on A'
//!               <-- READY -----------------------
//!   n times:    isend 8 B on A   ==============>   A' done: next irecv on A', isend 8 B on B
//!               B' done <=========================
//!   bandwidth:  --- BW size iters window ------->  keeps `window` irecvs posted on A'
//!               <-- READY -----------------------
//!               `iters` isends of `size` on A  ==>
//!               <-- DONE ------------------------
//!               --- END ------------------------>  exits
//! ```
//!
//! Latency is one-way = round trip / 2 of an 8-byte ping-pong over the two comm pairs (A one
//! way, B back); each side has its next receive posted before the peer can send, as NCCL does,
//! so the time includes the FIFO post's trip but never waits on it in the steady state.
//!
//! Bandwidth is timed at the sender from `READY` (the receiver's window is posted) to the
//! completion of the last isend; a soft-provider write completes once its bytes are in the
//! peer's memory. Messages rotate over distinct slots of each side's 256 MiB buffer.
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm};
use ibnet_core::provider::{MrKeys, Provider};
use ibnet_core::request::ReqId;
use ibnet_core::wire::QpInfo;
use ibnet_soft::SoftProvider;

use super::{slots, unit, End};

type S = SendComm<SoftProvider>;
type R = RecvComm<SoftProvider>;

/// A bench that stops making progress fails instead of hanging.
const DEADLINE: Duration = Duration::from_secs(60);
const TAG: u32 = 1;
/// Empty polls before [`spin`] starts yielding the CPU.
pub const BUSY: u32 = 64;

fn info_line(i: &QpInfo) -> String {
    let mut b = [0u8; ibnet_core::wire::QP_INFO_MAX_LEN];
    let n = i.encode(&mut b).unwrap();
    let hex: String = b[..n].iter().map(|x| format!("{x:02x}")).collect();
    format!("QPINFO {hex}")
}

fn read_line(r: &mut impl BufRead) -> String {
    let mut l = String::new();
    assert!(r.read_line(&mut l).unwrap() > 0, "peer closed");
    l.trim().to_owned()
}

fn read_info(r: &mut impl BufRead) -> QpInfo {
    loop {
        let l = read_line(r);
        if let Some(i) = l.find("QPINFO ") {
            let hex = &l[i + 7..];
            let b: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            return QpInfo::decode(&b).unwrap();
        }
    }
}

fn expect(r: &mut impl BufRead, what: &str) {
    while !read_line(r).contains(what) {}
}

fn say(w: &mut impl Write, s: &str) {
    writeln!(w, "{s}").unwrap();
    w.flush().unwrap();
}

/// Polls `f` until it yields (panics after [`DEADLINE`]): busy for [`BUSY`] polls, then with a
/// `sched_yield` between polls, so that on a host with few cores the provider's copy worker gets
/// the CPU that a pure busy-poll of both processes would take from it. The clock is read only
/// once it starts yielding: a call that succeeds at once (most isends and tests of a stream)
/// costs what the raw loop's iteration costs, no `clock_gettime` (~20-40 ns each, 2-3 per
/// message at 4 KiB).
fn spin<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let mut polls = 0u32;
    let mut since = None;
    loop {
        if let Some(v) = f() {
            return v;
        }
        polls += 1;
        if polls < BUSY {
            std::hint::spin_loop();
        } else {
            let t = *since.get_or_insert_with(Instant::now);
            assert!(t.elapsed() < DEADLINE, "{what} made no progress");
            std::thread::yield_now();
        }
    }
}

fn done(what: &str, mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> Done {
    spin(what, || f().unwrap())
}

fn isend(s: &mut S, addr: u64, size: usize, mr: MrKeys) -> ReqId {
    spin("isend", || s.isend(addr, size as u64, TAG, mr).unwrap())
}

fn irecv(r: &mut R, addr: u64, size: usize, mr: MrKeys) -> ReqId {
    let b = RecvBuf {
        addr,
        size: size as u64,
        tag: TAG,
        mr,
    };
    r.irecv(&[b]).unwrap().expect("irecv always accepts")
}

fn keys(e: &End) -> MrKeys {
    e.p.mr_keys(&e._mr)
}

/// Slot `i` (mod the rotation for `size`) of `e`'s buffer.
fn slot(e: &End, size: usize, i: usize) -> u64 {
    e.buf.addr() + ((i % slots(size)) * size) as u64
}

/// The peer's side, entered after the provider section's QUIT.
pub fn peer(e: &End, inp: &mut impl BufRead, out: &mut impl Write) {
    let p = e.p.clone();
    let cfg = CommConfig::default();
    let mk = keys(e);
    let mut r = R::new(p.clone(), cfg, &read_info(inp)).unwrap();
    say(out, &info_line(&r.local_info()));
    let mut s = S::new(p, cfg).unwrap();
    say(out, &info_line(&s.local_info()));
    s.connect(&read_info(inp)).unwrap();
    loop {
        let l = read_line(inp);
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.first().copied() {
            Some("LAT") => {
                let n: usize = f[1].parse().unwrap();
                let size: usize = f[2].parse().unwrap();
                let mut rid = irecv(&mut r, slot(e, size, 0), size, mk);
                say(out, "READY");
                for i in 0..n {
                    done("recv", || r.test(rid));
                    if i + 1 < n {
                        rid = irecv(&mut r, slot(e, size, 0), size, mk);
                    }
                    let sid = isend(&mut s, slot(e, size, 1), size, mk);
                    done("send", || s.test(sid));
                }
            }
            Some("BW") => {
                let size: usize = f[1].parse().unwrap();
                let iters: usize = f[2].parse().unwrap();
                let window: usize = f[3].parse().unwrap();
                let mut q = VecDeque::with_capacity(window);
                let mut posted = 0;
                while posted < iters.min(window) {
                    q.push_back(irecv(&mut r, slot(e, size, posted), size, mk));
                    posted += 1;
                }
                say(out, "READY");
                while let Some(id) = q.pop_front() {
                    let d = done("recv", || r.test(id));
                    assert_eq!(d.sizes[0], size as u64);
                    if posted < iters {
                        q.push_back(irecv(&mut r, slot(e, size, posted), size, mk));
                        posted += 1;
                    }
                }
                say(out, "DONE");
            }
            Some("END") => break,
            _ => panic!("unknown command {l:?}"),
        }
    }
    s.close().unwrap();
    r.close().unwrap();
}

/// The comm pair in this process, connected to [`peer`].
pub struct Comms<'a, I, O> {
    e: &'a End,
    s: S,
    r: R,
    mk: MrKeys,
    inp: I,
    out: O,
}

impl<'a, I: BufRead, O: Write> Comms<'a, I, O> {
    /// Connects both pairs over the control channel (`inp` reads the peer, `out` writes to it).
    pub fn connect(e: &'a End, mut inp: I, mut out: O) -> Self {
        let p = e.p.clone();
        let cfg = CommConfig::default();
        let mut s = S::new(p.clone(), cfg).unwrap();
        say(&mut out, &info_line(&s.local_info()));
        s.connect(&read_info(&mut inp)).unwrap();
        let r = R::new(p, cfg, &read_info(&mut inp)).unwrap();
        say(&mut out, &info_line(&r.local_info()));
        Self {
            e,
            s,
            r,
            mk: keys(e),
            inp,
            out,
        }
    }

    /// Ping-pong of `size` bytes, `iters` round trips after `iters / 10` of warm-up; one-way
    /// µs.
    pub fn latency(&mut self, size: usize, iters: usize) -> f64 {
        let warm = iters / 10;
        let n = warm + iters;
        say(&mut self.out, &format!("LAT {n} {size}"));
        let (e, mk) = (self.e, self.mk);
        let mut rid = irecv(&mut self.r, slot(e, size, 0), size, mk);
        expect(&mut self.inp, "READY");
        let mut t = Instant::now();
        for i in 0..n {
            if i == warm {
                t = Instant::now();
            }
            let sid = isend(&mut self.s, slot(e, size, 1), size, mk);
            let r = &mut self.r;
            done("recv", || r.test(rid));
            if i + 1 < n {
                rid = irecv(r, slot(e, size, 0), size, mk);
            }
            let s = &mut self.s;
            done("send", || s.test(sid));
        }
        t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0
    }

    /// `iters` messages of `size`, `window` in flight; GB/s.
    pub fn bandwidth(&mut self, size: usize, iters: usize, window: usize) -> f64 {
        say(&mut self.out, &format!("BW {size} {iters} {window}"));
        let (e, mk) = (self.e, self.mk);
        let mut q = VecDeque::with_capacity(window);
        expect(&mut self.inp, "READY");
        let t = Instant::now();
        for i in 0..iters {
            if q.len() == window {
                let id = q.pop_front().unwrap();
                let s = &mut self.s;
                done("send", || s.test(id));
            }
            q.push_back(isend(&mut self.s, slot(e, size, i), size, mk));
        }
        while let Some(id) = q.pop_front() {
            let s = &mut self.s;
            done("send", || s.test(id));
        }
        let gbs = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        expect(&mut self.inp, "DONE");
        gbs
    }

    /// Tells the peer to exit and closes both comms.
    pub fn end(mut self) {
        say(&mut self.out, "END");
        self.s.close().unwrap();
        self.r.close().unwrap();
    }
}

/// Runs the section and prints it; `raw_us` / `raw` are this run's `process_vm_writev` figures
/// (one 8-byte call; GB/s per size).
pub fn print<I: BufRead, O: Write>(
    mut c: Comms<'_, I, O>,
    quick: bool,
    raw_us: f64,
    raw: &[(usize, f64)],
) {
    let lat_iters = if quick { 5_000 } else { 50_000 };
    let us = c.latency(8, lat_iters);
    println!("\nibnet comms (SendComm -> RecvComm, two processes, CommConfig::default())");
    println!(
        "  8 B one-way (RTT/2, reply on a second comm pair)  {us:8.2} us   ratio {:.2} vs one raw call (goal <= 2.0)",
        us / raw_us
    );
    println!("                        raw CMA   comm w<=16  ratio   (goal >= 0.9 at >= 1 MiB)");
    let budget = if quick { 64usize << 20 } else { 1usize << 30 };
    for &(size, raw) in raw {
        let iters = (budget / size).clamp(8, 50_000);
        let window = slots(size);
        let gbs = c.bandwidth(size, iters, window);
        let unit = unit(size);
        println!(
            "  {unit:>8} (w={window:>2})     {raw:8.2}   {gbs:9.2}   {:5.2}",
            gbs / raw
        );
    }
    c.end();
}
