//! The shared-memory segment every provider publishes: its registration table, the receive
//! side of its QPs, and its comms' FIFO rings.
//!
//! One segment per provider instance: a memfd mapped by the owner and, read-write, by every
//! peer process that connects a QP to it (through `/proc/<pid>/fd/<fd>`; in-process peers use
//! the owner's mapping). Layout (fixed by [`VERSION`]; a peer never trusts sizes it reads):
//!
//! ```text
//!  offset 0        Header   magic, version, pid, nonce, lease lanes
//!  HDR_BYTES       MrSlot × MR_SLOTS      registration table (key = gen << 16 | index)
//!  QP_OFF          QpHead × QP_SLOTS      per QP: state, responder error, recv_posted
//!  RING_OFF        Ring × QP_SLOTS        per QP: inbound ring (256 × 64 B = 16 KiB, page
//!                                         aligned; small payloads inline, see `ring`)
//!  BOUNCE_OFF      Bounce × BOUNCE_QPS    per QP of the first BOUNCE_QPS slots: BOUNCE_SLOTS
//!                                         × BOUNCE_MAX bytes (512 KiB) of payloads written by
//!                                         the initiator (`qp.rs`, "Bounce payloads")
//!  FIFO_OFF        FIFO_SLOTS × FIFO_STRIDE  FIFO rings (`alloc_fifo`), page aligned
//! ```
//! The segment is sparse: a page costs memory only once touched. A QP's ring and bounce pages
//! are punched out (`MADV_REMOVE`) when the QP is created and destroyed, so an idle or closed
//! QP costs only its 192-byte head, and the table can be as large as the plugin advertises
//! ([`QP_SLOTS`]).
//!
//! ## FIFO rings in shared memory (small writes without a syscall)
//! A comm's FIFO ring (clear-to-send elements its peer RDMA-writes) is allocated in the FIFO
//! area of its provider's segment, which every connected peer has mapped. A peer's RDMA WRITE
//! whose remote range lies entirely inside that area (after the usual lease on the target's
//! registration: key, range, access) is done with word stores through the peer's own mapping
//! ([`copy_leased`]): the bytes move in one cache-line handoff, with no `process_vm_writev`,
//! at post time in the posting thread: after every earlier WR of the QP that the posting thread
//! copied (all up to `direct_max`; larger ones are copied eagerly by workers, as before, and
//! ordered only by immediates), and before any later immediate (the combiner delivers it after
//! the write). Errors complete the WR as any other copy's do. The fault injector's corrupted
//! element (`IBNET_SOFT_FAULTS` `fifo_corrupt`) takes the same path ([`write_leased`]). The owner reads its ring
//! with Acquire loads, as it would after a NIC's write. A released FIFO slot is zeroed with
//! `fallocate(PUNCH_HOLE)` (its pages are freed too).
//!
//! ## Registration leases (initiator checks, owner deregisters)
//! An initiator copies into (or out of) a peer's memory only under a *lease* on the slot the
//! rkey names; `dereg` waits for leases to drain before the memory may be reused:
//! ```text
//!  initiator                                   owner (dereg)
//!  busy.fetch_add(1)            (SeqCst)       state.store(invalid) (SeqCst)
//!  (busy_remote[lane] for peers, busy_local for the owner's own copies: separate lines)
//!  state.load() == key's gen?   (SeqCst)       while any busy.load() != 0 (SeqCst) { wait ≤ 1 s }
//!  check range/access, copy                    slot reusable
//!  busy.fetch_sub(1)            (Release) ───▶ (Acquire) sees 0: the copy is complete
//! ```
//! In the single total order of the SeqCst operations either the initiator sees the slot
//! invalid, or the owner sees `busy > 0` and waits.
//!
//! **Lanes.** Each peer provider counts its leases in a lane of its own: at connect it claims
//! one of the `LANES - 1` entries of the owner's header lane table (`pid << 32 | nonce`, by
//! CAS; lane 0 is shared by peers that found the table full). A lease held by a process that
//! has exited (killed mid-copy) can never be released by it; `dereg` therefore looks, while it
//! waits, at the process of every busy lane (pidfd: exited or reaped) and zeroes the lane's
//! count in this slot once that process is gone: no copy of a dead process can be in flight, so
//! its leases are void, and `dereg_mr` succeeds at once. Only a live process that holds a lease
//! past the deadline (stopped, stuck in a copy), or a dead one counted in the shared lane 0,
//! still makes `dereg` give up after 1 s and quarantine the slot (never reused); `dereg_mr` then
//! fails with `EBUSY` and the memory must not be reused. Lanes are not recycled while the owner
//! lives (a dead process's stale counts may remain in slots not yet deregistered).
//!
//! ## Inbound ring (WRITE_WITH_IMM delivery)
//! ```text
//!  target (owner)                                   initiator (its QP's combiner)
//!  post_recv: recv_posted = p+1       (Release) ──▶ p = recv_posted (Acquire), re-read only
//!                                                   when the cached credit runs out; t < p ?
//!                                                   ring[t % RING]: meta, inline payload (Relaxed)
//!  poll: ring[h % RING].seq == h+1 ? (Acquire)  ◀── ring[t % RING].seq = t + 1 (Release)
//!        read meta (and payload: re-check rkey,
//!        range, access; copy it in); h += 1
//! ```
//! The reader polls the entry itself (one cache line carries both the signal and the data; the
//! entry's layout and the inline payload's rules are in `ring`). The target never posts more
//! than `RING` receives beyond what it has polled, so the initiator never overwrites an entry
//! the target has not read.
//!
//! Trust: every process of the same user can already write anywhere in this process with
//! cross-memory attach, so the table protects against bugs (stale keys, ranges, deregistered
//! memory), not against a hostile same-user process. Values read from a peer's segment are still
//! validated before use (indices, counters), so a corrupt segment cannot cause UB or a panic.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ibnet_core::fifo::FifoRing;

use crate::lease::{Header, Lease as SlotLease, MrSlot};
pub use crate::lease::{LeaseError, MAGIC, OWN_LANE};
pub use crate::ring::RingEntry;
use crate::sys::{self, Mapping};

/// Segment format version (part of the provider address).
pub const VERSION: u32 = 6;
/// Registration slots (index 0 unused). Keys carry a 16-bit index.
pub const MR_SLOTS: usize = 1 << 16;
/// Bits of a QP number that hold its slot index; the 5 bits above hold a generation (QP numbers
/// stay within RC's 24 bits).
pub const QP_IDX_BITS: u32 = 19;
/// QP slots (index 0 unused): 2 × 1024 comms (the plugin's `maxComms`, send and receive) × 129
/// QPs (128 = `NCCL_IB_QPS_PER_CONNECTION`'s maximum, plus a flush QP), and the unused slot 0.
pub const QP_SLOTS: usize = 2 * 1024 * 129 + 1;
const _: () = assert!(QP_SLOTS <= 1 << QP_IDX_BITS);

/// Entries of a QP's inbound ring: the most receives a QP may have posted (the core posts at
/// most `MAX_REQUESTS`, 256, per QP). A busy QP touches all of it: 16 KiB.
pub const RING: usize = 256;

const HDR_BYTES: usize = 4096;
const MR_OFF: usize = HDR_BYTES;
const QP_OFF: usize = MR_OFF + MR_SLOTS * std::mem::size_of::<MrSlot>();
const RING_BYTES: usize = RING * std::mem::size_of::<RingEntry>();
const RING_OFF: usize = (QP_OFF + QP_SLOTS * std::mem::size_of::<QpHead>() + 4095) & !4095;
/// Bounce slots of a QP: payloads of cross-process WRITE_WITH_IMMs between `ring::INLINE_MAX`
/// and [`BOUNCE_MAX`] bytes that the initiator has written and the target not yet copied out.
pub const BOUNCE_SLOTS: usize = 32;
/// Bytes of one bounce slot: the largest payload that travels through one.
pub const BOUNCE_MAX: usize = 16 << 10;
const BOUNCE_BYTES: usize = BOUNCE_SLOTS * BOUNCE_MAX;
/// QP slots with bounce slots: the first ones (slot indices are handed out lowest first, so
/// every QP has them while fewer than this many exist at once). Bounded so that the segment
/// stays within what tools map (valgrind refuses an 80 GiB mapping): 1 GiB of address space,
/// of which only what is used becomes memory.
pub const BOUNCE_QPS: usize = 2048;
const BOUNCE_OFF: usize = (RING_OFF + QP_SLOTS * RING_BYTES).next_multiple_of(4096);
/// FIFO rings a segment holds (beyond them `alloc_fifo` falls back to the heap, and peers'
/// writes into those rings to `process_vm_writev`).
pub const FIFO_SLOTS: usize = 512;
/// Bytes per FIFO slot (a ring, rounded up to pages).
pub const FIFO_STRIDE: usize = std::mem::size_of::<FifoRing>().next_multiple_of(4096);
const FIFO_OFF: usize = (BOUNCE_OFF + BOUNCE_QPS * BOUNCE_BYTES).next_multiple_of(4096);
/// Total bytes of a segment (virtual; pages are allocated as they are touched).
pub const BYTES: usize = FIFO_OFF + FIFO_SLOTS * FIFO_STRIDE;

/// Access bits stored in a slot.
pub const ACC_LOCAL_WRITE: u32 = 1;
/// Peers may write.
pub const ACC_REMOTE_WRITE: u32 = 2;
/// Peers may read.
pub const ACC_REMOTE_READ: u32 = 4;

/// The head of one QP's receive side.
#[repr(C, align(64))]
pub struct QpHead {
    /// The QP number while the QP lives, 0 when free.
    state: AtomicU64,
    /// `qpn << 32 | status`: an initiator's WR hit a responder error (remote access) on this
    /// QP, which must move to the error state (as RC does); 0: none. Written by initiators.
    error: AtomicU64,
    _p0: [u64; 6],
    /// Receives posted so far (written by the owner).
    recv_posted: AtomicU64,
    _p1: [u64; 7],
    /// Bounce payloads copied out so far (`b + 1` after the one numbered `b`; written by the
    /// owner after the copy, read by the initiator before it reuses a slot: `ring`'s
    /// `bounce_free`/`bounce_release`, whose atomics the loom model swaps).
    bounce_done: ibnet_core::sync::AtomicU64,
    _p3: [u64; 7],
}

/// The receive side of one QP: its head and its inbound ring (two places of the segment).
#[derive(Clone, Copy)]
pub struct QpBlock<'a> {
    /// The QP number while the QP lives, 0 when free.
    pub state: &'a AtomicU64,
    /// Responder error mark (see [`QpHead`]).
    pub error: &'a AtomicU64,
    /// Receives posted so far (written by the owner).
    pub recv_posted: &'a AtomicU64,
    /// Bounce payloads copied out so far (written by the owner, see [`QpHead`]).
    pub bounce_done: &'a ibnet_core::sync::AtomicU64,
    /// One entry per delivery `t`, at `t % RING`.
    pub ring: &'a [RingEntry; RING],
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<MrSlot>() == 192);
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<QpHead>() == 192);
const _: () = assert!(RING_BYTES.is_multiple_of(4096));
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<RingEntry>() == 64);
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Header>() <= HDR_BYTES);
const _: () = assert!(QP_OFF.is_multiple_of(64));

/// A held lease on a registration of a segment: the slot's lease (`lease::Lease`, whose drop
/// releases it; while it lives, the owner's `dereg` waits), and the segment whose registration
/// table granted it (a write into that segment's FIFO area goes through our mapping of it).
pub struct Lease<'a> {
    _slot: SlotLease<'a>,
    /// The segment whose registration table granted the lease.
    seg: &'a Segment,
}

/// A mapped segment: this provider's own, or a peer's.
pub struct Segment {
    map: Mapping,
    /// The memfd (own segment only): peers open it through `/proc/<pid>/fd/<fd>`.
    fd: Option<OwnedFd>,
    /// Random identity of the owner provider.
    pub nonce: u64,
    /// The owner's pid.
    pub pid: i32,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Segment(pid {}, nonce {:#x})", self.pid, self.nonce)
    }
}

/// Target: copies an inline payload `src` (read from a ring entry) into this process's own
/// memory at `raddr`, covered by `lease` (taken by the caller on its own registration with
/// remote-write access: the re-check of a peer-written entry).
pub fn write_own(_lease: &Lease<'_>, raddr: u64, src: &[u8]) {
    // SAFETY: `[raddr, raddr + len)` is inside a live registration of this process with
    // remote-write access (the lease checked key, range and access, and keeps `dereg` from
    // completing meanwhile); the owner keeps registered memory mapped until deregistered (as
    // for in-process word copies); the source is `src`, borrowed for the call.
    unsafe { sys::atomic_copy(raddr, src.as_ptr() as u64, src.len()) };
}

/// Initiator: writes `len` bytes of this process's own memory at `laddr` (covered by
/// `_local`, a lease on the local registration) into bounce slot `b` of QP slot `idx` (<
/// [`BOUNCE_QPS`]) of `remote`, a peer's segment mapped here.
pub fn write_bounce(
    _local: &Lease<'_>,
    laddr: u64,
    remote: &Segment,
    idx: usize,
    b: u64,
    len: usize,
) {
    let len = len.min(BOUNCE_MAX);
    // SAFETY: the source is inside a live local registration (the lease), probed at `reg_mr`
    // and kept mapped until deregistered; the destination is one bounce slot (`len` ≤ its
    // size) inside our mapping of `remote`, which the caller borrows. The bytes are published
    // by the combiner's later Release store of the ring entry; the owner reads them only after
    // that (`ring::bounce_free` keeps us off a slot until it has).
    unsafe { sys::bulk_copy(remote.bounce_ptr(idx, b), laddr, len) };
}

/// Target: copies `len` bytes (≤ [`BOUNCE_MAX`]) of bounce slot `b` of our QP slot `idx`
/// (< [`BOUNCE_QPS`]) into this process's own memory at `raddr`, covered by `_lease` (taken by
/// the caller on its own registration with remote-write access: the re-check of a
/// peer-written entry).
pub fn read_bounce(own: &Segment, idx: usize, b: u64, _lease: &Lease<'_>, raddr: u64, len: usize) {
    let len = len.min(BOUNCE_MAX);
    // SAFETY: the destination is inside a live registration of this process with remote-write
    // access (the lease checked key, range and access, and keeps `dereg` from completing
    // meanwhile), kept mapped until deregistered; the source is one bounce slot inside our own
    // mapping, read after the entry's Acquire; a peer that writes it concurrently (against
    // the protocol) only tears the bytes it sent (`sys::bulk_copy`: opaque to the compiler).
    unsafe { sys::bulk_copy(raddr, own.bounce_ptr(idx, b), len) };
}

/// Initiator: reads `dst.len()` bytes of this process's own memory at `laddr` (an inline
/// payload), covered by `lease` (taken by the caller on the local registration).
pub fn read_own(_lease: &Lease<'_>, laddr: u64, dst: &mut [u8]) {
    // SAFETY: `[laddr, laddr + len)` is inside a live local registration (the lease), probed
    // at `reg_mr` and kept mapped until deregistered (as for in-process word copies); the
    // destination is `dst`, borrowed mutably for the call.
    unsafe { sys::atomic_copy(dst.as_mut_ptr() as u64, laddr, dst.len()) };
}

impl Segment {
    /// Creates this provider's segment.
    pub fn create(nonce: u64) -> io::Result<Self> {
        let fd = sys::memfd_create(c"ibnet-soft")?;
        sys::ftruncate(fd.as_fd(), BYTES as u64)?;
        let map = Mapping::map_shared(fd.as_fd(), BYTES)?;
        let pid = sys::getpid();
        let s = Self {
            map,
            fd: Some(fd),
            nonce,
            pid,
        };
        s.header().publish(VERSION, pid, nonce);
        Ok(s)
    }

    /// Maps a peer's segment from its memfd and checks that it is the one its address names.
    pub fn attach(pid: i32, fd: i32, nonce: u64) -> io::Result<Self> {
        let f = sys::open_peer_fd(pid, fd)?;
        if sys::file_size(f.as_fd())? != BYTES as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "peer segment size",
            ));
        }
        let map = Mapping::map_shared(f.as_fd(), BYTES)?;
        let s = Self {
            map,
            fd: None,
            nonce,
            pid,
        };
        if !s.header().is(VERSION, pid, nonce) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "peer segment identity",
            ));
        }
        Ok(s)
    }

    /// The memfd number (own segment).
    pub fn fd_num(&self) -> i32 {
        self.fd.as_ref().map_or(-1, sys::raw)
    }

    /// Address of the header magic in the owner (used to probe cross-memory attach).
    pub fn magic_addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is BYTES long, page aligned, and the header is at offset 0; it
        // consists of atomics, which are valid for any bit pattern; the reference lives no
        // longer than `self`, which owns the mapping.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    fn mr(&self, idx: usize) -> &MrSlot {
        debug_assert!(idx < MR_SLOTS);
        let idx = idx % MR_SLOTS;
        // SAFETY: in bounds (idx < MR_SLOTS), 64-byte aligned (page-aligned base + 4096 +
        // 192·idx); atomics only, valid for any bit pattern; lives as long as `self`.
        unsafe {
            &*(self
                .map
                .as_ptr()
                .add(MR_OFF + idx * std::mem::size_of::<MrSlot>()) as *const MrSlot)
        }
    }

    fn qp_head(&self, idx: usize) -> &QpHead {
        debug_assert!(idx < QP_SLOTS);
        let idx = idx % QP_SLOTS;
        // SAFETY: in bounds (idx < QP_SLOTS), 64-byte aligned (QP_OFF and the head size are
        // 64-multiples); atomics and padding only, valid for any bit pattern; lives as long as
        // `self`.
        unsafe {
            &*(self
                .map
                .as_ptr()
                .add(QP_OFF + idx * std::mem::size_of::<QpHead>()) as *const QpHead)
        }
    }

    /// FIFO slot `idx` (must be < [`FIFO_SLOTS`]) of the own segment.
    pub fn fifo(&self, idx: usize) -> &FifoRing {
        debug_assert!(idx < FIFO_SLOTS);
        let idx = idx % FIFO_SLOTS;
        // SAFETY: in bounds (FIFO_OFF + FIFO_SLOTS · FIFO_STRIDE = BYTES), page aligned (both
        // offsets are page multiples; FifoRing needs 64); FifoRing consists of atomics only,
        // valid for any bit pattern; lives as long as `self`.
        unsafe { &*(self.map.as_ptr().add(FIFO_OFF + idx * FIFO_STRIDE) as *const FifoRing) }
    }

    /// Zeroes FIFO slot `idx` of the own segment (and frees its pages) for its next user.
    pub fn clear_fifo(&self, idx: usize) -> io::Result<()> {
        let fd = self.fd.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        let off = (FIFO_OFF + (idx % FIFO_SLOTS) * FIFO_STRIDE) as u64;
        sys::punch_hole(fd.as_fd(), off, FIFO_STRIDE as u64)
    }

    /// Where `[raddr, raddr + len)` of the owner's address space (whose segment mapping starts
    /// at `base` there) lies in our mapping of this segment, if it is inside the FIFO area.
    pub(crate) fn fifo_area_ptr(&self, base: u64, raddr: u64, len: u64) -> Option<u64> {
        let off = raddr.checked_sub(base)?;
        let end = off.checked_add(len)?;
        (off >= FIFO_OFF as u64 && end <= BYTES as u64).then(|| self.map.as_ptr() as u64 + off)
    }

    fn ring_ptr(&self, idx: usize) -> *mut u8 {
        debug_assert!(idx < QP_SLOTS);
        // SAFETY: `RING_OFF + (idx % QP_SLOTS) * RING_BYTES + RING_BYTES <= BYTES`: inside the
        // mapping.
        unsafe {
            self.map
                .as_ptr()
                .add(RING_OFF + (idx % QP_SLOTS) * RING_BYTES)
        }
    }

    /// The QP block `idx` (must be < [`QP_SLOTS`]).
    #[inline]
    pub fn qp_block(&self, idx: usize) -> QpBlock<'_> {
        let h = self.qp_head(idx);
        // SAFETY: the ring of slot `idx` lies inside the mapping (`ring_ptr`), page aligned;
        // atomics only, valid for any bit pattern (a punched-out page reads as zeros); lives as
        // long as `self`.
        let ring = unsafe { &*(self.ring_ptr(idx) as *const [RingEntry; RING]) };
        QpBlock {
            state: &h.state,
            error: &h.error,
            recv_posted: &h.recv_posted,
            bounce_done: &h.bounce_done,
            ring,
        }
    }

    /// Address in our mapping of bounce slot `b % BOUNCE_SLOTS` of QP slot `idx` (which must
    /// be < [`BOUNCE_QPS`]).
    fn bounce_ptr(&self, idx: usize, b: u64) -> u64 {
        debug_assert!(idx < BOUNCE_QPS);
        let off = BOUNCE_OFF
            + (idx % BOUNCE_QPS) * BOUNCE_BYTES
            + (b % BOUNCE_SLOTS as u64) as usize * BOUNCE_MAX;
        self.map.as_ptr() as u64 + off as u64
    }

    /// Owner: zeroes QP slot `idx`'s inbound ring and gives its pages, and its bounce slots'
    /// pages, back to the system (`MADV_REMOVE`; the ring by atomic stores where the kernel
    /// refuses; bounce slots hold nothing a reader trusts: no need to zero them). Control path
    /// (create and destroy of a QP).
    pub fn clear_ring(&self, idx: usize) {
        if sys::punch(self.ring_ptr(idx), RING_BYTES).is_err() {
            for e in self.qp_block(idx).ring {
                e.clear();
            }
        }
        if idx < BOUNCE_QPS {
            let b = self.bounce_ptr(idx, 0) as *mut u8;
            let _ = sys::punch(b, BOUNCE_BYTES); // only memory is at stake
        }
    }

    /// Peer: claims a lease lane in this (the owner's) segment for the provider `(pid,
    /// nonce)` of this process; returns it (0, the shared lane, when the table is full).
    pub fn claim_lane(&self, pid: i32, nonce: u64) -> u8 {
        self.header().claim_lane(pid, nonce)
    }

    /// Takes a lease on the registration `key` covering `[addr, addr + len)` with `need`;
    /// `own` says the lease is taken by the owner process itself (its local SGE), else it is
    /// counted in the shared lane 0 (see [`Segment::lease_lane`]).
    #[inline]
    pub fn lease(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: u32,
        own: bool,
    ) -> Result<Lease<'_>, LeaseError> {
        self.lease_lane(key, addr, len, need, if own { OWN_LANE } else { 0 })
    }

    /// [`Segment::lease`] counted in `lane` ([`OWN_LANE`]: the owner's own copies; else a
    /// lane of [`Segment::claim_lane`]).
    #[inline]
    pub fn lease_lane(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: u32,
        lane: u8,
    ) -> Result<Lease<'_>, LeaseError> {
        let idx = (key & 0xffff) as usize;
        if idx == 0 {
            return Err(LeaseError::Key);
        }
        self.mr(idx)
            .lease(key, addr, len, need, lane)
            .map(|slot| Lease {
                _slot: slot,
                seg: self,
            })
    }

    /// Owner: fills free slot `idx` and makes it valid; returns the key.
    pub fn reg(&self, idx: usize, addr: u64, len: u64, access: u32) -> u32 {
        self.mr(idx).reg(idx, addr, len, access)
    }

    /// Owner: invalidates slot `idx` and waits (≤ `timeout`) for leases to drain; leases of
    /// exited processes are voided (see "Lanes" in the module doc). Returns `false` when a
    /// lease was still held at the deadline (the slot must be quarantined).
    pub fn dereg(&self, idx: usize, timeout: Duration) -> bool {
        let slot = self.mr(idx);
        slot.invalidate();
        let start = Instant::now();
        let mut spins = 0u32;
        while !slot.drained() {
            if start.elapsed() >= timeout {
                return false;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                if spins.is_multiple_of(16) {
                    self.void_dead_lanes(slot); // a few µs of syscalls, every ~1 ms
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            if spins == 1 {
                self.void_dead_lanes(slot); // at once: a dead peer costs no wait
            }
        }
        true
    }

    /// Zeroes the counts of `slot`'s lanes whose process has exited (lane 0 is shared: kept).
    fn void_dead_lanes(&self, slot: &MrSlot) {
        let h = self.header();
        for lane in slot.busy_lanes() {
            let pid = h.lane_pid(lane);
            if pid > 0 && pid != self.pid && sys::pid_exited(pid) {
                slot.void_lane(lane);
            }
        }
    }
}

/// A zeroed FIFO ring on the heap (128 KiB: too large to build on the stack).
pub fn zeroed_fifo() -> Box<ibnet_core::fifo::FifoRing> {
    use ibnet_core::fifo::FifoRing;
    let layout = std::alloc::Layout::new::<FifoRing>();
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<FifoRing>();
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `p` is a fresh allocation of `FifoRing`'s layout by the global allocator (what
    // `Box` frees with); `FifoRing` consists only of atomics (and arrays of them), for which the
    // all-zero bit pattern is valid: a zeroed ring is the empty ring `FifoRing::new` builds.
    unsafe { Box::from_raw(p) }
}

pub use crate::sys::Dir;

/// How bytes reach a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabric {
    /// Same process: memory copies.
    InProc,
    /// Another process of this host: cross-memory attach into `pid`.
    Cross {
        /// The peer's pid.
        pid: i32,
        /// Where the peer's segment is mapped in the peer (its FIFO rings: see the module doc).
        base: u64,
    },
}

/// In-process copies of at most this many bytes use atomic word copies (cheap, no syscall);
/// larger ones go through the kernel (`process_vm_writev` into our own pid), which fails with
/// `EFAULT` instead of faulting. Measured crossover of the two on this kind of host (16 KiB:
/// about equal bandwidth; 8 bytes: ~25 ns vs ~250-550 ns a syscall).
pub const WORD_COPY_MAX: usize = 16 << 10;

/// The kernel refused cross-memory attach into our own pid (seccomp): word copies only.
static SELF_CMA_DENIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The in-process fabric: copies `len` bytes from `src` to `dst`, both in this process.
///
/// # Safety
/// Both ranges are inside live, probed registrations (leases held by the caller): mapped with
/// the access the copy needs, as long as the owners keep the memory mapped until deregistering
/// it. Should an owner break that, a copy above [`WORD_COPY_MAX`] still fails cleanly with
/// `EFAULT`; a smaller one would fault.
unsafe fn in_proc_copy(dst: u64, src: u64, len: usize) -> io::Result<usize> {
    // Relaxed: a sticky hint; either path is a correct copy.
    if len > WORD_COPY_MAX && !SELF_CMA_DENIED.load(Ordering::Relaxed) {
        // SAFETY: `dst` is our own memory that the caller may write (leased registration); the
        // kernel validates both ranges.
        match unsafe { sys::vm_copy(Dir::Write, sys::getpid(), src, dst, len) } {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) => {
                SELF_CMA_DENIED.store(true, Ordering::Relaxed); // Relaxed: as above
            }
            r => return r,
        }
    }
    // SAFETY: see the function's contract.
    unsafe { sys::atomic_copy(dst, src, len) };
    Ok(len)
}

/// `process_vm_writev`/`readv` into the peer of a cross-process `fabric`.
///
/// # Safety
/// As [`sys::vm_copy`]: the local range is inside a live local registration (for a read, one
/// with local-write access).
unsafe fn cross(dir: Dir, fabric: Fabric, laddr: u64, raddr: u64, len: usize) -> io::Result<usize> {
    let Fabric::Cross { pid, .. } = fabric else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: the caller's contract.
    unsafe { sys::vm_copy(dir, pid, laddr, raddr, len) }
}

/// A cross-process write of `len` bytes from `src` (this process) to `raddr` in the peer of
/// `fabric`, whose segment `remote` is mapped here: word stores through that mapping when the
/// range lies inside the segment's FIFO area (module doc), else `process_vm_writev`.
///
/// # Safety
/// `[src, src + len)` is readable memory of this process (inside a live local registration, or
/// a buffer borrowed for the call); `remote` is the segment of the registration that covers
/// `[raddr, raddr + len)` in the peer, leased by the caller.
unsafe fn cross_write(
    fabric: Fabric,
    remote: &Segment,
    src: u64,
    raddr: u64,
    len: usize,
) -> io::Result<usize> {
    let Fabric::Cross { base, .. } = fabric else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    if len <= WORD_COPY_MAX {
        if let Some(dst) = remote.fifo_area_ptr(base, raddr, len as u64) {
            // SAFETY: `dst..dst + len` is inside our mapping of the peer's segment (checked),
            // which the caller's remote lease borrows (it outlives the copy); the segment is
            // atomics only, written here with atomic stores. The source: the caller's contract.
            unsafe { sys::atomic_copy(dst, src, len) };
            return Ok(len);
        }
    }
    // SAFETY: the caller's contract; the kernel checks the remote range.
    unsafe { cross(Dir::Write, fabric, src, raddr, len) }
}

/// Writes `src` (a buffer of this process) to `raddr` in the peer, covered by the lease passed
/// in: like [`copy_leased`] for a write whose bytes come from outside any registration (the
/// fault injector's corrupted FIFO element), on the same paths (a write into the peer's FIFO
/// area by word stores through its segment).
pub fn write_leased(fabric: Fabric, remote: &Lease<'_>, raddr: u64, src: &[u8]) -> io::Result<()> {
    let (s, len) = (src.as_ptr() as u64, src.len());
    let n = match fabric {
        // SAFETY: the destination is inside a live registration (the lease) that the owner
        // keeps mapped until deregistered; the source is `src`, borrowed for the call.
        Fabric::InProc => unsafe { in_proc_copy(raddr, s, len) }?,
        // SAFETY: the source is `src`, borrowed for the call; `remote` leases the destination.
        Fabric::Cross { .. } => unsafe { cross_write(fabric, remote.seg, s, raddr, len) }?,
    };
    if n == len {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}

/// Copies `len` bytes between `laddr` (this process) and `raddr` (the peer), both covered by
/// the leases passed in (which keep the owners from deregistering them meanwhile). Never
/// faults on a range the kernel can check (cross-process, and in-process above
/// [`WORD_COPY_MAX`]): the copy fails with `EFAULT` instead. A cross-process write into the
/// peer's FIFO area is done through our mapping of its segment (no syscall; module doc).
pub fn copy_leased(
    fabric: Fabric,
    dir: Dir,
    _local: &Lease<'_>,
    laddr: u64,
    remote: &Lease<'_>,
    raddr: u64,
    len: usize,
) -> io::Result<()> {
    let n = match fabric {
        Fabric::InProc => {
            let (dst, src) = match dir {
                Dir::Write => (raddr, laddr),
                Dir::Read => (laddr, raddr),
            };
            // SAFETY: both ranges are inside live registrations (the leases), probed at
            // `reg_mr` and promised mapped until deregistered; dereg waits for the leases.
            unsafe { in_proc_copy(dst, src, len) }?
        }
        // SAFETY: the source is inside a live local registration (the local lease), probed at
        // `reg_mr`; the remote lease covers the destination.
        Fabric::Cross { .. } if dir == Dir::Write => {
            unsafe { cross_write(fabric, remote.seg, laddr, raddr, len) }?
        }
        // SAFETY: the local range is inside a live local registration (lease; local-write
        // access for a read); the kernel checks both ranges.
        Fabric::Cross { .. } => unsafe { cross(dir, fabric, laddr, raddr, len) }?,
    };
    if n == len {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}
