//! GPU-direct decisions for verbs devices, made once per process through `ibnet-hip`.
//!
//! * GPU-direct RDMA (`NCCL_PTR_CUDA`): a peer-memory client is registered (NVIDIA
//!   `nv_peer_mem`/`nvidia-peermem`, AMD `amdkfd` memory peers, `RCCL_FORCE_ENABLE_GDRDMA`),
//!   as the seed's `ncclIbGdrSupport` and NCCL 2.28 decide it.
//! * DMA-BUF (`NCCL_PTR_DMABUF`): the NIC side is the per-device `ibv_reg_dmabuf_mr(fd=-1)`
//!   probe (in `ibnet_verbs::device`); on ROCm, RCCL additionally requires HSA's DMA-BUF support, its
//!   export symbol, the kernel config and `NCCL_DMABUF_ENABLE=1`, decided here. On CUDA, NCCL
//!   itself checks the GPU side.
//!
//! The soft provider never uses this: it moves host memory only.

use std::sync::OnceLock;

use ibnet_hip::{Env, GpuRuntime, Host, Vendor};

/// The process-wide GPU-direct decisions.
#[derive(Debug)]
pub struct GpuDirect {
    /// Advertise `NCCL_PTR_CUDA` on verbs devices.
    pub gdr: bool,
    /// Whether the GPU side allows DMA-BUF (always true on CUDA, where NCCL decides).
    pub dmabuf_gpu_side: bool,
}

impl GpuDirect {
    /// Whether GPU-direct RDMA is possible on a verbs device whose DMA-BUF probe said
    /// `nic_dmabuf`: through a peer-memory module, or through DMA-BUF alone when the GPU side
    /// allows it too. This is when receives may land in GPU memory, so the flush is enabled
    /// (the seed and NCCL 2.28: GDR support or DMA-BUF support).
    pub fn possible(&self, nic_dmabuf: bool) -> bool {
        self.gdr || (nic_dmabuf && self.dmabuf_gpu_side)
    }
}

/// Detects once, logs each decision at INFO, and returns the result.
pub fn gpu_direct() -> &'static GpuDirect {
    static G: OnceLock<GpuDirect> = OnceLock::new();
    // The runtime's variables come from the one reader (`env.rs`).
    let host = Host::system().with_env(Env::Lookup(ibnet_nccl::env::var));
    G.get_or_init(|| match GpuRuntime::detect_on(host) {
        Ok(rt) => {
            let gdr = rt.gdr_support();
            ibnet_nccl::info!(
                ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
                "{}; GPU Direct RDMA {} ({})",
                rt.describe(),
                if gdr.enabled { "enabled" } else { "disabled" },
                gdr.reason
            );
            let dmabuf_gpu_side = match rt.vendor() {
                Vendor::Nvidia => true,
                Vendor::Amd => {
                    let d = rt.dmabuf_support(0);
                    ibnet_nccl::info!(
                        ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
                        "DMA-BUF on the GPU side {} ({})",
                        if d.enabled { "enabled" } else { "disabled" },
                        d.reason
                    );
                    d.enabled
                }
            };
            GpuDirect {
                gdr: gdr.enabled,
                dmabuf_gpu_side,
            }
        }
        // A value that cannot be used (IBNET_GPU other than auto, cuda, hip, rocm or none) is
        // the user's error: one WARN. No runtime on the host is not: INFO.
        Err(e @ ibnet_hip::Error::InvalidArgument { .. }) => {
            let v = ibnet_nccl::env::var("IBNET_GPU").unwrap_or_default();
            ibnet_nccl::warn!(
                "GPU runtime not chosen ({e}; IBNET_GPU={v:?}): GPU Direct RDMA disabled"
            );
            GpuDirect {
                gdr: false,
                dmabuf_gpu_side: false,
            }
        }
        Err(e) => {
            ibnet_nccl::info!(
                ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
                "no GPU runtime ({e}): GPU Direct RDMA disabled"
            );
            GpuDirect {
                gdr: false,
                dmabuf_gpu_side: false,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dma_buf_alone_makes_gpu_direct_possible() {
        let g = |gdr, dmabuf_gpu_side| GpuDirect {
            gdr,
            dmabuf_gpu_side,
        };
        assert!(g(true, false).possible(false), "peer memory");
        assert!(g(false, true).possible(true), "DMA-BUF only: flush enabled");
        assert!(!g(false, true).possible(false), "the NIC refused DMA-BUF");
        assert!(
            !g(false, false).possible(true),
            "the GPU side refused DMA-BUF"
        );
    }
}
