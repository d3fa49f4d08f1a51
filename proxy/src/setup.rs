//! What the caller decides for a connection before the engine sets it up.

/// What the caller decided for a connection (NCCL's `setupReq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetupReq {
    /// This rank (the tag of its sends).
    pub tp_rank: u32,
    /// This rank's index among the local ranks (selects the shared pool).
    pub tp_local_rank: u32,
    /// The peer's rank (the tag of receives from it; the shared comm key on send).
    pub tp_remote_rank: u32,
    /// Shared-buffer mode (p2p); see [`SetupReq::shared_default`].
    pub shared: bool,
    /// The net device.
    pub net_dev: u32,
    /// GPU-direct RDMA: buffers in device memory.
    pub use_gdr: bool,
    /// Received data must be flushed before the GPU reads it (receive side, with `use_gdr`).
    pub need_flush: bool,
    /// The channel.
    pub channel: u32,
    /// The connection index.
    pub conn_index: u32,
    /// The identity of the process the GPU side runs in (NCCL compares host and pid hashes).
    /// Equal to [`ProxyConfig::process_id`](super::ProxyConfig::process_id) (both 0 by
    /// default): the same process, the map carries addresses. Different: the banks are
    /// exported and the GPU process maps them from
    /// [`ProxyState::export_map`](super::ProxyState::export_map)'s message.
    pub gpu_process: u64,
}

impl SetupReq {
    /// NCCL's choice of shared-buffer mode: never for ring/tree graphs or connection index 0;
    /// otherwise `NCCL_NET_SHARED_BUFFERS` (`-2`, the default, means on).
    pub fn shared_default(has_graph: bool, conn_index: u32, net_shared_buffers: i64) -> bool {
        if has_graph || conn_index == 0 {
            false
        } else if net_shared_buffers != -2 {
            net_shared_buffers != 0
        } else {
            true
        }
    }
}
