//! The memory provider: where a connection's shared structures and buffers come from.
//!
//! NCCL allocates with CUDA (pinned host memory, device memory, cuMem shareable handles,
//! GDR-copy mappings). The engine only needs the operations below, so a CUDA, HIP or plain
//! host-memory implementation can stand behind it. The engine allocates at connect and frees
//! exactly what it took at free; it never allocates during progress.
//!
//! GDR copy (NCCL's `gdcSync` / `gdcFlush`): a provider that can map a word of device memory
//! into the proxy's address space returns it from [`MemProvider::gdc_alloc`]. The engine then
//! keeps the ring counter it writes (`head` on send, `tail` on recv) in that word instead of in
//! host memory, fencing write-combined stores with [`MemProvider::store_fence`], and, when
//! flushing through GDR copy is enabled, flushes received data with one read of a mapped word
//! ([`MemProvider::flush_read`]) instead of the network's `iflush`.
//!
//! Across processes (the GPU's process is not the proxy's, see [`super::xmap`]): the proxy's
//! provider describes each bank it allocated with [`MemProvider::export`] (POSIX shared memory
//! for host banks, a cuMem shareable handle or CUDA IPC handle for device banks); the GPU
//! process's provider maps it with [`MemProvider::import`] and unmaps it with
//! [`MemProvider::unimport`]. Freeing the region in the proxy process does not wait for the
//! importer: each side unmaps its own mapping, and the memory goes when the last one does.

use super::export::BankDesc;
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::{AtomicU64, Ordering};

/// Where a region lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemKind {
    /// Host memory the GPU can access (pinned / mapped).
    Host,
    /// Device (GPU) memory.
    Device,
}

/// Memory handed out by a [`MemProvider`].
///
/// Built only through [`Region::new`] (unsafe: the provider vouches for the memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    cpu: u64,
    gpu: u64,
    size: usize,
    kind: MemKind,
    handle: u64,
}

impl Region {
    /// Describes memory at `cpu` (the proxy's address; for device memory, the address the
    /// network registers) and `gpu` (the address GPU kernels use), `size` bytes.
    /// `handle` is the provider's own token (an IPC/shareable handle, an allocation id).
    ///
    /// # Safety
    /// `[cpu, cpu + size)` must be readable and writable by the calling process, zero-filled,
    /// aligned to 4096 bytes, and stay valid until the region is given back to
    /// [`MemProvider::free`]. Concurrent access by the GPU side must be through the atomic
    /// protocols of [`super::shared`] and the data buffers only.
    #[allow(unsafe_code)]
    pub unsafe fn new(cpu: u64, gpu: u64, size: usize, kind: MemKind, handle: u64) -> Self {
        Self {
            cpu,
            gpu,
            size,
            kind,
            handle,
        }
    }
    /// The proxy's address.
    #[inline]
    pub fn cpu(&self) -> u64 {
        self.cpu
    }
    /// The GPU's address.
    #[inline]
    pub fn gpu(&self) -> u64 {
        self.gpu
    }
    /// Size in bytes.
    #[inline]
    pub fn size(&self) -> usize {
        self.size
    }
    /// Host or device.
    #[inline]
    pub fn kind(&self) -> MemKind {
        self.kind
    }
    /// The provider's token.
    #[inline]
    pub fn handle(&self) -> u64 {
        self.handle
    }
}

/// Allocation, DMA-BUF export and GDR-copy mapping for the engine.
///
/// # Safety
/// Every [`Region`] returned must satisfy [`Region::new`]'s contract. Methods are called from
/// the proxy thread only, at connect and free (never during progress), except
/// [`MemProvider::store_fence`] and [`MemProvider::flush_read`].
#[allow(unsafe_code)]
pub unsafe trait MemProvider {
    /// Allocates `size` zeroed bytes of `kind` memory, 4096-aligned.
    fn alloc(&mut self, kind: MemKind, size: usize) -> Result<Region>;
    /// Gives a region back.
    fn free(&mut self, region: Region) -> Result<()>;
    /// A DMA-BUF fd for `[offset, offset + len)` of device region `region`, or `None` when the
    /// provider cannot export one (the engine then registers by address). The engine closes it
    /// with [`MemProvider::close_dmabuf`] right after registration.
    fn dmabuf_fd(&mut self, region: &Region, offset: usize, len: usize) -> Result<Option<i32>> {
        let _ = (region, offset, len);
        Ok(None)
    }
    /// Closes an fd from [`MemProvider::dmabuf_fd`].
    fn close_dmabuf(&mut self, fd: i32) {
        let _ = fd;
    }
    /// Maps `words` 8-byte words of device memory for the proxy (GDR copy): `cpu` is the
    /// proxy's mapping, `gpu` the device address. `None` when GDR copy is not available.
    fn gdc_alloc(&mut self, words: usize) -> Result<Option<Region>> {
        let _ = words;
        Ok(None)
    }
    /// Describes `region` (from [`MemProvider::alloc`]) so another process can map it.
    /// Called at connect for every bank of a cross-process connection; must not take
    /// resources that outlive the region (release them in [`MemProvider::free`]). The engine
    /// fills in the bank. The default: not exportable.
    fn export(&mut self, region: &Region) -> Result<BankDesc> {
        let _ = region;
        Err(Error::BadState {
            op: "export proxy memory",
            state: "memory provider cannot share memory across processes",
        })
    }
    /// Maps a bank another process exported (in the GPU's process). The region's `cpu` is
    /// this process's mapping, `gpu` the address its kernels use. The descriptor has passed
    /// [`BankDesc::check`]; the provider checks its handle. The default: cannot import.
    fn import(&mut self, desc: &BankDesc) -> Result<Region> {
        let _ = desc;
        Err(Error::BadState {
            op: "import proxy memory",
            state: "memory provider cannot share memory across processes",
        })
    }
    /// Unmaps a region from [`MemProvider::import`].
    fn unimport(&mut self, region: Region) -> Result<()> {
        let _ = region;
        Err(Error::BadState {
            op: "unimport proxy memory",
            state: "memory provider cannot share memory across processes",
        })
    }
    /// Flushes write-combined stores to a GDR-copy mapping (NCCL's `wc_store_fence`).
    fn store_fence(&self) {}
    /// Forces earlier network writes into device memory to complete by reading `word`, a
    /// GDR-copy mapped word (a PCIe read).
    fn flush_read(&self, word: &AtomicU64) {
        // SeqCst: a real load that the compiler cannot drop or move; the read is the flush.
        core::hint::black_box(word.load(Ordering::SeqCst));
    }
}
