//! The per-device memory-registration cache: fixed capacity, lock-free hits, reference counts.
//!
//! NCCL registers the same buffers over and over (every comm, every channel). Registering memory
//! with the NIC is a slow system call, so each device keeps one [`MrCache`] that maps a
//! page-aligned range to its registration and counts references. The seed keeps a growable array
//! under a mutex and scans it linearly on every register and deregister; this cache is an
//! open-addressing hash table of `N` slots whose hits are a hash, one or two slot probes and one
//! CAS, with no lock and no allocation.
//!
//! # Keys
//! A range `(addr, len)` is cached under `(base, pages)`: `base = addr` rounded down to the page
//! size, `pages` = whole pages up to `addr + len` rounded up. The page size is a parameter (the ffi
//! passes `sysconf(_SC_PAGESIZE)`); it must be a power of two. A length of zero is rejected with
//! [`Error::OutOfRange`] (NCCL never registers 0 bytes and the verbs reject empty registrations;
//! an error is the one deterministic answer). The key ignores how the memory is registered
//! (plain, DMA-BUF), as the seed does: the first registration of a range serves every later one.
//!
//! # Containing registrations
//! With [`acquire_or_contained`](MrCache::acquire_or_contained) (what the plugin uses), a range
//! with no entry of its own is served by a live (READY) entry whose range contains it, as NCCL
//! 2.28 does: it then returns a reference to that container
//! (its value, base and length, under a handle of its own: see "Registrations"), and releasing
//! it releases that reference to the container. This second
//! look scans all `N` slots (one load each, lock-free, no allocation) and runs only when the
//! exact key missed; it takes a reference with the same generation-checked CAS as a hit, so the
//! transitions below are unchanged. A range is registered on its own only when no live entry
//! contains it at the time of the scan (a container published just after is harmless: two
//! overlapping registrations may coexist; only identical ranges are kept unique).
//!
//! # Registrations
//! Every successful acquire is a *registration* with a record of its own in a fixed table of
//! `R` records (`R = N` unless given; `regs.rs` has the record protocol). The [`MrHandle`] it
//! returns is the record's index and generation, not the slot's: two registrations sharing one
//! entry (the same range twice, or a contained range) have two handles. Releasing a handle ends
//! its record (one CAS, so a second release of it is an error) and drops the reference the
//! record held on the slot; [`get`](MrCache::get) goes through the record too, so a released
//! handle reads nothing even while its entry lives on for other registrations. A full record
//! table is [`Error::Full`] `{ what: "MR registrations", .. }`.
//!
//! # Slots and probing
//! A key's *home* is a 64-bit mix of `(base, pages)` modulo `N`; its *window* is the
//! `min(N, 16)` slots from home on (wrapping). Entries live in their window only: a lookup scans
//! at most the window (hits stop at the match, usually the first probe), never the table, so its
//! cost does not grow with the number of cached ranges. Freed slots are immediately reusable:
//! there are no tombstones, because a lookup never stops early at an empty slot.
//!
//! # State word
//! Each slot has one `AtomicU64` state word, the key (`base`, `pages`, two atomics) and the value
//! cell.
//! ```text
//!   63          32 31 29 28    20 19          0
//!  ┌──────────────┬─────┬────────┬─────────────┐
//!  │  generation  │ tag │  pins  │    refs     │      tag: FREE CLAIMED PENDING READY DRAINING
//!  └──────────────┴─────┴────────┴─────────────┘
//! ```
//! The generation goes up by one (skipping 0) on every claim, so a reference taken in an
//! earlier life of the slot is detected as stale by the CAS that would use it. `refs` counts
//! registrations (LIVE records) on the entry; `pins` counts [`get`](MrCache::get) calls
//! copying the value right now.
//!
//! # Transitions (who may do what)
//! ```text
//!          claim: CAS, gen+1         key written           register Ok: value written
//!  FREE ─────────────────▶ CLAIMED ────────────▶ PENDING ──────────────────────────▶ READY(refs 1)
//!   ▲   (any acquirer)       (claimer only)   │ (claimer)        (claimer only)      │    ▲
//!   │                                          │                                      │    │ hit: CAS refs+1
//!   ├──── back off / register Err or panic ───┘                                      │    │ release: CAS refs-1
//!   │     (claimer only)                                                              │    │ get: CAS pins+1, pins-1
//!   │                                                                                 ├────┘
//!   │                                              release of the last ref: CAS refs 1→0
//!   └── wait pins == 0; store FREE ◀── deregister(value) ◀── DRAINING ◀──────────────┘
//!       (drainer only)                  (drainer only)
//! ```
//! * The key is written only in CLAIMED, the value only in PENDING, both by the claimer. Readers
//!   read the key of a PENDING/READY/DRAINING slot and then check that the generation did not move
//!   (a seqlock check); they read the value only while they hold a ref or a pin (or as the
//!   drainer), so it cannot be rewritten under them.
//! * A hit that races with the release of the last reference cannot resurrect the entry: both
//!   are a CAS on the same word; once DRAINING, the hit's CAS fails and it waits for the slot to
//!   become FREE, then registers the range anew.
//!
//! # One registration per range
//! Two threads missing the same key at once may claim two different free slots. Each claimer,
//! after publishing PENDING, issues a `SeqCst` fence and scans the window for the same key:
//! ```text
//!  claimer A                                   claimer B
//!  state[a] = PENDING(K)    (Release)          state[b] = PENDING(K)    (Release)
//!  fence(SeqCst)  ─────── total order S ─────  fence(SeqCst)
//!  scan state[*] for K      (Acquire)          scan state[*] for K      (Acquire)
//! ```
//! Whichever fence comes second in `S` sees the other's PENDING (or what followed it), so of any
//! two concurrent claimers at least one sees the other. On finding the key in another slot:
//! READY → back off (free own slot, start over: it becomes a hit); PENDING at a lower window
//! position → back off; PENDING at a higher position, or DRAINING → wait until it leaves that
//! state, then look again. Waits only point to higher positions or to a drainer (who waits for
//! nobody but `get`), so there is no cycle. Hence at any time at most one registration per range
//! exists, and a range is registered again only after its previous registration was deregistered.
//!
//! # Progress
//! Hits, [`get`](MrCache::get) and releases that do not reach zero are lock-free (a CAS loop).
//! The cold paths wait, by design: an acquirer of a range that is being registered or
//! deregistered by another thread spins (with [`spin_hint`]) until that thread is done, since
//! there must be one registration. Closures must not call back into the same cache for the same
//! range. A panic inside `register` or `deregister` (in an unwinding build) still frees the slot.
//!
//! # Full
//! [`Error::Full`] means every slot of the key's window holds a live registration. Slots in a
//! transient state (claimed, registering, draining) are waited for, not reported as full. With
//! a good hash and `N` about four times the live ranges, a full window is vanishingly rare.
#![allow(unsafe_code)]

mod regs;

use core::fmt;
use core::mem::MaybeUninit;

use crate::error::{Error, Result};
use crate::sync::{fence, spin_hint, AtomicU64, Ordering, UnsafeCell};
use regs::{Regs, MAX_SLOTS};

const REFS_BITS: u32 = 20;
const PINS_BITS: u32 = 9;
const PINS_SHIFT: u32 = REFS_BITS;
const TAG_SHIFT: u32 = REFS_BITS + PINS_BITS;
const GEN_SHIFT: u32 = 32;
const REFS_MASK: u64 = (1 << REFS_BITS) - 1;
const PINS_MASK: u64 = (1 << PINS_BITS) - 1;
const ONE_REF: u64 = 1;
const ONE_PIN: u64 = 1 << PINS_SHIFT;

/// Most references one cached range can hold (the `refs` field is 20 bits wide).
pub const MAX_REFS: u32 = REFS_MASK as u32;
/// Most slots a key may occupy away from its home slot (the probe window is `min(N, PROBE)`).
pub const PROBE: usize = 16;

const FREE: u64 = 0;
const CLAIMED: u64 = 1;
const PENDING: u64 = 2;
const READY: u64 = 3;
const DRAINING: u64 = 4;

#[inline]
const fn word(gen: u32, tag: u64, pins: u64, refs: u64) -> u64 {
    ((gen as u64) << GEN_SHIFT) | (tag << TAG_SHIFT) | (pins << PINS_SHIFT) | refs
}
#[inline]
const fn gen_of(s: u64) -> u32 {
    (s >> GEN_SHIFT) as u32
}
#[inline]
const fn tag_of(s: u64) -> u64 {
    (s >> TAG_SHIFT) & 0b111
}
#[inline]
const fn pins_of(s: u64) -> u64 {
    (s >> PINS_SHIFT) & PINS_MASK
}
#[inline]
const fn refs_of(s: u64) -> u64 {
    s & REFS_MASK
}
/// Whether a slot in state `s` carries a published key.
#[inline]
const fn keyed(s: u64) -> bool {
    matches!(tag_of(s), PENDING | READY | DRAINING)
}

/// One acquire's lookup: the caller's range rounded out to whole pages (its key and length in
/// bytes), the page size, and whether a live registration containing the range serves it
/// ([`MrCache::acquire_or_contained`]).
#[derive(Clone, Copy)]
struct Lookup {
    key: Key,
    bytes: u64,
    page: u64,
    containing: bool,
}

impl Lookup {
    /// The lookup of `[addr, addr + len)` in pages of `page` bytes (errors: [`Key::new`]'s).
    #[inline]
    fn new(addr: u64, len: u64, page: u64, containing: bool) -> Result<Self> {
        let (key, bytes) = Key::new(addr, len, page)?;
        Ok(Self {
            key,
            bytes,
            page,
            containing,
        })
    }
}

/// A cached range: base address rounded down to the page, and its length in whole pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    base: u64,
    pages: u64,
}

impl Key {
    /// Rounds `(addr, len)` out to whole pages of size `page`; returns the key and its length in
    /// bytes.
    fn new(addr: u64, len: u64, page: u64) -> Result<(Self, u64)> {
        if page == 0 || !page.is_power_of_two() {
            return Err(Error::OutOfRange {
                what: "MR page size (a power of two)",
                value: clamp_i64(page),
                min: 1,
                max: 1 << 62,
            });
        }
        let limit = u64::MAX - addr;
        if len == 0 || len > limit {
            return Err(Error::OutOfRange {
                what: "MR length",
                value: clamp_i64(len),
                min: 1,
                max: clamp_i64(limit),
            });
        }
        let mask = page - 1;
        let base = addr & !mask;
        let last = addr + (len - 1); // no overflow: len <= u64::MAX - addr
        let pages = ((last & !mask) - base) / page + 1;
        // Only a range ending in the last page of the address space rounds out to 2^64 bytes.
        let bytes = pages.checked_mul(page).ok_or_else(|| Error::OutOfRange {
            what: "MR length",
            value: clamp_i64(len),
            min: 1,
            max: clamp_i64(limit.saturating_sub(page)),
        })?;
        Ok((Self { base, pages }, bytes))
    }

    /// A 64-bit mix of both fields (murmur3's finalizer over a multiplicative combine), so that
    /// page-aligned bases with zero low bits still spread over all slots.
    #[inline]
    fn hash(self) -> u64 {
        let mut x = self.base
            ^ self
                .pages
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(31);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A handle to one registration: its record's index + the record's generation (module docs,
/// "Registrations"). Each acquire gets its own, also when it shares a cache entry.
///
/// Stale handles (the registration was released, or its record was reused since) are
/// detected: [`MrCache::get`] returns `None` and [`MrCache::release`] an error, whatever became
/// of the entry it shared. A live handle's bits are never 0 (generations start at 1), so
/// [`MrHandle::to_bits`] may serve as a non-NULL C token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrHandle {
    idx: u32,
    gen: u32,
}

impl MrHandle {
    /// The record index.
    #[inline]
    pub fn index(self) -> u32 {
        self.idx
    }
    /// Packs the handle into a `u64` (generation in the high half).
    #[inline]
    pub fn to_bits(self) -> u64 {
        ((self.gen as u64) << 32) | self.idx as u64
    }
    /// Unpacks [`MrHandle::to_bits`]. Any value is accepted; a value that names no live entry is
    /// simply stale.
    #[inline]
    pub fn from_bits(b: u64) -> Self {
        Self {
            idx: b as u32,
            gen: (b >> 32) as u32,
        }
    }
}

/// One reference to a cached registration, as returned by [`MrCache::acquire`].
///
/// Give it back with [`MrCache::release`]`(r.handle, …)`; the cache does not release on drop
/// (the ffi hands the handle to C).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrRef<M> {
    /// This registration's own handle.
    pub handle: MrHandle,
    /// The registration, as `register` returned it.
    pub value: M,
    /// The registered base address (the requested address rounded down to the page).
    pub base: u64,
    /// The registered length in bytes (whole pages).
    pub len: u64,
}

#[repr(C, align(64))]
struct Slot<M> {
    state: AtomicU64,
    base: AtomicU64,
    pages: AtomicU64,
    value: UnsafeCell<MaybeUninit<M>>,
}

impl<M> Slot<M> {
    #[cfg(not(loom))]
    const fn new() -> Self {
        Self {
            state: AtomicU64::new(word(0, FREE, 0, 0)),
            base: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }
    #[cfg(loom)]
    fn new() -> Self {
        Self {
            state: AtomicU64::new(word(0, FREE, 0, 0)),
            base: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Reads the key. Callers validate it by re-reading the generation afterwards.
    #[inline]
    fn key(&self) -> Key {
        Key {
            // Acquire: pairs with the Release key stores in `claim`, so a key from a newer claim
            // makes that claim's generation bump visible to the caller's re-check.
            base: self.base.load(Ordering::Acquire),
            // Acquire: same pair as `base`.
            pages: self.pages.load(Ordering::Acquire),
        }
    }

    /// Spins until the slot leaves state `s` (a different tag or generation).
    fn wait_change(&self, s: u64) {
        loop {
            // Relaxed: only a hint to look again; the looks that follow carry their own ordering.
            let now = self.state.load(Ordering::Relaxed);
            if gen_of(now) != gen_of(s) || tag_of(now) != tag_of(s) {
                return;
            }
            spin_hint();
        }
    }

    /// Copies the value out.
    ///
    /// Callers hold a ref or a pin on a READY state, or are the drainer; they synchronized with
    /// the READY store that published the value (see the call sites).
    #[inline]
    fn read_value(&self) -> M
    where
        M: Copy,
    {
        // SAFETY: the value was written before the Release store of READY, which the caller has
        // acquired (directly or through the release sequence of RMWs that follows it); it is not
        // written again before the slot is FREE, which needs the caller's ref/pin to be gone.
        self.value.with(|p| unsafe { (*p).assume_init() })
    }
}

/// Frees a PENDING slot unless disarmed: used around `register`, so that an error or a panic
/// never leaves a slot stuck.
struct Revert<'a> {
    state: &'a AtomicU64,
    free: u64,
}

impl Drop for Revert<'_> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire claim CAS of the next claimer of this slot.
        self.state.store(self.free, Ordering::Release);
    }
}

/// Finishes a drain (waits out `get` pins, frees the slot), also if `deregister` panics.
struct Drain<'a> {
    state: &'a AtomicU64,
    free: u64,
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        // Acquire: pairs with the Release unpin in `get`: its copy of the value is done.
        while pins_of(self.state.load(Ordering::Acquire)) != 0 {
            spin_hint();
        }
        // Release: pairs with the Acquire claim CAS of the next claimer of this slot: every
        // read of the old value happens before the new value is written.
        self.state.store(self.free, Ordering::Release);
    }
}

/// How a scan of the window ended.
enum Scan<M> {
    Hit(MrRef<M>),
    /// The key is being registered or deregistered in slot `.0` (state `.1`): wait, retry.
    Wait(usize, u64),
    Miss,
}

/// A fixed-capacity, lock-free registration cache of `N` slots (a power of two) holding values
/// `M` (the ffi's MR handle and keys).
///
/// Drive it with [`acquire`](Self::acquire) (register-or-hit, counts a reference) and
/// [`release`](Self::release) (drops a reference, deregisters at zero); [`get`](Self::get) reads
/// an entry by handle. It is `Sync`: share one per device between all threads. The protocol is
/// in the [module docs](self).
///
/// `R` (default `N`, a power of two) is how many registrations may be live at once (module
/// docs, "Registrations").
///
/// Each slot takes 64 bytes (one cache line, for `M` up to 40 bytes) and each record 8;
/// `MrCache<M, 4096>` is 288 KiB. Outside loom builds `new` is `const`, so a cache can live
/// in a `static`.
pub struct MrCache<M, const N: usize, const R: usize = N> {
    slots: [Slot<M>; N],
    regs: Regs<R>,
}

// SAFETY: each slot's value cell is written only by the thread owning the slot in PENDING, which
// no other thread reads, and read only by holders of a ref or pin, or by the drainer, after they
// synchronized with that write (module docs). Values are handed out by copy to other threads, so
// `M: Send`; several threads copy the same `M` at once, so `M: Sync`.
unsafe impl<M: Copy + Send + Sync, const N: usize, const R: usize> Sync for MrCache<M, N, R> {}

impl<M: Copy, const N: usize, const R: usize> Default for MrCache<M, N, R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M, const N: usize, const R: usize> fmt::Debug for MrCache<M, N, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrCache")
            .field("capacity", &N)
            .field("registrations", &R)
            .finish_non_exhaustive()
    }
}

impl<M: Copy, const N: usize, const R: usize> MrCache<M, N, R> {
    /// The probe window: how many slots from a key's home it may occupy.
    const WINDOW: usize = if N < PROBE { N } else { PROBE };
    const CHECK: () = assert!(
        N.is_power_of_two() && N <= MAX_SLOTS && R.is_power_of_two() && R <= 1 << 31,
        "MrCache capacity N must be a power of two <= 2^30, and registrations R one <= 2^31"
    );

    /// An empty cache.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        let () = Self::CHECK;
        Self {
            slots: [const { Slot::new() }; N],
            regs: Regs::new(),
        }
    }
    /// An empty cache.
    #[cfg(loom)]
    pub fn new() -> Self {
        let () = Self::CHECK;
        Self {
            slots: core::array::from_fn(|_| Slot::new()),
            regs: Regs::new(),
        }
    }

    /// Makes `*p` an empty cache in place, slot by slot, so that a large `N` never passes
    /// through the stack (the caller owns the allocation; the core never allocates).
    ///
    /// # Safety
    /// `p` is valid for writes of `Self` and properly aligned; any previous value is
    /// overwritten without being dropped.
    #[cfg(not(loom))]
    pub unsafe fn init_in_place(p: *mut Self) {
        let () = Self::CHECK;
        // SAFETY: `p` is valid and aligned (caller); each element of `slots` is written once
        // through a raw pointer, never read before, and `regs` is built in place by its own
        // `init_in_place` under the same contract (a field of `*p`, valid and aligned).
        unsafe {
            let slots = core::ptr::addr_of_mut!((*p).slots) as *mut Slot<M>;
            for i in 0..N {
                slots.add(i).write(Slot::new());
            }
            Regs::init_in_place(core::ptr::addr_of_mut!((*p).regs));
        }
    }

    /// The capacity `N`.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Like [`acquire`](Self::acquire), but when the range has no entry of its own, a live
    /// registration that contains it serves it (NCCL 2.28's rule): the returned [`MrRef`] then
    /// names the container (value, base, length) under its own handle, and releasing it
    /// releases this reference to the container. Lock-free and allocation-free; the second look costs one load per slot and
    /// runs only when the exact key missed (module docs, "Containing registrations").
    pub fn acquire_or_contained<F>(
        &self,
        addr: u64,
        len: u64,
        page: u64,
        register: F,
    ) -> Result<MrRef<M>>
    where
        F: FnOnce(u64, u64) -> Result<M>,
    {
        self.acquire_impl(Lookup::new(addr, len, page, true)?, register)
    }

    /// Returns a reference to the registration of the page-rounded range around
    /// `[addr, addr + len)`, registering it if it is not cached.
    ///
    /// `register(base, len)` is called with the rounded range, at most once per call, and only
    /// when no registration of that range is live: of many threads acquiring one uncached range
    /// at once, exactly one registers and the others wait for it and share its result. If
    /// `register` fails, its error is returned to that thread, the slot is freed, and waiting
    /// threads try again (calling their own `register`).
    ///
    /// Every call that succeeds is a registration with its own handle (module docs,
    /// "Registrations"), also a hit. A hit is lock-free and allocation-free. Errors:
    /// [`Error::OutOfRange`] for `len == 0`, a range past the end of the address space or a
    /// `page` that is not a power of two; `Full { what: "MR registrations", .. }` when `R`
    /// registrations are live; [`Error::Full`] `{ what: "MR cache", .. }` when the range's probe
    /// window holds only live entries; `Full { what: "MR cache refcount", .. }` at [`MAX_REFS`]
    /// references; or the error `register` returned.
    pub fn acquire<F>(&self, addr: u64, len: u64, page: u64, register: F) -> Result<MrRef<M>>
    where
        F: FnOnce(u64, u64) -> Result<M>,
    {
        self.acquire_impl(Lookup::new(addr, len, page, false)?, register)
    }

    fn acquire_impl<F>(&self, l: Lookup, register: F) -> Result<MrRef<M>>
    where
        F: FnOnce(u64, u64) -> Result<M>,
    {
        // The record first, so that a full table costs no registration; given back if the
        // slot reference fails (or `register` panics). The search starts from the range's hash.
        let rec = self.regs.reserve(l.key.hash() as usize)?;
        let mut r = self.acquire_slot(l, register)?;
        let (idx, gen) = rec.publish(r.handle.idx as usize);
        r.handle = MrHandle { idx, gen };
        Ok(r)
    }

    /// Takes one reference on the entry for `l`'s key (a hit, a containing entry when
    /// `l.containing`, or a new registration). The returned handle names the slot (index + the slot's generation).
    fn acquire_slot<F>(&self, l: Lookup, register: F) -> Result<MrRef<M>>
    where
        F: FnOnce(u64, u64) -> Result<M>,
    {
        let Lookup {
            key,
            bytes,
            page,
            containing,
        } = l;
        let home = key.hash() as usize & (N - 1);
        let (slot, idx, gen) = loop {
            match self.scan(key, bytes, home)? {
                Scan::Hit(r) => return Ok(r),
                Scan::Wait(i, s) => {
                    self.slots[i].wait_change(s);
                    continue;
                }
                Scan::Miss => {}
            }
            // No registration of exactly this range: one that contains it serves as well.
            if containing {
                if let Some(r) = self.scan_containing(key, page)? {
                    return Ok(r);
                }
            }
            let Some((pos, gen)) = self.claim(key, home)? else {
                continue; // waited for a transient slot; look again
            };
            let idx = (home + pos) & (N - 1);
            let slot = &self.slots[idx];
            if self.validate(key, home, pos) {
                break (slot, idx, gen);
            }
            // Release: pairs with the Acquire claim CAS of the next claimer of this slot.
            slot.state.store(word(gen, FREE, 0, 0), Ordering::Release);
        };
        // We own the slot in PENDING and no other registration of `key` is live or pending.
        let revert = Revert {
            state: &slot.state,
            free: word(gen, FREE, 0, 0),
        };
        let value = register(key.base, bytes)?; // on error `revert` frees the slot
        core::mem::forget(revert);
        // SAFETY: the slot is PENDING and ours: nobody reads the value of a PENDING slot, and the
        // readers of its previous life finished before the Release store of FREE that our claim
        // CAS acquired.
        slot.value
            .with_mut(|p| unsafe { p.write(MaybeUninit::new(value)) });
        // Release: publishes the value; pairs with the Acquire hit/pin CAS and scans.
        slot.state.store(word(gen, READY, 0, 1), Ordering::Release);
        Ok(MrRef {
            handle: MrHandle {
                idx: idx as u32,
                gen,
            },
            value,
            base: key.base,
            len: bytes,
        })
    }

    /// Scans the window for `key`: takes a reference on a READY match, or reports a slot that is
    /// registering/deregistering `key`.
    #[inline]
    fn scan(&self, key: Key, bytes: u64, home: usize) -> Result<Scan<M>> {
        let mut wait = None;
        for pos in 0..Self::WINDOW {
            let idx = (home + pos) & (N - 1);
            let slot = &self.slots[idx];
            // Acquire: pairs with the Release store of READY (and the RMWs of its release
            // sequence), so the value is visible once our CAS below succeeds.
            let mut s = slot.state.load(Ordering::Acquire);
            if !keyed(s) || slot.key() != key {
                continue;
            }
            let gen = gen_of(s);
            match self.take_ref(idx, s, key.base, bytes)? {
                Ok(hit) => return Ok(Scan::Hit(hit)),
                Err(now) => s = now,
            }
            if gen_of(s) == gen && matches!(tag_of(s), PENDING | DRAINING) && wait.is_none() {
                wait = Some((idx, s));
            }
        }
        Ok(wait.map_or(Scan::Miss, |(i, s)| Scan::Wait(i, s)))
    }

    /// Takes one reference on slot `idx`, seen in state `s`, while it stays READY in the
    /// generation of `s`. Returns the reference (naming `base` and `len`), or the state that
    /// ended the attempt (another generation, or no longer READY).
    #[inline]
    fn take_ref(
        &self,
        idx: usize,
        mut s: u64,
        base: u64,
        len: u64,
    ) -> Result<core::result::Result<MrRef<M>, u64>> {
        let slot = &self.slots[idx];
        let gen = gen_of(s);
        while gen_of(s) == gen && tag_of(s) == READY {
            if refs_of(s) == REFS_MASK {
                return Err(Error::Full {
                    what: "MR cache refcount",
                    cap: MAX_REFS as usize,
                });
            }
            // Acquire on success: pairs with the Release store of READY (the CAS reads the latest
            // value of READY's release sequence), so the value is visible. The CAS also
            // re-validates the generation, so a key read from a newer life of the slot never
            // yields a wrong hit.
            match slot
                .state
                .compare_exchange(s, s + ONE_REF, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    return Ok(Ok(MrRef {
                        handle: MrHandle {
                            idx: idx as u32,
                            gen,
                        },
                        value: slot.read_value(),
                        base,
                        len,
                    }))
                }
                Err(now) => s = now,
            }
        }
        Ok(Err(s))
    }

    /// Scans every slot for a READY registration whose range contains `key` (pages of size
    /// `page`), and takes a reference on the first one found. The returned [`MrRef`] names the
    /// container: its handle, value, base and length, so releasing it releases the container.
    ///
    /// This is the miss path's second look (NCCL 2.28 reuses a containing registration too): it
    /// costs one state load per slot (`N`), no lock, no allocation. Matching is the same seqlock
    /// as in [`scan`](Self::scan): the key is read after the state and the reference CAS
    /// re-validates the generation, so a key read from another life of the slot never hits.
    fn scan_containing(&self, key: Key, page: u64) -> Result<Option<MrRef<M>>> {
        // `key.pages * page` fits: `Key::new` checked the rounded length.
        let end = key.base + key.pages * page;
        for (idx, slot) in self.slots.iter().enumerate() {
            // Acquire: pairs with the Release store of READY (as in `scan`).
            let s = slot.state.load(Ordering::Acquire);
            if tag_of(s) != READY {
                continue;
            }
            let c = slot.key();
            let Some(c_end) = c
                .pages
                .checked_mul(page)
                .and_then(|b| c.base.checked_add(b))
            else {
                continue; // a key torn across two lives of the slot; the CAS would fail anyway
            };
            if c.base > key.base || c_end < end {
                continue;
            }
            if let Ok(hit) = self.take_ref(idx, s, c.base, c_end - c.base)? {
                return Ok(Some(hit));
            }
        }
        Ok(None)
    }

    /// Claims the first free slot of the window for `key` and publishes it PENDING. Returns its
    /// window position and generation, `Ok(None)` after waiting for a transient slot (look
    /// again), or `Full` when every slot of the window is READY.
    fn claim(&self, key: Key, home: usize) -> Result<Option<(usize, u32)>> {
        let mut transient = None;
        for pos in 0..Self::WINDOW {
            let idx = (home + pos) & (N - 1);
            let slot = &self.slots[idx];
            // Relaxed: a candidate only; the CAS below carries the Acquire.
            let s = slot.state.load(Ordering::Relaxed);
            match tag_of(s) {
                FREE => {
                    let gen = match gen_of(s).wrapping_add(1) {
                        0 => 1,
                        g => g,
                    };
                    let claimed = word(gen, CLAIMED, 0, 0);
                    // Acquire: pairs with the Release store of FREE by the slot's previous owner
                    // (drainer or backed-off claimer): its accesses to key and value are done.
                    // (The SeqCst fence below would also acquire it; this states the intent.)
                    let won = slot.state.compare_exchange(
                        s,
                        claimed,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    );
                    if won.is_err() {
                        continue; // taken meanwhile; try the next slot
                    }
                    // Release: pairs with the Acquire key loads in `Slot::key`; orders the CLAIMED
                    // generation bump before the key (seqlock writer side).
                    slot.base.store(key.base, Ordering::Release);
                    // Release: same pair as `base`.
                    slot.pages.store(key.pages, Ordering::Release);
                    // Release: pairs with the Acquire loads of `scan` and `validate`, which then
                    // see the key.
                    slot.state
                        .store(word(gen, PENDING, 0, 0), Ordering::Release);
                    // SeqCst: pairs with the same fence of every other claimer (module docs: of
                    // two claimers at least one sees the other's PENDING in `validate`).
                    fence(Ordering::SeqCst);
                    return Ok(Some((pos, gen)));
                }
                READY => {}
                _ => {
                    if transient.is_none() {
                        transient = Some((idx, s));
                    }
                }
            }
        }
        match transient {
            Some((idx, s)) => {
                self.slots[idx].wait_change(s);
                Ok(None)
            }
            None => Err(Error::Full {
                what: "MR cache",
                cap: N,
            }),
        }
    }

    /// After publishing PENDING at window position `mine`: may this claimer register `key`?
    /// `false` means back off (free the slot and look again).
    fn validate(&self, key: Key, home: usize, mine: usize) -> bool {
        for pos in (0..Self::WINDOW).filter(|&p| p != mine) {
            let slot = &self.slots[(home + pos) & (N - 1)];
            loop {
                // Acquire: pairs with the Release store of PENDING/READY, so the key is visible;
                // it follows our SeqCst fence, so it sees any claimer whose fence came first.
                let s = slot.state.load(Ordering::Acquire);
                if !keyed(s) {
                    break;
                }
                let k = slot.key();
                // Acquire: same pair as `s` (the Release stores of PENDING in `claim` and READY
                // in `acquire_impl`). The seqlock re-check itself rests on the key loads' Acquire
                // (pairing with `claim`'s Release key stores): a key from a newer claim makes its
                // generation bump visible here, so a changed generation means the key may be from
                // another life of the slot.
                let s2 = slot.state.load(Ordering::Acquire);
                if gen_of(s2) != gen_of(s) {
                    continue;
                }
                if k != key {
                    break;
                }
                match tag_of(s2) {
                    READY => return false,
                    PENDING if pos < mine => return false,
                    PENDING | DRAINING => slot.wait_change(s2),
                    _ => break, // it backed off, failed or finished draining
                }
            }
        }
        true
    }

    /// Ends the registration `handle` (one [`acquire`](Self::acquire)) and drops the reference
    /// it held on its entry. The entry's last reference calls `deregister(value)` exactly once
    /// and frees the slot (also when `deregister` fails; its error is returned).
    ///
    /// Errors: [`Error::BadState`] `{ op: "MR cache release", .. }` for a handle that names no
    /// live registration: never acquired, from another cache, or released already (a second
    /// release of a handle is refused even while other registrations keep its entry alive;
    /// of two concurrent releases of one handle exactly one succeeds).
    #[inline]
    pub fn release<F>(&self, handle: MrHandle, deregister: F) -> Result<()>
    where
        F: FnOnce(M) -> Result<()>,
    {
        let Some(idx) = self.regs.free(handle.idx, handle.gen) else {
            return Err(Error::BadState {
                op: "MR cache release",
                state: "stale or unknown handle",
            });
        };
        self.release_slot(idx, deregister)
    }

    /// Drops one reference on slot `idx`, which the caller's (just ended) record held.
    #[inline]
    fn release_slot<F>(&self, idx: usize, deregister: F) -> Result<()>
    where
        F: FnOnce(M) -> Result<()>,
    {
        let slot = &self.slots[idx];
        // Relaxed: a candidate only; the CAS below carries the ordering. It sees our reference
        // (READY, refs >= 1, the generation it was taken in): the record's Acquire CAS in
        // `Regs::free` ordered the reference's CAS before this load.
        let mut s = slot.state.load(Ordering::Relaxed);
        let gen = gen_of(s);
        loop {
            if gen_of(s) != gen || tag_of(s) != READY || refs_of(s) == 0 {
                // Unreachable while records and references agree; an error, not a panic.
                return Err(Error::BadState {
                    op: "MR cache release",
                    state: "the registration's entry holds no reference for it",
                });
            }
            if refs_of(s) > 1 {
                // Release: pairs with the Acquire CAS of the last releaser: our copy of the value
                // happens before the slot is drained and reused.
                match slot.state.compare_exchange(
                    s,
                    s - ONE_REF,
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Ok(()),
                    Err(now) => s = now,
                }
            } else {
                let draining = word(gen, DRAINING, pins_of(s), 0);
                // Acquire: pairs with the Release decrements of the other holders (we read the
                // end of their release sequence); a concurrent hit's CAS now fails.
                match slot
                    .state
                    .compare_exchange(s, draining, Ordering::Acquire, Ordering::Relaxed)
                {
                    Ok(_) => break,
                    Err(now) => s = now,
                }
            }
        }
        let drain = Drain {
            state: &slot.state,
            free: word(gen, FREE, 0, 0),
        };
        // We are the drainer: the value is not rewritten before our FREE store.
        let value = slot.read_value();
        let result = deregister(value);
        drop(drain); // waits out `get` pins, frees the slot
        result
    }

    /// The value of a live registration, or `None` if `handle` is stale (released, or never
    /// one of this cache's). Lock-free; safe to call with any handle, also concurrently with
    /// its release.
    ///
    /// It reads the record, pins the slot the record names, and reads the record again: an
    /// unchanged record held its reference all along, so the pinned slot is in the life the
    /// registration holds. (If the record was ended and the slot reused meanwhile, the pin's
    /// Acquire CAS synchronizes with that reuse's READY store, which comes after the record's
    /// end in happens-before: the second read then cannot return the old word.)
    pub fn get(&self, handle: MrHandle) -> Option<M> {
        let (w, idx) = self.regs.live(handle.idx, handle.gen)?;
        let slot = self.slots.get(idx)?;
        // Relaxed: a candidate only; the CAS below carries the Acquire. It is not older than
        // the record's reference (the Acquire load in `Regs::live` ordered it after).
        let mut s = slot.state.load(Ordering::Relaxed);
        loop {
            if tag_of(s) != READY {
                return None; // the record was ended since (a LIVE record keeps its slot READY)
            }
            if pins_of(s) == PINS_MASK {
                spin_hint(); // 511 concurrent `get`s of one entry: wait for one to finish
                             // Relaxed: a candidate only, as above.
                s = slot.state.load(Ordering::Relaxed);
                continue;
            }
            // Acquire: pairs with the Release store of READY (through its release sequence of
            // RMWs), so the value is visible.
            match slot
                .state
                .compare_exchange(s, s + ONE_PIN, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        let value = self.regs.still(handle.idx, w).then(|| slot.read_value());
        // Release: pairs with the Acquire pin check in `Drain::drop`: our copy is done before
        // the slot is freed.
        slot.state.fetch_sub(ONE_PIN, Ordering::Release);
        value
    }

    /// The reference count of the entry a live registration shares (how many registrations
    /// hold it), or `None` if `handle` is stale (a snapshot, for diagnostics and tests).
    pub fn refcount(&self, handle: MrHandle) -> Option<u32> {
        let (_, idx) = self.regs.live(handle.idx, handle.gen)?;
        let s = self.slots.get(idx)?.state.load(Ordering::Relaxed); // Relaxed: snapshot, nothing read through it
        (tag_of(s) == READY).then_some(refs_of(s) as u32)
    }

    /// How many registrations are live right now (acquired, not released): a snapshot that
    /// scans all `R` records, for diagnostics and tests only.
    pub fn registrations(&self) -> usize {
        self.regs.count_live()
    }

    /// How many entries are live (READY) right now: a snapshot that scans all `N` slots, for
    /// diagnostics and tests only.
    pub fn live(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| tag_of(s.state.load(Ordering::Relaxed)) == READY) // Relaxed: snapshot, nothing read through it
            .count()
    }

    /// How many slots are not FREE right now (live, or registering/deregistering): a snapshot
    /// that scans all `N` slots, for diagnostics and tests only.
    pub fn occupied(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| tag_of(s.state.load(Ordering::Relaxed)) != FREE) // Relaxed: snapshot, nothing read through it
            .count()
    }

    /// Ends every registration still live and empties the cache, for its owner's teardown
    /// (NCCL may finalize without deregistering everything): each live entry's value goes to
    /// `deregister` once, whatever its reference count, and every record ends, so a handle
    /// from before reads as stale. Returns `(registrations, entries)`: how many records were
    /// live and how many entries were deregistered. `&mut self`: no other thread can hold or
    /// use the cache meanwhile, so this is no part of the lock-free protocol above.
    pub fn drain_all<F: FnMut(M)>(&mut self, mut deregister: F) -> (usize, usize) {
        let regs = self.regs.end_all();
        let mut entries = 0;
        for slot in self.slots.iter() {
            // Relaxed: no other thread has the cache (`&mut self`); no pair.
            let s = slot.state.load(Ordering::Relaxed);
            // No other tag is possible without another thread (an acquire or release runs
            // its slot back to FREE or READY before it returns, also on error or panic).
            if tag_of(s) != READY {
                continue;
            }
            let value = slot.read_value();
            // Relaxed: as above. Freed before `deregister` runs: a panic there leaves no
            // entry behind that a later drain would deregister again.
            slot.state
                .store(word(gen_of(s), FREE, 0, 0), Ordering::Relaxed);
            entries += 1;
            deregister(value);
        }
        (regs, entries)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
