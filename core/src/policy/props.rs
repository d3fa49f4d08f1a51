//! The properties a device reports that are decisions, not readings: `maxComms`, the pointer
//! kinds (`ptrSupport`) and the exported port. ffi reads the device (`max_qp`, the DMA-BUF
//! probe, the GPU side) and passes what it read.

/// `NCCL_PTR_HOST`: host memory.
pub const PTR_HOST: i32 = 0x1;
/// `NCCL_PTR_CUDA`: GPU memory through GPU-direct RDMA (peer memory).
pub const PTR_CUDA: i32 = 0x2;
/// `NCCL_PTR_DMABUF`: GPU memory through DMA-BUF.
pub const PTR_DMABUF: i32 = 0x4;

/// The most comms (send and receive together) advertised per device, whatever the QP budget:
/// 1024 of each, as many as NCCL opens per peer NIC in practice.
pub const MAX_COMMS: i32 = 2048;

/// What bounds a device's comms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommBudget {
    /// QPs the device holds (verbs: `max_qp`; soft: its QP table).
    pub qps: i32,
    /// Data QPs per comm (`NCCL_IB_QPS_PER_CONNECTION`; 0 counts as 1).
    pub nqps: u8,
    /// Whether a comm also takes a flush QP (receive comms only; counted for all, to stay true).
    pub gdr_flush: bool,
    /// Memory for QPs and the bytes one comm takes of it, where the provider enforces such a
    /// budget (soft's `IBNET_SOFT_MEM`); `None`: no memory bound (verbs).
    pub memory: Option<(u64, u64)>,
}

/// `maxComms`: the comms that fit in the QP budget and in the memory budget, at least 1 and at
/// most [`MAX_COMMS`].
pub fn max_comms(b: &CommBudget) -> i32 {
    let per_comm = i32::from(b.nqps.max(1)) + i32::from(b.gdr_flush);
    let by_qps = b.qps / per_comm;
    let by_mem = match b.memory {
        None => i32::MAX,
        Some((mem, per)) => i32::try_from(mem / per.max(1)).unwrap_or(i32::MAX),
    };
    by_qps.min(by_mem).clamp(1, MAX_COMMS)
}

/// `ptrSupport` of a verbs device: host memory always; GPU memory through peer memory when
/// `gdr` works, through DMA-BUF when the NIC's probe (`nic_dmabuf`) and the GPU side
/// (`gpu_dmabuf`) both do.
pub fn ptr_support(gdr: bool, nic_dmabuf: bool, gpu_dmabuf: bool) -> i32 {
    let mut ptr = PTR_HOST;
    if gdr {
        ptr |= PTR_CUDA;
    }
    if nic_dmabuf && gpu_dmabuf {
        ptr |= PTR_DMABUF;
    }
    ptr
}

/// The port NCCL is shown: the verbs port plus `realPort` ([`super::merge::real_port`]), so
/// the two single-port functions of a dual-port NIC read as ports 1 and 2.
pub fn exported_port(port: u8, real_port: i32) -> i32 {
    i32::from(port).saturating_add(real_port)
}

/// A port's speed in Mbps: `queried`, what `ibv_query_port_speed` answered (units of
/// 100 Mbps; `None` when not asked, not available or failed), else `fallback` (speed × width
/// from `ibv_query_port`), as NCCL 2.30 with `NCCL_IB_QUERY_PORT_SPEED`.
pub fn port_speed(queried: Option<u64>, fallback: i32) -> i32 {
    queried
        .and_then(|s| s.checked_mul(100))
        .and_then(|m| i32::try_from(m).ok())
        .unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(qps: i32, nqps: u8, gdr_flush: bool, memory: Option<(u64, u64)>) -> CommBudget {
        CommBudget {
            qps,
            nqps,
            gdr_flush,
            memory,
        }
    }

    #[test]
    fn max_comms_is_the_tighter_budget_within_1_and_max_comms() {
        assert_eq!(max_comms(&budget(1000, 1, false, None)), 1000);
        assert_eq!(max_comms(&budget(1000, 2, true, None)), 333);
        assert_eq!(max_comms(&budget(1000, 0, false, None)), 1000, "0 QPs is 1");
        assert_eq!(max_comms(&budget(1 << 20, 1, false, None)), MAX_COMMS);
        assert_eq!(max_comms(&budget(0, 1, false, None)), 1, "at least one");
        assert_eq!(max_comms(&budget(1000, 1, false, Some((10_000, 1000)))), 10);
        assert_eq!(
            max_comms(&budget(1000, 1, false, Some((10, 0)))),
            10,
            "0 bytes is 1"
        );
        assert_eq!(
            max_comms(&budget(1000, 1, false, Some((u64::MAX, 1)))),
            1000
        );
    }

    #[test]
    fn pointer_kinds_and_port() {
        assert_eq!(ptr_support(false, true, false), PTR_HOST);
        assert_eq!(ptr_support(true, false, true), PTR_HOST | PTR_CUDA);
        assert_eq!(ptr_support(false, true, true), PTR_HOST | PTR_DMABUF);
        assert_eq!(exported_port(1, 1), 2);
        assert_eq!(exported_port(1, 0), 1);
    }

    #[test]
    fn queried_speed_wins_in_100_mbps_units() {
        assert_eq!(port_speed(Some(4000), 100_000), 400_000);
        assert_eq!(port_speed(None, 100_000), 100_000);
        assert_eq!(port_speed(Some(u64::MAX), 7), 7, "beyond i32: the fallback");
    }
}
