//! The lock-free protocols of the shared segment, apart from where they live: a registration
//! slot with its lease counters ([`MrSlot`], protocol in `segment`'s module doc: "Registration
//! leases", "Lanes") and the segment header's publication ([`Header`]). `segment.rs` places
//! these in the memfd; the loom model (`tests/loom_seg.rs`, `--cfg loom`) runs them on the heap
//! under every interleaving, which is why every atomic here comes from `ibnet_core::sync`.
#![cfg_attr(loom, allow(missing_docs))]

use ibnet_core::sync::{AtomicU32, AtomicU64, Ordering};

/// loom does not put SeqCst loads and stores into one total order (tokio-rs/loom#180), which
/// the Dekker pair of `lease` and `invalidate`/`drained` relies on; under loom a SeqCst fence
/// between each side's store and load stands for that order. The real build needs none: there
/// the SeqCst accesses themselves are in the total order.
#[inline(always)]
fn loom_sc_order() {
    #[cfg(loom)]
    ibnet_core::sync::fence(Ordering::SeqCst);
}

/// Lease lanes per registration slot (lane 0 shared, see `segment`).
pub const LANES: usize = 16;
/// The lane of the owner's own copies (`busy_local`).
pub const OWN_LANE: u8 = u8::MAX;
/// Magic at offset 0.
pub const MAGIC: u64 = u64::from_le_bytes(*b"IBNSOFT1");

/// The segment header: identity of the owner, and the lease-lane table.
#[repr(C)]
pub struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    pid: AtomicU32,
    nonce: AtomicU64,
    /// Lease lanes: `pid << 32 | nonce & 0xffff_ffff` of the peer provider that claimed each
    /// (0: free; entry 0 stays free: the shared lane).
    lanes: [AtomicU64; LANES],
}

impl Header {
    /// A zeroed header (the loom model; the segment's is zeroed memfd memory).
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            pid: AtomicU32::new(0),
            nonce: AtomicU64::new(0),
            lanes: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Owner, at create: writes the identity, the magic last.
    pub fn publish(&self, version: u32, pid: i32, nonce: u64) {
        // Relaxed: published by the Release store of `magic` below.
        self.version.store(version, Ordering::Relaxed);
        self.pid.store(pid as u32, Ordering::Relaxed);
        self.nonce.store(nonce, Ordering::Relaxed);
        // Release: pairs with the Acquire in `is`.
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// Peer, at attach: is this the published header of `(version, pid, nonce)`?
    pub fn is(&self, version: u32, pid: i32, nonce: u64) -> bool {
        // Acquire: pairs with the Release store of `magic` in `publish`.
        self.magic.load(Ordering::Acquire) == MAGIC
            // Relaxed (all three): ordered after the Acquire load above.
            && self.version.load(Ordering::Relaxed) == version
            && self.pid.load(Ordering::Relaxed) == pid as u32
            && self.nonce.load(Ordering::Relaxed) == nonce
    }

    /// Is the magic there (Acquire)? The loom model checks that `is` then holds.
    #[cfg(loom)]
    pub fn published(&self) -> bool {
        // Acquire: pairs with the Release store of `magic` in `publish`.
        self.magic.load(Ordering::Acquire) == MAGIC
    }

    /// Peer: claims a lease lane for the provider `(pid, nonce)`; 0 (shared) when full.
    pub fn claim_lane(&self, pid: i32, nonce: u64) -> u8 {
        let tag = (pid as u32 as u64) << 32 | (nonce & 0xffff_ffff).max(1);
        for (i, l) in self.lanes.iter().enumerate().skip(1) {
            // AcqRel/Acquire: a winning CAS's Release pairs with the Acquire of a later
            // claimant's CAS (success or failure) on the same lane. Nothing is published through
            // the tag (it is only ever set from 0, and `lane_pid` reads it Relaxed), so this
            // orders only among claimants.
            match l.compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return i as u8,
                Err(t) if t == tag => return i as u8,
                Err(_) => {}
            }
        }
        0
    }

    /// The pid that claimed `lane` (0: none, or the shared lane).
    pub fn lane_pid(&self, lane: usize) -> i32 {
        // Relaxed: a hint; what rests on it is the process having exited.
        (self.lanes[lane % LANES].load(Ordering::Relaxed) >> 32) as i32
    }
}

/// One registration slot: a read-mostly line, then the lease counters of peers (per lane) and
/// of the owner's own copies on lines of their own (leases from both sides of a ping-pong never
/// share a line, and never invalidate the read-mostly line).
#[repr(C, align(64))]
pub struct MrSlot {
    /// `gen << 1 | valid`.
    state: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    access: AtomicU32,
    _p0: [u32; 9],
    /// Leases held by peers right now, one count per lane.
    busy_remote: [AtomicU32; LANES],
    /// Leases held by the owner's own copies right now.
    busy_local: AtomicU32,
    _p2: [u32; 15],
}

/// Why a lease was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseError {
    /// Bad index, stale generation or deregistered.
    Key,
    /// The range leaves the registration.
    Range,
    /// The registration lacks the access right.
    Access,
}

/// A held lease on a registration: while it lives, the owner's `dereg` waits.
pub struct Lease<'a> {
    busy: &'a AtomicU32,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // Release: pairs with the SeqCst `busy` loads in `drained`: our copy happened before
        // the owner sees the lease gone.
        self.busy.fetch_sub(1, Ordering::Release);
    }
}

impl MrSlot {
    /// An empty slot (the loom model; the segment's are zeroed memfd memory).
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            addr: AtomicU64::new(0),
            len: AtomicU64::new(0),
            access: AtomicU32::new(0),
            _p0: [0; 9],
            busy_remote: core::array::from_fn(|_| AtomicU32::new(0)),
            busy_local: AtomicU32::new(0),
            _p2: [0; 15],
        }
    }

    /// Initiator: a lease on this slot for `key`'s generation over `[addr, addr + len)` with
    /// `need`, counted in `lane` ([`OWN_LANE`]: the owner's own copies).
    #[inline]
    pub fn lease(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: u32,
        lane: u8,
    ) -> Result<Lease<'_>, LeaseError> {
        let busy = if lane == OWN_LANE {
            &self.busy_local
        } else {
            &self.busy_remote[lane as usize % LANES]
        };
        // SeqCst: the Dekker pair with `invalidate` + `drained` (store state, load busy).
        busy.fetch_add(1, Ordering::SeqCst);
        loom_sc_order();
        let lease = Lease { busy };
        // SeqCst: see above; also acquires the fields written before `reg`'s Release store.
        let st = self.state.load(Ordering::SeqCst);
        if st != (((key >> 16) as u64) << 1) | 1 {
            return Err(LeaseError::Key);
        }
        // Relaxed: ordered after the state load above (which synchronised with `reg`).
        let (a, l) = (
            self.addr.load(Ordering::Relaxed),
            self.len.load(Ordering::Relaxed),
        );
        let end = addr.checked_add(len).ok_or(LeaseError::Range)?;
        if addr < a || end > a.saturating_add(l) {
            return Err(LeaseError::Range);
        }
        // Relaxed: as `addr`/`len` above.
        if self.access.load(Ordering::Relaxed) & need != need {
            return Err(LeaseError::Access);
        }
        Ok(lease)
    }

    /// Owner: fills this (free) slot, number `idx`, and makes it valid; returns the key.
    pub fn reg(&self, idx: usize, addr: u64, len: u64, access: u32) -> u32 {
        // Relaxed: only the owner writes `state`.
        let gen = (((self.state.load(Ordering::Relaxed) >> 1) + 1) & 0xffff).max(1);
        // Relaxed: published by the Release store of `state` below.
        self.addr.store(addr, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.access.store(access, Ordering::Relaxed);
        // Release: pairs with the SeqCst (acquiring) state load in `lease`.
        self.state.store((gen << 1) | 1, Ordering::Release);
        ((gen as u32) << 16) | idx as u32
    }

    /// Owner: no new lease may start (then wait for [`MrSlot::drained`]).
    pub fn invalidate(&self) {
        // Relaxed: only the owner writes `state`.
        let st = self.state.load(Ordering::Relaxed);
        // SeqCst: the Dekker pair with `lease` (see `segment`).
        self.state.store(st & !1, Ordering::SeqCst);
        loom_sc_order();
    }

    /// Owner: no lease is held (every copy under one has completed).
    pub fn drained(&self) -> bool {
        // SeqCst (all): the Dekker pair with `lease`; they also acquire the Release of every
        // dropped lease.
        self.busy_local.load(Ordering::SeqCst) == 0
            && self
                .busy_remote
                .iter()
                .all(|b| b.load(Ordering::SeqCst) == 0)
    }

    /// Owner: the lanes (≥ 1) holding leases right now.
    pub fn busy_lanes(&self) -> impl Iterator<Item = usize> + '_ {
        self.busy_remote
            .iter()
            .enumerate()
            .skip(1)
            // Relaxed: a hint for which processes to look at.
            .filter(|(_, b)| b.load(Ordering::Relaxed) != 0)
            .map(|(i, _)| i)
    }

    /// Owner: voids the leases of `lane`, whose process has exited: it runs no copy and never
    /// touches the count again, so nothing it did is lost.
    pub fn void_lane(&self, lane: usize) {
        // SeqCst: like the loads in `drained`.
        self.busy_remote[lane % LANES].store(0, Ordering::SeqCst);
    }
}
