//! One entry of a QP's inbound ring (WRITE_WITH_IMM delivery) and its publish/take protocol,
//! with small payloads carried *inline* (segment `VERSION` 4).
//!
//! An entry is one cache line: the initiator's combiner writes it with plain stores and
//! publishes it with one Release store of `seq`; the target polls `seq` with Acquire and then
//! reads the rest. A WRITE_WITH_IMM of at most [`INLINE_MAX`] bytes carries its payload in the
//! entry (with the remote address and rkey), so the bytes cross in that one cache-line handoff
//! instead of a `process_vm_writev`; the target copies them into its registered memory before
//! it reports the receive (after re-checking rkey, range and remote-write access against its
//! own registration table: the ring is peer-writable, never trusted).
//! ```text
//!  initiator (combiner, in WR order)              target (poller, in ring order)
//!  raddr, key, data[..], meta   (Relaxed)
//!  seq = t + 1                  (Release) ──────▶ seq == t + 1 ? (Acquire)
//!                                                 read meta, key, raddr, data (Relaxed)
//! ```
//! `seq` is set by a compare-and-swap, not a store: a target QP in the error state flushes a
//! receive whose delivery has not come by swapping `seq` to a *flushed* mark (`flush`), and
//! the initiator's `publish` then fails (the delivery is refused: `RetryExceeded` at the
//! initiator, as an RC responder in error acknowledges nothing). Exactly one of the two wins,
//! so a delivery is either taken by the target or refused at the initiator, never acknowledged
//! and then dropped (the loom model checks it).
//! A payload of up to `segment::BOUNCE_MAX` bytes between a cross-process pair travels
//! *bounced*: the initiator has written it into a bounce slot of the target's segment, and the
//! entry carries the slot's number `b` (in `data[0]`) instead of the bytes; the target copies it
//! out the same way (re-checks included) and then publishes `bounce_done = b + 1` (Release)
//! in its QP head, which the initiator reads (Acquire) before it reuses a slot (`qp.rs`,
//! "Bounce payloads").
//!
//! Why 32 bytes: the entry is one 64-byte line (one handoff, as before), of which the signal
//! (`seq`), `imm << 32 | len`, the remote address and `rkey << 32 | flag` take four words; the
//! other four carry the payload. That holds the 8-byte messages latency-bound collectives send
//! with room to spare; a larger entry would cost a second line (ring memory is 16 KiB per
//! active QP: 256 entries), a smaller one would gain nothing.
//!
//! The module uses `ibnet_core::sync` atomics so that the loom model (`tests/loom_seg.rs`) runs
//! these very functions.
#![allow(missing_docs)] // pub only for the loom model (doc-hidden); documented here

use ibnet_core::sync::{AtomicU64, Ordering};

/// Most payload bytes a ring entry carries inline.
pub const INLINE_MAX: usize = 32;
/// Words of inline payload.
pub const INLINE_WORDS: usize = INLINE_MAX / 8;

/// `key`'s low bit: the entry carries its payload inline.
const K_INLINE: u64 = 1;
/// `key`'s second bit: the payload is in bounce slot `data[0]`.
const K_BOUNCE: u64 = 2;

/// One write-with-immediate delivery (one cache line).
#[repr(C, align(64))]
pub struct RingEntry {
    /// `t + 1` once the entry of delivery `t` is complete.
    seq: AtomicU64,
    /// `imm << 32 | byte_len`.
    meta: AtomicU64,
    /// Inline payload: where it goes in the target.
    raddr: AtomicU64,
    /// Payload: `rkey << 32 | K_INLINE` or `rkey << 32 | K_BOUNCE`; 0 for a delivery without.
    key: AtomicU64,
    /// Inline payload bytes (native byte order of the words).
    data: [AtomicU64; INLINE_WORDS],
}

/// Where the bytes of a payload are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// In the entry: `len` (≤ [`INLINE_MAX`]) bytes of these words.
    Words([u64; INLINE_WORDS]),
    /// In bounce slot `b` (mod the slot count) of the target's QP (`len` ≤ its size).
    Bounce(u64),
}

/// A payload that travels with its immediate, for `raddr`/`rkey` of the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inline {
    pub raddr: u64,
    pub rkey: u32,
    pub body: Body,
}

/// The bytes of payload words (the first `len` are the payload's).
pub fn bytes(words: &[u64; INLINE_WORDS]) -> [u8; INLINE_MAX] {
    let mut b = [0u8; INLINE_MAX];
    for (c, w) in b.chunks_exact_mut(8).zip(words) {
        c.copy_from_slice(&w.to_ne_bytes());
    }
    b
}

/// Packs up to [`INLINE_MAX`] bytes into payload words (the rest zero).
pub fn pack(bytes: &[u8]) -> [u64; INLINE_WORDS] {
    let mut b = [0u8; INLINE_MAX];
    let n = bytes.len().min(INLINE_MAX);
    b[..n].copy_from_slice(&bytes[..n]);
    let mut w = [0u64; INLINE_WORDS];
    for (w, c) in w.iter_mut().zip(b.chunks_exact(8)) {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        *w = u64::from_ne_bytes(a);
    }
    w
}

/// Initiator: may bounce slot number `b` be written? It may once the target has copied out
/// every payload up to `b - slots` (its `done` word, Acquire, re-read only when `seen`, the
/// value last read, says no). A `done` beyond `b` is impossible (peer-written): no.
pub fn bounce_free(b: u64, seen: &mut u64, done: &AtomicU64, slots: u64) -> bool {
    if b.wrapping_sub(*seen) < slots {
        return true;
    }
    // Acquire: pairs with the target's Release in `bounce_release`: its copies out of the
    // slot happened before we write it again.
    let d = done.load(Ordering::Acquire);
    if d > b {
        return false;
    }
    *seen = d;
    b - d < slots
}

/// Target: every bounce payload up to number `b` has been copied out (after the copies).
pub fn bounce_release(done: &AtomicU64, b: u64) {
    // Release: pairs with the initiator's Acquire in `bounce_free`.
    done.store(b.wrapping_add(1), Ordering::Release);
}

/// `seq` of an entry whose receive `t` the target flushed (never `t + 1` of any delivery:
/// counts stay far below 2^63).
const fn flushed(t: u64) -> u64 {
    (t + 1) | 1 << 63
}

/// What the target read from an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub imm: u32,
    pub len: u32,
    /// The payload, when it travelled inline (its `len` not yet validated: see [`INLINE_MAX`]).
    pub inline: Option<Inline>,
}

impl Default for RingEntry {
    fn default() -> Self {
        Self::new()
    }
}

impl RingEntry {
    /// An empty entry (all zero: what a fresh or punched page reads as).
    pub fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            meta: AtomicU64::new(0),
            raddr: AtomicU64::new(0),
            key: AtomicU64::new(0),
            data: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Initiator (the QP's combiner, the only writer of this entry while the target has not
    /// re-posted its receive): publishes delivery `t`. `false`: the target, in the error
    /// state, flushed receive `t` first ([`RingEntry::flush`]), so the delivery did not land.
    pub fn publish(&self, t: u64, imm: u32, len: u32, inline: Option<&Inline>) -> bool {
        // Relaxed: only the target's `flush` writes `seq` besides us; the CAS below decides.
        let cur = self.seq.load(Ordering::Relaxed);
        if cur == flushed(t) {
            return false;
        }
        // Relaxed (all but `seq`): published by the Release store of `seq` below.
        self.meta
            .store(((imm as u64) << 32) | len as u64, Ordering::Relaxed);
        match inline {
            Some(p) => {
                self.raddr.store(p.raddr, Ordering::Relaxed);
                let k = match p.body {
                    Body::Words(words) => {
                        for (d, w) in self.data.iter().zip(words) {
                            d.store(w, Ordering::Relaxed);
                        }
                        K_INLINE
                    }
                    Body::Bounce(b) => {
                        self.data[0].store(b, Ordering::Relaxed);
                        K_BOUNCE
                    }
                };
                self.key
                    .store(((p.rkey as u64) << 32) | k, Ordering::Relaxed);
            }
            None => self.key.store(0, Ordering::Relaxed),
        }
        // Release (success): pairs with the target's Acquire in `take` (and in `flush`'s
        // failure): the fields above, and every byte the initiator's QP copied before (which
        // happened-before this point), are visible. Relaxed (failure): nothing is read.
        // A CAS, not a store: the target's `flush` of the same receive may come first, and
        // then exactly one of the two wins (the fields written above are never read).
        self.seq
            .compare_exchange(cur, t + 1, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Target (the QP's poller), in the error state: flushes receive `t` unless delivery `t`
    /// was published. `true`: flushed, and the initiator's `publish` of `t` fails from now
    /// on (an RC responder in error acknowledges nothing); `false`: the delivery is there,
    /// for `take`. So a delivery is either taken by the target or failed at the initiator,
    /// never acknowledged and then dropped.
    pub fn flush(&self, t: u64) -> bool {
        // Acquire: pairs with `publish`'s Release CAS (a delivery seen here is then read by
        // `take`, whose own Acquire load repeats this).
        let cur = self.seq.load(Ordering::Acquire);
        if cur == t + 1 {
            return false;
        }
        // Relaxed (success): the mark publishes nothing; the CAS's place in `seq`'s
        // modification order alone excludes `publish`'s. Acquire (failure): pairs with
        // `publish`'s Release CAS, as above.
        self.seq
            .compare_exchange(cur, flushed(t), Ordering::Relaxed, Ordering::Acquire)
            .is_ok()
    }

    /// Target (the QP's poller): delivery `t`, if it has been published.
    pub fn take(&self, t: u64) -> Option<Delivery> {
        // Acquire: pairs with the Release store of `seq` in `publish`.
        if self.seq.load(Ordering::Acquire) != t + 1 {
            return None;
        }
        // Relaxed (all): ordered by the Acquire load of `seq`; the initiator does not write
        // this entry again before the target re-posts the receive, which it does after this.
        let meta = self.meta.load(Ordering::Relaxed);
        let key = self.key.load(Ordering::Relaxed);
        let body = if key & K_INLINE != 0 {
            Some(Body::Words(std::array::from_fn(|i| {
                self.data[i].load(Ordering::Relaxed)
            })))
        } else if key & K_BOUNCE != 0 {
            Some(Body::Bounce(self.data[0].load(Ordering::Relaxed)))
        } else {
            None
        };
        let inline = body.map(|body| Inline {
            raddr: self.raddr.load(Ordering::Relaxed),
            rkey: (key >> 32) as u32,
            body,
        });
        Some(Delivery {
            imm: (meta >> 32) as u32,
            len: meta as u32,
            inline,
        })
    }

    /// Owner: resets the entry (control path; published by the QP's `state` store at create).
    pub fn clear(&self) {
        // Relaxed: published by the Release store of the QP's `state` at create.
        self.seq.store(0, Ordering::Relaxed);
    }
}
