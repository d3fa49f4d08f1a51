//! Rail failover under NCCL-like traffic, through the plugin API: many fused comm pairs over
//! soft0 + soft1 at once, in both directions (two threads, each the sender of half the pairs
//! and the receiver of the other half), several operations in flight per comm (single and
//! multi-receives, buffers reused as NCCL reuses its steps), and rail 1 failing at a random
//! work request of each comm (`IBNET_SOFT_FAULTS=seed=…,wr_fail=…:RetryExceeded` on soft1
//! only: a data write, a write-with-immediate, a clear-to-send or a notice, at either end).
//!
//! Expected: every message arrives whole (exact size, every byte), nothing hangs (each round
//! is bounded: a stuck operation fails the test with what each side waits for), and each comm
//! that lost rail 1 logs one WARN naming it. Rounds of fresh comms give new failure points.
//! `IBNET_FUSED_STRESS_ROUNDS` (default 1) and `IBNET_FUSED_STRESS_SEED` (default 7) make a
//! longer or different run; `IBNET_FUSED_STRESS_OPS` the operations per pair (default 160),
//! `IBNET_FUSED_STRESS_WR_FAIL` the odds of a WR failing (1 in 200 by default).

use crate::util;

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api::{self, Sizes};
use util::*;

/// Pairs per direction.
const PAIRS: usize = 6;
/// Operations in flight per comm (NCCL's steps in flight).
const DEPTH: usize = 4;
/// Receives of one operation at most (a multi-receive).
const WIDE: usize = 4;
/// Largest send.
const MAX_LEN: usize = 48 * 1024;
/// No end of a thread moving for this long is a hang (a round takes a few seconds).
const STALL: Duration = Duration::from_secs(20);

fn env_num(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// The shape of operation `j` of pair `p`: how many receives, and each send's size.
fn shape(p: usize, j: usize) -> (usize, [usize; WIDE]) {
    let mut x = Rng(((p as u64) << 32 | j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    x.next();
    let n = if x.next().is_multiple_of(4) {
        2 + (x.next() % (WIDE as u64 - 1)) as usize
    } else {
        1
    };
    let sizes = core::array::from_fn(|_| match x.next() % 4 {
        0 => (x.next() % 256) as usize,
        1 => (x.next() % 4096) as usize,
        _ => (x.next() % MAX_LEN as u64) as usize + 1,
    });
    (n, sizes)
}

/// The byte at `k` of send `i` of operation `j` of pair `p`.
fn byte(p: usize, j: usize, i: usize, k: usize) -> u8 {
    let v = (k as u32).wrapping_mul(2_654_435_761) ^ ((p * 7919 + j * 31 + i) as u32);
    (v ^ v >> 13) as u8
}

/// Whether `req` is done (`sizes`: a receive's sizes out, or NULL); an error fails the test.
fn poll(req: *mut c_void, sizes: *mut c_int, what: &str) -> bool {
    let mut x = 0;
    let rc = api::test(req, &mut x, sizes);
    assert_eq!(rc, ncclResult_t::Success, "{what}: {:?}", take_log());
    x != 0
}

/// One end of one pair, driven by one thread.
struct End {
    pair: usize,
    send: bool,
    comm: *mut c_void,
    /// `DEPTH × WIDE` buffers of `MAX_LEN` bytes, one registration.
    buf: Vec<u8>,
    mh: *mut c_void,
    /// Operations started / finished (an operation `j` uses slot `j % DEPTH`).
    started: usize,
    finished: usize,
    /// Per slot: the requests of its operation (a receive: one request in `reqs[0]`).
    reqs: [[*mut c_void; WIDE]; DEPTH],
    done: [[bool; WIDE]; DEPTH],
    got: [[c_int; WIDE]; DEPTH],
}

// SAFETY (test): an `End` is used by one thread at a time (moved to it whole).
unsafe impl Send for End {}

impl End {
    fn new(pair: usize, send: bool, comm: *mut c_void) -> Self {
        let mut buf = vec![0u8; DEPTH * WIDE * MAX_LEN];
        let mh = reg(comm, &mut buf);
        Self {
            pair,
            send,
            comm,
            buf,
            mh,
            started: 0,
            finished: 0,
            reqs: [[core::ptr::null_mut(); WIDE]; DEPTH],
            done: [[false; WIDE]; DEPTH],
            got: [[0; WIDE]; DEPTH],
        }
    }

    fn at(&mut self, slot: usize, i: usize) -> *mut u8 {
        self.buf[(slot * WIDE + i) * MAX_LEN..].as_mut_ptr()
    }

    fn tag(i: usize) -> c_int {
        10 + i as c_int
    }

    /// One step: start what may start, post what may post, test what is in flight. Whether
    /// anything moved.
    fn step(&mut self, ops: usize) -> bool {
        let mut moved = false;
        if self.started < ops && self.started < self.finished + DEPTH {
            moved |= self.start();
        }
        for j in self.finished..self.started {
            moved |= self.progress(j);
        }
        while self.finished < self.started && self.all_done(self.finished) {
            self.finish(self.finished);
            self.finished += 1;
            moved = true;
        }
        moved
    }

    fn all_done(&self, j: usize) -> bool {
        let (n, _) = shape(self.pair, j);
        let s = j % DEPTH;
        if self.send {
            self.done[s][..n].iter().all(|d| *d)
        } else {
            self.done[s][0]
        }
    }

    /// Starts operation `started`: a receive posts its irecv; a send fills its buffers (its
    /// isends are posted by `progress`, in order, as the receiver's clear-to-sends arrive).
    fn start(&mut self) -> bool {
        let j = self.started;
        let (n, sizes) = shape(self.pair, j);
        let s = j % DEPTH;
        self.reqs[s] = [core::ptr::null_mut(); WIDE];
        self.done[s] = [false; WIDE];
        self.got[s] = [0; WIDE];
        if self.send {
            for (i, &len) in sizes.iter().enumerate().take(n) {
                let p = self.pair;
                // SAFETY (test): inside `buf` (slot, i) and `len ≤ MAX_LEN`.
                let b = unsafe { std::slice::from_raw_parts_mut(self.at(s, i), len) };
                for (k, x) in b.iter_mut().enumerate() {
                    *x = byte(p, j, i, k);
                }
            }
        } else {
            // Poison the buffers, so stale or missing bytes show.
            for i in 0..n {
                // SAFETY (test): inside `buf`.
                unsafe { std::slice::from_raw_parts_mut(self.at(s, i), MAX_LEN) }.fill(0xee);
            }
            let mut data: Vec<*mut c_void> = (0..n).map(|i| self.at(s, i).cast()).collect();
            let lens = [MAX_LEN; WIDE];
            let tags: Vec<c_int> = (0..n).map(Self::tag).collect();
            let mut mhs = vec![self.mh; n];
            let rc = api::irecv(
                self.comm,
                n as c_int,
                data.as_mut_ptr(),
                Sizes::Size(lens.as_ptr()),
                tags.as_ptr(),
                mhs.as_mut_ptr(),
                core::ptr::null_mut(),
                &mut self.reqs[s][0],
            );
            assert_eq!(
                rc,
                ncclResult_t::Success,
                "pair {} irecv {j}: {:?}",
                self.pair,
                take_log()
            );
            assert!(!self.reqs[s][0].is_null(), "irecv gave no request");
        }
        self.started += 1;
        true
    }

    fn progress(&mut self, j: usize) -> bool {
        let (n, sizes) = shape(self.pair, j);
        let s = j % DEPTH;
        let mut moved = false;
        if !self.send {
            if !self.done[s][0] {
                let what = format!("pair {} recv {j}", self.pair);
                self.done[s][0] = poll(self.reqs[s][0], self.got[s].as_mut_ptr(), &what);
                moved |= self.done[s][0];
            }
            return moved;
        }
        for (i, &len) in sizes.iter().enumerate().take(n) {
            if self.reqs[s][i].is_null() {
                // The sends of an operation go in order, and only once the earlier
                // operations' sends are all posted (NCCL posts a step's sends in order).
                if i > 0 && self.reqs[s][i - 1].is_null() {
                    break;
                }
                if i == 0 && j > self.finished {
                    let (m, _) = shape(self.pair, j - 1);
                    if self.reqs[(j - 1) % DEPTH][..m].iter().any(|r| r.is_null()) {
                        break;
                    }
                }
                let p = self.at(s, i).cast();
                let rc = api::isend(
                    self.comm,
                    p,
                    len as u64,
                    Self::tag(i),
                    self.mh,
                    core::ptr::null_mut(),
                    &mut self.reqs[s][i],
                );
                assert_eq!(
                    rc,
                    ncclResult_t::Success,
                    "pair {} isend {j}.{i}: {:?}",
                    self.pair,
                    take_log()
                );
                if self.reqs[s][i].is_null() {
                    break;
                }
                moved = true;
            }
            if !self.done[s][i] {
                let what = format!("pair {} send {j}.{i}", self.pair);
                self.done[s][i] = poll(self.reqs[s][i], core::ptr::null_mut(), &what);
                moved |= self.done[s][i];
            }
        }
        moved
    }

    /// A receive's operation is done: exact sizes and every byte.
    fn finish(&mut self, j: usize) {
        if self.send {
            return;
        }
        let (n, sizes) = shape(self.pair, j);
        let s = j % DEPTH;
        for (i, &len) in sizes.iter().enumerate().take(n) {
            assert_eq!(
                self.got[s][i], len as c_int,
                "pair {} op {j} receive {i}/{n}: size",
                self.pair
            );
            let p = self.pair;
            // SAFETY (test): inside `buf`.
            let b = unsafe { std::slice::from_raw_parts(self.at(s, i), MAX_LEN) };
            if let Some(k) = (0..len).find(|&k| b[k] != byte(p, j, i, k)) {
                panic!("pair {p} op {j} receive {i}/{n} ({len} B): byte {k} differs");
            }
            if let Some(k) = (len..MAX_LEN).find(|&k| b[k] != 0xee) {
                panic!("pair {p} op {j} receive {i}/{n} ({len} B): byte {k} written past the end");
            }
        }
    }

    /// What this end waits for (for a hang report).
    fn waiting(&self) -> String {
        let side = if self.send { "send" } else { "recv" };
        let mut w = Vec::new();
        for j in self.finished..self.started {
            let s = j % DEPTH;
            let (n, _) = shape(self.pair, j);
            let posted = self.reqs[s].iter().take(n).filter(|r| !r.is_null()).count();
            w.push(format!(
                "op {j} (n={n}, posted {posted}, done {:?})",
                &self.done[s][..n]
            ));
        }
        let live = api::rail_stats(self.comm).map(|st| st.live[..2].to_vec());
        format!(
            "pair {} {side}: {}/{} finished, live {live:?}, waits: {}",
            self.pair,
            self.finished,
            self.started,
            w.join(", ")
        )
    }

    fn close(mut self) {
        assert_eq!(api::dereg_mr(self.comm, self.mh), ncclResult_t::Success);
        let rc = if self.send {
            api::close_send(self.comm)
        } else {
            api::close_recv(self.comm)
        };
        assert_eq!(rc, ncclResult_t::Success);
        self.buf.clear();
    }
}

/// Drives `ends` until each has finished `ops` operations. A thread that sees no end move
/// for `STALL` fails the round with what every one of its ends waits for, and tells the other
/// thread (`stop`), which reports its own ends too.
fn drive(ends: &mut [End], ops: usize, stop: &AtomicBool) {
    let mut last = Instant::now();
    loop {
        let mut all = true;
        for e in ends.iter_mut() {
            if e.finished < ops {
                all = false;
                if e.step(ops) {
                    last = Instant::now();
                }
            }
        }
        if all {
            return;
        }
        let stalled = last.elapsed() > STALL;
        if stalled || stop.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
            let w: Vec<String> = ends.iter().map(End::waiting).collect();
            let warns: Vec<String> = take_log()
                .into_iter()
                .filter(|(l, _)| *l == Level::Warn)
                .map(|(_, t)| t)
                .collect();
            panic!(
                "{}:\n{}\nWARNs:\n{}",
                if stalled {
                    format!("hang: no progress for {STALL:?}")
                } else {
                    "the other thread stopped".into()
                },
                w.join("\n"),
                warns.join("\n")
            );
        }
    }
}

/// A random WR of rail 1 fails in every comm, in the middle of its traffic.
#[test]
fn many_fused_pairs_in_both_directions_survive_a_rail_failing_anywhere() {
    if util::ran_in_child() {
        return;
    }
    let seed = env_num("IBNET_FUSED_STRESS_SEED", 7);
    let rounds = env_num("IBNET_FUSED_STRESS_ROUNDS", 1) as usize;
    let ops = env_num("IBNET_FUSED_STRESS_OPS", 160) as usize;
    // About 2.5 WRs on rail 1 per operation of a pair (data, clear-to-send, sizes): each
    // pair's rail 1 fails within its first ~100 operations, at a random WR of either end.
    let wr_fail = env_num("IBNET_FUSED_STRESS_WR_FAIL", 200);
    let spec = format!("seed={seed},wr_fail={wr_fail}:RetryExceeded");
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "2"),
        ("IBNET_SOFT_FAULTS", spec.as_str()),
        ("IBNET_SOFT_FAULTS_DEV", "1"),
    ];
    if !init_soft(&env) {
        return;
    }
    let d = util::fuse_first_two();
    let mut failed_comms = 0;
    for round in 0..rounds {
        // Pairs 0..PAIRS send from thread A to thread B, the others from B to A.
        let mut a = Vec::new();
        let mut b = Vec::new();
        let mut listeners = Vec::new();
        let mut send_addrs = Vec::new();
        for pair in 0..2 * PAIRS {
            let (mut h, l) = listen_on(d);
            let (s, r, _) = establish_on(d, &mut h, l, Duration::from_secs(30));
            send_addrs.push(addr(&h));
            listeners.push(l);
            let (se, re) = (End::new(pair, true, s), End::new(pair, false, r));
            if pair < PAIRS {
                a.push(se);
                b.push(re);
            } else {
                b.push(se);
                a.push(re);
            }
        }
        let _ = take_log();
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let st = stop.clone();
        let tb = std::thread::spawn(move || {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drive(&mut b, ops, &st)));
            if r.is_err() {
                st.store(true, Ordering::Relaxed);
            }
            (b, r)
        });
        let ra =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drive(&mut a, ops, &stop)));
        if ra.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let (b, rb) = tb.join().expect("thread B");
        let text = |r: &std::thread::Result<()>| match r {
            Ok(()) => String::new(),
            Err(e) => e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        };
        assert!(
            ra.is_ok() && rb.is_ok(),
            "round {round}:\nthread A: {}\nthread B: {}",
            text(&ra),
            text(&rb)
        );
        // One WARN per comm that lost rail 1, naming it.
        let mut lost = 0;
        for e in a.iter().chain(&b) {
            let st = api::rail_stats(e.comm).unwrap();
            assert!(st.live[0], "pair {}: rail 0 stays", e.pair);
            lost += usize::from(!st.live[1]);
        }
        let log = take_log();
        let warns: Vec<&String> = log
            .iter()
            .filter(|(l, _)| *l == Level::Warn)
            .map(|(_, t)| t)
            .collect();
        assert!(
            warns
                .iter()
                .all(|t| t.contains("rail 1 (soft1)") && t.contains("moved to rail 0 (soft0)")),
            "round {round}: every WARN names rail 1 and where its traffic went: {warns:#?}"
        );
        assert_eq!(
            warns.len(),
            lost,
            "round {round}: one WARN per comm that lost rail 1: {warns:#?}"
        );
        for (pair, ad) in send_addrs.iter().enumerate() {
            let n = warns
                .iter()
                .filter(|t| t.contains(&format!("send comm to {ad}:")))
                .count();
            assert!(n <= 1, "pair {pair}: {n} WARNs of its send comm");
        }
        println!(
            "round {round}: {} ops x {} pairs in {:?}; {lost} of {} comms lost rail 1",
            ops,
            2 * PAIRS,
            t0.elapsed(),
            4 * PAIRS
        );
        failed_comms += lost;
        for e in a.into_iter().chain(b) {
            e.close();
        }
        for l in listeners {
            assert_eq!(api::close_listen(l), ncclResult_t::Success);
        }
    }
    assert!(
        failed_comms >= rounds * PAIRS,
        "the fault hit too few comms ({failed_comms}): this test misses its case"
    );
}
