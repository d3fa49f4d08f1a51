//! The GPU runtime's variables, read by `ibnet-hip` through the `Env` ffi gives it (besides
//! `NCCL_DMABUF_ENABLE` and `NCCL_IB_PCI_RELAXED_ORDERING`, declared in [`super::nccl_ib`],
//! which it reads again with RCCL's per-runtime defaults).

use super::var::Kind::{Int, Path, Word};
use super::var::Reader::Gpu;
use super::var::Since::{Ibnet, Rccl};
use super::var::Var;

/// The GPU runtime's variables, in README's order.
pub const VARS: &[Var] = &[
    Var::new(
        "IBNET_GPU",
        Word(&["auto", "cuda", "hip", "rocm", "none"]),
        "auto",
        Ibnet,
        "GPU runtime for GPU-direct: `auto` (CUDA, then HIP; HIP first in a process that has HIP and not CUDA loaded), `cuda`, `hip` (or `rocm`), `none`; any other value: one WARN, GPU-direct off",
    )
    .by(Gpu),
    Var::new("IBNET_CUDA_LIB", Path, "", Ibnet, "CUDA driver to `dlopen`")
        .shown("auto")
        .by(Gpu),
    Var::new("IBNET_HIP_LIB", Path, "", Ibnet, "HIP runtime to `dlopen`")
        .shown("auto")
        .by(Gpu),
    Var::new(
        "RCCL_FORCE_ENABLE_GDRDMA",
        Int { min: i64::MIN, max: i64::MAX },
        "-1",
        Rccl,
        "AMD GPUs: 1 forces GPU-direct RDMA on without a detected peer-memory client (as RCCL)",
    )
    .by(Gpu),
    Var::new(
        "RCCL_ROCR_PATH",
        Path,
        "",
        Rccl,
        "AMD GPUs: prefix put before `libhsa-runtime64.so` when it is opened for DMA-BUF (as RCCL)",
    )
    .shown("(none)")
    .by(Gpu),
];
