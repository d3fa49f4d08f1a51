//! Loom model of the send-queue protocol of `qp.rs`: a one-entry send queue whose WR is copied
//! by the poster and a copy-engine token while the poster kicks the combiner and a poller looks
//! at the cursor; and a stale token meeting the slot's next WR. The slot with its chunk claims,
//! the combiner and the first-failure mark are the crate's own (`ibnet_soft::sq`, built on
//! loom's atomics under `--cfg loom`); `advance` and `run_chunks` below are
//! `QpShared::advance` / `QpShared::run_chunks` step for step around those calls, with the bytes
//! of the copy as loom cells (so a missing happens-before is reported as a race).
//!
//! `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" cargo test -p ibnet-soft --release
//! --target-dir target/loom --test loom_qp`
#![cfg(loom)]

use ibnet_core::provider::{SendWr, Sge, WcStatus, WrOpcode};
use ibnet_soft::sq::{Combiner, ErrSeq, SqEntry};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

const CHUNK: u64 = 4096;
const CHUNKS: usize = 2;

/// A QP with a one-entry send queue; the target's bytes are `data`.
struct Qp {
    e: SqEntry,
    /// `QpShared::sq_tail`.
    tail: AtomicU64,
    /// `QpShared::sq_cursor`.
    cursor: AtomicU64,
    kicks: Combiner,
    err_seq: ErrSeq,
    /// One cell per chunk of the WR: what the copy writes.
    data: [UnsafeCell<u8>; CHUNKS],
    /// Combiner-only state: passes of `advance` (checks mutual exclusion).
    passes: UnsafeCell<u32>,
    /// The chunk whose copy fails, if any.
    fail_chunk: Option<usize>,
}

impl Qp {
    fn new(fail_chunk: Option<usize>) -> Self {
        Self {
            e: SqEntry::new(),
            tail: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            kicks: Combiner::new(),
            err_seq: ErrSeq::new(),
            data: [UnsafeCell::new(0), UnsafeCell::new(0)],
            passes: UnsafeCell::new(0),
            fail_chunk,
        }
    }

    /// Mirror of `QpShared::advance` (without peers and immediates).
    fn advance(&self) {
        // SAFETY: only the thread that holds the combiner runs `advance`, so access is exclusive.
        self.passes.with_mut(|p| unsafe { *p += 1 });
        let mut c = self.cursor.load(Ordering::Relaxed); // only the combiner writes it
        let t = self.tail.load(Ordering::Acquire); // pairs with the poster's Release
        while c < t {
            if !self.e.landed() {
                break;
            }
            let own = self.e.status();
            let st = if c > self.err_seq.first() {
                WcStatus::WrFlushError as u32
            } else {
                own
            };
            if st != 0 {
                self.e.set_status(st);
            }
            c += 1;
            self.cursor.store(c, Ordering::Release); // pairs with the poller's Acquire
        }
    }

    fn kick(&self) {
        self.kicks.kick(|| self.advance());
    }

    /// `QpShared::run_chunks` for WR `seq`: `true` when this call finished the last chunk.
    fn run_chunks(&self, seq: u64) -> bool {
        let mut last = false;
        while let Some(c) = self.e.claim(seq) {
            if self.e.status() == 0 && !self.err_seq.skips(seq) {
                let w = self.e.load();
                assert_eq!(w.wr_id, 7 + seq, "a claim of WR {seq} saw another WR");
                let i = (c.off / CHUNK) as usize;
                if self.fail_chunk == Some(i) {
                    self.e.set_err(WcStatus::RemoteAccessError, 14);
                    self.err_seq.note(seq);
                } else {
                    // SAFETY: chunk `i` is written only by its claimer, before its Release.
                    self.data[i].with_mut(|p| unsafe { *p = 1 });
                }
            }
            last = self.e.chunk_done();
        }
        last
    }

    /// `QpShared::run_token`: a copy worker's share.
    fn run_token(&self, seq: u64) {
        if self.run_chunks(seq) {
            self.kick();
        }
    }

    /// `QpShared::poll_into`'s kick: drives the combiner when WRs are published but not
    /// retired (a `post_send` of unsignaled plain WRITEs does not kick).
    fn poll_kick(&self) {
        // Acquire (both): as in `poll_into`.
        if self.cursor.load(Ordering::Acquire) < self.tail.load(Ordering::Acquire) {
            self.kick();
        }
    }

    /// The poller: once the WR is retired, its status and bytes must be final.
    fn poll(&self) -> Option<u32> {
        // Acquire: pairs with the combiner's Release store of `cursor` in `advance`.
        if self.cursor.load(Ordering::Acquire) < 1 {
            return None;
        }
        let st = self.e.status();
        for (i, d) in self.data.iter().enumerate() {
            // SAFETY: read after the Acquire that pairs with each chunk's Release (the model
            // checks exactly that).
            let v = d.with(|p| unsafe { *p });
            if self.fail_chunk != Some(i) && st == 0 {
                assert_eq!(v, 1, "chunk {i} not landed at retirement");
            }
        }
        Some(st)
    }
}

fn wr(seq: u64) -> SendWr {
    SendWr {
        wr_id: 7 + seq,
        opcode: WrOpcode::Write,
        sge: Sge {
            addr: 0x1000,
            len: (CHUNK as usize * CHUNKS) as u32,
            lkey: 1,
        },
        remote_addr: 0x2000,
        rkey: 2,
        imm: 0,
        signaled: true,
        inline: false,
    }
}

/// Poster (`QpShared::execute`): one WR of two chunks, one token to a worker, the poster
/// copying too, publish, kick; a concurrent poller. Afterwards the WR is retired (no lost kick)
/// with `want` as its status.
fn run(fail_chunk: Option<usize>, want: u32) {
    loom::model(move || {
        let qp = Arc::new(Qp::new(fail_chunk));
        qp.e.store(&wr(0));
        assert_eq!(qp.e.arm(0, CHUNK, true), CHUNKS as u32);
        // Spawning stands for the copy-engine channel send (a happens-before edge, as in
        // `Engine::submit`).
        let q = qp.clone();
        let worker = thread::spawn(move || q.run_token(0));
        let q = qp.clone();
        let poller = thread::spawn(move || {
            if let Some(st) = q.poll() {
                assert_eq!(st, want);
            }
        });
        // The poster copies while the worker wakes.
        qp.run_chunks(0);
        // Release: pairs with the Acquire load of `tail` in `advance` (and `poll_kick`).
        qp.tail.store(1, Ordering::Release); // `post`: publishes the entry
        qp.kick();
        worker.join().unwrap();
        poller.join().unwrap();
        // Acquire: pairs with `advance`'s Release store of `cursor` (the joins above already
        // order every combiner pass before this load).
        assert_eq!(qp.cursor.load(Ordering::Acquire), 1, "WR never retired");
        assert_eq!(qp.poll(), Some(want));
    });
}

#[test]
fn two_tokens_land_before_retirement() {
    run(None, 0);
}

#[test]
fn failed_chunk_sets_the_status_seen_at_retirement() {
    run(Some(1), WcStatus::RemoteAccessError as u32);
}

/// A `post_send` of unsignaled plain WRITEs only does not kick (`qp.rs`, "Send queue"): the
/// WR (copied by the poster and a worker token) is published without a kick while a poller
/// polls. Whatever the interleaving, the poster's next poll (which kicks before it looks)
/// retires it, with its bytes landed, and no combiner pass retires it early.
#[test]
fn unkicked_post_retires_at_the_next_poll() {
    loom::model(|| {
        let qp = Arc::new(Qp::new(None));
        qp.e.store(&wr(0));
        qp.e.arm(0, CHUNK, true);
        let q = qp.clone();
        let worker = thread::spawn(move || q.run_token(0));
        let q = qp.clone();
        let poller = thread::spawn(move || {
            q.poll_kick();
            if let Some(st) = q.poll() {
                assert_eq!(st, 0);
            }
        });
        qp.run_chunks(0);
        // Release: pairs with the Acquire load of `tail` in `poll_kick` and `advance`.
        qp.tail.store(1, Ordering::Release); // `post`: publishes the entry, no kick
        worker.join().unwrap();
        poller.join().unwrap();
        qp.poll_kick(); // the poster's next poll_cq
        assert_eq!(qp.poll(), Some(0), "WR never retired");
    });
}

/// A token of WR 0 that runs late: the poster copied WR 0 alone, it was retired and polled, and
/// the slot now holds WR 1, copied by the poster again. The stale token must claim nothing of
/// WR 1 (it would copy it under WR 0's sequence number) and never make WR 1 land early.
#[test]
fn stale_token_claims_nothing_of_the_next_wr() {
    loom::model(|| {
        let qp = Arc::new(Qp::new(None));
        qp.e.store(&wr(0));
        qp.e.arm(0, CHUNK, true);
        let q = qp.clone();
        let stale = thread::spawn(move || q.run_token(0));
        qp.run_chunks(0);
        // Release: `post` publishes the entry; pairs with the Acquire load of `tail` in
        // `advance`.
        qp.tail.store(1, Ordering::Release);
        qp.kick();
        // WR 0 retires once the worker (if it claimed a chunk) is done and kicks.
        while qp.poll().is_none() {
            thread::yield_now();
        }
        // The poller gave the slot back (sq_head); the poster reuses it for WR 1.
        qp.e.store(&wr(1));
        qp.e.arm(1, CHUNK, true);
        let first = qp.e.claim(1).expect("WR 1 has chunks");
        assert!(!qp.e.landed(), "WR 1 landed with a chunk still claimed");
        assert!(!qp.e.chunk_done());
        assert!(qp.run_chunks(1), "the poster finishes WR 1");
        let _ = first;
        stale.join().unwrap();
        assert!(qp.e.landed());
    });
}

/// The combiner alone: three kickers, each with work published before its kick; the pass that
/// runs after the last kick sees all of it, and passes never overlap.
#[test]
fn combiner_never_loses_a_kick() {
    loom::model(|| {
        let c = Arc::new(Combiner::new());
        let work = Arc::new(AtomicU32::new(0));
        let seen = Arc::new(UnsafeCell::new(0u32));
        let kick = |c: &Combiner, work: &AtomicU32, seen: &UnsafeCell<u32>| {
            work.fetch_add(1, Ordering::Relaxed); // published by the kick's AcqRel
            c.kick(|| {
                let w = work.load(Ordering::Relaxed);
                // SAFETY: the combiner runs one closure at a time, so access is exclusive.
                seen.with_mut(|p| unsafe { *p = (*p).max(w) });
            });
        };
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let (c, work, seen) = (c.clone(), work.clone(), seen.clone());
                thread::spawn(move || kick(&c, &work, &seen))
            })
            .collect();
        kick(&c, &work, &seen);
        for t in ts {
            t.join().unwrap();
        }
        // SAFETY: every thread has been joined; nothing else touches `seen`.
        assert_eq!(seen.with(|p| unsafe { *p }), 3, "a kick was lost");
    });
}
