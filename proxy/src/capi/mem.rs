//! Memory for the engine behind the C API: the caller's allocator (`ibnet_proxy_mem_t`
//! callbacks), or zeroed, page-aligned host memory from this library: POSIX shared memory
//! ([`ShmBank`]), so every bank can be exported to a GPU process other than the proxy's and
//! imported there.
//!
//! The engine allocates only at connect and frees at free, so a `Vec` of live allocations is
//! fine here (never touched during progress).

use core::ffi::{c_int, c_void};

use crate::{BankDesc, MemKind, MemProvider, Region};
use ibnet_core::sync::{AtomicU64, Ordering};
use ibnet_core::{Error, Result};

use super::shm::ShmBank;

/// `ibnet_proxy_mem_t`: the caller's allocator. `alloc` returns zeroed, 4096-aligned memory of
/// `kind` (0 host, 1 device) readable and writable by this process at `*cpu`, and the address
/// GPU kernels use at `*gpu` (the same as `cpu` for host memory), plus a token of its own in
/// `*handle`; it returns 0 on success. `free` gives back what `alloc` (or `gdc_alloc`)
/// returned. Every later callback is optional (NULL: not offered); see `include/ibnet.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CMemTable {
    /// Passed back to every callback.
    pub ctx: *mut c_void,
    /// Allocates.
    pub alloc: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            kind: c_int,
            size: usize,
            cpu: *mut *mut c_void,
            gpu: *mut u64,
            handle: *mut u64,
        ) -> c_int,
    >,
    /// Frees.
    pub free:
        Option<unsafe extern "C" fn(ctx: *mut c_void, cpu: *mut c_void, handle: u64) -> c_int>,
    /// GDR copy: `words` 8-byte device words mapped for this process (`*cpu`, write-combined)
    /// at device address `*gpu`; freed through `free`.
    pub gdc_alloc: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            words: usize,
            cpu: *mut *mut c_void,
            gpu: *mut u64,
            handle: *mut u64,
        ) -> c_int,
    >,
    /// Flushes write-combined stores to GDR-copy words (NCCL's `wc_store_fence`).
    pub store_fence: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
    /// Forces earlier network writes into device memory by reading `word` (a GDR-copy word);
    /// NULL: the library reads it.
    pub flush_read: Option<unsafe extern "C" fn(ctx: *mut c_void, word: *const u64)>,
    /// A DMA-BUF fd for `[offset, offset + len)` of the device region at `cpu`, in `*fd`
    /// (-1: none; the library closes it after registration).
    pub dmabuf_fd: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            cpu: *mut c_void,
            handle: u64,
            offset: usize,
            len: usize,
            fd: *mut c_int,
        ) -> c_int,
    >,
    /// Describes the region at `cpu` for another process: `*kind` (an `IBNET_HANDLE_*`), up
    /// to 64 bytes of `handle_out`, and `*offset` of the region in the exported object.
    pub export_mem: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            cpu: *mut c_void,
            handle: u64,
            size: usize,
            kind: *mut c_int,
            handle_out: *mut u8,
            offset: *mut u64,
        ) -> c_int,
    >,
    /// Maps what another process's `export_mem` described (`owner`: its pid): `*cpu` for
    /// this process, `*gpu` for kernels, `*token` for `unimport_mem`.
    pub import_mem: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            kind: c_int,
            handle: *const u8,
            owner: u64,
            size: usize,
            offset: u64,
            cpu: *mut *mut c_void,
            gpu: *mut u64,
            token: *mut u64,
        ) -> c_int,
    >,
    /// Unmaps what `import_mem` mapped.
    pub unimport_mem:
        Option<unsafe extern "C" fn(ctx: *mut c_void, cpu: *mut c_void, token: u64) -> c_int>,
}

/// The engine's memory: the caller's callbacks or this library's host memory.
pub struct ProxyMem {
    table: Option<CMemTable>,
    live: Vec<ShmBank>,
    imported: Vec<ShmBank>,
}

impl ProxyMem {
    /// Host memory from this library.
    pub fn host() -> Self {
        Self {
            table: None,
            live: Vec::new(),
            imported: Vec::new(),
        }
    }

    /// The caller's allocator.
    ///
    /// # Safety
    /// The callbacks must behave as [`CMemTable`] documents for as long as this value lives.
    pub unsafe fn from_table(t: CMemTable) -> Result<Self> {
        if t.alloc.is_none() || t.free.is_none() {
            return Err(Error::Missing {
                what: "ibnet_proxy_mem_t alloc/free",
            });
        }
        if t.import_mem.is_some() && t.unimport_mem.is_none() {
            return Err(Error::Missing {
                what: "ibnet_proxy_mem_t unimportMem (importMem is set)",
            });
        }
        Ok(Self {
            table: Some(t),
            live: Vec::new(),
            imported: Vec::new(),
        })
    }

    /// Live allocations from this library's host memory, and live imports.
    pub fn live(&self) -> usize {
        self.live.len() + self.imported.len()
    }
}

// SAFETY: host regions are fresh zeroed 4096-aligned allocations freed only through `free`;
// regions from the caller's table carry its contract (see `ProxyMem::from_table`).
unsafe impl MemProvider for ProxyMem {
    fn alloc(&mut self, kind: MemKind, size: usize) -> Result<Region> {
        if let Some(t) = self.table {
            let f = t.alloc.ok_or(Error::Missing { what: "alloc" })?;
            let (mut cpu, mut gpu, mut h) = (core::ptr::null_mut(), 0u64, 0u64);
            let k = match kind {
                MemKind::Host => 0,
                MemKind::Device => 1,
            };
            // SAFETY: the caller's callback, with valid out-pointers.
            let rc = unsafe { f(t.ctx, k, size, &mut cpu, &mut gpu, &mut h) };
            if rc != 0 || cpu.is_null() || !(cpu as usize).is_multiple_of(4096) {
                return Err(Error::Provider {
                    call: "ibnet_proxy_mem_t alloc",
                    errno: rc,
                });
            }
            // SAFETY: the callback's contract (zeroed, aligned, mapped until freed).
            return Ok(unsafe { Region::new(cpu as u64, gpu, size, kind, h) });
        }
        let b = ShmBank::create(size.max(8))?;
        let a = b.addr();
        self.live.push(b);
        // SAFETY: a fresh zero-filled shared mapping of at least `size` bytes, page-aligned,
        // mapped until `free` drops it.
        Ok(unsafe { Region::new(a, a, size, kind, 0) })
    }

    fn free(&mut self, r: Region) -> Result<()> {
        if let Some(t) = self.table {
            let f = t.free.ok_or(Error::Missing { what: "free" })?;
            // SAFETY: a region the callback allocated, freed once.
            let rc = unsafe { f(t.ctx, r.cpu() as *mut c_void, r.handle()) };
            if rc != 0 {
                return Err(Error::Provider {
                    call: "ibnet_proxy_mem_t free",
                    errno: rc,
                });
            }
            return Ok(());
        }
        let i = self
            .live
            .iter()
            .position(|b| b.addr() == r.cpu())
            .ok_or(Error::Missing { what: "region" })?;
        drop(self.live.swap_remove(i));
        Ok(())
    }

    fn export(&mut self, r: &Region) -> Result<BankDesc> {
        if let Some(t) = &self.table {
            return t.export(r);
        }
        let b = self
            .live
            .iter()
            .find(|b| b.addr() == r.cpu())
            .ok_or(Error::Missing {
                what: "region to export",
            })?;
        b.export()
    }

    fn import(&mut self, d: &BankDesc) -> Result<Region> {
        if let Some(r) = self
            .table
            .as_ref()
            .map(|t| t.import(d))
            .transpose()?
            .flatten()
        {
            return Ok(r);
        }
        // Without the caller's importMem: the library's own shared memory (host banks).
        let b = ShmBank::import(d)?;
        let (a, n) = (b.addr(), b.len());
        self.imported.push(b);
        // SAFETY: a shared mapping of `n` bytes, page-aligned, mapped until `unimport`; the
        // exporter zero-filled it at creation. Its contents follow the shared protocols.
        Ok(unsafe { Region::new(a, a, n, MemKind::Host, 0) })
    }

    fn unimport(&mut self, r: Region) -> Result<()> {
        match self.imported.iter().position(|b| b.addr() == r.cpu()) {
            Some(i) => {
                drop(self.imported.swap_remove(i));
                Ok(())
            }
            None => match &self.table {
                Some(t) => t.unimport(&r),
                None => Err(Error::Missing {
                    what: "imported region",
                }),
            },
        }
    }

    fn dmabuf_fd(&mut self, r: &Region, offset: usize, len: usize) -> Result<Option<i32>> {
        self.table.map_or(Ok(None), |t| t.dmabuf(r, offset, len))
    }

    fn close_dmabuf(&mut self, fd: i32) {
        // SAFETY: an fd the caller's dmabufFd handed over for us to close, closed once.
        unsafe { libc::close(fd) };
    }

    fn gdc_alloc(&mut self, words: usize) -> Result<Option<Region>> {
        self.table.map_or(Ok(None), |t| t.gdc(words))
    }

    fn store_fence(&self) {
        if let Some(t) = &self.table {
            t.fence();
        }
    }

    fn flush_read(&self, word: &AtomicU64) {
        if !self.table.is_some_and(|t| t.flush(word)) {
            // SeqCst: a real load the compiler cannot drop; the read is the flush.
            core::hint::black_box(word.load(Ordering::SeqCst));
        }
    }
}
