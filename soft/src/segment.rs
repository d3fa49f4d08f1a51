//! The shared-memory segment every provider publishes: its registration table and the receive
//! side of its QPs.
//!
//! One segment per provider instance: a memfd mapped by the owner and, read-write, by every
//! peer process that connects a QP to it (through `/proc/<pid>/fd/<fd>`; in-process peers use
//! the owner's mapping). Layout (fixed by [`VERSION`]; a peer never trusts sizes it reads):
//!
//! ```text
//!  offset 0        Header   magic, version, pid, nonce
//!  HDR_BYTES       MrSlot × MR_SLOTS      registration table (key = gen << 16 | index)
//!  QP_OFF          QpBlock × QP_SLOTS     per QP: recv_posted, inbound ring
//!  FIFO_OFF        FIFO_SLOTS × FIFO_STRIDE  FIFO rings (`alloc_fifo`), page aligned
//! ```
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
//! the write). Errors complete the WR as any other copy's do. The owner reads its ring
//! with Acquire loads, as it would after a NIC's write. A released FIFO slot is zeroed with
//! `fallocate(PUNCH_HOLE)` (its pages are freed too).
//!
//! ## Registration leases (initiator checks, owner deregisters)
//! An initiator copies into (or out of) a peer's memory only under a *lease* on the slot the
//! rkey names; `dereg` waits for leases to drain before the memory may be reused:
//! ```text
//!  initiator                                   owner (dereg)
//!  busy.fetch_add(1)            (SeqCst)       state.store(invalid) (SeqCst)
//!  (busy_remote for peers, busy_local for the owner's own copies: separate cache lines)
//!  state.load() == key's gen?   (SeqCst)       while busy.load() != 0 (SeqCst) { wait ≤ 1 s }
//!  check range/access, copy                    slot reusable
//!  busy.fetch_sub(1)            (Release) ───▶ (Acquire) sees 0: the copy is complete
//! ```
//! In the single total order of the SeqCst operations either the initiator sees the slot
//! invalid, or the owner sees `busy > 0` and waits. A lease that is never released (a peer
//! killed mid-copy, or stopped) makes `dereg` give up after 1 s and quarantine the slot (never
//! reused); `dereg_mr` then fails with `EBUSY` and the memory must not be reused.
//!
//! ## Inbound ring (WRITE_WITH_IMM delivery)
//! ```text
//!  target (owner)                                   initiator (its QP's combiner)
//!  post_recv: recv_posted = p+1       (Release) ──▶ p = recv_posted (Acquire), re-read only
//!                                                   when the cached credit runs out; t < p ?
//!                                                   ring[t % RING].meta = imm << 32 | len (Relaxed)
//!  poll: ring[h % RING].seq == h+1 ? (Acquire)  ◀── ring[t % RING].seq = t + 1 (Release)
//!        read meta; h += 1 (for h < posted)
//! ```
//! The reader polls the entry itself (one cache line carries both the signal and the data).
//! The target never posts more than `RING` receives beyond what it has polled, so the
//! initiator never overwrites an entry the target has not read.
//!
//! Trust: every process of the same user can already write anywhere in this process with
//! cross-memory attach, so the table protects against bugs (stale keys, ranges, deregistered
//! memory), not against a hostile same-user process. Values read from a peer's segment are still
//! validated before use (indices, counters), so a corrupt segment cannot cause UB or a panic.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use ibnet_core::fifo::FifoRing;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::sys::{self, Mapping};

/// Segment format version (part of the provider address).
pub const VERSION: u32 = 2;
/// Magic at offset 0.
pub const MAGIC: u64 = u64::from_le_bytes(*b"IBNSOFT1");
/// Registration slots (index 0 unused). Keys carry a 16-bit index.
pub const MR_SLOTS: usize = 1 << 16;
/// QP slots (index 0 unused). QP numbers carry a 16-bit index and an 8-bit generation.
pub const QP_SLOTS: usize = 2048;
/// Entries of a QP's inbound ring: the most receives a QP may have posted.
pub const RING: usize = 1024;

const HDR_BYTES: usize = 4096;
const MR_OFF: usize = HDR_BYTES;
const QP_OFF: usize = MR_OFF + MR_SLOTS * std::mem::size_of::<MrSlot>();
/// FIFO rings a segment holds (beyond them `alloc_fifo` falls back to the heap, and peers'
/// writes into those rings to `process_vm_writev`).
pub const FIFO_SLOTS: usize = 512;
/// Bytes per FIFO slot (a ring, rounded up to pages).
pub const FIFO_STRIDE: usize = std::mem::size_of::<FifoRing>().next_multiple_of(4096);
const FIFO_OFF: usize = (QP_OFF + QP_SLOTS * std::mem::size_of::<QpBlock>()).next_multiple_of(4096);
/// Total bytes of a segment (virtual; pages are allocated as they are touched).
pub const BYTES: usize = FIFO_OFF + FIFO_SLOTS * FIFO_STRIDE;

/// Access bits stored in a slot.
pub const ACC_LOCAL_WRITE: u32 = 1;
/// Peers may write.
pub const ACC_REMOTE_WRITE: u32 = 2;
/// Peers may read.
pub const ACC_REMOTE_READ: u32 = 4;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    pid: AtomicU32,
    nonce: AtomicU64,
}

/// One registration slot: a read-mostly line, then the lease counters of this process and of
/// peers on lines of their own (so leases from both sides of a ping-pong never share a line,
/// and never invalidate the read-mostly line).
#[repr(C, align(64))]
pub struct MrSlot {
    /// `gen << 1 | valid`.
    state: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    access: AtomicU32,
    _p0: [u32; 9],
    /// Leases held by peers right now.
    busy_remote: AtomicU32,
    _p1: [u32; 15],
    /// Leases held by the owner's own copies right now.
    busy_local: AtomicU32,
    _p2: [u32; 15],
}

/// The receive side of one QP.
#[repr(C, align(64))]
pub struct QpBlock {
    /// The QP number while the QP lives, 0 when free.
    pub state: AtomicU64,
    _p0: [u64; 7],
    /// Receives posted so far (written by the owner).
    pub recv_posted: AtomicU64,
    _p1: [u64; 7],
    _p3: [u64; 8],
    /// One entry per delivery `t`, at `t % RING`.
    pub ring: [RingEntry; RING],
}

/// One write-with-immediate delivery.
#[repr(C)]
pub struct RingEntry {
    /// `t + 1` once the entry of delivery `t` is complete.
    pub seq: AtomicU64,
    /// `imm << 32 | byte_len`.
    pub meta: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<MrSlot>() == 192);
const _: () = assert!(std::mem::size_of::<Header>() <= HDR_BYTES);
const _: () = assert!(QP_OFF % 64 == 0);

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
    /// The segment whose registration table granted it.
    seg: &'a Segment,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // Release: pairs with the SeqCst/Acquire `busy` loads in `dereg`: our copy happened
        // before the owner sees the lease gone.
        self.busy.fetch_sub(1, Ordering::Release);
    }
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
        let h = s.header();
        // Relaxed: peers only map the segment after receiving our address over the control
        // path, which happens-after this store (socket / thread hand-off).
        h.version.store(VERSION, Ordering::Relaxed);
        h.pid.store(pid as u32, Ordering::Relaxed);
        h.nonce.store(nonce, Ordering::Relaxed);
        // Release: publishes the header fields above; pairs with the Acquire in `attach`.
        h.magic.store(MAGIC, Ordering::Release);
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
        let h = s.header();
        // Acquire: pairs with the Release store of `magic` in `create`.
        let ok = h.magic.load(Ordering::Acquire) == MAGIC
            && h.version.load(Ordering::Relaxed) == VERSION
            && h.pid.load(Ordering::Relaxed) == pid as u32
            && h.nonce.load(Ordering::Relaxed) == nonce;
        if !ok {
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

    /// The QP block `idx` (must be < [`QP_SLOTS`]).
    pub fn qp_block(&self, idx: usize) -> &QpBlock {
        debug_assert!(idx < QP_SLOTS);
        let idx = idx % QP_SLOTS;
        // SAFETY: in bounds, 64-byte aligned (QP_OFF and the block size are 64-multiples);
        // atomics and padding only, valid for any bit pattern; lives as long as `self`.
        unsafe {
            &*(self
                .map
                .as_ptr()
                .add(QP_OFF + idx * std::mem::size_of::<QpBlock>())
                as *const QpBlock)
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
    fn fifo_area_ptr(&self, base: u64, raddr: u64, len: u64) -> Option<u64> {
        let off = raddr.checked_sub(base)?;
        let end = off.checked_add(len)?;
        (off >= FIFO_OFF as u64 && end <= BYTES as u64).then(|| self.map.as_ptr() as u64 + off)
    }

    /// Takes a lease on the registration `key` covering `[addr, addr + len)` with `need`;
    /// `own` says the lease is taken by the owner process itself (its local SGE).
    #[inline]
    pub fn lease(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: u32,
        own: bool,
    ) -> Result<Lease<'_>, LeaseError> {
        let idx = (key & 0xffff) as usize;
        if idx == 0 {
            return Err(LeaseError::Key);
        }
        let slot = self.mr(idx);
        let busy = if own {
            &slot.busy_local
        } else {
            &slot.busy_remote
        };
        // SeqCst: the Dekker pair with `dereg` (store state, load busy); see the module doc.
        busy.fetch_add(1, Ordering::SeqCst);
        let lease = Lease { busy, seg: self };
        // SeqCst: see above; also acquires the fields written before `reg`'s Release store.
        let st = slot.state.load(Ordering::SeqCst);
        if st != (((key >> 16) as u64) << 1) | 1 {
            return Err(LeaseError::Key);
        }
        // Relaxed: ordered after the state load above (which synchronised with `reg`).
        let (a, l) = (
            slot.addr.load(Ordering::Relaxed),
            slot.len.load(Ordering::Relaxed),
        );
        let end = addr.checked_add(len).ok_or(LeaseError::Range)?;
        if addr < a || end > a.saturating_add(l) {
            return Err(LeaseError::Range);
        }
        // Relaxed: as `addr`/`len` above.
        if slot.access.load(Ordering::Relaxed) & need != need {
            return Err(LeaseError::Access);
        }
        Ok(lease)
    }

    /// Owner: fills free slot `idx` and makes it valid; returns the key.
    pub fn reg(&self, idx: usize, addr: u64, len: u64, access: u32) -> u32 {
        let slot = self.mr(idx);
        // Relaxed: only the owner writes `state`.
        let gen = (((slot.state.load(Ordering::Relaxed) >> 1) + 1) & 0xffff).max(1);
        // Relaxed: published by the Release store of `state` below.
        slot.addr.store(addr, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.access.store(access, Ordering::Relaxed);
        // Release: pairs with the SeqCst (acquiring) state load in `lease`.
        slot.state.store((gen << 1) | 1, Ordering::Release);
        ((gen as u32) << 16) | idx as u32
    }

    /// Owner: invalidates slot `idx` and waits (≤ `timeout`) for leases to drain. Returns
    /// `false` when a lease was still held at the deadline (the slot must be quarantined).
    pub fn dereg(&self, idx: usize, timeout: Duration) -> bool {
        let slot = self.mr(idx);
        // Relaxed: only the owner writes `state`.
        let st = slot.state.load(Ordering::Relaxed);
        // SeqCst: the Dekker pair with `lease` (see the module doc).
        slot.state.store(st & !1, Ordering::SeqCst);
        let start = Instant::now();
        let mut spins = 0u32;
        // SeqCst: see above; it also acquires the Release of every dropped lease.
        while slot.busy_remote.load(Ordering::SeqCst) != 0
            || slot.busy_local.load(Ordering::SeqCst) != 0
        {
            if start.elapsed() >= timeout {
                return false;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        true
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
        Fabric::Cross { base, .. } if dir == Dir::Write && len <= WORD_COPY_MAX => {
            match remote.seg.fifo_area_ptr(base, raddr, len as u64) {
                Some(dst) => {
                    // SAFETY: `dst..dst + len` is inside our mapping of the peer's segment
                    // (checked), which the remote lease borrows (it outlives the copy); the
                    // segment is atomics only, written here with atomic stores. The source is
                    // inside a live local registration (lease), probed at `reg_mr`.
                    unsafe { sys::atomic_copy(dst, laddr, len) };
                    len
                }
                // SAFETY: as in the general arm below.
                None => unsafe { cross(dir, fabric, laddr, raddr, len) }?,
            }
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
