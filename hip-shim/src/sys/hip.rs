//! HIP (`libamdhip64.so`) and HSA (`libhsa-runtime64.so`), resolved with `dlsym`.
//!
//! HIP gives device counts, pointer attributes and allocations; HSA gives the DMA-BUF query and
//! export, the way RCCL uses it (`rocmLibraryInit`: `RCCL_ROCR_PATH` prefixes the HSA file name).
//! `hsa_init` is reference-counted, so calling it next to HIP's own is harmless; we balance it
//! with `hsa_shut_down` on drop.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{FromRawFd, OwnedFd};

use libc::c_char;
use libloading::Library;

use super::{c_str, optional, required};
use crate::env::Env;
use crate::error::{Error, Result};

/// HIP library name used in messages.
pub(crate) const HIP_LIB: &str = "libamdhip64.so";
/// HSA library name used in messages.
pub(crate) const HSA_LIB: &str = "libhsa-runtime64.so";

type HipError = c_int;
type HsaStatus = c_int;

/// `hipMemcpyHostToDevice`.
const MEMCPY_H2D: c_int = 1;
/// `hipMemcpyDeviceToHost`.
const MEMCPY_D2H: c_int = 2;
/// `HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED` (a `bool`).
const HSA_INFO_DMABUF_SUPPORTED: c_int = 0x204;

/// `hipPointerAttribute_t` (ROCm 5 and 6 share this layout; 5 names the first field
/// `memoryType`), followed by spare room in case a future runtime writes more.
#[repr(C)]
struct PointerAttr {
    mem_type: c_uint,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
    is_managed: c_int,
    allocation_flags: c_uint,
    _spare: [u64; 8],
}

/// Raw answer of `hipPointerGetAttributes`, mapped to a kind by `crate::pointer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawHipPointer {
    /// The `type` / `memoryType` field.
    pub(crate) mem_type: u32,
    /// The `device` field.
    pub(crate) device: i32,
    /// The `isManaged` field.
    pub(crate) is_managed: bool,
}

/// A device allocation made by [`Hip::alloc`]; not `Clone`, so it is freed at most once.
#[derive(Debug)]
pub(crate) struct HipAlloc(usize);

impl HipAlloc {
    /// The device address.
    pub(crate) fn addr(&self) -> usize {
        self.0
    }
}

/// Resolved HIP entry points. Field types are the `hip_runtime_api.h` prototypes.
pub(crate) struct Hip {
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    get_device: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    pointer_get_attributes: unsafe extern "C" fn(*mut PointerAttr, *const c_void) -> HipError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError,
    get_error_name: Option<unsafe extern "C" fn(HipError) -> *const c_char>,
    _lib: Library,
}

impl Hip {
    /// Opens `IBNET_HIP_LIB` if set, else HIP (`libamdhip64.so`, then the versioned sonames),
    /// and resolves the table.
    pub(crate) fn load(env: &Env) -> Result<Self> {
        let names: Vec<String> = match env.get("IBNET_HIP_LIB").filter(|p| !p.is_empty()) {
            Some(path) => vec![path],
            None => ["", ".7", ".6", ".5"]
                .iter()
                .map(|v| format!("{HIP_LIB}{v}"))
                .collect(),
        };
        let (lib, _) = super::open_first(&names).map_err(|reason| Error::NotPresent { reason })?;
        Ok(Self {
            runtime_get_version: required!(lib, HIP_LIB, "hipRuntimeGetVersion"),
            get_device_count: required!(lib, HIP_LIB, "hipGetDeviceCount"),
            get_device: required!(lib, HIP_LIB, "hipGetDevice"),
            set_device: required!(lib, HIP_LIB, "hipSetDevice"),
            pointer_get_attributes: required!(lib, HIP_LIB, "hipPointerGetAttributes"),
            malloc: required!(lib, HIP_LIB, "hipMalloc"),
            free: required!(lib, HIP_LIB, "hipFree"),
            memcpy: required!(lib, HIP_LIB, "hipMemcpy"),
            get_error_name: optional!(lib, "hipGetErrorName"),
            _lib: lib,
        })
    }

    fn check(&self, call: &'static str, rc: HipError) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let name = match self.get_error_name {
            // SAFETY: hipGetErrorName returns a pointer to a static string (or NULL).
            Some(f) => unsafe { c_str(f(rc)) },
            None => String::new(),
        };
        Err(Error::Call {
            call,
            code: rc,
            name,
        })
    }

    /// `hipRuntimeGetVersion` (`HIP_VERSION`: major·10⁷ + minor·10⁵ + patch).
    pub(crate) fn runtime_version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid, writable int.
        self.check("hipRuntimeGetVersion", unsafe {
            (self.runtime_get_version)(&mut v)
        })?;
        Ok(v)
    }

    /// `hipGetDeviceCount`.
    pub(crate) fn device_count(&self) -> Result<i32> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable int.
        self.check("hipGetDeviceCount", unsafe {
            (self.get_device_count)(&mut n)
        })?;
        Ok(n)
    }

    /// `hipPointerGetAttributes(addr)`; the raw status is kept in the error so callers can
    /// treat `hipErrorInvalidValue` (ROCm 5, unknown host memory) as "unregistered".
    pub(crate) fn pointer_attributes(&self, addr: usize) -> Result<RawHipPointer> {
        // SAFETY: PointerAttr is plain data (ints and raw pointers); all-zero is valid.
        let mut a: PointerAttr = unsafe { std::mem::zeroed() };
        // SAFETY: `a` is writable and larger than hipPointerAttribute_t; `addr` is only looked
        // up by the runtime, never dereferenced.
        self.check("hipPointerGetAttributes", unsafe {
            (self.pointer_get_attributes)(&mut a, addr as *const c_void)
        })?;
        Ok(RawHipPointer {
            mem_type: a.mem_type,
            device: a.device,
            is_managed: a.is_managed != 0,
        })
    }

    /// Runs `f` with `dev` as the calling thread's current device, restoring the previous one.
    fn on_device<R>(&self, dev: i32, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let mut prev: c_int = 0;
        // SAFETY: `prev` is a valid out-pointer.
        self.check("hipGetDevice", unsafe { (self.get_device)(&mut prev) })?;
        // SAFETY: plain int argument; HIP validates it.
        self.check("hipSetDevice", unsafe { (self.set_device)(dev) })?;
        let out = f();
        // SAFETY: restores the device that was current on entry.
        let restore = self.check("hipSetDevice", unsafe { (self.set_device)(prev) });
        let r = out?;
        restore?;
        Ok(r)
    }

    /// `hipMalloc` on device `dev`: an owned allocation, freed only through [`Hip::free`].
    pub(crate) fn alloc(&self, dev: i32, len: usize) -> Result<HipAlloc> {
        self.on_device(dev, || {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: `p` is a valid out-pointer.
            self.check("hipMalloc", unsafe { (self.malloc)(&mut p, len) })?;
            Ok(HipAlloc(p as usize))
        })
    }

    /// `hipFree` of an allocation this crate made (consumed, so it cannot be freed twice).
    pub(crate) fn free(&self, a: HipAlloc) -> Result<()> {
        // SAFETY: `a` was returned by `alloc` and is consumed here, so it is freed exactly once.
        self.check("hipFree", unsafe { (self.free)(a.0 as *mut c_void) })
    }

    /// `hipMemcpy(HostToDevice)`.
    pub(crate) fn copy_to_device(&self, dst: usize, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is readable for its length; HIP validates the device address `dst`.
        self.check("hipMemcpy", unsafe {
            (self.memcpy)(
                dst as *mut c_void,
                src.as_ptr().cast(),
                src.len(),
                MEMCPY_H2D,
            )
        })
    }

    /// `hipMemcpy(DeviceToHost)`.
    pub(crate) fn copy_from_device(&self, dst: &mut [u8], src: usize) -> Result<()> {
        // SAFETY: `dst` is writable for its length; HIP validates the device address `src`.
        self.check("hipMemcpy", unsafe {
            (self.memcpy)(
                dst.as_mut_ptr().cast(),
                src as *const c_void,
                dst.len(),
                MEMCPY_D2H,
            )
        })
    }
}

/// Resolved HSA entry points (`hsa.h`, `hsa_ext_amd.h` prototypes).
pub(crate) struct Hsa {
    shut_down: unsafe extern "C" fn() -> HsaStatus,
    system_get_info: unsafe extern "C" fn(c_int, *mut c_void) -> HsaStatus,
    export_dmabuf:
        Option<unsafe extern "C" fn(*const c_void, usize, *mut c_int, *mut u64) -> HsaStatus>,
    status_string: Option<StatusString>,
    _lib: Library,
}

impl Hsa {
    /// Opens HSA (honouring `RCCL_ROCR_PATH` as a file-name prefix) and calls `hsa_init`.
    pub(crate) fn load(env: &Env) -> Result<Self> {
        let prefix = env.get("RCCL_ROCR_PATH").unwrap_or_default();
        let names = vec![format!("{prefix}{HSA_LIB}"), format!("{prefix}{HSA_LIB}.1")];
        let (lib, _) = super::open_first(&names).map_err(|reason| Error::NotPresent { reason })?;
        let init: unsafe extern "C" fn() -> HsaStatus = required!(lib, HSA_LIB, "hsa_init");
        let shut_down = required!(lib, HSA_LIB, "hsa_shut_down");
        let system_get_info = required!(lib, HSA_LIB, "hsa_system_get_info");
        let status_string = optional!(lib, "hsa_status_string");
        // SAFETY: hsa_init takes no arguments and is reference-counted.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(status_error(status_string, "hsa_init", rc));
        }
        Ok(Self {
            shut_down,
            system_get_info,
            export_dmabuf: optional!(lib, "hsa_amd_portable_export_dmabuf"),
            status_string,
            _lib: lib,
        })
    }

    fn error(&self, call: &'static str, rc: HsaStatus) -> Error {
        status_error(self.status_string, call, rc)
    }

    /// `hsa_system_get_info(HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED)`.
    pub(crate) fn dmabuf_supported(&self) -> Result<bool> {
        let mut v = [0u8; 8];
        // SAFETY: the attribute's value is a `bool`; `v` is writable for 8 bytes.
        let rc =
            unsafe { (self.system_get_info)(HSA_INFO_DMABUF_SUPPORTED, v.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(self.error("hsa_system_get_info", rc));
        }
        Ok(v[0] != 0)
    }

    /// Whether `hsa_amd_portable_export_dmabuf` was resolved.
    pub(crate) fn has_export(&self) -> bool {
        self.export_dmabuf.is_some()
    }

    /// `hsa_amd_portable_export_dmabuf(addr, len)`: a new fd and the offset of `addr` in it.
    pub(crate) fn export_dmabuf(&self, addr: usize, len: usize) -> Result<(OwnedFd, u64)> {
        let f = self.export_dmabuf.ok_or_else(|| Error::Unsupported {
            what: "libhsa-runtime64 lacks hsa_amd_portable_export_dmabuf".into(),
        })?;
        let (mut fd, mut off): (c_int, u64) = (-1, 0);
        // SAFETY: both out-pointers are valid; HSA validates the range and never dereferences
        // `addr` on the host.
        let rc = unsafe { f(addr as *const c_void, len, &mut fd, &mut off) };
        if rc != 0 {
            return Err(self.error("hsa_amd_portable_export_dmabuf", rc));
        }
        if fd < 0 {
            return Err(Error::Call {
                call: "hsa_amd_portable_export_dmabuf",
                code: 0,
                name: format!("returned fd {fd}"),
            });
        }
        // SAFETY: on success HSA hands us a new descriptor nothing else owns; closing it with
        // close(2) is what hsa_amd_portable_close_dmabuf does.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, off))
    }
}

type StatusString = unsafe extern "C" fn(HsaStatus, *mut *const c_char) -> HsaStatus;

/// Builds an [`Error::Call`] naming the status with `hsa_status_string` when available.
fn status_error(status_string: Option<StatusString>, call: &'static str, rc: HsaStatus) -> Error {
    let mut name = String::new();
    if let Some(f) = status_string {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` is a valid out-pointer; HSA stores a static string pointer in it.
        if unsafe { f(rc, &mut p) } == 0 {
            // SAFETY: NULL or a static NUL-terminated string owned by HSA.
            name = unsafe { c_str(p) };
        }
    }
    Error::Call {
        call,
        code: rc,
        name,
    }
}

impl Drop for Hsa {
    fn drop(&mut self) {
        // SAFETY: balances the successful hsa_init in `load` (reference-counted).
        let _ = unsafe { (self.shut_down)() };
    }
}
