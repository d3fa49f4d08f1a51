//! The CUDA driver API (`libcuda.so.1`), resolved with `dlsym`.
//!
//! Only the `_v2` entry points are used where the driver exports both (`cuMemAlloc_v2`, …): the
//! unsuffixed names are the 32-bit-size legacy ABI. Device pointers are `CUdeviceptr` (`u64`);
//! addresses that came from Rust are passed as integers, so no host pointer is dereferenced.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::os::fd::{FromRawFd, OwnedFd};

use libc::c_char;
use libloading::Library;

use super::{c_str, optional, required};
use crate::env::Env;
use crate::error::{Error, Result};

/// The library file name NCCL loads.
pub(crate) const LIB: &str = "libcuda.so.1";

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
/// `CUdeviceptr`.
pub(crate) type DevPtr = u64;

/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
pub(crate) const ATTR_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
pub(crate) const ATTR_DMA_BUF_SUPPORTED: c_int = 124;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (writes a `CUmemorytype`).
pub(crate) const PTR_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED` (writes a boolean).
pub(crate) const PTR_IS_MANAGED: c_int = 8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (writes an `int`).
pub(crate) const PTR_DEVICE_ORDINAL: c_int = 9;
/// `CUDA_ERROR_INVALID_VALUE`: what `cuPointerGetAttribute` returns for unknown host memory.
pub(crate) const ERROR_INVALID_VALUE: i32 = 1;
/// `CUDA_ERROR_INVALID_CONTEXT`: no context current on the calling thread.
pub(crate) const ERROR_INVALID_CONTEXT: i32 = 201;
/// `CU_MEMORYTYPE_DEVICE`.
pub(crate) const MEMORYTYPE_DEVICE: u32 = 2;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const RANGE_HANDLE_DMA_BUF_FD: c_int = 1;
/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`.
const HOSTALLOC_PORTABLE_DEVICEMAP: c_uint = 0x1 | 0x2;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const IPC_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpcHandle(pub(crate) [u8; 64]);

/// Resolved driver entry points. Field types are the `cuda.h` prototypes.
pub(crate) struct Cuda {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_int, DevPtr) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_push: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    mem_get_address_range: unsafe extern "C" fn(*mut DevPtr, *mut usize, DevPtr) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut DevPtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(DevPtr) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(DevPtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, DevPtr, usize) -> CuResult,
    get_handle_for_address_range:
        Option<unsafe extern "C" fn(*mut c_void, DevPtr, usize, c_int, c_ulonglong) -> CuResult>,
    get_error_name: Option<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>,
    memset_d8: Option<unsafe extern "C" fn(DevPtr, u8, usize) -> CuResult>,
    memcpy_dtod: Option<unsafe extern "C" fn(DevPtr, DevPtr, usize) -> CuResult>,
    mem_host_alloc: Option<unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult>,
    mem_free_host: Option<unsafe extern "C" fn(*mut c_void) -> CuResult>,
    host_get_device_pointer:
        Option<unsafe extern "C" fn(*mut DevPtr, *mut c_void, c_uint) -> CuResult>,
    ipc_get_mem_handle: Option<unsafe extern "C" fn(*mut IpcHandle, DevPtr) -> CuResult>,
    ipc_open_mem_handle: Option<unsafe extern "C" fn(*mut DevPtr, IpcHandle, c_uint) -> CuResult>,
    ipc_close_mem_handle: Option<unsafe extern "C" fn(DevPtr) -> CuResult>,
    // Declared last so it is dropped (dlclose) after nothing else can use the pointers.
    _lib: Library,
}

impl Cuda {
    /// Opens `IBNET_CUDA_LIB` if set, else `libcuda.so.1` then `libcuda.so`, and resolves the
    /// table. Does not call `cuInit`.
    pub(crate) fn load(env: &Env) -> Result<Self> {
        let names = match env.get("IBNET_CUDA_LIB").filter(|p| !p.is_empty()) {
            Some(path) => vec![path],
            None => vec![LIB.to_owned(), "libcuda.so".to_owned()],
        };
        let (lib, _name) =
            super::open_first(&names).map_err(|reason| Error::NotPresent { reason })?;
        Ok(Self {
            init: required!(lib, LIB, "cuInit"),
            driver_get_version: required!(lib, LIB, "cuDriverGetVersion"),
            device_get_count: required!(lib, LIB, "cuDeviceGetCount"),
            device_get: required!(lib, LIB, "cuDeviceGet"),
            device_get_attribute: required!(lib, LIB, "cuDeviceGetAttribute"),
            pointer_get_attribute: required!(lib, LIB, "cuPointerGetAttribute"),
            primary_ctx_retain: required!(lib, LIB, "cuDevicePrimaryCtxRetain"),
            primary_ctx_release: required!(lib, LIB, "cuDevicePrimaryCtxRelease_v2"),
            ctx_push: required!(lib, LIB, "cuCtxPushCurrent_v2"),
            ctx_pop: required!(lib, LIB, "cuCtxPopCurrent_v2"),
            mem_get_address_range: required!(lib, LIB, "cuMemGetAddressRange_v2"),
            mem_alloc: required!(lib, LIB, "cuMemAlloc_v2"),
            mem_free: required!(lib, LIB, "cuMemFree_v2"),
            memcpy_htod: required!(lib, LIB, "cuMemcpyHtoD_v2"),
            memcpy_dtoh: required!(lib, LIB, "cuMemcpyDtoH_v2"),
            get_handle_for_address_range: optional!(lib, "cuMemGetHandleForAddressRange"),
            get_error_name: optional!(lib, "cuGetErrorName"),
            memset_d8: optional!(lib, "cuMemsetD8_v2"),
            memcpy_dtod: optional!(lib, "cuMemcpyDtoD_v2"),
            mem_host_alloc: optional!(lib, "cuMemHostAlloc"),
            mem_free_host: optional!(lib, "cuMemFreeHost"),
            host_get_device_pointer: optional!(lib, "cuMemHostGetDevicePointer_v2"),
            ipc_get_mem_handle: optional!(lib, "cuIpcGetMemHandle"),
            ipc_open_mem_handle: optional!(lib, "cuIpcOpenMemHandle_v2"),
            ipc_close_mem_handle: optional!(lib, "cuIpcCloseMemHandle"),
            _lib: lib,
        })
    }

    /// Maps a `CUresult` to `Ok` or an [`Error::Call`] carrying the driver's name for it.
    fn check(&self, call: &'static str, rc: CuResult) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let mut name = String::new();
        if let Some(f) = self.get_error_name {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: `p` is a valid out-pointer; the driver stores a pointer to a static string
            // (or leaves it NULL), which `c_str` copies immediately.
            if unsafe { f(rc, &mut p) } == 0 {
                // SAFETY: NULL or a static NUL-terminated string owned by the driver.
                name = unsafe { c_str(p) };
            }
        }
        Err(Error::Call {
            call,
            code: rc,
            name,
        })
    }

    /// `cuInit(0)`.
    pub(crate) fn init(&self) -> Result<()> {
        // SAFETY: cuInit takes a flags word (must be 0) and has no pointer arguments.
        self.check("cuInit", unsafe { (self.init)(0) })
    }

    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    pub(crate) fn driver_version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid, writable int.
        self.check("cuDriverGetVersion", unsafe {
            (self.driver_get_version)(&mut v)
        })?;
        Ok(v)
    }

    /// `cuDeviceGetCount`.
    pub(crate) fn device_count(&self) -> Result<i32> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable int.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut n)
        })?;
        Ok(n)
    }

    fn device(&self, ordinal: i32) -> Result<CuDevice> {
        let mut d: CuDevice = 0;
        // SAFETY: `d` is a valid out-pointer; the driver validates `ordinal`.
        self.check("cuDeviceGet", unsafe { (self.device_get)(&mut d, ordinal) })?;
        Ok(d)
    }

    /// `cuDeviceGetAttribute(attr)` for device ordinal `ordinal`.
    pub(crate) fn device_attribute(&self, attr: c_int, ordinal: i32) -> Result<i32> {
        let dev = self.device(ordinal)?;
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; the driver validates `attr` and `dev`.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.device_get_attribute)(&mut v, attr, dev)
        })?;
        Ok(v)
    }

    /// Whether `cuMemGetHandleForAddressRange` was resolved (CUDA ≥ 11.7 drivers).
    pub(crate) fn has_dmabuf_export(&self) -> bool {
        self.get_handle_for_address_range.is_some()
    }

    /// `cuPointerGetAttribute(attr, addr)` for an attribute whose value fits in 4 bytes
    /// (`CUmemorytype`, `int`, boolean). Returns the raw status on failure so callers can tell
    /// "not a CUDA pointer" (`CUDA_ERROR_INVALID_VALUE`) from real errors.
    pub(crate) fn pointer_attribute(&self, attr: c_int, addr: DevPtr) -> Result<u32> {
        // Eight zeroed bytes: room for any scalar attribute, so a 1-byte boolean or a 4-byte
        // enum both land in the first bytes and cannot overrun.
        let mut buf = [0u8; 8];
        // SAFETY: `buf` is writable for 8 bytes, more than any of the scalar attributes this is
        // called with; `addr` is only looked up by the driver, never dereferenced by it.
        self.check("cuPointerGetAttribute", unsafe {
            (self.pointer_get_attribute)(buf.as_mut_ptr().cast(), attr, addr)
        })?;
        Ok(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]))
    }

    /// Retains device `ordinal`'s primary context (released when the guard drops).
    pub(crate) fn primary_context(&self, ordinal: i32) -> Result<PrimaryCtx<'_>> {
        let dev = self.device(ordinal)?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; `dev` came from cuDeviceGet.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.primary_ctx_retain)(&mut ctx, dev)
        })?;
        Ok(PrimaryCtx {
            cuda: self,
            dev,
            ctx,
        })
    }
}

/// A device allocation made by [`Current::alloc`]; not `Clone`, so it is freed at most once.
#[derive(Debug)]
pub(crate) struct CudaAlloc(DevPtr);

impl CudaAlloc {
    /// The device address.
    pub(crate) fn addr(&self) -> DevPtr {
        self.0
    }
}

/// A retained primary context; [`PrimaryCtx::scoped`] makes it current for a closure.
pub(crate) struct PrimaryCtx<'a> {
    cuda: &'a Cuda,
    dev: CuDevice,
    ctx: CuContext,
}

impl PrimaryCtx<'_> {
    /// Runs `f` with this context pushed as current on the calling thread, then pops it.
    pub(crate) fn scoped<R>(&self, f: impl FnOnce(&Current<'_>) -> Result<R>) -> Result<R> {
        let c = self.cuda;
        // SAFETY: `self.ctx` is a live, retained context (released only in Drop).
        c.check("cuCtxPushCurrent", unsafe { (c.ctx_push)(self.ctx) })?;
        let out = f(&Current { cuda: c });
        let mut popped: CuContext = std::ptr::null_mut();
        // SAFETY: we pushed exactly one context above on this thread; `popped` is writable.
        let pop = c.check("cuCtxPopCurrent", unsafe { (c.ctx_pop)(&mut popped) });
        let r = out?;
        pop?;
        Ok(r)
    }
}

impl Drop for PrimaryCtx<'_> {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Cuda::primary_context`; errors cannot be reported
        // from Drop and would only mean the device is already gone.
        let _ = unsafe { (self.cuda.primary_ctx_release)(self.dev) };
    }
}

/// Calls that need a current context; only obtainable inside [`PrimaryCtx::scoped`].
pub(crate) struct Current<'a> {
    cuda: &'a Cuda,
}

impl Current<'_> {
    /// `cuMemGetAddressRange`: base and size of the allocation containing `addr`.
    pub(crate) fn address_range(&self, addr: DevPtr) -> Result<(DevPtr, usize)> {
        let (mut base, mut size) = (0 as DevPtr, 0usize);
        // SAFETY: both out-pointers are valid; `addr` is only looked up.
        self.cuda.check("cuMemGetAddressRange", unsafe {
            (self.cuda.mem_get_address_range)(&mut base, &mut size, addr)
        })?;
        Ok((base, size))
    }

    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)` for `[start, start + len)`.
    pub(crate) fn export_dmabuf(&self, start: DevPtr, len: usize) -> Result<OwnedFd> {
        let f = self
            .cuda
            .get_handle_for_address_range
            .ok_or_else(|| Error::Unsupported {
                what: "libcuda lacks cuMemGetHandleForAddressRange (driver < 11.7)".into(),
            })?;
        let mut fd: c_int = -1;
        // SAFETY: for DMA_BUF_FD the handle out-parameter is an `int`; `fd` is writable. The
        // driver validates the range itself.
        self.cuda.check("cuMemGetHandleForAddressRange", unsafe {
            f(
                (&mut fd as *mut c_int).cast(),
                start,
                len,
                RANGE_HANDLE_DMA_BUF_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(Error::Call {
                call: "cuMemGetHandleForAddressRange",
                code: 0,
                name: format!("returned fd {fd}"),
            });
        }
        // SAFETY: on success the driver hands us a new file descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `cuMemAlloc`: an owned allocation, freed only through [`Current::free`].
    pub(crate) fn alloc(&self, len: usize) -> Result<CudaAlloc> {
        let mut p: DevPtr = 0;
        // SAFETY: `p` is a valid out-pointer.
        self.cuda
            .check("cuMemAlloc", unsafe { (self.cuda.mem_alloc)(&mut p, len) })?;
        Ok(CudaAlloc(p))
    }

    /// `cuMemFree` of an allocation this crate made (consumed, so it cannot be freed twice).
    pub(crate) fn free(&self, a: CudaAlloc) -> Result<()> {
        // SAFETY: `a` was returned by `alloc` and is consumed here, so it is freed exactly once.
        self.cuda
            .check("cuMemFree", unsafe { (self.cuda.mem_free)(a.0) })
    }

    /// `cuMemcpyHtoD`: copies `src` to device address `dst`.
    pub(crate) fn copy_to_device(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is readable for `src.len()` bytes; the driver validates `dst`.
        self.cuda.check("cuMemcpyHtoD", unsafe {
            (self.cuda.memcpy_htod)(dst, src.as_ptr().cast(), src.len())
        })
    }

    /// `cuMemcpyDtoH`: copies from device address `src` into `dst`.
    pub(crate) fn copy_from_device(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        // SAFETY: `dst` is writable for `dst.len()` bytes; the driver validates `src`.
        self.cuda.check("cuMemcpyDtoH", unsafe {
            (self.cuda.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    fn need<T>(&self, f: Option<T>, call: &'static str) -> Result<T> {
        f.ok_or_else(|| Error::Unsupported {
            what: format!("libcuda lacks {call}"),
        })
    }

    /// `cuMemsetD8`: `len` bytes at `dst` set to `v`.
    pub(crate) fn memset(&self, dst: DevPtr, v: u8, len: usize) -> Result<()> {
        let f = self.need(self.cuda.memset_d8, "cuMemsetD8_v2")?;
        // SAFETY: device addresses only; the driver validates the range.
        self.cuda.check("cuMemsetD8", unsafe { f(dst, v, len) })
    }

    /// `cuMemcpyDtoD`: `len` bytes from device `src` to device `dst`.
    pub(crate) fn copy_device(&self, dst: DevPtr, src: DevPtr, len: usize) -> Result<()> {
        let f = self.need(self.cuda.memcpy_dtod, "cuMemcpyDtoD_v2")?;
        // SAFETY: device addresses only; the driver validates both ranges.
        self.cuda.check("cuMemcpyDtoD", unsafe { f(dst, src, len) })
    }

    /// `cuMemHostAlloc(PORTABLE | DEVICEMAP)` and `cuMemHostGetDevicePointer`: pinned host
    /// memory (host address, device address), freed only through [`Current::free_host`].
    pub(crate) fn alloc_host(&self, len: usize) -> Result<(HostAlloc, DevPtr)> {
        let a = self.need(self.cuda.mem_host_alloc, "cuMemHostAlloc")?;
        let g = self.need(
            self.cuda.host_get_device_pointer,
            "cuMemHostGetDevicePointer_v2",
        )?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        self.cuda.check("cuMemHostAlloc", unsafe {
            a(&mut p, len, HOSTALLOC_PORTABLE_DEVICEMAP)
        })?;
        let h = HostAlloc(p as usize);
        let mut d: DevPtr = 0;
        // SAFETY: `p` is pinned memory the driver just gave us; `d` is a valid out-pointer.
        match self
            .cuda
            .check("cuMemHostGetDevicePointer", unsafe { g(&mut d, p, 0) })
        {
            Ok(()) => Ok((h, d)),
            Err(e) => {
                let _ = self.free_host(h);
                Err(e)
            }
        }
    }

    /// `cuMemFreeHost` of memory from [`Current::alloc_host`] (consumed: freed once).
    pub(crate) fn free_host(&self, h: HostAlloc) -> Result<()> {
        let f = self.need(self.cuda.mem_free_host, "cuMemFreeHost")?;
        // SAFETY: `h` came from cuMemHostAlloc and is consumed here.
        self.cuda
            .check("cuMemFreeHost", unsafe { f(h.0 as *mut c_void) })
    }

    /// `cuIpcGetMemHandle` of the allocation at `base`.
    pub(crate) fn ipc_handle(&self, base: DevPtr) -> Result<IpcHandle> {
        let f = self.need(self.cuda.ipc_get_mem_handle, "cuIpcGetMemHandle")?;
        let mut h = IpcHandle([0; 64]);
        // SAFETY: `h` is a writable 64-byte handle.
        self.cuda
            .check("cuIpcGetMemHandle", unsafe { f(&mut h, base) })?;
        Ok(h)
    }

    /// `cuIpcOpenMemHandle` (lazy peer access): the base of another process's allocation
    /// here, closed only through [`Current::ipc_close`].
    pub(crate) fn ipc_open(&self, h: IpcHandle) -> Result<DevPtr> {
        let f = self.need(self.cuda.ipc_open_mem_handle, "cuIpcOpenMemHandle_v2")?;
        let mut d: DevPtr = 0;
        // SAFETY: `d` is a valid out-pointer; the handle is passed by value.
        self.cuda.check("cuIpcOpenMemHandle", unsafe {
            f(&mut d, h, IPC_LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(d)
    }

    /// `cuIpcCloseMemHandle` of a base from [`Current::ipc_open`].
    pub(crate) fn ipc_close(&self, base: DevPtr) -> Result<()> {
        let f = self.need(self.cuda.ipc_close_mem_handle, "cuIpcCloseMemHandle")?;
        // SAFETY: unmaps an IPC mapping; the driver validates `base`.
        self.cuda.check("cuIpcCloseMemHandle", unsafe { f(base) })
    }
}

/// Pinned host memory from [`Current::alloc_host`]; not `Clone`, so it is freed at most once.
#[derive(Debug)]
pub(crate) struct HostAlloc(usize);

impl HostAlloc {
    /// The host address.
    pub(crate) fn addr(&self) -> usize {
        self.0
    }
}
