//! The GPU side of the ring protocol, for host-side producers/consumers, simulators and the
//! loom models. A CUDA/HIP kernel does the same with volatile accesses and fences.
//!
//! ```text
//!  send connection (GPU produces step k)         recv connection (GPU consumes step k)
//!  1. wait  has_credit(k): head + N > k          1. wait  arrived(k): tail > k
//!  2. fill slot k % N (OFFSET mode: at           2. read slot k % N (OFFSET mode: at
//!     offset(k) in the shared buffer)               offset(k) in the shared buffer)
//!  3. publish(k, bytes): size; advance(k+1):    3. consume(k+1): head = k+1
//!     tail (LL: size only; the flags do the rest)
//!  registered mode: publish(base, n) once; wait until the proxy resets the size to -1
//! ```

use super::lifecycle::DeviceView;
use super::shared::{load_step, store_step, RecvMem};
use super::{Dir, STEPS};
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::AtomicU64;

/// The GPU side of a send connection.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSend<'a, const N: usize = STEPS> {
    head: &'a AtomicU64,
    mem: &'a RecvMem<N>,
}

impl<'a, const N: usize> DeviceSend<'a, N> {
    /// Over the connection's `head` word and `RecvMem`.
    pub fn new(head: &'a AtomicU64, mem: &'a RecvMem<N>) -> Self {
        Self { head, mem }
    }
    /// Whether the proxy gave credit for step `k` (the slot is free to fill).
    #[inline]
    pub fn has_credit(&self, k: u64) -> bool {
        // Wrapping: shared-buffer connections start at head = -N (no credit).
        load_step(self.head).wrapping_add(N as u64) > k
    }
    /// The first step without credit: every step below it is free to fill (`head + N`). A
    /// kernel may keep it and read it again only once it used it up, as NCCL's do.
    #[inline]
    pub fn credit_end(&self) -> u64 {
        // Wrapping: shared-buffer connections start at head = -N (no credit).
        load_step(self.head).wrapping_add(N as u64)
    }
    /// The shared-buffer offset of step `k`'s slot (valid once `has_credit(k)`).
    #[inline]
    pub fn offset(&self, k: u64) -> u32 {
        self.mem.conn_fifo[RecvMem::<N>::slot(k)].offset()
    }
    /// Publishes the size of the data in step `k`'s slot (after writing the data).
    #[inline]
    pub fn publish(&self, k: u64, bytes: u64) {
        self.mem.conn_fifo[RecvMem::<N>::slot(k)].publish(bytes);
    }
    /// Moves `tail` to `to` (the step after the last one filled; SIMPLE and LL128).
    #[inline]
    pub fn advance(&self, to: u64) {
        store_step(&self.mem.tail, to);
    }
    /// Whether step `k`'s slot still holds a size (registered mode: the proxy has not finished).
    #[inline]
    pub fn pending(&self, k: u64) -> bool {
        self.mem.conn_fifo[RecvMem::<N>::slot(k)].size().is_some()
    }
}

/// The GPU side of a receive connection.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRecv<'a, const N: usize = STEPS> {
    head: &'a AtomicU64,
    tail: &'a AtomicU64,
    mem: &'a RecvMem<N>,
}

impl<'a, const N: usize> DeviceRecv<'a, N> {
    /// Over the connection's `head` word, `tail` word (in `mem` or GDR-copy memory) and
    /// `RecvMem`.
    pub fn new(head: &'a AtomicU64, tail: &'a AtomicU64, mem: &'a RecvMem<N>) -> Self {
        Self { head, tail, mem }
    }
    /// Whether step `k` landed.
    #[inline]
    pub fn arrived(&self, k: u64) -> bool {
        load_step(self.tail) > k
    }
    /// The first step that has not landed (`tail`): every step below it has. A kernel may
    /// keep it and read it again only once it used it up, as NCCL's do.
    #[inline]
    pub fn landed_end(&self) -> u64 {
        load_step(self.tail)
    }
    /// The shared-buffer offset of step `k`'s slot (valid once `arrived(k)`).
    #[inline]
    pub fn offset(&self, k: u64) -> u32 {
        self.mem.conn_fifo[RecvMem::<N>::slot(k)].offset()
    }
    /// Every step before `to` is consumed: `head = to`; those slots may be reused.
    #[inline]
    pub fn consume(&self, to: u64) {
        store_step(self.head, to);
    }
    /// Registered mode: the kernel is ready to receive `bytes` into the user buffer at step
    /// `base`.
    #[inline]
    pub fn ready(&self, base: u64, bytes: u64) {
        self.mem.conn_fifo[RecvMem::<N>::slot(base)].publish(bytes);
    }
    /// Registered mode: whether the proxy still owns the user buffer.
    #[inline]
    pub fn pending(&self, base: u64) -> bool {
        self.mem.conn_fifo[RecvMem::<N>::slot(base)]
            .size()
            .is_some()
    }
}

/// The three words and the `RecvMem` of a [`DeviceView`], as references.
///
/// # Safety
/// `view` must come from [`super::ProxyState::device_view`] of a connection that stays
/// connected for `'a`, and its GPU addresses must be valid in this process (host memory, or
/// a provider whose GPU addresses are host-accessible).
#[allow(unsafe_code)]
pub unsafe fn words<'a>(view: &DeviceView) -> Result<(&'a AtomicU64, &'a AtomicU64, &'a RecvMem)> {
    let ok = |a: u64, align: u64| a != 0 && a.is_multiple_of(align);
    if !ok(view.head, 8) || !ok(view.tail, 8) || !ok(view.recv_mem, 4096) {
        return Err(Error::Missing {
            what: "device view address",
        });
    }
    // SAFETY: the caller guarantees the addresses are live, host-accessible and belong to the
    // connection's zero-initialised shared structures; alignment is checked above. Every field
    // is atomic, so sharing them with the proxy thread is race-free.
    unsafe {
        Ok((
            &*(view.head as *const AtomicU64),
            &*(view.tail as *const AtomicU64),
            &*(view.recv_mem as *const RecvMem),
        ))
    }
}

impl<'a> DeviceSend<'a> {
    /// The GPU side of a send connection's [`DeviceView`].
    ///
    /// # Safety
    /// As [`words`].
    #[allow(unsafe_code)]
    pub unsafe fn from_view(view: &DeviceView) -> Result<Self> {
        if view.dir != Dir::Send {
            return Err(Error::BadState {
                op: "DeviceSend::from_view",
                state: "receive connection",
            });
        }
        // SAFETY: forwarded to our caller.
        let (head, _, mem) = unsafe { words(view)? };
        Ok(Self::new(head, mem))
    }
}

impl<'a> DeviceRecv<'a> {
    /// The GPU side of a receive connection's [`DeviceView`].
    ///
    /// # Safety
    /// As [`words`].
    #[allow(unsafe_code)]
    pub unsafe fn from_view(view: &DeviceView) -> Result<Self> {
        if view.dir != Dir::Recv {
            return Err(Error::BadState {
                op: "DeviceRecv::from_view",
                state: "send connection",
            });
        }
        // SAFETY: forwarded to our caller.
        let (head, tail, mem) = unsafe { words(view)? };
        Ok(Self::new(head, tail, mem))
    }
}
