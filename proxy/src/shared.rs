//! The memory the GPU and the proxy share, `#[repr(C)]` with NCCL's layout.
//!
//! A connection owns one [`SendMem`] and one [`RecvMem`] (in host memory, mapped for the GPU),
//! plus its data buffers. Who writes what:
//!
//! ```text
//!                     send connection                 recv connection
//!  SendMem.head       proxy → GPU: credits            GPU → proxy: slots consumed
//!  RecvMem.tail       GPU → proxy: slots filled       proxy → GPU: slots landed
//!  connFifo[s].size   GPU sets (bytes), proxy resets  GPU sets (registered mode: "kernel
//!                     to -1 before `head` moves       started"), proxy resets to -1
//!  connFifo[s].offset proxy → GPU (shared buffers)    proxy → GPU (shared buffers)
//!  connFifo[s].mode   set once at connect: NORMAL (dedicated) or OFFSET (shared buffers)
//! ```
//!
//! Counters are absolute step numbers (`u64`, never wrap in practice); slot `k % N` holds step
//! `k`. A size of -1 (all ones, as `ssize_t`) marks an empty slot.
//!
//! Orderings (the GPU's `__threadfence_system` + volatile stores map to Release, its volatile
//! loads + fence to Acquire):
//! * A writer fills data and `connFifo` fields, then stores the counter with **Release**; the
//!   other side loads the counter with **Acquire** and then reads them.
//! * `size` is published by the GPU with Release and loaded by the proxy with Acquire (LL uses
//!   no `tail`: the size and the line flags are all it has).
//! * The proxy resets `size` to -1 with Relaxed *before* its Release store of `head`: the GPU
//!   only refills a slot after an Acquire load of `head` that covers it, so its next `size` is
//!   ordered after the reset (checked by the loom model `loom_proxy`).
//!
//! The raw views into memory from a [`MemProvider`](super::MemProvider) ([`MemRef`],
//! [`BufView`]) are this module's `unsafe`; the proxy's only other `unsafe` items are
//! [`Region::new`](super::Region::new) and the `MemProvider` trait (`mem`), and the GPU-side
//! constructors from a `DeviceView` (`device`).
#![allow(unsafe_code)]

use core::marker::PhantomData;
use core::ptr::NonNull;

use super::mem::Region;
use super::STEPS;
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::{AtomicU32, AtomicU64, Ordering};

/// The size value of an empty slot (-1 as `ssize_t`).
pub const SIZE_EMPTY: u64 = u64::MAX;

/// One slot's descriptor in `RecvMem::connFifo` (NCCL's `struct ncclConnFifo`).
#[repr(C)]
#[derive(Debug)]
pub struct ConnFifo {
    mode: AtomicU32,
    offset: AtomicU32,
    size: AtomicU64,
    ptr: AtomicU64,
}

impl Default for ConnFifo {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnFifo {
    /// An empty slot in NORMAL mode.
    pub fn new() -> Self {
        Self {
            mode: AtomicU32::new(super::MODE_NORMAL),
            offset: AtomicU32::new(0),
            size: AtomicU64::new(SIZE_EMPTY),
            ptr: AtomicU64::new(0),
        }
    }

    /// The published size, or `None` for an empty slot (-1).
    #[inline]
    pub fn size(&self) -> Option<u64> {
        // Acquire: pairs with the Release in `publish`; data and offset written before the size
        // are visible.
        let s = self.size.load(Ordering::Acquire);
        (s != SIZE_EMPTY).then_some(s)
    }

    /// Producer: publishes `size` bytes in this slot.
    #[inline]
    pub fn publish(&self, size: u64) {
        // Release: pairs with the Acquire in `size`.
        self.size.store(size, Ordering::Release);
    }

    /// Marks the slot empty (-1). The caller publishes the reset with a Release store of the
    /// ring's `head` (see the module doc).
    #[inline]
    pub fn clear(&self) {
        // Relaxed: ordered before the caller's Release store of `head`, which the GPU acquires
        // before it refills this slot.
        self.size.store(SIZE_EMPTY, Ordering::Relaxed);
    }

    /// The slot's offset into the shared buffer (OFFSET mode).
    #[inline]
    pub fn offset(&self) -> u32 {
        // Relaxed: written by the proxy before its Release credit/tail store, which the reader
        // acquired; the proxy reading back its own value needs no ordering.
        self.offset.load(Ordering::Relaxed)
    }

    /// Sets the slot's offset (proxy, shared-buffer mode), published by the next credit/tail.
    #[inline]
    pub fn set_offset(&self, off: u32) {
        // Relaxed: published by the proxy's next Release store of `head` (send) / `tail` (recv).
        self.offset.store(off, Ordering::Relaxed);
    }

    /// The slot's mode ([`super::MODE_NORMAL`] or [`super::MODE_OFFSET`]).
    #[inline]
    pub fn mode(&self) -> u32 {
        // Relaxed: set once at connect, before the connection is handed to the GPU.
        self.mode.load(Ordering::Relaxed)
    }

    /// Sets the mode (at connect).
    #[inline]
    pub fn set_mode(&self, m: u32) {
        // Relaxed: the connection is not running yet; handing it out publishes it.
        self.mode.store(m, Ordering::Relaxed);
    }

    /// The pointer field (NCCL's `MODE_PTR`; unused by this engine, kept for layout).
    #[inline]
    pub fn ptr(&self) -> u64 {
        // Relaxed: not part of any protocol here.
        self.ptr.load(Ordering::Relaxed)
    }
}

/// The proxy's side of a ring's progress counter (`head` or `tail`).
#[inline]
pub fn load_step(word: &AtomicU64) -> u64 {
    // Acquire: pairs with the Release in `store_step` on the other side.
    word.load(Ordering::Acquire)
}

/// Publishes a ring counter: everything written before (data, `connFifo` fields, size resets)
/// is visible to whoever loads it with [`load_step`].
#[inline]
pub fn store_step(word: &AtomicU64, v: u64) {
    // Release: pairs with the Acquire in `load_step`.
    word.store(v, Ordering::Release);
}

/// Memory the proxy writes and the GPU reads for a connection (NCCL's `struct ncclSendMem`):
/// `head` on a send connection (credits), on a recv connection the GPU's consumed count.
// Under loom the layout does not matter and a 4 KiB alignment overflows loom's small
// coroutine stacks.
#[cfg_attr(not(loom), repr(C, align(4096)))]
#[cfg_attr(loom, repr(C))]
#[derive(Debug)]
pub struct SendMem {
    /// Ring counter: see the module doc.
    pub head: AtomicU64,
    _pad1: [u8; 56],
    ptr_exchange: AtomicU64,
    red_op_arg_exchange: [AtomicU64; 2],
    _pad2: [u8; 40],
    offs_fifo: [AtomicU32; STEPS],
}

impl Default for SendMem {
    fn default() -> Self {
        Self::new()
    }
}

impl SendMem {
    /// A zeroed `SendMem` (head 0).
    pub fn new() -> Self {
        Self {
            head: AtomicU64::new(0),
            _pad1: [0; 56],
            ptr_exchange: AtomicU64::new(0),
            red_op_arg_exchange: core::array::from_fn(|_| AtomicU64::new(0)),
            _pad2: [0; 40],
            offs_fifo: core::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

/// Memory the GPU writes and the proxy reads on a send connection, and the reverse on a recv
/// connection (NCCL's `struct ncclRecvMem`). `N` is [`STEPS`] except in loom models.
#[cfg_attr(not(loom), repr(C, align(4096)))]
#[cfg_attr(loom, repr(C))]
#[derive(Debug)]
pub struct RecvMem<const N: usize = STEPS> {
    /// Ring counter: see the module doc.
    pub tail: AtomicU64,
    _pad1: [u8; 56],
    /// Per-slot descriptors.
    pub conn_fifo: [ConnFifo; N],
    /// Word a GDR-copy flush may read (NCCL's `flush`).
    pub flush: AtomicU32,
}

impl<const N: usize> Default for RecvMem<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> RecvMem<N> {
    /// Tail 0, every slot empty.
    pub fn new() -> Self {
        const { assert!(N > 0) };
        Self {
            tail: AtomicU64::new(0),
            _pad1: [0; 56],
            conn_fifo: core::array::from_fn(|_| ConnFifo::new()),
            flush: AtomicU32::new(0),
        }
    }

    /// The slot of step `step`.
    #[inline]
    pub fn slot(step: u64) -> usize {
        (step % N as u64) as usize
    }

    /// Proxy, send connection: is step `step` ready? Returns its size when `connFifo` holds one
    /// and (unless `need_tail` is false, as for LL) `tail` has passed `tail_step`.
    #[inline]
    pub fn ready(&self, step: u64, tail_step: u64, need_tail: bool) -> Option<u64> {
        let size = self.conn_fifo[Self::slot(step)].size()?;
        if need_tail && load_step(&self.tail) <= tail_step {
            return None;
        }
        Some(size)
    }

    /// Proxy, send connection: the network is done with step `step`: reset its size, then
    /// hand the slot back to the GPU by storing `new_head` into `head` (when `Some`; shared-buffer
    /// connections post credits elsewhere).
    #[inline]
    pub fn retire(&self, step: u64, head: Option<(&AtomicU64, u64)>) {
        self.conn_fifo[Self::slot(step)].clear();
        if let Some((w, v)) = head {
            store_step(w, v);
        }
    }
}

#[cfg(not(loom))]
const _: () = {
    assert!(core::mem::size_of::<ConnFifo>() == 24);
    assert!(core::mem::size_of::<SendMem>() == 4096);
    assert!(core::mem::offset_of!(SendMem, offs_fifo) == 128);
    assert!(core::mem::size_of::<RecvMem>() == 4096);
    assert!(core::mem::offset_of!(RecvMem, conn_fifo) == 64);
    assert!(core::mem::offset_of!(RecvMem, flush) == 64 + 24 * STEPS);
};

/// A typed view of a `T` inside memory a [`MemProvider`](super::MemProvider) handed out.
///
/// Built only by `MemRef::at` (crate-private), which checks bounds and alignment against the region. The
/// engine keeps a region alive (does not free it) while views into it exist.
#[derive(Debug)]
pub struct MemRef<T> {
    ptr: NonNull<T>,
    _t: PhantomData<*const T>,
}

impl<T> Clone for MemRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MemRef<T> {}

impl<T> MemRef<T> {
    /// A view of the `T` at byte `offset` in `region` (CPU address).
    ///
    /// `T` must be a type for which all-zero bytes are a valid value (the atomics-only structs
    /// of this module): regions are zeroed on allocation.
    pub(crate) fn at(region: &Region, offset: usize) -> Result<Self> {
        let size = core::mem::size_of::<T>();
        let end = offset.checked_add(size).ok_or(Error::OutOfRange {
            what: "shared structure offset",
            value: offset as i64,
            min: 0,
            max: region.size() as i64,
        })?;
        let addr = region.cpu().wrapping_add(offset as u64);
        if end > region.size() || !addr.is_multiple_of(core::mem::align_of::<T>() as u64) {
            return Err(Error::OutOfRange {
                what: "shared structure offset",
                value: offset as i64,
                min: 0,
                max: region.size().saturating_sub(size) as i64,
            });
        }
        let ptr = NonNull::new(addr as *mut T).ok_or(Error::Missing {
            what: "region address",
        })?;
        Ok(Self {
            ptr,
            _t: PhantomData,
        })
    }

    /// The address of the view.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The `T`.
    #[inline]
    pub fn get(&self) -> &T {
        // SAFETY: `at` checked that `[addr, addr + size_of::<T>())` lies inside a region whose
        // memory the `MemProvider` contract makes valid, zero-initialised and aligned to 4096
        // (checked alignment here), and `T` is valid when zeroed. The engine frees a region only
        // in `ProxyState::free`, after which no `MemRef` into it is used. Every field of `T` is
        // an atomic, so shared access from the GPU side is not a data race.
        unsafe { self.ptr.as_ref() }
    }
}

/// A bounds-checked window of a data buffer, read as 8-byte atomic words (LL / LL128 flags).
#[derive(Debug, Clone, Copy)]
pub struct BufView {
    addr: u64,
    len: usize,
}

impl BufView {
    /// `[addr, addr + len)`, which must lie inside `region` and be 8-byte aligned.
    pub(crate) fn new(region: &Region, addr: u64, len: usize) -> Result<Self> {
        let start = region.cpu();
        let ok = addr >= start
            && addr.is_multiple_of(8)
            && (addr - start)
                .checked_add(len as u64)
                .is_some_and(|e| e <= region.size() as u64);
        if !ok {
            return Err(Error::OutOfRange {
                what: "buffer window",
                value: addr.wrapping_sub(start) as i64,
                min: 0,
                max: region.size() as i64,
            });
        }
        Ok(Self { addr, len })
    }

    /// Words in the window.
    #[inline]
    pub fn words(&self) -> usize {
        self.len / 8
    }

    /// Word `i` (Acquire load): pairs with the producer's Release store of the word, so a flag
    /// seen here makes the data written before it visible.
    #[inline]
    pub fn load(&self, i: usize) -> Option<u64> {
        if i >= self.words() {
            return None;
        }
        let p = (self.addr + 8 * i as u64) as *const AtomicU64;
        // SAFETY: `new` checked that the window lies in a live region (MemProvider contract:
        // valid, zeroed, not freed while the engine runs) and is 8-byte aligned; `i` is in
        // bounds. Any bit pattern is a valid `u64`; the producer writes these words atomically.
        let w = unsafe { &*p };
        // Acquire: pairs with the producer's Release store of the line (see `device`).
        Some(w.load(Ordering::Acquire))
    }
}
