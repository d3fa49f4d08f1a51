//! The send-queue protocol of a QP, apart from what it moves: a slot ([`SqEntry`]) with its
//! chunk claims, the combining flag that runs the in-order retirement ([`Combiner`]), and the
//! first failed WR ([`ErrSeq`]). `qp.rs` builds on these; the loom model
//! (`tests/loom_qp.rs`, `--cfg loom`) runs these very functions under every interleaving, which
//! is why every atomic here comes from `ibnet_core::sync` (loom's types under `--cfg loom`).
//!
//! A WR is cut into `n` chunks. Whoever copies — the posting thread, and copy workers holding a
//! *token* `(qp, seq)` — claims chunks one at a time until none is left; the WR has *landed*
//! when every chunk is done. Landing never waits for a token: a worker that wakes late finds
//! nothing to claim and leaves, so the poster may copy everything itself while workers wake.
//! ```text
//!  poster                          copy worker (token seq s)          combiner
//!  entry.store(wr)       Relaxed
//!  arm(s, n, chunk): left = n, chunk Relaxed;
//!    run = tag(s) | n    Release ─▶ claim(s): run tag == s, count > 0?
//!                                   CAS run → count-1 (Acquire) ─ owns chunk count-1
//!  (claims chunks too)              copy; err: set_err, ErrSeq::note (Release)
//!  sq_tail = s+1         Release    chunk_done: left -= 1 (Release) ─▶ == 0: kick
//!  kick ────────────────────────────────────────────────────────▶ landed(): left == 0 (Acquire)
//!                                                                 ─▶ status, ErrSeq::first
//!                                                                 ─▶ sq_cursor (Release)
//! ```
//! A token left over from an earlier WR of the same slot (its WR landed; the slot may hold a
//! new one) sees a different tag, or a count of 0, and claims nothing: a WR lands only once
//! every chunk was claimed, so no stale claim can succeed (the tag holds 32 bits of the
//! sequence number; a token would have to sleep through 2^32 WRs of its QP to be fooled).
#![allow(missing_docs)] // pub only for the loom model (doc-hidden); documented here

use crossbeam_utils::CachePadded;
use ibnet_core::provider::{SendWr, WcStatus, WrOpcode};
use ibnet_core::sync::{AtomicU32, AtomicU64, Ordering};

use crate::ring::{Body, INLINE_WORDS};

pub const OP_WRITE: u32 = 0;
pub const OP_WRITE_IMM: u32 = 1;
pub const OP_READ: u32 = 2;
pub const F_SIGNALED: u32 = 1 << 8;
/// The WR's payload was captured into the entry at post (`inline`): it travels in the
/// target's ring entry (`ring`), not by a copy.
pub const F_INLINE: u32 = 1 << 9;
/// The WR's payload was written into a bounce slot of the target at post (its number in
/// `inline[0]`): it travels bounced (`ring`), not by a copy.
pub const F_BOUNCE: u32 = 1 << 10;

/// One send-queue slot. Fields are atomics (Relaxed) published by `sq_tail` (Release) or by
/// `run` (Release in `arm`, Acquire in a successful claim); only the poster writes them, and only while the slot is free.
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
    /// Chunks not yet done (0: the data has landed, or failed).
    left: AtomicU32,
    /// 0 or the WR's own error status.
    pub status: AtomicU32,
    pub vendor: AtomicU32,
    /// `tag(seq) << 32 | chunks not yet claimed` (claims count down).
    run: AtomicU64,
    /// Chunk size of this WR.
    chunk: AtomicU64,
    /// The payload of an `F_INLINE` WR (`ring::pack`), captured at post.
    inline: [AtomicU64; INLINE_WORDS],
}

// SAFETY: every field is an atomic integer (plain memory under `not(loom)`); all zeros is
// `SqEntry::new()`, a free slot.
#[cfg(not(loom))]
#[allow(unsafe_code)]
unsafe impl crate::zeroed::Zeroable for SqEntry {}

/// A claimed chunk: bytes `[off, off + len)` of the WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub off: u64,
    pub len: u64,
}

fn tag(seq: u64) -> u64 {
    (seq & 0xffff_ffff) << 32
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
            left: AtomicU32::new(0),
            status: AtomicU32::new(0),
            vendor: AtomicU32::new(0),
            run: AtomicU64::new(0),
            chunk: AtomicU64::new(0),
            inline: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Poster: writes `w` into this (free) slot; [`SqEntry::arm`] follows before any copy.
    pub fn store(&self, w: &SendWr) {
        let op = match w.opcode {
            WrOpcode::Write => OP_WRITE,
            WrOpcode::WriteWithImm => OP_WRITE_IMM,
            WrOpcode::Read => OP_READ,
        };
        // Relaxed (all): published by the Release stores of `sq_tail` and of `run` in `arm`.
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
    }

    /// Poster: WR `seq` (stored in this slot) is to be copied in chunks of `chunk` bytes
    /// (`chunk` ≥ 1; 0 chunks for an empty WR, or `copy: false` for a WR with nothing left to
    /// copy: already copied by the poster, or not executed). Returns the number of chunks.
    pub fn arm(&self, seq: u64, chunk: u64, copy: bool) -> u32 {
        let n = if copy {
            // Relaxed: `len` was stored by this thread.
            (self.len.load(Ordering::Relaxed) as u64).div_ceil(chunk.max(1)) as u32
        } else {
            0
        };
        // Relaxed (both): published by the Release store of `run` below (claimers) and by
        // `sq_tail` (the combiner's `landed`).
        self.chunk.store(chunk.max(1), Ordering::Relaxed);
        self.left.store(n, Ordering::Relaxed);
        // Release: pairs with the Acquire of a successful claim: the WR's fields, `chunk` and
        // `left` are visible to whoever copies a chunk.
        self.run.store(tag(seq) | n as u64, Ordering::Release);
        n
    }

    /// Claims the next chunk of WR `seq`; `None` when none is left, or when the slot holds
    /// another WR (a stale token).
    pub fn claim(&self, seq: u64) -> Option<Chunk> {
        // Relaxed: only a successful CAS below (Acquire) hands out a chunk.
        let mut cur = self.run.load(Ordering::Relaxed);
        loop {
            if cur & !0xffff_ffff != tag(seq) || cur & 0xffff_ffff == 0 {
                return None;
            }
            // Acquire: pairs with `arm`'s Release (through the release sequence of the claims'
            // RMWs): the WR's fields are visible. Relaxed on failure: we retry.
            match self
                .run
                .compare_exchange_weak(cur, cur - 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        // The chunk is ours, so the WR cannot land (nor the slot be reused) before we call
        // `chunk_done`: these fields are this WR's.
        // Relaxed (both): ordered by the successful Acquire claim above.
        let chunk = self.chunk.load(Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed) as u64;
        let off = ((cur & 0xffff_ffff) - 1) * chunk;
        Some(Chunk {
            off,
            len: chunk.min(len.saturating_sub(off)),
        })
    }

    /// Chunks of WR `seq` not yet claimed (0 if the slot holds another WR).
    pub fn unclaimed(&self, seq: u64) -> u32 {
        // Relaxed: a hint for handing out tokens; claims themselves are CASes.
        let cur = self.run.load(Ordering::Relaxed);
        if cur & !0xffff_ffff == tag(seq) {
            cur as u32
        } else {
            0
        }
    }

    /// A claimed chunk is done (copied, failed or skipped); `true` for the WR's last one (the
    /// caller must kick the combiner).
    pub fn chunk_done(&self) -> bool {
        // Release: pairs with the Acquire load in `landed` (through the release sequence of
        // these RMWs): this chunk's bytes and the WR's status happen-before its retirement.
        self.left.fetch_sub(1, Ordering::Release) == 1
    }

    /// Poster: the WR's payload travels inline (`words`, packed by `ring::pack`); before
    /// [`SqEntry::arm`].
    pub fn set_inline(&self, words: &[u64; INLINE_WORDS]) {
        // Relaxed (all): published by the Release stores of `run` in `arm` and of `sq_tail`.
        for (d, w) in self.inline.iter().zip(words) {
            d.store(*w, Ordering::Relaxed);
        }
        self.flags.fetch_or(F_INLINE, Ordering::Relaxed);
    }

    /// Poster: the WR's payload is in bounce slot `b` of the target; before [`SqEntry::arm`].
    pub fn set_bounce(&self, b: u64) {
        // Relaxed (both): published by the Release stores of `run` in `arm` and of `sq_tail`.
        self.inline[0].store(b, Ordering::Relaxed);
        self.flags.fetch_or(F_BOUNCE, Ordering::Relaxed);
    }

    /// The payload that travels with the immediate, if the WR carries one (combiner; ordered
    /// by `sq_tail`/`landed`).
    pub fn inline(&self) -> Option<Body> {
        // Relaxed (all): the caller synchronised with the poster (Acquire of `sq_tail`).
        let f = self.flags.load(Ordering::Relaxed);
        if f & F_INLINE != 0 {
            Some(Body::Words(std::array::from_fn(|i| {
                self.inline[i].load(Ordering::Relaxed)
            })))
        } else if f & F_BOUNCE != 0 {
            Some(Body::Bounce(self.inline[0].load(Ordering::Relaxed)))
        } else {
            None
        }
    }

    /// A snapshot of the WR.
    pub fn load(&self) -> Wr {
        // Relaxed (all): the caller synchronised with the poster (sq_tail Acquire or a successful claim).
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
        // Relaxed: the first error wins; published by the Release `left` decrement of the
        // chunk (copiers) or by `sq_tail` (poster).
        if self
            .status
            .compare_exchange(0, st as u32, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.vendor.store(vendor, Ordering::Relaxed);
        }
    }
    /// Combiner: every chunk is done (the data has landed, or failed).
    pub fn landed(&self) -> bool {
        // Acquire: pairs with the Release decrements in `chunk_done`.
        self.left.load(Ordering::Acquire) == 0
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
