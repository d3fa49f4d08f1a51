//! [`GpuRuntime`]: the detected GPU stack and everything the plugin asks of it.
//!
//! ```text
//! detect ── IBNET_GPU=auto (default): CUDA first (libcuda.so.1 + cuInit + ≥1 device),
//!           │                         then ROCm (libamdhip64.so + ≥1 device; HSA optional);
//!           │                         ROCm first if HIP is already mapped and libcuda is not
//!           ├ cuda | hip: only that one;  none: no runtime
//!           └ nothing found → Error::NotPresent { reason } naming every attempt
//! GpuRuntime
//!   gdr_support()        peer-memory module → NCCL_PTR_CUDA        (peermem.rs)
//!   dmabuf_support(dev)  NCCL / RCCL chains  → NCCL_PTR_DMABUF      (dmabuf.rs)
//!   export_dmabuf(p, n)  fd + offset for regMrDmaBuf
//!   pointer_kind(p)      host / device / managed / unregistered
//!   alloc(dev, n)        a device buffer (tools, tests)
//! ```
//!
//! None of these is on the data path: call them at init/registration time and cache the answers.

use std::ffi::c_void;
use std::os::fd::OwnedFd;

use crate::decision::{Decision, PointerKind, Vendor};
use crate::dmabuf::{self, CudaProbe, RocmProbe};
use crate::error::{Error, Result};
use crate::host::Host;
use crate::peermem;
use crate::pointer;
use crate::sys::cuda::{self, Cuda, CudaAlloc};
use crate::sys::hip::{Hip, HipAlloc, Hsa};

/// An exported DMA-BUF for a device range: pass `fd`, `offset` and `len` to
/// `ibv_reg_dmabuf_mr` (or the plugin's `regMrDmaBuf`). The fd closes when this is dropped;
/// the registration keeps its own reference, so dropping right after registering is correct.
#[derive(Debug)]
pub struct DmaBuf {
    /// The DMA-BUF file descriptor (owned).
    pub fd: OwnedFd,
    /// Offset of the requested address inside the DMA-BUF.
    pub offset: u64,
    /// The requested length (the DMA-BUF itself may be larger).
    pub len: usize,
}

enum Backend {
    Cuda(Cuda),
    Rocm {
        hip: Hip,
        version: i32,
        hsa: std::result::Result<Hsa, Error>,
    },
}

/// A loaded GPU runtime (CUDA driver or HIP/HSA). `Send + Sync`: keep one in a `OnceLock`.
pub struct GpuRuntime {
    backend: Backend,
    host: Host,
    devices: i32,
}

impl std::fmt::Debug for GpuRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Which runtimes `IBNET_GPU` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Auto,
    Cuda,
    Hip,
    Nothing,
}

fn want(host: &Host) -> Result<Want> {
    match host.env().get("IBNET_GPU").as_deref().map(str::trim) {
        None | Some("") | Some("auto") => Ok(Want::Auto),
        Some("cuda") => Ok(Want::Cuda),
        Some("hip") | Some("rocm") => Ok(Want::Hip),
        Some("none") => Ok(Want::Nothing),
        Some(_) => Err(Error::InvalidArgument {
            what: "IBNET_GPU must be auto, cuda, hip (or rocm) or none",
        }),
    }
}

/// The inner reason of a `NotPresent`, or the error's text.
fn reason_of(e: Error) -> String {
    match e {
        Error::NotPresent { reason } => reason,
        other => other.to_string(),
    }
}

fn load_cuda(host: &Host) -> Result<(Cuda, i32)> {
    let c = Cuda::load(host.env())?;
    c.init()?;
    let n = c.device_count()?;
    if n < 1 {
        return Err(Error::NotPresent {
            reason: "CUDA driver reports 0 devices".into(),
        });
    }
    Ok((c, n))
}

fn load_hip(host: &Host) -> Result<(Backend, i32)> {
    let hip = Hip::load(host.env())?;
    let version = hip.runtime_version()?;
    let n = hip.device_count()?;
    if n < 1 {
        return Err(Error::NotPresent {
            reason: "HIP reports 0 devices".into(),
        });
    }
    let hsa = Hsa::load(host.env());
    Ok((Backend::Rocm { hip, version, hsa }, n))
}

impl GpuRuntime {
    /// Detects the GPU runtime of this process's machine (root `/`) with no variable set; the
    /// plugin passes its environment through [`GpuRuntime::detect_on`].
    pub fn detect() -> Result<Self> {
        Self::detect_on(Host::system())
    }

    /// Detects with an explicit [`Host`] (tests inject a fake root and environment; the
    /// libraries themselves are always the real ones). Honours `IBNET_GPU`.
    pub fn detect_on(host: Host) -> Result<Self> {
        let w = want(&host)?;
        let mut why = Vec::new();
        if w == Want::Nothing {
            return Err(Error::NotPresent {
                reason: "disabled by IBNET_GPU=none".into(),
            });
        }
        // In an RCCL process HIP is already mapped: try it first so a stray libcuda on the same
        // machine cannot win. Otherwise CUDA goes first.
        let hip_mapped = || {
            !crate::sys::is_loaded(crate::sys::cuda::LIB)
                && ["", ".7", ".6", ".5"]
                    .iter()
                    .any(|v| crate::sys::is_loaded(&format!("{}{v}", crate::sys::hip::HIP_LIB)))
        };
        let order: &[Vendor] = match w {
            Want::Cuda => &[Vendor::Nvidia],
            Want::Hip => &[Vendor::Amd],
            _ if hip_mapped() => &[Vendor::Amd, Vendor::Nvidia],
            _ => &[Vendor::Nvidia, Vendor::Amd],
        };
        for v in order {
            match v {
                Vendor::Nvidia => match load_cuda(&host) {
                    Ok((c, devices)) => {
                        return Ok(Self {
                            backend: Backend::Cuda(c),
                            host,
                            devices,
                        })
                    }
                    Err(e) => why.push(format!("CUDA: {}", reason_of(e))),
                },
                Vendor::Amd => match load_hip(&host) {
                    Ok((backend, devices)) => {
                        return Ok(Self {
                            backend,
                            host,
                            devices,
                        })
                    }
                    Err(e) => why.push(format!("ROCm: {}", reason_of(e))),
                },
            }
        }
        Err(Error::NotPresent {
            reason: why.join(" | "),
        })
    }

    /// Which stack this is.
    pub fn vendor(&self) -> Vendor {
        match self.backend {
            Backend::Cuda(_) => Vendor::Nvidia,
            Backend::Rocm { .. } => Vendor::Amd,
        }
    }

    /// Number of GPUs the runtime reported at detection.
    pub fn device_count(&self) -> i32 {
        self.devices
    }

    /// One line for the INFO log: vendor, version, devices, HSA state.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Cuda(c) => {
                let v = c
                    .driver_version()
                    .map_or_else(|e| e.to_string(), |v| v.to_string());
                format!("CUDA driver {v}, {} GPU(s)", self.devices)
            }
            Backend::Rocm { version, hsa, .. } => {
                let h = hsa.as_ref().map_or_else(
                    |e| format!("HSA unavailable ({e})"),
                    |_| "HSA loaded".into(),
                );
                format!("HIP runtime {version}, {} GPU(s), {h}", self.devices)
            }
        }
    }

    /// GPUDirect RDMA through a peer-memory module (`NCCL_PTR_CUDA`); see [`crate::peermem`].
    pub fn gdr_support(&self) -> Decision {
        peermem::gdr_support(self.vendor(), &self.host)
    }

    /// CUDA only: `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` of `dev` (what NCCL's core
    /// `ncclGpuGdrSupport` reads). On ROCm this is [`Error::Unsupported`].
    pub fn gpu_direct_rdma_attribute(&self, dev: i32) -> Result<bool> {
        match &self.backend {
            Backend::Cuda(c) => {
                Ok(c.device_attribute(cuda::ATTR_GPU_DIRECT_RDMA_SUPPORTED, dev)? != 0)
            }
            Backend::Rocm { .. } => Err(Error::Unsupported {
                what: "GPU_DIRECT_RDMA attribute is CUDA-only".into(),
            }),
        }
    }

    /// DMA-BUF support (`NCCL_PTR_DMABUF`) for GPU `dev`, decided as NCCL/RCCL do; see
    /// [`crate::dmabuf`]. The NIC-side `ibv_reg_dmabuf_mr(fd=-1)` probe is the plugin's.
    pub fn dmabuf_support(&self, dev: i32) -> Decision {
        match &self.backend {
            Backend::Cuda(c) => dmabuf::cuda_decision(&self.host, c, dev),
            Backend::Rocm { hsa, .. } => dmabuf::rocm_decision(&self.host, &HsaProbe(hsa)),
        }
    }

    /// Exports `[ptr, ptr + len)` of device memory as a DMA-BUF.
    ///
    /// CUDA: the range is widened to whole pages inside its allocation (the driver requires
    /// page alignment) and, if the driver still refuses, to the whole allocation; `offset` says
    /// where `ptr` lies in the fd. ROCm: `hsa_amd_portable_export_dmabuf` picks the window.
    pub fn export_dmabuf(&self, ptr: *const c_void, len: usize) -> Result<DmaBuf> {
        let addr = ptr as usize;
        if addr == 0 {
            return Err(Error::InvalidArgument {
                what: "NULL device pointer",
            });
        }
        if len == 0 {
            return Err(Error::InvalidArgument {
                what: "zero-length range",
            });
        }
        match &self.backend {
            Backend::Cuda(c) => export_cuda(c, addr as u64, len),
            Backend::Rocm { hsa, .. } => {
                let hsa = hsa.as_ref().map_err(Clone::clone)?;
                let (fd, offset) = hsa.export_dmabuf(addr, len)?;
                Ok(DmaBuf { fd, offset, len })
            }
        }
    }

    /// What `ptr` points at, according to the runtime.
    pub fn pointer_kind(&self, ptr: *const c_void) -> Result<PointerKind> {
        let addr = ptr as usize;
        match &self.backend {
            Backend::Cuda(c) => {
                let a = addr as u64;
                let mem_type = match cuda_pointer_attribute(c, cuda::PTR_MEMORY_TYPE, a) {
                    Ok(t) => t,
                    Err(Error::Call {
                        code: cuda::ERROR_INVALID_VALUE,
                        ..
                    }) => return Ok(PointerKind::Unregistered),
                    Err(e) => return Err(e),
                };
                let managed = cuda_pointer_attribute(c, cuda::PTR_IS_MANAGED, a).unwrap_or(0) != 0;
                let dev =
                    cuda_pointer_attribute(c, cuda::PTR_DEVICE_ORDINAL, a).map_or(-1, |d| d as i32);
                Ok(pointer::cuda_kind(mem_type, managed, dev))
            }
            Backend::Rocm { hip, version, .. } => match hip.pointer_attributes(addr) {
                Ok(r) => Ok(pointer::hip_kind(
                    *version,
                    r.mem_type,
                    r.is_managed,
                    r.device,
                )),
                // hipErrorInvalidValue: ROCm 5's answer for memory HIP does not know.
                Err(Error::Call { code: 1, .. }) => Ok(PointerKind::Unregistered),
                Err(e) => Err(e),
            },
        }
    }

    /// The CUDA driver table (for [`crate::proxy_mem`]); HIP is not supported there yet.
    pub(crate) fn cuda(&self) -> Result<&Cuda> {
        match &self.backend {
            Backend::Cuda(c) => Ok(c),
            Backend::Rocm { .. } => Err(Error::Unsupported {
                what: "the proxy memory provider on ROCm (CUDA only)".into(),
            }),
        }
    }

    /// Allocates `len` bytes on GPU `dev` (freed on drop). For tools and tests, not the plugin.
    pub fn alloc(&self, dev: i32, len: usize) -> Result<DeviceBuffer<'_>> {
        if len == 0 {
            return Err(Error::InvalidArgument {
                what: "zero-length allocation",
            });
        }
        let alloc = match &self.backend {
            Backend::Cuda(c) => {
                let ctx = c.primary_context(dev)?;
                let a = ctx.scoped(|cur| cur.alloc(len))?;
                Alloc::Cuda(a, ctx)
            }
            Backend::Rocm { hip, .. } => Alloc::Hip(hip.alloc(dev, len)?),
        };
        let addr = match &alloc {
            Alloc::Cuda(a, _) => a.addr() as usize,
            Alloc::Hip(a) => a.addr(),
        };
        Ok(DeviceBuffer {
            rt: self,
            alloc: Some(alloc),
            addr,
            len,
            dev,
        })
    }
}

/// `cuPointerGetAttribute`, retried with GPU 0's primary context current if the driver wants
/// a context (`CUDA_ERROR_INVALID_CONTEXT`) on a thread that has none.
fn cuda_pointer_attribute(c: &Cuda, attr: std::ffi::c_int, addr: u64) -> Result<u32> {
    match c.pointer_attribute(attr, addr) {
        Err(Error::Call {
            code: cuda::ERROR_INVALID_CONTEXT,
            ..
        }) => c
            .primary_context(0)?
            .scoped(|_| c.pointer_attribute(attr, addr)),
        other => other,
    }
}

fn export_cuda(c: &Cuda, addr: u64, len: usize) -> Result<DmaBuf> {
    let not_device = Error::InvalidArgument {
        what: "not CUDA device memory",
    };
    match cuda_pointer_attribute(c, cuda::PTR_MEMORY_TYPE, addr) {
        Ok(cuda::MEMORYTYPE_DEVICE) => {}
        Ok(_)
        | Err(Error::Call {
            code: cuda::ERROR_INVALID_VALUE,
            ..
        }) => return Err(not_device),
        Err(e) => return Err(e),
    }
    if cuda_pointer_attribute(c, cuda::PTR_IS_MANAGED, addr).unwrap_or(0) != 0 {
        return Err(Error::Unsupported {
            what: "DMA-BUF export of managed memory".into(),
        });
    }
    let dev = cuda_pointer_attribute(c, cuda::PTR_DEVICE_ORDINAL, addr)? as i32;
    c.primary_context(dev)?.scoped(|cur| {
        let (base, size) = cur.address_range(addr)?;
        let (start, stop) = pointer::export_window(addr, len, base, size, crate::sys::page_size())?;
        let whole = (base, base + size as u64);
        match cur.export_dmabuf(start, (stop - start) as usize) {
            Ok(fd) => Ok(DmaBuf {
                fd,
                offset: addr - start,
                len,
            }),
            Err(e @ Error::Unsupported { .. }) => Err(e),
            Err(_) if (start, stop) != whole => {
                let fd = cur.export_dmabuf(base, size)?;
                Ok(DmaBuf {
                    fd,
                    offset: addr - base,
                    len,
                })
            }
            Err(e) => Err(e),
        }
    })
}

impl CudaProbe for Cuda {
    fn driver_version(&self) -> Result<i32> {
        Cuda::driver_version(self)
    }
    fn has_export(&self) -> bool {
        self.has_dmabuf_export()
    }
    fn dmabuf_attribute(&self, dev: i32) -> Result<i32> {
        self.device_attribute(cuda::ATTR_DMA_BUF_SUPPORTED, dev)
    }
}

struct HsaProbe<'a>(&'a std::result::Result<Hsa, Error>);

impl RocmProbe for HsaProbe<'_> {
    fn hsa(&self) -> std::result::Result<(), String> {
        self.0.as_ref().map(|_| ()).map_err(|e| e.to_string())
    }
    fn dmabuf_supported(&self) -> Result<bool> {
        self.0.as_ref().map_err(Clone::clone)?.dmabuf_supported()
    }
    fn has_export(&self) -> bool {
        self.0.as_ref().is_ok_and(Hsa::has_export)
    }
}

/// The owned allocation behind a [`DeviceBuffer`].
enum Alloc<'rt> {
    /// The allocation and a retained primary context: releasing the last retain destroys the
    /// context and every allocation in it, so the buffer keeps one for its whole life.
    Cuda(CudaAlloc, cuda::PrimaryCtx<'rt>),
    Hip(HipAlloc),
}

/// Device memory from [`GpuRuntime::alloc`]; freed on drop.
pub struct DeviceBuffer<'rt> {
    rt: &'rt GpuRuntime,
    alloc: Option<Alloc<'rt>>,
    addr: usize,
    len: usize,
    dev: i32,
}

impl std::fmt::Debug for DeviceBuffer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer {{ dev: {}, addr: {:#x}, len: {} }}",
            self.dev, self.addr, self.len
        )
    }
}

impl DeviceBuffer<'_> {
    /// The device address (not dereferenceable on the host).
    pub fn as_ptr(&self) -> *mut c_void {
        self.addr as *mut c_void
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: zero-length buffers are refused at allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU it lives on.
    pub fn device(&self) -> i32 {
        self.dev
    }

    fn check_range(&self, offset: usize, n: usize) -> Result<usize> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.addr + offset),
            _ => Err(Error::InvalidArgument {
                what: "copy outside the device buffer",
            }),
        }
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.check_range(offset, src.len())?;
        match &self.rt.backend {
            Backend::Cuda(c) => c
                .primary_context(self.dev)?
                .scoped(|cur| cur.copy_to_device(dst as u64, src)),
            Backend::Rocm { hip, .. } => hip.copy_to_device(dst, src),
        }
    }

    /// Copies from the buffer at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.check_range(offset, dst.len())?;
        match &self.rt.backend {
            Backend::Cuda(c) => c
                .primary_context(self.dev)?
                .scoped(|cur| cur.copy_from_device(dst, src as u64)),
            Backend::Rocm { hip, .. } => hip.copy_from_device(dst, src),
        }
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // Errors cannot be reported from Drop; a failed free only leaks device memory.
        let _ = match (&self.rt.backend, self.alloc.take()) {
            (Backend::Cuda(_), Some(Alloc::Cuda(a, ctx))) => ctx.scoped(|cur| cur.free(a)),
            (Backend::Rocm { hip, .. }, Some(Alloc::Hip(a))) => hip.free(a),
            _ => Ok(()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Env;

    fn host(vars: &[(&str, &str)]) -> Host {
        Host::system().with_env(Env::fixed(vars.iter().copied()))
    }

    #[test]
    fn runtime_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<GpuRuntime>();
    }

    #[test]
    fn ibnet_gpu_none_and_garbage() {
        match GpuRuntime::detect_on(host(&[("IBNET_GPU", "none")])) {
            Err(Error::NotPresent { reason }) => assert!(reason.contains("IBNET_GPU=none")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            GpuRuntime::detect_on(host(&[("IBNET_GPU", "nvidia!")])),
            Err(Error::InvalidArgument { .. })
        ));
    }

    /// On a machine without GPU libraries (CI, this dev box) detection reports absence and
    /// names the libraries it tried; on a GPU machine it must find the matching vendor.
    #[test]
    fn absence_is_reported_with_reasons() {
        match GpuRuntime::detect_on(host(&[("IBNET_GPU", "cuda")])) {
            Err(Error::NotPresent { reason }) => {
                assert!(reason.starts_with("CUDA: "), "{reason}");
                assert!(reason.contains("libcuda"), "{reason}");
            }
            Err(e) => assert!(e.to_string().contains("cu"), "unexpected CUDA error: {e}"),
            Ok(rt) => assert_eq!(rt.vendor(), Vendor::Nvidia),
        }
        match GpuRuntime::detect_on(host(&[("IBNET_GPU", "hip")])) {
            Err(Error::NotPresent { reason }) => {
                assert!(reason.contains("libamdhip64.so"), "{reason}");
                assert!(!reason.contains("CUDA"), "{reason}");
            }
            Err(e) => assert!(e.to_string().contains("hip"), "unexpected HIP error: {e}"),
            Ok(rt) => assert_eq!(rt.vendor(), Vendor::Amd),
        }
        match GpuRuntime::detect_on(host(&[])) {
            Err(Error::NotPresent { reason }) => {
                assert!(
                    reason.contains("CUDA: ") && reason.contains("ROCm: "),
                    "{reason}"
                );
            }
            Err(e) => panic!("auto detection must fail with NotPresent, got {e}"),
            Ok(rt) => assert!(rt.device_count() >= 1),
        }
    }
}
