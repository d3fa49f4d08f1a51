//! The optional callbacks of `ibnet_proxy_mem_t` ([`CMemTable`]): GDR-copy words and their
//! fence and flush, DMA-BUF export of device memory, and cross-process export/import. Each
//! returns what the engine's [`MemProvider`](crate::MemProvider) method returns;
//! a callback the caller left NULL means "not offered".

use core::ffi::{c_int, c_void};

use crate::{BankDesc, HandleKind, MemKind, Region};
use ibnet_core::sync::AtomicU64;
use ibnet_core::{Error, Result};

use super::mem::CMemTable;

fn failed(call: &'static str, rc: c_int) -> Error {
    Error::Provider { call, errno: rc }
}

impl CMemTable {
    /// `gdc_alloc`, or `None` when not offered.
    pub(crate) fn gdc(&self, words: usize) -> Result<Option<Region>> {
        let Some(f) = self.gdc_alloc else {
            return Ok(None);
        };
        let (mut cpu, mut gpu, mut h) = (core::ptr::null_mut(), 0u64, 0u64);
        // SAFETY: the caller's callback (its contract), valid out-pointers.
        let rc = unsafe { f(self.ctx, words, &mut cpu, &mut gpu, &mut h) };
        if rc != 0 || cpu.is_null() || !(cpu as usize).is_multiple_of(8) || gpu == 0 {
            return Err(failed("ibnet_proxy_mem_t gdcAlloc", rc));
        }
        // SAFETY: the callback's contract: `words` 8-byte words mapped at `cpu` until `free`,
        // zeroed, aligned (checked 8 here; the engine needs no more for words).
        Ok(Some(unsafe {
            Region::new(cpu as u64, gpu, words * 8, MemKind::Device, h)
        }))
    }

    /// `store_fence`, when offered.
    pub(crate) fn fence(&self) {
        if let Some(f) = self.store_fence {
            // SAFETY: the caller's callback.
            unsafe { f(self.ctx) };
        }
    }

    /// `flush_read`, or `false` when not offered.
    pub(crate) fn flush(&self, w: &AtomicU64) -> bool {
        let Some(f) = self.flush_read else {
            return false;
        };
        // SAFETY: the caller's callback, given a GDR-copy word of the engine.
        unsafe { f(self.ctx, w.as_ptr().cast_const()) };
        true
    }

    /// `dmabuf_fd`: `Some(fd)`, or `None` when not offered or the callback gives none.
    pub(crate) fn dmabuf(&self, r: &Region, off: usize, len: usize) -> Result<Option<i32>> {
        let Some(f) = self.dmabuf_fd else {
            return Ok(None);
        };
        let mut fd: c_int = -1;
        // SAFETY: the caller's callback, valid out-pointer.
        let rc = unsafe {
            f(
                self.ctx,
                r.cpu() as *mut c_void,
                r.handle(),
                off,
                len,
                &mut fd,
            )
        };
        if rc != 0 {
            return Err(failed("ibnet_proxy_mem_t dmabufFd", rc));
        }
        Ok((fd >= 0).then_some(fd))
    }

    /// `export_mem` as a descriptor owned by this process.
    pub(crate) fn export(&self, r: &Region) -> Result<BankDesc> {
        let f = self.export_mem.ok_or(Error::BadState {
            op: "export proxy memory",
            state: "ibnet_proxy_mem_t has no exportMem",
        })?;
        let (mut kind, mut h, mut off) = (0 as c_int, [0u8; 64], 0u64);
        // SAFETY: the caller's callback; `h` has the 64 bytes it may write.
        let rc = unsafe {
            f(
                self.ctx,
                r.cpu() as *mut c_void,
                r.handle(),
                r.size(),
                &mut kind,
                h.as_mut_ptr(),
                &mut off,
            )
        };
        if rc != 0 {
            return Err(failed("ibnet_proxy_mem_t exportMem", rc));
        }
        let k = u8::try_from(kind)
            .ok()
            .and_then(HandleKind::from_raw)
            .ok_or(Error::OutOfRange {
                what: "exportMem handle kind",
                value: kind as i64,
                min: 1,
                max: 4,
            })?;
        BankDesc::new(k, r.size() as u64, off, std::process::id() as u64, &h)
    }

    /// `import_mem`, or `None` when not offered.
    pub(crate) fn import(&self, d: &BankDesc) -> Result<Option<Region>> {
        let Some(f) = self.import_mem else {
            return Ok(None);
        };
        let (mut cpu, mut gpu, mut tok) = (core::ptr::null_mut(), 0u64, 0u64);
        let size = usize::try_from(d.size).map_err(|_| failed("importMem size", 0))?;
        // SAFETY: the caller's callback; the handle has 64 readable bytes.
        let rc = unsafe {
            f(
                self.ctx,
                d.kind()? as c_int,
                d.handle.as_ptr(),
                d.owner,
                size,
                d.offset,
                &mut cpu,
                &mut gpu,
                &mut tok,
            )
        };
        if rc != 0 || cpu.is_null() || !(cpu as usize).is_multiple_of(4096) {
            return Err(failed("ibnet_proxy_mem_t importMem", rc));
        }
        // SAFETY: the callback's contract: `size` bytes mapped at `cpu` (4096-aligned, checked)
        // until `unimport_mem`, holding what the exporter wrote (zeroed at allocation).
        Ok(Some(unsafe {
            Region::new(cpu as u64, gpu, size, MemKind::Host, tok)
        }))
    }

    /// `unimport_mem` (present whenever `import_mem` is).
    pub(crate) fn unimport(&self, r: &Region) -> Result<()> {
        let f = self.unimport_mem.ok_or(Error::Missing {
            what: "ibnet_proxy_mem_t unimportMem",
        })?;
        // SAFETY: the caller's callback, for a region its `import_mem` mapped.
        let rc = unsafe { f(self.ctx, r.cpu() as *mut c_void, r.handle()) };
        if rc != 0 {
            return Err(failed("ibnet_proxy_mem_t unimportMem", rc));
        }
        Ok(())
    }
}
