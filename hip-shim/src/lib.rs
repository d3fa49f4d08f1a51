//! # ibnet-hip
//!
//! GPU runtimes for the ibnet plugin, loaded with `dlopen` at run time: no link-time dependency
//! on CUDA or ROCm, so one `libnccl-net-ibnet.so` serves NCCL and RCCL, and a machine without
//! GPU libraries (CI) simply gets "not present" with a reason.
//!
//! ```text
//!            plugin (ibnet-ffi) / ibnet-perf --gpu
//!                         │
//!   GpuRuntime::detect()  ▼            free functions (no runtime needed)
//!   ┌──────────────────────────────┐   peermem::gdr_support(vendor, &Host)
//!   │ gdr_support()   → Decision    │   kconfig::check(&Host)
//!   │ dmabuf_support(dev) → Decision│
//!   │ export_dmabuf(ptr, len)       │
//!   │ pointer_kind(ptr)             │
//!   │ alloc(dev, len)               │
//!   └──────────────┬───────────────┘
//!                  ▼ sys (the only unsafe module)
//!     libcuda.so.1 │ libamdhip64.so + libhsa-runtime64.so
//! ```
//!
//! What the plugin does with it (per NCCL's `ptrSupport` rules):
//!
//! * `NCCL_PTR_CUDA` when [`GpuRuntime::gdr_support`] is enabled (a peer-memory module lets
//!   plain `ibv_reg_mr` pin GPU memory);
//! * `NCCL_PTR_DMABUF` when [`GpuRuntime::dmabuf_support`] is enabled **and** the NIC accepts
//!   `ibv_reg_dmabuf_mr` (its fd = -1 probe, done by the plugin with a verbs context);
//! * `regMrDmaBuf` receives NCCL's fd with offset 0, or RCCL's fd with a non-zero offset;
//!   [`GpuRuntime::export_dmabuf`] produces the same pair for ibnet's own tools.
//!
//! Every [`Decision`] carries a reason string so the plugin can log which path was chosen.
//! All calls are fallible and never panic; none belongs on the data path (cache the answers).
//!
//! The proxy engine on a GPU: [`proxy_mem`] ([`CudaProxyMem`]: device banks with `cuMemAlloc`,
//! pinned host banks, DMA-BUF, CUDA IPC export/import), [`copy_net`] (a loopback net copying
//! through the driver) and [`proxy_probe`] (the engine end to end with its banks in GPU
//! memory; the `proxy_gpu_probe` example).
//!
//! Environment: `NCCL_DMABUF_ENABLE` (NCCL default 1, RCCL default 0), `RCCL_FORCE_ENABLE_GDRDMA`,
//! `NCCL_IB_PCI_RELAXED_ORDERING` (Hyper-V rule), `RCCL_ROCR_PATH` (HSA location) and ours,
//! `IBNET_GPU` = `auto` (default) | `cuda` | `hip` (or `rocm`) | `none`, `IBNET_CUDA_LIB` / `IBNET_HIP_LIB`
//! (a library path to load instead of `libcuda.so.1` / `libamdhip64.so`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod copy_net;
pub mod decision;
pub mod dmabuf;
pub mod env;
pub mod error;
pub mod host;
pub mod kconfig;
pub mod peermem;
mod pointer;
pub mod proxy_mem;
pub mod proxy_probe;
pub mod runtime;
mod sys;

pub use decision::{Decision, PointerKind, Vendor};
pub use env::Env;
pub use error::{Error, Result};
pub use host::Host;
pub use proxy_mem::{CudaProxyMem, DeviceCopier};
pub use runtime::{DeviceBuffer, DmaBuf, GpuRuntime};
