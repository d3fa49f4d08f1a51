//! Registration records: one per [`acquire`](super::MrCache::acquire), each with its own
//! generation, naming the cache slot whose reference it holds.
//!
//! Several registrations may share one cache entry (the same range twice, or a range inside
//! a cached one); each still gets a record of its own, and the handle it returns names the
//! record (index + the record's generation), never the slot. So releasing a registration
//! twice, or using its handle after its release, is detected even while the shared entry
//! lives on for the other registrations.
//!
//! # Record word
//! ```text
//!   63          32 31 30 29                0
//!  ┌──────────────┬─────┬───────────────────┐
//!  │  generation  │ tag │  cache slot index  │      tag: FREE RESERVED LIVE
//!  └──────────────┴─────┴───────────────────┘
//! ```
//! ```text
//!          reserve: CAS, gen+1            publish (slot ref held): store
//!  FREE ───────────────────────▶ RESERVED ─────────────────────────────▶ LIVE(slot)
//!   ▲   (any acquirer)              │  (reserver only)                     │
//!   ├──── acquire failed: store ────┘                                      │
//!   └──────────────────────── release: CAS LIVE(gen, slot) → FREE(gen) ◀───┘  (one winner)
//! ```
//! A LIVE record holds one reference on its slot, so the slot stays READY, in one generation,
//! for as long as the record is LIVE; the record need not store the slot's generation.
//! A reader (`get`) loads the record, pins the slot, then loads the record again: an
//! unchanged word means the pin is on the slot life the record holds (see `MrCache::get`).
//!
//! Capacity: `R` records, fixed. Reserving first tries the record the caller derives from the
//! range's hash (free in the common case: one probe, nothing shared written); if it is taken
//! (another registration of the same range, or a collision) it scans from a rotating cursor,
//! so that many registrations of one range do not pile up behind one start (which would cost
//! each one probe per registration before it). A table without a free record is
//! [`Error::Full`] `{ what: "MR registrations", cap: R }`, reported before the cache is touched.

use crate::error::{Error, Result};
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

const GEN_SHIFT: u32 = 32;
const TAG_SHIFT: u32 = 30;
const IDX_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// Most slots a cache with records may have (the slot index field is 30 bits).
pub(super) const MAX_SLOTS: usize = 1 << TAG_SHIFT;

const FREE: u64 = 0;
const RESERVED: u64 = 1;
const LIVE: u64 = 2;

#[inline]
const fn rword(gen: u32, tag: u64, slot: u64) -> u64 {
    ((gen as u64) << GEN_SHIFT) | (tag << TAG_SHIFT) | slot
}
#[inline]
const fn rgen(w: u64) -> u32 {
    (w >> GEN_SHIFT) as u32
}
#[inline]
const fn rtag(w: u64) -> u64 {
    (w >> TAG_SHIFT) & 0b11
}
#[inline]
const fn rslot(w: u64) -> usize {
    (w & IDX_MASK) as usize
}

/// A fixed table of `R` registration records (a power of two).
pub(super) struct Regs<const R: usize> {
    recs: [AtomicU64; R],
    /// Where a scan starts when the caller's first choice is taken (a hint; an RMW, so two
    /// scanners start apart).
    cursor: AtomicUsize,
}

impl<const R: usize> Regs<R> {
    /// An empty table.
    #[cfg(not(loom))]
    pub(super) const fn new() -> Self {
        Self {
            recs: [const { AtomicU64::new(rword(0, FREE, 0)) }; R],
            cursor: AtomicUsize::new(0),
        }
    }
    /// An empty table.
    #[cfg(loom)]
    pub(super) fn new() -> Self {
        Self {
            recs: core::array::from_fn(|_| AtomicU64::new(rword(0, FREE, 0))),
            cursor: AtomicUsize::new(0),
        }
    }

    /// Makes `*p` an empty table in place, record by record (never through the stack).
    ///
    /// # Safety
    /// `p` is valid for writes of `Self` and properly aligned; any previous value is
    /// overwritten without being dropped.
    #[cfg(not(loom))]
    pub(super) unsafe fn init_in_place(p: *mut Self) {
        // SAFETY: `p` is valid and aligned (caller); each field, and each record, is written
        // once through a raw pointer, never read before.
        unsafe {
            let recs = core::ptr::addr_of_mut!((*p).recs) as *mut AtomicU64;
            for i in 0..R {
                recs.add(i).write(AtomicU64::new(rword(0, FREE, 0)));
            }
            core::ptr::addr_of_mut!((*p).cursor).write(AtomicUsize::new(0));
        }
    }

    /// Reserves a free record for one acquire: record `first` (modulo `R`) if it is free, else
    /// the first free one from the cursor on. The reservation is given back on drop unless
    /// [`Reservation::publish`] makes it LIVE.
    #[inline]
    pub(super) fn reserve(&self, first: usize) -> Result<Reservation<'_>> {
        if let Some(r) = self.try_take(first & (R - 1)) {
            return Ok(r);
        }
        // Relaxed: a starting point only; `try_take`'s CAS decides.
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        for k in 0..R {
            if let Some(r) = self.try_take(start.wrapping_add(k) & (R - 1)) {
                return Ok(r);
            }
        }
        Err(Error::Full {
            what: "MR registrations",
            cap: R,
        })
    }

    /// Reserves record `idx` if it is free.
    #[inline]
    fn try_take(&self, idx: usize) -> Option<Reservation<'_>> {
        let rec = &self.recs[idx];
        // Relaxed: a candidate only; the CAS below decides.
        let w = rec.load(Ordering::Relaxed);
        if rtag(w) != FREE {
            return None;
        }
        let gen = match rgen(w).wrapping_add(1) {
            0 => 1, // handles are never 0
            g => g,
        };
        // Relaxed: the record carries nothing but this word. Its previous owner (a releaser's
        // CAS to FREE) left no data behind, and the new life is published to readers by the
        // Release store in `publish` (paired with the Acquire loads in `live` and `free`).
        rec.compare_exchange(
            w,
            rword(gen, RESERVED, 0),
            Ordering::Relaxed,
            Ordering::Relaxed,
        )
        .ok()?;
        Some(Reservation {
            rec,
            idx: idx as u32,
            gen,
        })
    }

    /// The word and slot of the LIVE record `(idx, gen)`, or `None` if it names no live
    /// registration.
    #[inline]
    pub(super) fn live(&self, idx: u32, gen: u32) -> Option<(u64, usize)> {
        // Acquire: pairs with the Release store of LIVE in `publish`: the slot reference the
        // record holds (the acquirer's CAS on the slot state) is visible from here on.
        let w = self.recs.get(idx as usize)?.load(Ordering::Acquire);
        (rgen(w) == gen && rtag(w) == LIVE).then_some((w, rslot(w)))
    }

    /// Whether record `idx` still holds the word `w` (read by [`live`](Self::live) before).
    #[inline]
    pub(super) fn still(&self, idx: u32, w: u64) -> bool {
        // Acquire: pairs with the Release store of LIVE in `publish` (as in `live`). What makes
        // the re-check sound is that it comes after the caller's Acquire pin CAS on the slot
        // (program order): see `MrCache::get`.
        self.recs[idx as usize].load(Ordering::Acquire) == w
    }

    /// Ends the LIVE record `(idx, gen)`; returns the slot whose reference it held, or `None`
    /// if it names no live registration (stale, released already, never issued). Of two
    /// concurrent releases of one record exactly one gets the slot.
    #[inline]
    pub(super) fn free(&self, idx: u32, gen: u32) -> Option<usize> {
        let rec = self.recs.get(idx as usize)?;
        // Relaxed: a candidate only; the CAS below carries the Acquire.
        let w = rec.load(Ordering::Relaxed);
        if rgen(w) != gen || rtag(w) != LIVE {
            return None;
        }
        // Acquire: pairs with the Release store of LIVE in `publish`, so the slot reference
        // this record holds is visible to the slot release that follows.
        rec.compare_exchange(w, rword(gen, FREE, 0), Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        Some(rslot(w))
    }

    /// How many records are LIVE right now (a snapshot, for diagnostics and tests).
    pub(super) fn count_live(&self) -> usize {
        self.recs
            .iter()
            .filter(|r| rtag(r.load(Ordering::Relaxed)) == LIVE) // Relaxed: snapshot, nothing read through it
            .count()
    }

    /// Ends every LIVE record (keeping its generation, so its handle reads as stale); returns
    /// how many there were. `&mut self`: the caller has the table to itself (no record can be
    /// RESERVED, and nobody reads one meanwhile).
    pub(super) fn end_all(&mut self) -> usize {
        let mut n = 0;
        for r in self.recs.iter() {
            // Relaxed (both): no other thread has the table (`&mut self`); no pair.
            let w = r.load(Ordering::Relaxed);
            if rtag(w) == LIVE {
                r.store(rword(rgen(w), FREE, 0), Ordering::Relaxed);
                n += 1;
            }
        }
        n
    }
}

/// A reserved record; freed on drop (an acquire that failed or panicked) unless published.
pub(super) struct Reservation<'a> {
    rec: &'a AtomicU64,
    idx: u32,
    gen: u32,
}

impl Reservation<'_> {
    /// Makes the record LIVE, holding the reference the caller took on `slot`; returns the
    /// registration's `(index, generation)`.
    #[inline]
    pub(super) fn publish(self, slot: usize) -> (u32, u32) {
        debug_assert!((slot as u64) <= IDX_MASK);
        // Release: pairs with the Acquire loads in `live` and the Acquire CAS in `free`: the
        // slot reference taken before (the CAS on the slot state) is visible to whoever sees
        // the record LIVE.
        self.rec
            .store(rword(self.gen, LIVE, slot as u64), Ordering::Release);
        let out = (self.idx, self.gen);
        core::mem::forget(self);
        out
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        // Relaxed: a reserved record was never published, so nobody reads through it; the
        // next reserver's CAS needs only this word.
        self.rec.store(rword(self.gen, FREE, 0), Ordering::Relaxed);
    }
}
