//! The send-queue protocol of a QP, apart from what it moves: a slot ([`SqEntry`]) with its
//! copy tokens, the combining flag that runs the in-order retirement ([`Combiner`]), and the
//! first failed WR ([`ErrSeq`]). `qp.rs` builds on these; the loom model
//! (`tests/loom_qp.rs`, `--cfg loom`) checks them under every interleaving, which is why every
//! atomic here comes from `ibnet_core::sync` (loom's types under `--cfg loom`).
//!
//! ```text
//!  poster                   copy worker (× k tokens)          combiner (whoever kicks first)
//!  entry.store(wr)  Relaxed
//!  set_tokens(k)    Relaxed ─ channel send ─▶ claim chunks, copy
//!  sq_tail = s+1    Release                   err: set_err, ErrSeq::note (Release)
//!  kick ─────────────────────┐                token_done: tokens -= 1 (Release) ─▶ == 0: kick
//!                            ▼                                 │
//!           Combiner::kick: kicks += 1 (AcqRel); 0 before? run advance, then CAS(k → 0)
//!           (AcqRel) or, if kicks came meanwhile, advance again. advance: landed()
//!           (tokens Acquire == 0) ─▶ status, ErrSeq::first (Acquire) ─▶ sq_cursor (Release)
//!           ─▶ poller (Acquire) reads the final status; the bytes happened-before.
//! ```
#![allow(missing_docs)] // pub only for the loom model (doc-hidden); documented here

use crossbeam_utils::CachePadded;
use ibnet_core::provider::{SendWr, WcStatus, WrOpcode};
use ibnet_core::sync::{AtomicU32, AtomicU64, Ordering};

pub const OP_WRITE: u32 = 0;
pub const OP_WRITE_IMM: u32 = 1;
pub const OP_READ: u32 = 2;
pub const F_SIGNALED: u32 = 1 << 8;

/// One send-queue slot. Fields are atomics (Relaxed) published by `sq_tail` (Release) or by the
/// copy-engine channel; only the poster writes them, and only while the slot is free.
#[repr(align(64))]
pub struct SqEntry {
    pub wr_id: AtomicU64,
    pub laddr: AtomicU64,
    pub raddr: AtomicU64,
    pub len: AtomicU32,
    pub lkey: AtomicU32,
    pub rkey: AtomicU32,
    pub imm: AtomicU32,
    pub flags: AtomicU32,
    /// Tokens still held by copy workers (0: the data has landed or failed).
    tokens: AtomicU32,
    /// 0 or the WR's own error status.
    pub status: AtomicU32,
    pub vendor: AtomicU32,
    /// Next byte offset to claim (tokens).
    claim: AtomicU64,
}

/// A snapshot of a WR.
#[derive(Clone, Copy, Debug)]
pub struct Wr {
    pub wr_id: u64,
    pub laddr: u64,
    pub raddr: u64,
    pub len: u32,
    pub lkey: u32,
    pub rkey: u32,
    pub op: u32,
    pub signaled: bool,
}

impl SqEntry {
    /// An empty slot.
    pub fn new() -> Self {
        Self {
            wr_id: AtomicU64::new(0),
            laddr: AtomicU64::new(0),
            raddr: AtomicU64::new(0),
            len: AtomicU32::new(0),
            lkey: AtomicU32::new(0),
            rkey: AtomicU32::new(0),
            imm: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            tokens: AtomicU32::new(0),
            status: AtomicU32::new(0),
            vendor: AtomicU32::new(0),
            claim: AtomicU64::new(0),
        }
    }

    /// Poster: writes `w` into this (free) slot, with no tokens out.
    pub fn store(&self, w: &SendWr) {
        let op = match w.opcode {
            WrOpcode::Write => OP_WRITE,
            WrOpcode::WriteWithImm => OP_WRITE_IMM,
            WrOpcode::Read => OP_READ,
        };
        // Relaxed (all): published by the Release store of `sq_tail` / the channel send.
        self.wr_id.store(w.wr_id, Ordering::Relaxed);
        self.laddr.store(w.sge.addr, Ordering::Relaxed);
        self.raddr.store(w.remote_addr, Ordering::Relaxed);
        self.len.store(w.sge.len, Ordering::Relaxed);
        self.lkey.store(w.sge.lkey, Ordering::Relaxed);
        self.rkey.store(w.rkey, Ordering::Relaxed);
        self.imm.store(w.imm, Ordering::Relaxed);
        self.flags.store(
            op | if w.signaled { F_SIGNALED } else { 0 },
            Ordering::Relaxed,
        );
        self.status.store(0, Ordering::Relaxed);
        self.vendor.store(0, Ordering::Relaxed);
        self.claim.store(0, Ordering::Relaxed);
        self.tokens.store(0, Ordering::Relaxed);
    }

    /// A snapshot of the WR.
    pub fn load(&self) -> Wr {
        // Relaxed (all): the caller synchronised with the poster (sq_tail Acquire or channel).
        let flags = self.flags.load(Ordering::Relaxed);
        Wr {
            wr_id: self.wr_id.load(Ordering::Relaxed),
            laddr: self.laddr.load(Ordering::Relaxed),
            raddr: self.raddr.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            lkey: self.lkey.load(Ordering::Relaxed),
            rkey: self.rkey.load(Ordering::Relaxed),
            op: flags & 0xff,
            signaled: flags & F_SIGNALED != 0,
        }
    }

    /// The WR's opcode (`OP_*`).
    pub fn op(&self) -> u32 {
        // Relaxed: as in `load`.
        self.flags.load(Ordering::Relaxed) & 0xff
    }

    /// Records the WR's own error (the first one wins).
    pub fn set_err(&self, st: WcStatus, vendor: u32) {
        // Relaxed: the first error wins; published by the token's Release `tokens` decrement
        // (workers) or by `sq_tail` (poster).
        if self
            .status
            .compare_exchange(0, st as u32, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.vendor.store(vendor, Ordering::Relaxed);
        }
    }
    /// Poster: `k` tokens go out to copy workers (before they are sent).
    pub fn set_tokens(&self, k: u32) {
        // Relaxed: published to the workers by the channel send, to the combiner by the
        // Release store of `sq_tail` (its Acquire load comes before `landed`).
        self.tokens.store(k, Ordering::Relaxed);
    }

    /// Worker: claims the next `chunk` bytes; returns their offset (≥ len: none left).
    pub fn claim(&self, chunk: u64) -> u64 {
        // Relaxed: claims only need to be unique (RMWs on one location).
        self.claim.fetch_add(chunk, Ordering::Relaxed)
    }

    /// Worker: gives a token back; `true` for the last one (the caller must kick).
    pub fn token_done(&self) -> bool {
        // Release: pairs with the Acquire load in `landed` (through the release sequence of
        // these RMWs): this token's copies and status happen-before the WR's retirement.
        self.tokens.fetch_sub(1, Ordering::Release) == 1
    }

    /// Combiner: every token is back (the data has landed, or failed).
    pub fn landed(&self) -> bool {
        // Acquire: pairs with the Release decrements in `token_done`.
        self.tokens.load(Ordering::Acquire) == 0
    }

    /// The WR's status so far (0: none).
    pub fn status(&self) -> u32 {
        // Relaxed: ordered by `landed`'s Acquire (combiner) or `sq_cursor`'s (poller); a worker
        // only uses it as a hint to skip work.
        self.status.load(Ordering::Relaxed)
    }

    /// Combiner: the WR's final status.
    pub fn set_status(&self, st: u32) {
        // Relaxed: published by the combiner's Release store of `sq_cursor`.
        self.status.store(st, Ordering::Relaxed);
    }
}

impl Default for SqEntry {
    fn default() -> Self {
        Self::new()
    }
}

/// The combining flag: whoever raises `kicks` from 0 runs the retirement pass until no kick
/// arrived meanwhile; other kickers only count (their work is then seen by that combiner).
pub struct Combiner {
    kicks: CachePadded<AtomicU32>,
}

impl Default for Combiner {
    fn default() -> Self {
        Self::new()
    }
}

impl Combiner {
    /// No combiner running.
    pub fn new() -> Self {
        Self {
            kicks: CachePadded::new(AtomicU32::new(0)),
        }
    }

    /// Runs `advance` now, or makes the running combiner run it again. `advance` runs in one
    /// thread at a time, and at least once after this call began.
    pub fn kick(&self, mut advance: impl FnMut()) {
        // AcqRel: Release publishes what we did before kicking to the running combiner (its
        // Acquire load / failed CAS below); Acquire, when we become the combiner, sees the
        // previous combiner's work (its successful AcqRel CAS).
        if self.kicks.fetch_add(1, Ordering::AcqRel) != 0 {
            return;
        }
        loop {
            // Acquire: pairs with the AcqRel increments of other kickers.
            let k = self.kicks.load(Ordering::Acquire);
            advance();
            // AcqRel: on success our pass is published to the next combiner (its AcqRel
            // increment); on failure we acquire the new kickers' work and go round again.
            if self
                .kicks
                .compare_exchange(k, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// Sequence number of the first WR whose copy failed (`u64::MAX`: none). WRs behind it are not
/// executed and complete with `WrFlushError`.
pub struct ErrSeq(AtomicU64);

impl Default for ErrSeq {
    fn default() -> Self {
        Self::new()
    }
}

impl ErrSeq {
    /// No failure.
    pub fn new() -> Self {
        Self(AtomicU64::new(u64::MAX))
    }

    /// Worker: the copy of WR `seq` failed (after `SqEntry::set_err`).
    pub fn note(&self, seq: u64) {
        // Release: pairs with the Acquire load in `first`: the WR's error status is visible.
        self.0.fetch_min(seq, Ordering::Release);
    }

    /// Worker: WR `seq` is behind a failed one, so its copies may be skipped (a hint).
    pub fn skips(&self, seq: u64) -> bool {
        // Relaxed: a stale read only costs one wasted chunk copy before the error shows.
        seq > self.0.load(Ordering::Relaxed)
    }

    /// Combiner: the first failed WR.
    pub fn first(&self) -> u64 {
        // Acquire: pairs with the Release in `note`.
        self.0.load(Ordering::Acquire)
    }
}
