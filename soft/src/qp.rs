//! One RC queue pair: its send queue, the execution of WRs, in-order delivery of immediates,
//! and the receive queue.
//!
//! ## Send queue
//! ```text
//!            sq_head (poller)    sq_cursor (combiner)       sq_tail (poster)
//!  ... done ─────┤ retired, not yet ├─ landed / executing ─────┤ free ...
//!                   polled
//! ```
//! * `post_send` (exclusive via `&mut Qp`) writes each WR into `sq[tail % cap]` and executes its
//!   data movement at once: a WR of at most `direct_max` bytes in the posting thread (one
//!   `process_vm_writev`, or an atomic word copy in-process); a larger one is cut into chunks
//!   (size-adaptive, `split`: whole rounds of `workers + 1` equal pieces, between `min_piece`
//!   and `chunk`) that the posting thread and up to `workers` copy workers (one *token* each)
//!   claim until none is left (on an idle QP, one copier per `direct_max` bytes: the poster
//!   and `idle_helpers` workers, the same ones every time, see `engine.rs`'s mailboxes;
//!   more copiers of one message into one target contend): the poster copies chunks itself
//!   and hands a worker a token only while at least two chunks are unclaimed (one for
//!   itself, one for the worker; at most one token per worker), so that a worker is woken only when it will find work, and the
//!   poster never waits for one (see `sq.rs`). While an earlier WR of the QP has not landed (a
//!   stream of large WRs), the poster hands every chunk to the workers and returns at once
//!   instead, to post the next WR. Data movement is eager: it never waits for earlier WRs (the
//!   RC contract only orders immediates).
//!   Medium WRs of a stream go to the workers too ("Streams" below).
//! * The **combiner** ([`QpShared::kick`]) advances `sq_cursor` in WR order over entries whose
//!   chunks are all done. For a `WriteWithImm` at the cursor it delivers the immediate into the
//!   target's inbound ring — so an immediate is visible only after every earlier WR of the QP
//!   has landed. With no receive posted at the target (RNR) the cursor stays, and the delivery
//!   is retried by the next kick: every `post_send` and every `poll_cq` of this QP's CQ kicks
//!   (a NIC's RNR timer, driven by the initiator's progress calls; it never gives up while the
//!   target lives, like `rnr_retry = 7`). One exception: a `post_send` of unsignaled plain
//!   WRITEs only (a comm's clear-to-send posts) does not kick. Such a WR delivers nothing and
//!   nobody waits for its retirement but the poller (its failure, its SQ slot), and every
//!   `poll_cq` kicks before it harvests; its bytes moved at post (or a worker kicks when it
//!   finishes them). Its combiner pass then runs in the poster's next poll, mostly while it
//!   waits, instead of on the way to its next send.
//! * `poll_cq` retires entries in `[sq_head, sq_cursor)`, producing completions for signaled
//!   WRs and for every WR that failed.
//!
//! The combiner is a combining flag, `kicks`: whoever raises it from 0 runs `advance` until no
//! kick arrived meanwhile; others just count. It is never contended on the posting thread except
//! by a copy worker finishing that QP's last chunk.
//!
//! ## Inline payloads (small WRITE_WITH_IMM without a syscall)
//! A WRITE_WITH_IMM of 1..=`ring::INLINE_MAX` (32) bytes is not copied: at post the poster takes
//! the same leases a copy would (local key; remote key, range and remote-write access: an error
//! completes the WR and marks the target exactly as a failed copy does, "Errors" below), reads
//! the payload into the SQ entry (verbs' inline semantics: the buffer is free at once) and arms
//! the entry as landed. The combiner, at its turn in WR order, writes the payload with the
//! immediate into the target's ring entry (one cache line, published by the entry's Release
//! `seq` store); the target's poller, in ring order, re-checks rkey, range and access against
//! its own table under a lease (the ring is peer-writable: a failed re-check — the MR was
//! deregistered meanwhile, or a corrupt entry — moves the target QP to the error state and
//! flushes that receive and the rest) and copies the payload in before it reports the receive.
//!
//! Ordering (what the target can observe, at its completions): an inline payload is published
//! only when the combiner reaches its WR, i.e. after every earlier WR of the QP has landed
//! (`landed`), so it never overtakes an earlier CMA write; it is applied before its own receive
//! completes, and the poller applies entries strictly in ring order, so at the completion of
//! any later WRITE_WITH_IMM (inline or not: its immediate sits behind in the ring) the earlier
//! inline bytes are in place. What is *not* ordered, as for every other WR since copies are
//! eager: a later write whose bytes overlap an earlier WR that has not completed at the target
//! (here: an inline payload not yet polled) may land first and then be overwritten. Verbs
//! users never rewrite bytes of an outstanding receive (NCCL reuses a buffer only after its
//! completion), and the provider already copies chunks of large WRs out of order. Nor is the
//! payload in the target's memory when the *initiator's* completion arrives (unlike RC's ack
//! of a write): it lands at the target's poll, which a receiver does before it reads the bytes.
//!
//! ## Bounce payloads (medium WRITE_WITH_IMM without a syscall)
//! Between processes, a WRITE_WITH_IMM of `INLINE_MAX` + 1 ..= `bounce_max` bytes
//! ([`crate::Config::bounce_max`], at most `segment::BOUNCE_MAX`) goes the same way with the
//! bytes out of line: at post the poster takes the same leases, then writes the payload with
//! one bulk copy (`sys::bulk_copy`: `rep movsb` on x86-64) into the next of the target QP's
//! `BOUNCE_SLOTS` bounce slots (in the target's segment, mapped here; QPs of the first
//! `BOUNCE_QPS` slot indices have them), numbered `b`
//! in post order; the combiner publishes `b` with the immediate; the target's poller, in ring
//! order, re-checks rkey, range and access under a lease, copies the slot out into its memory,
//! and publishes `bounce_done = b + 1` (Release). The poster writes slot `b` only once
//! `bounce_done > b - BOUNCE_SLOTS` (Acquire; `ring::bounce_free`, loom-checked): a slot is
//! never rewritten before it was copied out. With no slot free (the target has not polled),
//! or an in-process peer (whose copies are word copies anyway), the WR is copied as any other.
//! Two memory copies of a few KiB on two cores cost less than a `process_vm_writev` (~0.5 µs of
//! fixed cost: page pinning), which is what small and medium messages pay; the ordering and
//! visibility rules are those of inline payloads.
//!
//! Only WRITE_WITH_IMM goes inline: its target polls for the receive anyway, which is where the
//! payload is applied. A plain small write has no such progress point at the target (it may
//! just watch memory), so it keeps its copy; the common one, a clear-to-send FIFO element, is
//! already syscall-free (word stores into the peer's FIFO area: `segment`).
//!
//! ## Streams (medium WRs copied in parallel)
//! A WR of `stream_min` ([`crate::Config::stream_min`]) ..= `direct_max` bytes posted while an
//! earlier WR of the QP is still outstanding (`sq_head < seq`: not yet polled; a hint read
//! Relaxed) to a peer in another process goes whole to a copy worker (one token per `chunk`
//! bytes), and the poster returns at once — even where it would have bounced the WR. A
//! sender with messages in flight (NCCL's pipelined steps, a bandwidth test) then gets up to
//! `workers` `process_vm_writev`s running at once, one message each, instead of one at a time
//! in the posting thread; a latency-bound exchange (the previous WR polled before the next is
//! posted) keeps the posting thread's copy, which has no thread hop. Nothing new is shared: it
//! is the large WRs' streaming mode, with the same claims and the same in-order combiner.
//!
//! ## Errors
//! The first failing WR completes with its own status (`LocalProtectionError`,
//! `RemoteAccessError`, …) and moves the QP to the error state (`fail`); WRs behind it are not
//! executed (`err_seq`: their copies are skipped) and complete with `WrFlushError`, WRs before
//! it complete normally. When the peer process dies (or its QP is destroyed) every
//! outstanding WR, sends and receives, completes with `RetryExceeded`. WRs posted in the error
//! state complete with `WrFlushError`. Copy workers skip the chunks of a failed QP.
//!
//! As a target in the error state, a QP completes each posted receive once, in order: with
//! its delivery if that was published, else flushed (`WrFlushError`, or the QP's own status).
//! The flush marks the ring entry (`ring::RingEntry::flush`, a CAS on `seq` against the
//! initiator's publishing CAS), so a delivery that comes after it fails at the initiator with
//! `RetryExceeded` (an RC responder in error acknowledges nothing) instead of being
//! acknowledged there and dropped here: the two ends always agree on whether a
//! write-with-immediate arrived (a fused comm's failover relies on it: `ibnet_core::fused`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_utils::CachePadded;
use ibnet_core::provider::{Completion, QpAttr, SendWr, WcOpcode, WcStatus, WrOpcode};
use ibnet_core::{Error, Result};

use crate::cq::{CqShared, Harvest};
use crate::engine::{Engine, Job};
use crate::peer::Peer;
use crate::ring::{self, INLINE_MAX};
use crate::segment::{
    self, Dir, Fabric, Segment, ACC_LOCAL_WRITE, ACC_REMOTE_READ, ACC_REMOTE_WRITE, BOUNCE_MAX,
    BOUNCE_QPS, BOUNCE_SLOTS, RING,
};
use crate::sq::{Combiner, ErrSeq, SqEntry, Wr, OP_READ, OP_WRITE_IMM};
use crate::zeroed::Zeroed;

mod faulty;
mod responder;

/// Where a connected QP sends to.
pub struct Remote {
    /// The peer provider.
    pub peer: Arc<Peer>,
    /// The remote QP number.
    pub qpn: u32,
    /// The remote QP's block index in the peer's segment.
    pub block: usize,
}

/// QP states visible to the provider.
const ST_RESET: u8 = 0;
const ST_RTS: u8 = 1;

/// Everything of a QP that the poster, the poller, the combiner and copy workers share.
pub struct QpShared {
    /// The QP number.
    pub qpn: u32,
    /// Block index in the own segment.
    pub idx: usize,
    own: Arc<Segment>,
    /// The CQ (for completion-slot accounting).
    pub cq: Arc<CqShared>,
    /// The send queue (lazily committed: `zeroed`).
    sq: Zeroed<SqEntry>,
    sq_mask: u64,
    max_send: u64,
    max_inline: u32,
    sq_tail: CachePadded<AtomicU64>,
    sq_cursor: CachePadded<AtomicU64>,
    sq_head: CachePadded<AtomicU64>,
    kicks: Combiner,
    /// Immediates delivered to the remote QP (combiner only).
    imm_sent: AtomicU64,
    /// The remote's `recv_posted` as last read (combiner only): credits known without touching
    /// the remote's cache line.
    posted_seen: AtomicU64,
    /// 0, or the status outstanding WRs complete with (error state).
    fail: AtomicU32,
    /// The first WR whose copy failed: WRs behind it are not executed (`WrFlushError`).
    err_seq: ErrSeq,
    state: AtomicU8,
    remote: OnceLock<Remote>,
    /// The receive queue's WR ids (lazily committed).
    rq: Zeroed<AtomicU64>,
    rq_mask: u64,
    max_recv: u64,
    rq_posted: CachePadded<AtomicU64>,
    rq_head: CachePadded<AtomicU64>,
    destroyed: AtomicBool,
    direct_max: u64,
    chunk: u64,
    /// Smallest piece of a WR above `direct_max` (`IBNET_SOFT_MIN_PIECE`): below it, waking a
    /// worker costs more than the copy it would take over.
    min_piece: u64,
    /// Largest WRITE_WITH_IMM sent bounced (0: none).
    bounce_max: u64,
    /// Smallest WR of a stream handed whole to a worker (0: none; "Streams").
    stream_min: u64,
    /// The next bounce slot number (poster only).
    bounce_next: AtomicU64,
    /// The target's `bounce_done` as last read (poster only).
    bounce_seen: AtomicU64,
    /// Armed `IBNET_SOFT_FAULTS` (None: the normal case).
    faults: Option<Arc<crate::inject::Inject>>,
    /// This QP's share of the provider's memory budget, given back when its memory is freed.
    _budget: Option<crate::budget::Held>,
}

// The budget's count of a QP's own state covers it (with room for the allocator and the CQ).
const _: () =
    assert!(std::mem::size_of::<QpShared>() + 256 <= crate::budget::QP_STATE_BYTES as usize);

/// Most cache lines of a small plain write into a peer's FIFO area hinted ahead of the copy
/// ([`QpShared::prefetch`]; a clear-to-send element is one line, a multi-receive's up to 8).
const HINT_LINES: usize = 8;

/// Most bytes of one WR the posting thread copies itself (beyond `direct_max`): up to this,
/// a WR never waits for a copy worker to wake up; above it the poster returns after this much.
const POSTER_MAX: u64 = 1 << 20;

/// The chunk size of a WR of `len` bytes copied by the poster and `workers` workers
/// (size-adaptive): whole rounds of `workers + 1` equal pieces, as few rounds as pieces of at
/// most `max` bytes allow, and fewer pieces (of at least `min`) for a smaller WR. Every
/// copier then finishes its last piece at about the same time: a WR one round larger takes
/// one piece-time longer, never a round with only some copiers busy (`len` of 2 MiB with 4
/// workers and `max` 256 KiB: 10 pieces of 208 KiB, two rounds, not 8 of 256 KiB, where
/// the second round keeps 3 of 5 copiers busy for as long as the first).
fn split(len: u64, workers: u64, max: u64, min: u64) -> u64 {
    let round = workers + 1;
    let rounds = len.div_ceil(round * max).max(1);
    let pieces = (round * rounds).min(len.div_ceil(min)).max(1);
    len.div_ceil(pieces).next_multiple_of(4096).min(max)
}

/// How many of `workers` copy workers help the poster with a WR of `len` (> `direct_max`)
/// bytes on an idle QP: one copier per `direct_max` bytes, so each copies about as much as
/// one copier does fastest alone. More copiers of one message into one target contend (page
/// pinning in the target's address space, each copier's cache footprint): on the 16-core
/// host 1 MiB took 60-70 µs with the poster and one or two workers against 89-98 µs with all
/// five copiers, and 2 MiB 131-150 µs against 174-184 (one device call, `IBNET_SOFT_WORKERS`
/// 1, 2 and 4). A stream keeps every worker (`stream`): there each copies its own message.
fn idle_helpers(len: u64, direct_max: u64, workers: u64) -> u64 {
    if direct_max == 0 {
        return workers;
    }
    len.div_ceil(direct_max).saturating_sub(1).min(workers)
}

fn status_of(v: u32) -> WcStatus {
    WcStatus::from_raw(v)
}

impl QpShared {
    /// A QP in the RESET state, with the provider's tunables `cfg`; its block in `own` must
    /// already be reset.
    pub fn new(
        qpn: u32,
        idx: usize,
        own: Arc<Segment>,
        cq: Arc<CqShared>,
        attr: &QpAttr,
        cfg: &crate::config::Config,
    ) -> Self {
        let scap = (attr.max_send_wr as usize).next_power_of_two();
        let rcap = (attr.max_recv_wr as usize).next_power_of_two();
        Self {
            qpn,
            idx,
            own,
            cq,
            sq: Zeroed::new(scap, SqEntry::new),
            sq_mask: scap as u64 - 1,
            max_send: attr.max_send_wr as u64,
            max_inline: attr.max_inline,
            sq_tail: CachePadded::new(AtomicU64::new(0)),
            sq_cursor: CachePadded::new(AtomicU64::new(0)),
            sq_head: CachePadded::new(AtomicU64::new(0)),
            kicks: Combiner::new(),
            imm_sent: AtomicU64::new(0),
            posted_seen: AtomicU64::new(0),
            fail: AtomicU32::new(0),
            err_seq: ErrSeq::new(),
            state: AtomicU8::new(ST_RESET),
            remote: OnceLock::new(),
            rq: Zeroed::new(rcap, || AtomicU64::new(0)),
            rq_mask: rcap as u64 - 1,
            max_recv: attr.max_recv_wr as u64,
            rq_posted: CachePadded::new(AtomicU64::new(0)),
            rq_head: CachePadded::new(AtomicU64::new(0)),
            destroyed: AtomicBool::new(false),
            direct_max: cfg.direct_max,
            chunk: cfg.chunk.max(4096),
            min_piece: cfg.min_piece.clamp(4096, cfg.chunk.max(4096)),
            bounce_max: cfg.bounce_max.min(BOUNCE_MAX as u64),
            stream_min: cfg.stream_min,
            bounce_next: AtomicU64::new(0),
            bounce_seen: AtomicU64::new(0),
            faults: None,
            _budget: None,
        }
    }

    /// The attributes the QP was created with (for `reset_qp`, which makes it anew).
    pub fn attr(&self) -> QpAttr {
        QpAttr {
            max_send_wr: self.max_send as u32,
            max_recv_wr: self.max_recv as u32,
            max_inline: self.max_inline,
            access: Default::default(),
        }
    }

    /// Arms `IBNET_SOFT_FAULTS` on this QP (before it is shared).
    pub fn with_faults(mut self, faults: Option<Arc<crate::inject::Inject>>) -> Self {
        self.faults = faults;
        self
    }

    /// Holds `held` of the provider's memory budget for as long as this QP's memory lives.
    pub fn with_budget(mut self, held: crate::budget::Held) -> Self {
        self._budget = Some(held);
        self
    }

    fn entry(&self, seq: u64) -> &SqEntry {
        &self.sq[(seq & self.sq_mask) as usize]
    }

    /// Connects (RESET → RTS). Fails if already connected.
    pub fn connect(&self, r: Remote) -> Result<()> {
        self.remote.set(r).map_err(|_| Error::BadState {
            op: "connect_qp",
            state: "already connected",
        })?;
        // Release: pairs with the Acquire load in `post`: `remote` is set before RTS is seen.
        self.state.store(ST_RTS, Ordering::Release);
        Ok(())
    }

    /// Moves the QP to the error state with `st` for outstanding WRs (first cause wins).
    fn set_fail(&self, st: WcStatus) {
        // Release: pairs with Acquire loads of `fail` (poller, poster): the cause is visible.
        let _ = self
            .fail
            .compare_exchange(0, st as u32, Ordering::Release, Ordering::Relaxed);
    }

    fn check_peer(&self) {
        if let Some(r) = self.remote.get() {
            if r.peer.is_dead() {
                self.set_fail(WcStatus::RetryExceeded);
            }
        }
        self.check_responder();
    }

    /// Destroys: flushes nothing (outstanding WRs are dropped), stops workers' copies, frees
    /// the CQ slots this QP still held, and frees the block for peers to see it gone.
    pub fn destroy(&self) {
        self.set_fail(WcStatus::WrFlushError);
        // Release: pairs with the poller's Acquire load; it stops looking at this QP.
        self.destroyed.store(true, Ordering::Release);
        // Release: pairs with the initiator's Acquire load of `state` in `deliver`.
        self.own
            .qp_block(self.idx)
            .state
            .store(0, Ordering::Release);
        // Acquire (all four): pair with the Release stores of the poller (`sq_head`,
        // `rq_head`) and the poster (`sq_tail`, `rq_posted`); destroy runs after both stopped
        // (`&mut`/drop), so these are their final values and the entries are readable.
        let (h, t) = (
            self.sq_head.load(Ordering::Acquire),
            self.sq_tail.load(Ordering::Acquire),
        );
        let signaled = (h..t).filter(|&s| self.entry(s).load().signaled).count() as u32;
        let recvs = self.rq_posted.load(Ordering::Acquire) - self.rq_head.load(Ordering::Acquire);
        self.cq.release(signaled + recvs as u32);
        self.own.clear_ring(self.idx); // the ring's pages go back to the system
    }

    // ---------------------------------------------------------------- posting

    /// `post_send`: validates every WR (all or nothing), then posts and executes them.
    pub fn post(self: &Arc<Self>, wrs: &[SendWr], engine: &Engine<Self>) -> Result<()> {
        // Acquire: pairs with the Release store in `connect`.
        if self.state.load(Ordering::Acquire) != ST_RTS {
            return Err(Error::BadState {
                op: "post_send",
                state: "QP not connected (RESET)",
            });
        }
        if let Some(w) = wrs.first() {
            self.prefetch(w);
        }
        // Relaxed: only the poster writes `sq_tail`.
        let tail = self.sq_tail.load(Ordering::Relaxed);
        // Acquire: pairs with the poller's Release of `sq_head`: it has read those entries.
        let head = self.sq_head.load(Ordering::Acquire);
        if (tail - head) + wrs.len() as u64 > self.max_send {
            return Err(Error::Full {
                what: "soft send queue",
                cap: self.max_send as usize,
            });
        }
        let mut signaled = 0;
        for w in wrs {
            if w.inline && w.sge.len > self.max_inline {
                return Err(Error::OutOfRange {
                    what: "inline send length",
                    value: w.sge.len as i64,
                    min: 0,
                    max: self.max_inline as i64,
                });
            }
            signaled += w.signaled as u32;
        }
        self.cq.reserve(signaled)?;
        // Acquire: pairs with `set_fail`'s Release.
        let failed = self.fail.load(Ordering::Acquire) != 0;
        let mut seq = tail;
        for w in wrs {
            let e = self.entry(seq);
            e.store(w);
            if failed {
                e.arm(seq, self.chunk, false);
                e.set_err(WcStatus::WrFlushError, 0);
            } else if self.faults.is_some() && self.inject_post(seq, e) {
                // an injected fault failed the WR (IBNET_SOFT_FAULTS)
            } else {
                self.execute(seq, e, w.sge.len as u64, engine);
            }
            seq += 1;
        }
        // Release: publishes the entries to the combiner and the poller (their Acquire loads).
        self.sq_tail.store(seq, Ordering::Release);
        // Unsignaled plain WRITEs only: the next poll_cq kicks ("Send queue" in the module doc).
        if wrs
            .iter()
            .any(|w| w.signaled || w.opcode != WrOpcode::Write)
        {
            self.kick();
        }
        Ok(())
    }

    /// Starts, as a cache hint, the cross-process line transfer that `w`'s execution will wait
    /// for (`hint`'s module doc): the peer's FIFO-area line a small plain write stores into,
    /// or the target's `recv_posted` when a WRITE_WITH_IMM finds the cached credits used up.
    /// No effect on what happens, only on when the line arrives.
    #[inline(always)]
    fn prefetch(&self, w: &SendWr) {
        let Some(r) = self.remote.get() else { return };
        let Fabric::Cross { base, .. } = r.peer.fabric else {
            return;
        };
        match w.opcode {
            // Relaxed (both): combiner-only counters, read here as a hint only.
            WrOpcode::WriteWithImm
                if self.imm_sent.load(Ordering::Relaxed)
                    >= self.posted_seen.load(Ordering::Relaxed) =>
            {
                crate::hint::read(r.peer.seg.qp_block(r.block).recv_posted);
            }
            WrOpcode::Write if w.sge.len as usize <= HINT_LINES * 64 => {
                let len = u64::from(w.sge.len);
                if let Some(p) = r.peer.seg.fifo_area_ptr(base, w.remote_addr, len) {
                    for off in (0..len.max(1)).step_by(64) {
                        crate::hint::write((p + off) as *const u8);
                    }
                }
            }
            _ => {}
        }
    }

    fn execute(self: &Arc<Self>, seq: u64, e: &SqEntry, len: u64, engine: &Engine<Self>) {
        if e.op() == OP_WRITE_IMM && len > 0 && len <= INLINE_MAX as u64 {
            self.capture_inline(seq, e, len); // travels in the target's ring entry
            return;
        }
        let stream = self.streams(seq, len, engine);
        if !stream
            && e.op() == OP_WRITE_IMM
            && len > 0
            && len <= self.bounce_max
            && self.capture_bounce(seq, e, len)
        {
            return; // travels through a bounce slot of the target's segment
        }
        if stream {
            // One WR of a stream, whole to a worker ("Streams" in the module doc).
            self.stream(seq, e, len.min(self.chunk), engine);
            return;
        }
        let workers = if len <= self.direct_max {
            0
        } else {
            engine.workers() as u64
        };
        if workers == 0 {
            self.copy_direct(seq, e, len); // in the posting thread: no hop
            return;
        }
        // Relaxed: a hint (which mode suits); both are correct.
        if self.sq_cursor.load(Ordering::Relaxed) < seq {
            // Streaming: an earlier WR of this QP has not landed yet, so workers are at work
            // (or waking up) and more WRs are likely to follow. The workers take every chunk
            // and the poster returns at once to post the next WR: `workers` streams copying
            // back to back, instead of a poster that copies its share and posts nothing
            // meanwhile.
            let chunk = split(len, workers, self.chunk, self.min_piece);
            self.stream(seq, e, chunk, engine);
            return;
        }
        // Idle QP (a latency-bound exchange): the poster copies too, with one helper per
        // further `direct_max` bytes (`idle_helpers`), and hands a token to a worker only
        // while at least two chunks are unclaimed (one for itself, one for the worker): a
        // worker is woken only when it will find work, and a WR of up to POSTER_MAX never
        // waits for a sleeping worker.
        let helpers = idle_helpers(len, self.direct_max, workers);
        let chunk = split(len, helpers, self.chunk, self.min_piece);
        let n = e.arm(seq, chunk, true) as u64;
        let tokens = n.saturating_sub(1).min(helpers);
        let (mut sent, mut copied) = (0, 0);
        loop {
            if sent < tokens && e.unclaimed(seq) >= 2 {
                // Helper `sent` of this QP is always the same worker: its cache keeps the
                // pieces it copied last time (`idle_helpers`).
                if !engine.submit_to(self.clone(), seq, self.idx + sent as usize) {
                    // Engine full or stopped: the poster copies what is left.
                    self.run_chunks(seq, e, u64::MAX);
                    return;
                }
                sent += 1;
            }
            if copied >= POSTER_MAX {
                break;
            }
            match self.run_chunks(seq, e, 1) {
                (0, _) => return, // all claimed
                (b, _) => copied += b,
            }
        }
        // Past the poster's share: the workers take the rest (at least one token out).
        while sent == 0 && e.unclaimed(seq) > 0 {
            if !engine.submit_to(self.clone(), seq, self.idx) {
                self.run_chunks(seq, e, u64::MAX);
            }
            sent += 1;
        }
    }

    /// Whether WR `seq` of `len` bytes is one of a stream that goes whole to a copy worker:
    /// at least `stream_min` and at most `direct_max` bytes, an earlier WR of the QP still
    /// outstanding (not yet polled), a worker to take it, and a peer in another process.
    fn streams(&self, seq: u64, len: u64, engine: &Engine<Self>) -> bool {
        self.stream_min != 0
            && len >= self.stream_min
            && len <= self.direct_max
            // Relaxed: a hint (which mode suits); both are correct.
            && self.sq_head.load(Ordering::Relaxed) < seq
            && engine.workers() > 0
            && self
                .remote
                .get()
                .is_some_and(|r| matches!(r.peer.fabric, Fabric::Cross { .. }))
    }

    /// Arms WR `seq` in chunks of `chunk` bytes and hands every chunk to the workers (one
    /// token per chunk, at most one per worker); the poster returns at once, to post the next
    /// WR. With the engine full or stopped the poster copies what is left.
    fn stream(self: &Arc<Self>, seq: u64, e: &SqEntry, chunk: u64, engine: &Engine<Self>) {
        let n = e.arm(seq, chunk, true) as u64;
        for _ in 0..n.min(engine.workers() as u64) {
            if !engine.submit(self.clone(), seq) {
                self.run_chunks(seq, e, u64::MAX);
                return;
            }
        }
    }

    /// Copies all of WR `seq` in the posting thread, before it is armed (nobody else can see
    /// it: no claims needed), then arms it with no chunks (landed).
    fn copy_direct(&self, seq: u64, e: &SqEntry, len: u64) {
        let w = e.load();
        let mut off = 0;
        // Relaxed: as in `run_chunks` (behind a failed WR of this chain: not executed).
        if self.fail.load(Ordering::Relaxed) != 0 || self.err_seq.skips(seq) {
            off = len;
        }
        while off < len {
            let n = self.chunk.min(len - off);
            if let Err((st, v)) = self.copy(&w, off, n) {
                e.set_err(st, v);
                self.err_seq.note(seq);
                self.mark_responder(st);
                break;
            }
            off += n;
        }
        e.arm(seq, self.chunk, false);
    }

    /// Captures the payload of WR `seq` (a WRITE_WITH_IMM of at most `INLINE_MAX` bytes) into
    /// its entry, after the checks a copy makes (local and remote leases: key, range, access;
    /// an error completes the WR as a failed copy's does), then arms it with no chunks
    /// (landed). The combiner carries the payload in the target's ring entry (see "Inline
    /// payloads" in the module doc).
    fn capture_inline(&self, seq: u64, e: &SqEntry, len: u64) {
        // Relaxed: as in `copy_direct`.
        if self.fail.load(Ordering::Relaxed) == 0 && !self.err_seq.skips(seq) {
            let w = e.load();
            match self.check_inline(&w, len) {
                Ok(words) => e.set_inline(&words),
                Err((st, v)) => {
                    e.set_err(st, v);
                    self.err_seq.note(seq);
                    self.mark_responder(st);
                }
            }
        }
        e.arm(seq, self.chunk, false);
    }

    /// The leases a write of `w` needs (checked, then released: the target re-checks when it
    /// copies the payload in) and the payload, read under the local lease.
    fn check_inline(
        &self,
        w: &Wr,
        len: u64,
    ) -> core::result::Result<[u64; ring::INLINE_WORDS], (WcStatus, u32)> {
        let r = self.remote.get().ok_or((WcStatus::LocalQpOpError, 0))?;
        let ll = self
            .own
            .lease(w.lkey, w.laddr, len, 0, true)
            .map_err(|_| (WcStatus::LocalProtectionError, 0))?;
        let own = Arc::ptr_eq(&r.peer.seg, &self.own);
        r.peer
            .lease(w.rkey, w.raddr, len, ACC_REMOTE_WRITE, own)
            .map_err(|_| (WcStatus::RemoteAccessError, 0))?;
        let mut buf = [0u8; INLINE_MAX];
        segment::read_own(&ll, w.laddr, &mut buf[..len as usize]);
        Ok(ring::pack(&buf))
    }

    /// Sends WR `seq` (a cross-process WRITE_WITH_IMM of at most `bounce_max` bytes) bounced
    /// when a bounce slot of the target is free: after the checks a copy makes (as
    /// `capture_inline`; an error completes the WR as a failed copy's does), writes the payload
    /// into the slot and arms the WR with no chunks (landed); the combiner publishes the slot's
    /// number with the immediate. `false` (nothing done) when the WR must be copied instead:
    /// in-process peer, a target QP without bounce slots (beyond `BOUNCE_QPS`), no free slot,
    /// target gone, or the QP failed.
    fn capture_bounce(&self, seq: u64, e: &SqEntry, len: u64) -> bool {
        let Some(r) = self.remote.get() else {
            return false;
        };
        // Relaxed: as in `copy_direct`.
        if !matches!(r.peer.fabric, Fabric::Cross { .. })
            || r.block >= BOUNCE_QPS
            || self.fail.load(Ordering::Relaxed) != 0
            || self.err_seq.skips(seq)
        {
            return false;
        }
        let Some(b) = self.bounce_slot(r) else {
            return false;
        };
        let w = e.load();
        match self.write_bounce(r, &w, len, b) {
            Ok(()) => {
                e.set_bounce(b);
                self.bounce_next.store(b + 1, Ordering::Relaxed); // poster only
            }
            Err((st, v)) => {
                e.set_err(st, v);
                self.err_seq.note(seq);
                self.mark_responder(st);
            }
        }
        e.arm(seq, self.chunk, false);
        true
    }

    /// The next bounce slot number, if that slot of the target is free (its payload copied
    /// out, or never used), and the target QP still lives.
    fn bounce_slot(&self, r: &Remote) -> Option<u64> {
        // Relaxed (both): poster only.
        let b = self.bounce_next.load(Ordering::Relaxed);
        let mut seen = self.bounce_seen.load(Ordering::Relaxed);
        let blk = r.peer.seg.qp_block(r.block);
        if !ring::bounce_free(b, &mut seen, blk.bounce_done, BOUNCE_SLOTS as u64) {
            return None;
        }
        self.bounce_seen.store(seen, Ordering::Relaxed); // poster only
                                                         // Acquire: pairs with the target's Release store of its QP number at create (its
                                                         // bounce slots are ours to write only while it is the QP we connected to).
        (blk.state.load(Ordering::Acquire) == r.qpn as u64).then_some(b)
    }

    /// The leases a write of `w` needs (as `check_inline`), then the payload written into
    /// bounce slot `b` of the target under the local lease.
    fn write_bounce(
        &self,
        r: &Remote,
        w: &Wr,
        len: u64,
        b: u64,
    ) -> core::result::Result<(), (WcStatus, u32)> {
        let ll = self
            .own
            .lease(w.lkey, w.laddr, len, 0, true)
            .map_err(|_| (WcStatus::LocalProtectionError, 0))?;
        r.peer
            .lease(w.rkey, w.raddr, len, ACC_REMOTE_WRITE, false)
            .map_err(|_| (WcStatus::RemoteAccessError, 0))?;
        segment::write_bounce(&ll, w.laddr, &r.peer.seg, r.block, b, len as usize);
        Ok(())
    }

    /// Claims and copies chunks of WR `seq` until none is left, or `budget` bytes were copied;
    /// returns the bytes claimed, and `true` when this call finished the WR's last chunk.
    fn run_chunks(&self, seq: u64, e: &SqEntry, budget: u64) -> (u64, bool) {
        let mut last = false;
        let mut done = 0;
        while done < budget {
            let Some(c) = e.claim(seq) else { break };
            done += c.len;
            // Relaxed (`fail`; `status` and `skips` are Relaxed too): a stale read only costs
            // one wasted chunk copy before the error shows; the poster sees its own earlier
            // stores (direct WRs of one chain).
            if e.status() == 0 && self.fail.load(Ordering::Relaxed) == 0 && !self.err_seq.skips(seq)
            {
                let w = e.load(); // this WR's: the claim keeps it from landing
                if let Err((st, v)) = self.copy(&w, c.off, c.len) {
                    e.set_err(st, v);
                    self.err_seq.note(seq);
                    self.mark_responder(st);
                }
            }
            last = e.chunk_done();
        }
        (done, last)
    }

    /// A copy worker's share of WR `seq` (nothing if it has landed meanwhile).
    fn run_token(&self, seq: u64) {
        if self.run_chunks(seq, self.entry(seq), u64::MAX).1 {
            self.kick();
        }
    }

    /// Moves bytes `[off, off + n)` of `w`, under leases on both registrations.
    fn copy(&self, w: &Wr, off: u64, n: u64) -> core::result::Result<(), (WcStatus, u32)> {
        let r = self.remote.get().ok_or((WcStatus::LocalQpOpError, 0))?;
        let (dir, lneed, rneed) = if w.op == OP_READ {
            (Dir::Read, ACC_LOCAL_WRITE, ACC_REMOTE_READ)
        } else {
            (Dir::Write, 0, ACC_REMOTE_WRITE)
        };
        let la = w
            .laddr
            .checked_add(off)
            .ok_or((WcStatus::LocalProtectionError, 0))?;
        let ra = w
            .raddr
            .checked_add(off)
            .ok_or((WcStatus::RemoteAccessError, 0))?;
        let ll = self
            .own
            .lease(w.lkey, la, n, lneed, true)
            .map_err(|_| (WcStatus::LocalProtectionError, 0))?;
        let own = Arc::ptr_eq(&r.peer.seg, &self.own);
        let rl = r
            .peer
            .lease(w.rkey, ra, n, rneed, own)
            .map_err(|_| (WcStatus::RemoteAccessError, 0))?;
        let injected = match self.faults {
            Some(_) if dir == Dir::Write => self.inject_copy(r, &rl, la, ra, n),
            _ => None,
        };
        let moved = injected.unwrap_or_else(|| {
            segment::copy_leased(r.peer.fabric, dir, &ll, la, &rl, ra, n as usize)
        });
        moved.map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(0);
            match errno {
                libc::ESRCH => {
                    r.peer.mark_dead();
                    (WcStatus::RetryExceeded, errno as u32)
                }
                libc::EFAULT => (WcStatus::RemoteAccessError, errno as u32),
                libc::EPERM | libc::EACCES => (WcStatus::RemoteOperationError, errno as u32),
                _ => (WcStatus::General, errno as u32),
            }
        })
    }

    // ---------------------------------------------------------------- combiner

    /// Runs [`Self::advance`] now or makes the running combiner run it again.
    pub fn kick(&self) {
        self.kicks.kick(|| self.advance());
    }

    /// Retires landed WRs in order, delivering immediates (combiner only).
    fn advance(&self) {
        self.check_peer();
        // Relaxed: only the combiner writes it.
        let mut c = self.sq_cursor.load(Ordering::Relaxed);
        // Acquire: pairs with the poster's Release of `sq_tail`.
        let t = self.sq_tail.load(Ordering::Acquire);
        while c < t {
            let e = self.entry(c);
            if !e.landed() {
                break; // chunks still being copied
            }
            // Ordered by `landed` (Acquire) / by sq_tail.
            let own = e.status();
            // Acquire: pairs with `set_fail`'s Release.
            let fail = self.fail.load(Ordering::Acquire);
            let err_seq = self.err_seq.first();
            let st = if c > err_seq {
                WcStatus::WrFlushError as u32 // behind the first failed WR: not executed
            } else if own != 0 {
                own
            } else if fail != 0 {
                fail
            } else if e.op() == OP_WRITE_IMM {
                match self.deliver(e) {
                    Deliver::Done => 0,
                    Deliver::Rnr => break,
                    Deliver::Gone => WcStatus::RetryExceeded as u32,
                }
            } else {
                0
            };
            if st != 0 {
                e.set_status(st); // published by the Release store of `sq_cursor` below
                self.set_fail(if st == WcStatus::RetryExceeded as u32 {
                    WcStatus::RetryExceeded
                } else {
                    WcStatus::WrFlushError
                });
            }
            c += 1;
            // Release: pairs with the poller's Acquire: the entry's final status is visible.
            self.sq_cursor.store(c, Ordering::Release);
        }
    }

    fn deliver(&self, e: &SqEntry) -> Deliver {
        let Some(r) = self.remote.get() else {
            return Deliver::Gone;
        };
        if r.peer.is_dead() {
            return Deliver::Gone;
        }
        let b = r.peer.seg.qp_block(r.block);
        // Acquire: pairs with the target's Release store of its QP number at create.
        if b.state.load(Ordering::Acquire) != r.qpn as u64 {
            return Deliver::Gone;
        }
        let t = self.imm_sent.load(Ordering::Relaxed); // combiner only
        if t >= self.posted_seen.load(Ordering::Relaxed) {
            // Acquire: pairs with the target's Release in `post_recv`: slot `t % RING` was
            // read by the target before it posted receive `t`.
            let p = b.recv_posted.load(Ordering::Acquire);
            self.posted_seen.store(p, Ordering::Relaxed); // combiner only
            if t >= p {
                return Deliver::Rnr;
            }
        }
        // Relaxed: the entry itself was published by `sq_tail`.
        let (imm, len) = (e.imm.load(Ordering::Relaxed), e.len.load(Ordering::Relaxed));
        let inline = e.inline().map(|body| ring::Inline {
            raddr: e.raddr.load(Ordering::Relaxed), // Relaxed: as above
            rkey: e.rkey.load(Ordering::Relaxed),   // Relaxed: as above
            body,
        });
        // Publishes with a Release store of the entry's `seq` (pairs with the target's Acquire
        // in `poll_into`): the entry, and every byte this QP copied before (which
        // happened-before this point), are visible.
        if !b.ring[(t % RING as u64) as usize].publish(t, imm, len, inline.as_ref()) {
            // The target's QP is in the error state and flushed this receive: as an RC
            // responder in error, it does not acknowledge ("Errors" in the module doc).
            return Deliver::Gone;
        }
        // Relaxed: combiner only (read back by the load above on the next delivery; `prefetch`
        // reads it as a hint only); the entry itself is published by `seq`'s Release above.
        self.imm_sent.store(t + 1, Ordering::Relaxed);
        Deliver::Done
    }

    // ---------------------------------------------------------------- receives

    /// `post_recv`.
    pub fn post_recv(&self, wr_id: u64) -> Result<()> {
        // Relaxed: only the poster writes it.
        let p = self.rq_posted.load(Ordering::Relaxed);
        // Acquire: pairs with the poller's Release of `rq_head`: those slots were read.
        let h = self.rq_head.load(Ordering::Acquire);
        if p - h >= self.max_recv {
            return Err(Error::Full {
                what: "soft receive queue",
                cap: self.max_recv as usize,
            });
        }
        self.cq.reserve(1)?;
        // Relaxed: published by the Release store of `rq_posted`.
        self.rq[(p & self.rq_mask) as usize].store(wr_id, Ordering::Relaxed);
        // Release: pairs with the poller's Acquire.
        self.rq_posted.store(p + 1, Ordering::Release);
        // Release: pairs with the initiator's Acquire in `deliver`.
        self.own
            .qp_block(self.idx)
            .recv_posted
            .store(p + 1, Ordering::Release);
        Ok(())
    }

    // ---------------------------------------------------------------- polling

    /// Writes this QP's ready completions into `out`; returns how many.
    fn poll_into(&self, out: &mut [Completion]) -> usize {
        // Acquire: pairs with `destroy`'s Release.
        if self.destroyed.load(Ordering::Acquire) || out.is_empty() {
            return 0;
        }
        self.check_peer();
        // Acquire (both): pair with the combiner's / poster's Release stores.
        if self.sq_cursor.load(Ordering::Acquire) < self.sq_tail.load(Ordering::Acquire) {
            self.kick(); // drives RNR retries and failure processing
        }
        let mut n = 0;
        let mut released = 0;
        // Sends.
        // Relaxed: only the poller writes it.
        let mut h = self.sq_head.load(Ordering::Relaxed);
        // Acquire: pairs with the combiner's Release of `sq_cursor`.
        let cur = self.sq_cursor.load(Ordering::Acquire);
        while h < cur && n < out.len() {
            let e = self.entry(h);
            let w = e.load();
            let st = e.status(); // ordered by the Acquire of `sq_cursor`
            if w.signaled || st != 0 {
                out[n] = Completion {
                    wr_id: w.wr_id,
                    status: status_of(st),
                    opcode: if w.op == OP_READ {
                        WcOpcode::RdmaRead
                    } else {
                        WcOpcode::RdmaWrite
                    },
                    byte_len: w.len,
                    imm: 0,
                    // Relaxed: ordered by the Acquire of `sq_cursor`, like `status`.
                    vendor_err: e.vendor.load(Ordering::Relaxed),
                    qp_num: self.qpn,
                };
                n += 1;
            }
            released += w.signaled as u32;
            h += 1;
        }
        // Release: pairs with the poster's Acquire: the entries were read, the slots are free.
        self.sq_head.store(h, Ordering::Release);
        let (k, r) = self.poll_recvs(&mut out[n..]);
        self.cq.release(released + r);
        n + k
    }

    /// [`Self::poll_into`]'s receives: their completions into `out`, in order (a delivery
    /// taken, or in the error state a receive flushed); returns how many, and the CQ slots
    /// they release.
    fn poll_recvs(&self, out: &mut [Completion]) -> (usize, u32) {
        let (mut n, mut released) = (0, 0);
        // Receives.
        let b = self.own.qp_block(self.idx);
        // Acquire: pairs with `post_recv`'s Release.
        let posted = self.rq_posted.load(Ordering::Acquire);
        // Relaxed: only the poller writes it.
        let mut rh = self.rq_head.load(Ordering::Relaxed);
        // Acquire: pairs with `set_fail`.
        let mut fail = self.fail.load(Ordering::Acquire);
        let mut bounced = None;
        // Never beyond `posted`: a peer can never complete more than was posted.
        while rh < posted && n < out.len() {
            let e = &b.ring[(rh % RING as u64) as usize];
            // Acquire inside `take`: pairs with the initiator's Release in `deliver` (data,
            // meta and inline payload visible).
            let got = match e.take(rh) {
                Some(d) => match d.inline {
                    Some(p) => {
                        if let ring::Body::Bounce(b) = p.body {
                            bounced = Some(b);
                        }
                        if self.apply_inline(&p, d.len) {
                            Some(d)
                        } else {
                            // A responder error (as RC): this and every later receive is
                            // flushed.
                            self.set_fail(WcStatus::WrFlushError);
                            fail = WcStatus::WrFlushError as u32;
                            None
                        }
                    }
                    None => Some(d),
                },
                None if fail == 0 => break, // not delivered yet
                // The error state: the receive is flushed, and its delivery can no longer
                // land (the initiator's `publish` fails: "Errors" in the module doc) ...
                None if e.flush(rh) => None,
                // ... unless the delivery won the race: take it on the next turn.
                None => continue,
            };
            // Relaxed: ordered by the Acquire of `rq_posted` above.
            let wr_id = self.rq[(rh & self.rq_mask) as usize].load(Ordering::Relaxed);
            out[n] = match got {
                Some(d) => {
                    let v = ((d.imm as u64) << 32) | d.len as u64;
                    Completion {
                        wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: v as u32,
                        imm: (v >> 32) as u32,
                        vendor_err: 0,
                        qp_num: self.qpn,
                    }
                }
                None => Completion {
                    wr_id,
                    status: status_of(fail),
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: 0,
                    imm: 0,
                    vendor_err: 0,
                    qp_num: self.qpn,
                },
            };
            n += 1;
            released += 1;
            rh += 1;
        }
        if let Some(last) = bounced {
            // Our copies out of every slot up to `last` happened before the initiator reuses
            // them (Release inside).
            ring::bounce_release(b.bounce_done, last);
        }
        // Release: pairs with `post_recv`'s Acquire: those wr_id slots were read.
        self.rq_head.store(rh, Ordering::Release);
        (n, released)
    }
}

impl QpShared {
    /// Target: copies an inline payload of `len` bytes into our memory, after re-checking (the
    /// entry is peer-written) its length, and its rkey, range and remote-write access against
    /// our own registration table under a lease; `false` on a responder error.
    fn apply_inline(&self, p: &ring::Inline, len: u32) -> bool {
        let max = match p.body {
            ring::Body::Words(_) => INLINE_MAX,
            ring::Body::Bounce(_) if self.idx < BOUNCE_QPS => BOUNCE_MAX,
            ring::Body::Bounce(_) => return false, // we have no bounce slots: corrupt
        };
        if len as usize > max {
            return false;
        }
        let Ok(lease) = self
            .own
            .lease(p.rkey, p.raddr, len as u64, ACC_REMOTE_WRITE, true)
        else {
            return false;
        };
        match p.body {
            ring::Body::Words(w) => {
                segment::write_own(&lease, p.raddr, &ring::bytes(&w)[..len as usize]);
            }
            ring::Body::Bounce(b) => {
                segment::read_bounce(&self.own, self.idx, b, &lease, p.raddr, len as usize);
            }
        }
        true
    }
}

impl Job for QpShared {
    fn run_token(&self, seq: u64) {
        QpShared::run_token(self, seq);
    }
}

impl Harvest for QpShared {
    fn poll_into(&self, out: &mut [Completion]) -> usize {
        QpShared::poll_into(self, out)
    }
}

enum Deliver {
    Done,
    Rnr,
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of `len` with `workers` workers and `max`-byte pieces at most.
    fn chunks(len: u64, workers: u64, max: u64) -> (u64, u64) {
        let c = split(len, workers, max, 32 << 10);
        (len.div_ceil(c), c)
    }

    #[test]
    fn an_idle_wr_gets_one_copier_per_direct_max_bytes() {
        const K: u64 = 1 << 10;
        // Just over DIRECT_MAX, and 1 MiB: the poster and one worker.
        assert_eq!(idle_helpers(512 * K + 1, 512 * K, 4), 1);
        assert_eq!(idle_helpers(1 << 20, 512 * K, 4), 1);
        // 2 MiB: four copiers; 4 MiB and more: every worker.
        assert_eq!(idle_helpers(2 << 20, 512 * K, 4), 3);
        assert_eq!(idle_helpers(4 << 20, 512 * K, 4), 4);
        assert_eq!(idle_helpers(64 << 20, 512 * K, 4), 4);
        // DIRECT_MAX 0 (every WR split): every worker.
        assert_eq!(idle_helpers(4 * K, 0, 4), 4);
        // 1 MiB with its helper: two rounds of two 256 KiB pieces.
        assert_eq!(
            chunks(1 << 20, idle_helpers(1 << 20, 512 * K, 4), 256 * K),
            (4, 256 * K)
        );
    }

    #[test]
    fn split_is_whole_rounds_of_the_copiers_pieces_at_least_min_piece() {
        const K: u64 = 1 << 10;
        // Fewer pieces than copiers for a small WR: none under MIN_PIECE.
        assert_eq!(chunks(96 * K, 4, 256 * K), (3, 32 * K));
        assert_eq!(chunks(128 * K, 4, 256 * K), (4, 32 * K));
        // One round: a piece per copier.
        assert_eq!(chunks(256 * K, 4, 256 * K), (5, 52 * K));
        assert_eq!(chunks(1 << 20, 4, 256 * K), (5, 208 * K));
        // Two rounds of 5, not 8 pieces of 256 KiB (a second round with 2 copiers idle).
        assert_eq!(chunks(2 << 20, 4, 256 * K), (10, 208 * K));
        // Page-rounded pieces: 256 of 256 KiB rather than 260 (51.2 rounds; immaterial).
        assert_eq!(chunks(64 << 20, 4, 256 * K), (256, 256 * K));
        // One worker; pieces never above `max`.
        assert_eq!(chunks(1 << 20, 1, 256 * K), (4, 256 * K));
        assert_eq!(chunks(1 << 20, 1, 64 * K), (16, 64 * K));
        // A larger smallest piece (IBNET_SOFT_MIN_PIECE): fewer, larger pieces below a round.
        assert_eq!(split(128 * K, 4, 256 * K, 64 * K), 64 * K);
        assert_eq!(split(256 * K, 4, 256 * K, 64 * K), 64 * K);
        assert_eq!(split(1 << 20, 4, 256 * K, 64 * K), 208 * K);
    }
}
