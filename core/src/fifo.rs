//! The receiver-posted FIFO of clear-to-send elements.
//!
//! The receiver drives a transfer: `irecv` tells the sender where to write by RDMA-writing one
//! [`FifoElem`] per receive buffer into the sender's [`FifoRing`]. The sender's `isend` polls the
//! ring slot of its next sequence number and, once every element of that slot has arrived,
//! writes the data.
//!
//! ```text
//!  receiver (writer)                                   sender (reader)
//!  elems[s][r] = {addr,size,rkey,nreqs,tag,rails,check} seq = fifo_head; s = seq % SLOTS
//!  elems[s][r].idx = seq+1            (Release) ──RDMA──▶ elems[s][0].idx == seq+1 ? (Acquire)
//!                                                       nreqs = elems[s][0].nreqs
//!                                                       elems[s][r].idx == seq+1 ∀r<nreqs (Acquire)
//!                                                       read fields; verify check  → use
//! ```
//!
//! * `idx` is the sequence number plus one, so a zeroed ring and every previous lap read as
//!   "not posted"; sequence numbers are 64-bit and never wrap.
//! * An element is 64 bytes (a 32-byte multiple) and the ring is 64-byte aligned, so PCIe
//!   relaxed ordering cannot split an element across write transactions.
//! * The element also carries `check`, a hash of all its other fields. A reader that sees the
//!   right `idx` but a wrong `check` is looking at an element still in flight (a NIC or a
//!   kernel copy may make the bytes of one write visible in any order) and tries again later.
//!   This makes the protocol independent of how the provider orders bytes within one write.
//! * The reader never spins: an incomplete slot is reported as "not yet".
//! * `rails` is the same in every element of a slot: a fused receiver's live-rail mask (bit `r`:
//!   rail `r` is in use at the receiver when it posted this receive; see `crate::fused`), 0 from
//!   a plain comm, whose sender ignores it. A slot whose elements disagree is a fault. With
//!   `rails` 0 an element's bytes and `check` are what they were before the word had a meaning.
//!
//! In the local, in-memory form (the loom models, and the receiver's staging copy) the writer
//! stores the fields with `Relaxed` and `idx` with `Release`; the reader loads `idx` with
//! `Acquire` before the fields.
//!
//! ## The sizes FIFO (multi-receive sizes, as NCCL 2.19+)
//!
//! A ring also holds one row of [`MAX_RECVS`] 32-bit sizes per slot. The *receiver's* ring
//! (its staging copy) is where the sender says how many bytes each send of a multi-receive
//! carried: the sender fills the row of its own ring ([`FifoRing::stage_sizes`], the local
//! source), and the write-with-immediate that completes the multi-receive writes those
//! `4·nreqs` bytes into the receiver's row of the same slot. The receiver reads its row
//! ([`FifoRing::sizes`]) only after that write's completion, which the provider delivers
//! after the bytes landed (RC), and checks every size against the buffer it posted. A single
//! receive needs no row: its immediate is its size.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Most receive buffers in one multi-receive (`maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Outstanding operations per comm NCCL 2.28 may issue (`NCCL_NET_MAX_REQUESTS`).
pub const NET_MAX_REQUESTS: usize = 32;
/// Request slots per comm: 32 operations × 8 receives. Also the number of FIFO slots.
pub const MAX_REQUESTS: usize = NET_MAX_REQUESTS * MAX_RECVS;

/// One clear-to-send element, as it sits in memory and on the wire (host byte order; both peers
/// run the same build).
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct FifoElem {
    addr: AtomicU64,
    size: AtomicU64,
    rkey: AtomicU32,
    nreqs: AtomicU32,
    tag: AtomicU32,
    /// The receiver's live-rail mask (module doc); 0 from a plain comm.
    rails: AtomicU32,
    idx: AtomicU64,
    check: AtomicU64,
    // Atomic like every other field: a provider writes whole elements into this memory.
    _pad: [AtomicU64; 2],
}

// The wire layout (loom's instrumented atomics are larger, so only the real build is checked).
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<FifoElem>() == 64);
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<FifoElem>().is_multiple_of(32));
const _: () = assert!(core::mem::align_of::<FifoElem>() >= 64);

/// What one posted receive says to the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PostedRecv {
    /// Address of the receive buffer in the receiver's memory.
    pub addr: u64,
    /// Size of the receive buffer.
    pub size: u64,
    /// The receive buffer's rkey.
    pub rkey: u32,
    /// The tag (NCCL: the remote rank).
    pub tag: u32,
}

/// Why a slot the reader looked at is unusable (a protocol violation by the writer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FifoFault {
    /// The offending field.
    pub field: &'static str,
    /// Its value.
    pub value: u64,
}

/// The hash stored in `check` (a 64-bit mix; not cryptographic: it detects torn elements).
/// `rails` shares a word with `nreqs`, so an element with `rails` 0 hashes as before.
// Inline: `publish_rails` (every irecv) and `poll_rails` (every isend) hash each element, and
// being generic they are compiled in the caller's crate, where this plain fn was an
// out-of-line call through the GOT with the element spilled for the reference (callgrind:
// -20 instr per message in core_cycle, proxy_step and bare_step).
#[inline]
fn check_of(p: &PostedRecv, nreqs: u32, rails: u32, idx: u64) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for w in [
        p.addr,
        p.size,
        ((p.rkey as u64) << 32) | p.tag as u64,
        nreqs as u64 | (rails as u64) << 32,
        idx,
    ] {
        h ^= w;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    h | 1 // never 0, so a zeroed element never verifies
}

/// A ring of `SLOTS` slots of [`MAX_RECVS`] elements each.
///
/// `FifoRing` (with the default `SLOTS`) is what a sender registers for its peer to write into,
/// and what a receiver stages its posts in. Small `SLOTS` exist for the loom models.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct FifoRing<const SLOTS: usize = MAX_REQUESTS> {
    slots: [[FifoElem; MAX_RECVS]; SLOTS],
    /// A few bytes of registered memory a flush may read into.
    scratch: [AtomicU64; 8],
    /// The sizes FIFO: per slot, the bytes each send of a multi-receive carried (module doc).
    sizes: [[AtomicU32; MAX_RECVS]; SLOTS],
}

impl<const SLOTS: usize> Default for FifoRing<SLOTS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const SLOTS: usize> FifoRing<SLOTS> {
    /// A zeroed ring (no slot posted).
    pub fn new() -> Self {
        const { assert!(SLOTS > 0) };
        Self {
            slots: core::array::from_fn(|_| core::array::from_fn(|_| FifoElem::default())),
            scratch: core::array::from_fn(|_| AtomicU64::new(0)),
            sizes: core::array::from_fn(|_| core::array::from_fn(|_| AtomicU32::new(0))),
        }
    }

    /// The ring's size in bytes (what is registered).
    pub const BYTES: usize = core::mem::size_of::<Self>();

    /// The ring slot of sequence number `seq`.
    #[inline]
    pub fn slot_of(seq: u64) -> usize {
        (seq % SLOTS as u64) as usize
    }

    /// Byte offset of `slot` from the start of the ring.
    #[inline]
    pub fn slot_offset(slot: usize) -> usize {
        slot * MAX_RECVS * core::mem::size_of::<FifoElem>()
    }

    /// Address of the ring (what is registered and sent to the peer).
    #[inline]
    pub fn base_addr(&self) -> u64 {
        self as *const Self as u64
    }

    /// Address of the scratch words a flush reads into.
    #[inline]
    pub fn scratch_addr(&self) -> u64 {
        self.scratch.as_ptr() as u64
    }

    /// Address of slot `slot`'s row of the sizes FIFO (`MAX_RECVS` × 4 bytes).
    #[inline]
    pub fn sizes_addr(&self, slot: usize) -> u64 {
        self.sizes[slot % SLOTS].as_ptr() as u64
    }

    /// Address of the whole sizes FIFO (what a receiver registers for its peer to write).
    #[inline]
    pub fn sizes_base(&self) -> u64 {
        self.sizes.as_ptr() as u64
    }

    /// Bytes of the whole sizes FIFO.
    pub const SIZES_BYTES: usize = SLOTS * MAX_RECVS * 4;

    /// Byte offset of slot `slot`'s row from [`FifoRing::sizes_base`].
    #[inline]
    pub fn sizes_offset(slot: usize) -> usize {
        (slot % SLOTS) * MAX_RECVS * 4
    }

    /// Sender side: stores `sizes` in slot `slot`'s row, the local source of the write that
    /// carries them to the receiver. Returns the row's address and the bytes to write.
    ///
    /// Each size must fit 32 bits (sends are at most `MAX_MSG_SIZE`, below 2³¹; checked by
    /// the caller).
    pub fn stage_sizes(&self, slot: usize, sizes: &[u64]) -> (u64, usize) {
        let n = sizes.len().min(MAX_RECVS);
        for (cell, &v) in self.sizes[slot % SLOTS].iter().zip(&sizes[..n]) {
            // Relaxed: the provider reads the row after `post_send`, which the posting thread
            // performs after these stores (program order; a NIC reads after the doorbell).
            cell.store(v as u32, Ordering::Relaxed);
        }
        (self.sizes_addr(slot), n * 4)
    }

    /// Receiver side: the first `n` sizes of slot `slot`'s row, as the peer wrote them.
    ///
    /// Call only after the completion of the write-with-immediate that carried them.
    pub fn sizes(&self, slot: usize, n: usize) -> [u64; MAX_RECVS] {
        let mut out = [0u64; MAX_RECVS];
        for (o, cell) in out
            .iter_mut()
            .zip(&self.sizes[slot % SLOTS][..n.min(MAX_RECVS)])
        {
            // Relaxed: the provider delivered the completion (taken from the CQ with Acquire,
            // or after a NIC's DMA) only after these bytes landed.
            *o = cell.load(Ordering::Relaxed) as u64;
        }
        out
    }

    /// Receiver side: the size of buffer `i` as published in slot `slot` (what this side
    /// posted; the staging copy keeps it until the slot is posted again).
    pub fn posted_size(&self, slot: usize, i: usize) -> u64 {
        // Relaxed: written by this thread in `publish`.
        self.slots[slot % SLOTS][i % MAX_RECVS]
            .size
            .load(Ordering::Relaxed)
    }

    /// Writer side: fills slot `seq % SLOTS` with `elems`, `idx` last. Returns the byte offset
    /// of the slot and the length to transfer (`elems.len()` elements). The slot's `rails` is 0
    /// (a plain comm's; [`FifoRing::publish_rails`] for a fused receiver's).
    ///
    /// `elems` must hold 1..=[`MAX_RECVS`] entries (checked by the caller, asserted here).
    pub fn publish(&self, seq: u64, elems: &[PostedRecv]) -> (usize, usize) {
        self.publish_rails(seq, elems, 0)
    }

    /// [`FifoRing::publish`] with the receiver's live-rail mask `rails` in every element.
    pub fn publish_rails(&self, seq: u64, elems: &[PostedRecv], rails: u32) -> (usize, usize) {
        debug_assert!(!elems.is_empty() && elems.len() <= MAX_RECVS);
        let n = elems.len().min(MAX_RECVS);
        let slot = Self::slot_of(seq);
        let idx = seq + 1;
        for (e, p) in self.slots[slot].iter().zip(&elems[..n]) {
            // Relaxed: these stores are published by the Release store of `idx` below.
            e.addr.store(p.addr, Ordering::Relaxed);
            e.size.store(p.size, Ordering::Relaxed);
            e.rkey.store(p.rkey, Ordering::Relaxed);
            e.nreqs.store(n as u32, Ordering::Relaxed);
            e.tag.store(p.tag, Ordering::Relaxed);
            e.rails.store(rails, Ordering::Relaxed);
            e.check
                .store(check_of(p, n as u32, rails, idx), Ordering::Relaxed);
            // Release: pairs with the Acquire load of `idx` in `poll`; the fields above are
            // visible to a reader that sees this `idx`.
            e.idx.store(idx, Ordering::Release);
        }
        (
            Self::slot_offset(slot),
            n * core::mem::size_of::<FifoElem>(),
        )
    }

    /// Reader side, a hint: whether the writer has begun posting the slot of `seq` (its first
    /// element's `idx` names `seq`). `false` means [`FifoRing::poll`] of `seq` would return
    /// `Ok(None)` now; `true` promises nothing (poll reads and checks the slot).
    #[inline]
    pub fn is_posted(&self, seq: u64) -> bool {
        // Relaxed: nothing is read on the strength of this load; `poll_rails` loads the same
        // `idx` again with Acquire (pairing with `publish`'s Release) before reading fields.
        self.slots[Self::slot_of(seq)][0]
            .idx
            .load(Ordering::Relaxed)
            == seq + 1
    }

    /// Reader side: the slot of `seq`, if the writer has posted every element of it.
    ///
    /// Returns `Ok(None)` when the slot is not (fully) posted yet, `Ok(Some(n))` with `out[..n]`
    /// filled once it is, and an error when the writer posted something impossible.
    pub fn poll(
        &self,
        seq: u64,
        out: &mut [PostedRecv; MAX_RECVS],
    ) -> Result<Option<usize>, FifoFault> {
        Ok(self.poll_rails(seq, out)?.map(|(n, _)| n))
    }

    /// [`FifoRing::poll`] that also returns the slot's `rails` (the same in every element, or
    /// the slot is a fault).
    pub fn poll_rails(
        &self,
        seq: u64,
        out: &mut [PostedRecv; MAX_RECVS],
    ) -> Result<Option<(usize, u32)>, FifoFault> {
        let slot = &self.slots[Self::slot_of(seq)];
        let idx = seq + 1;
        // Acquire: pairs with the writer's Release store of `idx` in `publish`.
        if slot[0].idx.load(Ordering::Acquire) != idx {
            return Ok(None);
        }
        // Relaxed: ordered after the Acquire load of elem 0's `idx` above.
        let nreqs = slot[0].nreqs.load(Ordering::Relaxed);
        if nreqs == 0 || nreqs as usize > MAX_RECVS {
            // `check` may still be in flight: only a verified element is a fault.
            let (p, rails) = Self::read(&slot[0]);
            if slot[0].check.load(Ordering::Relaxed) != check_of(&p, nreqs, rails, idx) {
                return Ok(None);
            }
            return Err(FifoFault {
                field: "nreqs",
                value: nreqs as u64,
            });
        }
        let mut rails0 = None;
        for (e, o) in slot[..nreqs as usize].iter().zip(out.iter_mut()) {
            // Acquire: pairs with the writer's Release store of this element's `idx`.
            if e.idx.load(Ordering::Acquire) != idx {
                return Ok(None);
            }
            let (p, rails) = Self::read(e);
            // Relaxed: ordered after this element's Acquire `idx` load.
            let n = e.nreqs.load(Ordering::Relaxed);
            if e.check.load(Ordering::Relaxed) != check_of(&p, n, rails, idx) {
                return Ok(None); // torn: part of the element is still in flight
            }
            if n != nreqs {
                return Err(FifoFault {
                    field: "nreqs",
                    value: n as u64,
                });
            }
            if *rails0.get_or_insert(rails) != rails {
                return Err(FifoFault {
                    field: "rails",
                    value: rails as u64,
                });
            }
            *o = p;
        }
        Ok(Some((nreqs as usize, rails0.unwrap_or(0))))
    }

    /// An element's fields and its `rails`.
    fn read(e: &FifoElem) -> (PostedRecv, u32) {
        // Relaxed: every caller loaded this element's `idx` with Acquire first.
        let p = PostedRecv {
            addr: e.addr.load(Ordering::Relaxed),
            size: e.size.load(Ordering::Relaxed),
            rkey: e.rkey.load(Ordering::Relaxed),
            tag: e.tag.load(Ordering::Relaxed),
        };
        // Relaxed: as above.
        (p, e.rails.load(Ordering::Relaxed))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn p(i: u64) -> PostedRecv {
        PostedRecv {
            addr: 0x1000 * (i + 1),
            size: 100 + i,
            rkey: 7 + i as u32,
            tag: i as u32,
        }
    }

    #[test]
    fn publish_then_poll_round_trips_every_element() {
        let ring: Box<FifoRing<4>> = Box::default();
        let mut out = [PostedRecv::default(); MAX_RECVS];
        assert_eq!(ring.poll(0, &mut out), Ok(None));
        let elems: [PostedRecv; 3] = core::array::from_fn(|i| p(i as u64));
        let (off, len) = ring.publish(0, &elems);
        assert_eq!((off, len), (0, 3 * 64));
        assert_eq!(ring.poll(0, &mut out), Ok(Some(3)));
        assert_eq!(&out[..3], &elems);
        // The next sequence number is not posted yet.
        assert_eq!(ring.poll(1, &mut out), Ok(None));
    }

    #[test]
    fn previous_lap_reads_as_not_posted() {
        let ring: Box<FifoRing<2>> = Box::default();
        let mut out = [PostedRecv::default(); MAX_RECVS];
        ring.publish(0, &[p(0)]);
        // seq 2 maps to the same slot but expects idx 3.
        assert_eq!(ring.poll(2, &mut out), Ok(None));
        ring.publish(2, &[p(5)]);
        assert_eq!(ring.poll(2, &mut out), Ok(Some(1)));
        assert_eq!(out[0], p(5));
        assert_eq!(FifoRing::<2>::slot_offset(1), 8 * 64);
    }

    #[test]
    fn torn_element_waits_and_bad_nreqs_is_a_fault() {
        let ring: Box<FifoRing<2>> = Box::default();
        let mut out = [PostedRecv::default(); MAX_RECVS];
        ring.publish(0, &[p(0), p(1)]);
        // Simulate a field of element 1 still in flight.
        // Relaxed (both `addr` stores): one thread; `poll` on this thread sees them in program
        // order, and the test is about the `check` mismatch, not publication.
        ring.slots[0][1].addr.store(0, Ordering::Relaxed);
        assert_eq!(ring.poll(0, &mut out), Ok(None));
        ring.slots[0][1].addr.store(p(1).addr, Ordering::Relaxed);
        assert_eq!(ring.poll(0, &mut out), Ok(Some(2)));
        // A hostile but well-formed element with nreqs 9.
        let e = &ring.slots[1][0];
        let bad = p(3);
        // Relaxed (the field stores): published by the Release store of `idx` below, as in
        // `publish_rails`.
        e.addr.store(bad.addr, Ordering::Relaxed);
        e.size.store(bad.size, Ordering::Relaxed);
        e.rkey.store(bad.rkey, Ordering::Relaxed);
        e.tag.store(bad.tag, Ordering::Relaxed);
        e.nreqs.store(9, Ordering::Relaxed);
        e.check.store(check_of(&bad, 9, 0, 2), Ordering::Relaxed);
        // Release: pairs with the Acquire load of `idx` in `poll_rails` (mirrors `publish_rails`;
        // a single thread here, so program order would do).
        e.idx.store(2, Ordering::Release);
        assert_eq!(
            ring.poll(1, &mut out),
            Err(FifoFault {
                field: "nreqs",
                value: 9
            })
        );
    }

    #[test]
    fn rails_round_trip_and_a_slot_that_disagrees_is_a_fault() {
        let ring: Box<FifoRing<4>> = Box::default();
        let mut out = [PostedRecv::default(); MAX_RECVS];
        ring.publish_rails(0, &[p(0), p(1)], 0b101);
        assert_eq!(ring.poll_rails(0, &mut out), Ok(Some((2, 0b101))));
        assert_eq!(ring.poll(0, &mut out), Ok(Some(2)));
        // A plain comm's slot says 0, and its element hashes as before the word had a meaning.
        ring.publish(1, &[p(2)]);
        assert_eq!(ring.poll_rails(1, &mut out), Ok(Some((1, 0))));
        // Relaxed: this thread wrote `check` in `publish`; program order suffices.
        assert_eq!(
            ring.slots[1][0].check.load(Ordering::Relaxed),
            check_of(&p(2), 1, 0, 2)
        );
        // `rails` still in flight: the element does not verify yet.
        ring.publish_rails(2, &[p(3)], 0b11);
        // Relaxed: one thread; `poll_rails` below sees it in program order.
        ring.slots[2][0].rails.store(0, Ordering::Relaxed);
        assert_eq!(ring.poll_rails(2, &mut out), Ok(None));
        // Two verified elements with different masks: a fault.
        ring.publish_rails(3, &[p(4), p(5)], 0b11);
        let e = &ring.slots[3][1];
        // Relaxed (`rails` and `check`): one thread; `poll_rails` below sees them in program
        // order (the slot's `idx` was already published by `publish_rails`).
        e.rails.store(0b10, Ordering::Relaxed);
        e.check
            .store(check_of(&p(5), 2, 0b10, 4), Ordering::Relaxed);
        assert_eq!(
            ring.poll_rails(3, &mut out),
            Err(FifoFault {
                field: "rails",
                value: 0b10
            })
        );
    }

    #[test]
    fn ring_layout_is_aligned() {
        assert_eq!(core::mem::align_of::<FifoRing>(), 64);
        let bytes = FifoRing::<MAX_REQUESTS>::BYTES;
        assert_eq!(
            bytes,
            MAX_REQUESTS * MAX_RECVS * 64 + 64 + MAX_REQUESTS * MAX_RECVS * 4
        );
    }

    #[test]
    fn sizes_row_round_trips_and_keeps_posted_sizes() {
        let ring: Box<FifoRing<4>> = Box::default();
        let (addr, len) = ring.stage_sizes(6, &[5, 0, 1 << 30]);
        assert_eq!(len, 12);
        assert_eq!(
            addr,
            ring.sizes_base() + FifoRing::<4>::sizes_offset(2) as u64
        );
        let got = ring.sizes(2, 3);
        assert_eq!(&got[..4], &[5, 0, 1 << 30, 0]);
        ring.publish(1, &[p(0), p(1)]);
        assert_eq!(ring.posted_size(1, 1), p(1).size);
    }
}
