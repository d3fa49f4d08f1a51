//! The proxy engine's memory on a real GPU ([`CudaProxyMem`], an
//! [`ibnet_proxy::MemProvider`] over the CUDA driver API), as NCCL's net transport
//! allocates it:
//!
//! ```text
//!  MemKind::Device  cuMemAlloc (padded, 4 KiB-aligned inside), zeroed with cuMemsetD8
//!  MemKind::Host    cuMemHostAlloc(PORTABLE | DEVICEMAP), zeroed; gpu = cuMemHostGetDevicePointer
//!  dmabuf_fd        cuMemGetHandleForAddressRange (when the window starts at offset 0)
//!  export (device)  cuIpcGetMemHandle ─▶ BankDesc { CudaIpc, offset of the aligned start }
//!  import           cuIpcOpenMemHandle (lazy peer access) + offset; unimport: cuIpcCloseMemHandle
//! ```
//! Host banks are not exported here (pinned host memory has no IPC handle): a cross-process
//! proxy keeps its host banks in POSIX shared memory (`ibnet-ffi`'s `ProxyMem`). GDR copy is not
//! offered (it needs the gdrcopy driver). Every call runs with GPU `dev`'s primary context
//! current, retained for the provider's life.
#![allow(unsafe_code)] // Region::new and the MemProvider impl: each has a SAFETY comment.

use ibnet_proxy::{BankDesc, HandleKind, MemKind, MemProvider, Region};

use crate::error::Error;
use crate::runtime::GpuRuntime;
use crate::sys::cuda::{CudaAlloc, HostAlloc, IpcHandle, PrimaryCtx};

/// Copies through the driver on GPU `dev` (what a kernel or a GPU-direct NIC does to device
/// memory, from the host): `Device` addresses through `cuMemcpy*`, host ones directly.
pub struct DeviceCopier<'rt> {
    ctx: PrimaryCtx<'rt>,
}

impl std::fmt::Debug for DeviceCopier<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceCopier")
    }
}

impl<'rt> DeviceCopier<'rt> {
    /// A copier on GPU `dev` of `rt` (CUDA only); one per thread.
    pub fn new(rt: &'rt GpuRuntime, dev: i32) -> crate::Result<Self> {
        Ok(Self {
            ctx: rt.cuda()?.primary_context(dev)?,
        })
    }

    /// Copies `src` to device address `dst`.
    pub fn write(&self, dst: u64, src: &[u8]) -> crate::Result<()> {
        self.ctx.scoped(|c| c.copy_to_device(dst, src))
    }

    /// Copies from device address `src` into `dst`.
    pub fn read(&self, src: u64, dst: &mut [u8]) -> crate::Result<()> {
        self.ctx.scoped(|c| c.copy_from_device(dst, src))
    }

    /// Copies `len` bytes from `src` to `dst`, each in device memory (`*_dev`) or host memory.
    ///
    /// # Safety
    /// Host ranges must be valid for the copy (readable `src`, writable `dst`, not
    /// overlapping); device ranges are checked by the driver.
    pub unsafe fn copy(
        &self,
        dst: u64,
        dst_dev: bool,
        src: u64,
        src_dev: bool,
        len: usize,
    ) -> crate::Result<()> {
        match (dst_dev, src_dev) {
            (true, true) => self.ctx.scoped(|c| c.copy_device(dst, src, len)),
            (true, false) => {
                // SAFETY: the caller's contract: `src` is readable for `len` bytes.
                let s = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
                self.write(dst, s)
            }
            (false, true) => {
                // SAFETY: the caller's contract: `dst` is writable for `len` bytes.
                let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
                self.read(src, d)
            }
            (false, false) => {
                // SAFETY: the caller's contract: valid, non-overlapping host ranges.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
                Ok(())
            }
        }
    }
}

/// One live allocation or import.
#[derive(Debug)]
enum Live {
    Dev { alloc: CudaAlloc, aligned: u64 },
    Host { alloc: HostAlloc },
    Ipc { base: u64, addr: u64 },
}

/// Proxy memory on CUDA GPU `dev` (see the module doc).
pub struct CudaProxyMem<'rt> {
    rt: &'rt GpuRuntime,
    ctx: PrimaryCtx<'rt>,
    dev: i32,
    live: Vec<Live>,
}

impl std::fmt::Debug for CudaProxyMem<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaProxyMem {{ dev: {}, live: {} }}",
            self.dev,
            self.live.len()
        )
    }
}

/// This crate's error as the engine's (the driver's code as the errno).
fn core_err(e: Error) -> ibnet_core::Error {
    match e {
        Error::Call { call, code, .. } => ibnet_core::Error::Provider { call, errno: code },
        _ => ibnet_core::Error::Provider {
            call: "CUDA proxy memory",
            errno: 0,
        },
    }
}

const PAGE: u64 = 4096;

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

impl<'rt> CudaProxyMem<'rt> {
    /// A provider on GPU `dev` of `rt` (CUDA only).
    pub fn new(rt: &'rt GpuRuntime, dev: i32) -> crate::Result<Self> {
        let ctx = rt.cuda()?.primary_context(dev)?;
        Ok(Self {
            rt,
            ctx,
            dev,
            live: Vec::new(),
        })
    }

    /// The GPU.
    pub fn device(&self) -> i32 {
        self.dev
    }

    /// Allocations and imports not yet given back.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    fn take(&mut self, cpu: u64) -> Option<Live> {
        let i = self.live.iter().position(|l| match l {
            Live::Dev { aligned, .. } => *aligned == cpu,
            Live::Host { alloc } => alloc.addr() as u64 == cpu,
            Live::Ipc { addr, .. } => *addr == cpu,
        })?;
        Some(self.live.swap_remove(i))
    }

    fn release(&self, l: Live) -> crate::Result<()> {
        self.ctx.scoped(|c| match l {
            Live::Dev { alloc, .. } => c.free(alloc),
            Live::Host { alloc } => c.free_host(alloc),
            Live::Ipc { base, .. } => c.ipc_close(base),
        })
    }

    fn alloc_dev(&mut self, size: usize) -> crate::Result<Region> {
        // cuMemAlloc aligns to at least 256 bytes: pad so a 4 KiB-aligned start fits.
        let padded = round_up(size as u64, PAGE) + PAGE;
        let (alloc, aligned) = self.ctx.scoped(|c| {
            let a = c.alloc(padded as usize)?;
            let aligned = round_up(a.addr(), PAGE);
            match c.memset(aligned, 0, size) {
                Ok(()) => Ok((a, aligned)),
                Err(e) => {
                    let _ = c.free(a);
                    Err(e)
                }
            }
        })?;
        self.live.push(Live::Dev { alloc, aligned });
        // SAFETY: `size` zeroed device bytes at a 4 KiB-aligned address, live until `free`.
        // The engine never dereferences device regions (it registers them and hands them to
        // the GPU); `cpu` is the address the network registers, as the contract allows.
        Ok(unsafe { Region::new(aligned, aligned, size, MemKind::Device, aligned) })
    }

    fn alloc_host(&mut self, size: usize) -> crate::Result<Region> {
        let (h, dptr) = self.ctx.scoped(|c| c.alloc_host(size))?;
        let a = h.addr();
        if a % PAGE as usize != 0 || a == 0 {
            let _ = self.ctx.scoped(|c| c.free_host(h));
            return Err(Error::InvalidArgument {
                what: "cuMemHostAlloc returned memory not 4 KiB-aligned",
            });
        }
        // SAFETY: `size` bytes of pinned host memory we own, mapped for this process.
        unsafe { std::ptr::write_bytes(a as *mut u8, 0, size) };
        self.live.push(Live::Host { alloc: h });
        // SAFETY: `size` zeroed, 4 KiB-aligned, host-accessible bytes, live until `free`;
        // `dptr` is their device mapping.
        Ok(unsafe { Region::new(a as u64, dptr, size, MemKind::Host, a as u64) })
    }

    fn base_of(&self, cpu: u64) -> Option<u64> {
        self.live.iter().find_map(|l| match l {
            Live::Dev { alloc, aligned } if *aligned == cpu => Some(alloc.addr()),
            _ => None,
        })
    }
}

impl Drop for CudaProxyMem<'_> {
    fn drop(&mut self) {
        // The engine frees what it took; anything left (a failed teardown) goes now.
        for l in std::mem::take(&mut self.live) {
            let _ = self.release(l);
        }
    }
}

// SAFETY: regions are fresh, zeroed, 4 KiB-aligned driver allocations (or IPC mappings of
// another process's such regions), live until `free` / `unimport`; see each constructor.
unsafe impl MemProvider for CudaProxyMem<'_> {
    fn alloc(&mut self, kind: MemKind, size: usize) -> ibnet_core::Result<Region> {
        match kind {
            MemKind::Device => self.alloc_dev(size),
            MemKind::Host => self.alloc_host(size),
        }
        .map_err(core_err)
    }

    fn free(&mut self, r: Region) -> ibnet_core::Result<()> {
        match self.take(r.cpu()) {
            Some(l @ Live::Ipc { .. }) => {
                self.live.push(l);
                Err(ibnet_core::Error::BadState {
                    op: "free CUDA proxy memory",
                    state: "an import (unimport it)",
                })
            }
            Some(l) => self.release(l).map_err(core_err),
            None => Err(ibnet_core::Error::Missing {
                what: "CUDA proxy region",
            }),
        }
    }

    fn dmabuf_fd(
        &mut self,
        r: &Region,
        offset: usize,
        len: usize,
    ) -> ibnet_core::Result<Option<i32>> {
        use std::os::fd::IntoRawFd;
        let p = (r.cpu() + offset as u64) as *const std::ffi::c_void;
        match self.rt.export_dmabuf(p, len) {
            // The engine registers with DMA-BUF offset 0: only an exact window will do.
            Ok(d) if d.offset == 0 => Ok(Some(d.fd.into_raw_fd())),
            Ok(_) | Err(Error::Unsupported { .. }) => Ok(None),
            Err(e) => Err(core_err(e)),
        }
    }

    fn close_dmabuf(&mut self, fd: i32) {
        // SAFETY: an fd `dmabuf_fd` handed out (into_raw_fd), closed once.
        unsafe { libc::close(fd) };
    }

    fn export(&mut self, r: &Region) -> ibnet_core::Result<BankDesc> {
        let base = self.base_of(r.cpu()).ok_or(ibnet_core::Error::BadState {
            op: "export CUDA proxy memory",
            state: "not a device region of this provider (host banks: use shared memory)",
        })?;
        let h = self.ctx.scoped(|c| c.ipc_handle(base)).map_err(core_err)?;
        BankDesc::new(
            HandleKind::CudaIpc,
            r.size() as u64,
            r.cpu() - base,
            std::process::id() as u64,
            &h.0,
        )
    }

    fn import(&mut self, d: &BankDesc) -> ibnet_core::Result<Region> {
        if d.kind()? != HandleKind::CudaIpc {
            return Err(ibnet_core::Error::BadState {
                op: "import CUDA proxy memory",
                state: "not a CUDA IPC handle",
            });
        }
        let h = IpcHandle(d.handle);
        let base = self.ctx.scoped(|c| c.ipc_open(h)).map_err(core_err)?;
        let addr = base + d.offset;
        self.live.push(Live::Ipc { base, addr });
        // SAFETY: the exporter's zeroed region, `d.size` bytes at `d.offset` of the allocation
        // the driver just mapped here, until `unimport` closes it (device memory: never
        // dereferenced by the engine).
        Ok(unsafe { Region::new(addr, addr, d.size as usize, MemKind::Device, base) })
    }

    fn unimport(&mut self, r: Region) -> ibnet_core::Result<()> {
        match self.take(r.cpu()) {
            Some(l @ Live::Ipc { .. }) => self.release(l).map_err(core_err),
            Some(other) => {
                self.live.push(other);
                Err(ibnet_core::Error::BadState {
                    op: "unimport CUDA proxy memory",
                    state: "an allocation, not an import",
                })
            }
            None => Err(ibnet_core::Error::Missing {
                what: "imported CUDA region",
            }),
        }
    }
}
