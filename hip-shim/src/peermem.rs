//! GPUDirect RDMA through a peer-memory client: can the NIC register GPU memory with plain
//! `ibv_reg_mr`? (`NCCL_PTR_CUDA` in `ptrSupport`.)
//!
//! Neither NCCL nor RCCL tests the GPU here; they look for a loaded peer-memory kernel module:
//!
//! ```text
//! NVIDIA (NCCL 2.28 ncclIbGdrSupport, plus the seed's nvidia-peermem entry), first hit wins:
//!   /sys/kernel/mm/memory_peers/nv_mem/version          nv_peer_mem (MLNX_OFED)
//!   /sys/kernel/mm/memory_peers/nv_mem_nc/version       nv_peer_mem, non-contiguous variant
//!   /sys/kernel/mm/memory_peers/nvidia-peermem/version  nvidia-peermem via memory_peers
//!   /sys/module/nvidia_peermem/version                  nvidia-peermem (upstream RDMA core)
//!
//! AMD (RCCL ncclIbGdrSupport):
//!   RCCL_FORCE_ENABLE_GDRDMA=1                          forced on, nothing else checked
//!   <dir>/amdkfd/version for dir in
//!     /sys/kernel/mm/memory_peers, /sys/kernel/memory_peers, /sys/memory_peers
//!   else: any subdirectory of those dirs                (rocm-systems PR #9540; replaces the
//!                                                        /proc/kallsyms scan, false positives)
//!   then, if found: Hyper-V guest (bios_version "Hyper-V UEFI Release…") with
//!     /proc/sys/kernel/numa_balancing = 1 and NCCL_IB_PCI_RELAXED_ORDERING=0 → disabled
//! ```
//!
//! Every result is a [`Decision`] whose reason names the path or variable that decided it.

use crate::decision::{Decision, Vendor};
use crate::host::Host;

/// NVIDIA peer-memory markers, in the order they are checked.
pub const NVIDIA_MARKERS: [&str; 4] = [
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "/sys/kernel/mm/memory_peers/nvidia-peermem/version",
    "/sys/module/nvidia_peermem/version",
];

/// Directories where the IB core's `memory_peers` may live (distribution-dependent).
pub const MEMORY_PEERS_DIRS: [&str; 3] = [
    "/sys/kernel/mm/memory_peers",
    "/sys/kernel/memory_peers",
    "/sys/memory_peers",
];

/// GPUDirect peer-memory decision for `vendor` on `host`.
pub fn gdr_support(vendor: Vendor, host: &Host) -> Decision {
    match vendor {
        Vendor::Nvidia => nvidia(host),
        Vendor::Amd => amd(host),
    }
}

/// NVIDIA: a loaded `nv_peer_mem` / `nvidia-peermem` module.
pub fn nvidia(host: &Host) -> Decision {
    match NVIDIA_MARKERS.iter().find(|p| host.exists(p)) {
        Some(p) => Decision::yes(format!("peer-memory module found: {p}")),
        None => Decision::no(format!(
            "no nv_peer_mem/nvidia-peermem module (none of {} exists)",
            NVIDIA_MARKERS.join(", ")
        )),
    }
}

/// AMD: `RCCL_FORCE_ENABLE_GDRDMA`, then the amdkfd peer-memory client, then the Hyper-V rule.
pub fn amd(host: &Host) -> Decision {
    let force = host.env().int_param("RCCL_FORCE_ENABLE_GDRDMA", -1);
    if force.value == 1 {
        return Decision::yes(format!("forced by {force}"));
    }
    let found = MEMORY_PEERS_DIRS
        .iter()
        .map(|d| format!("{d}/amdkfd/version"))
        .find(|p| host.exists(p))
        .map(|p| format!("amdkfd peer-memory client found: {p}"))
        .or_else(|| {
            MEMORY_PEERS_DIRS.iter().find_map(|d| {
                let subs = host.subdirs(d);
                (!subs.is_empty())
                    .then(|| format!("peer-memory client(s) found in {d}: {}", subs.join(", ")))
            })
        });
    let Some(found) = found else {
        return Decision::no(format!(
            "no amdkfd peer-memory client (no entries under {}; {force})",
            MEMORY_PEERS_DIRS.join(", ")
        ));
    };
    if let Some(why) = hyperv_blocks(host) {
        return Decision::no(format!("{found}, but {why}"));
    }
    Decision::yes(found)
}

/// RCCL's Hyper-V rule: returns why GDR is blocked, or `None`.
fn hyperv_blocks(host: &Host) -> Option<String> {
    let bios = host
        .read_text("/sys/devices/virtual/dmi/id/bios_version")
        .ok()?;
    if !bios.starts_with("Hyper-V UEFI Release") {
        return None;
    }
    let numa = host.read_text("/proc/sys/kernel/numa_balancing").ok()?;
    let ro = host.env().int_param("NCCL_IB_PCI_RELAXED_ORDERING", 2);
    (numa.trim() == "1" && ro.value == 0)
        .then(|| format!("Hyper-V guest with numa_balancing=1 and {ro} disables GDR (RCCL rule)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Env;
    use crate::host::testutil::TempTree;

    fn host(t: &TempTree, vars: &[(&str, &str)]) -> Host {
        Host::with_root(t.root()).with_env(Env::fixed(vars.iter().copied()))
    }

    #[test]
    fn nvidia_absent() {
        let t = TempTree::new("pm-nv0");
        let d = gdr_support(Vendor::Nvidia, &host(&t, &[]));
        assert!(!d.enabled);
        assert!(d.reason.contains("nvidia_peermem"), "{}", d.reason);
    }

    #[test]
    fn nvidia_each_marker_enables() {
        for m in NVIDIA_MARKERS {
            let t = TempTree::new("pm-nv");
            t.file(m, b"1.0\n");
            let d = nvidia(&host(&t, &[]));
            assert!(d.enabled, "{m}");
            assert!(d.reason.contains(m), "{}", d.reason);
        }
    }

    #[test]
    fn nvidia_ignores_amd_markers() {
        let t = TempTree::new("pm-nv-amd");
        t.file("/sys/kernel/mm/memory_peers/amdkfd/version", b"1\n");
        assert!(!nvidia(&host(&t, &[])).enabled);
    }

    #[test]
    fn amd_force_env() {
        let t = TempTree::new("pm-amd-force");
        let d = amd(&host(&t, &[("RCCL_FORCE_ENABLE_GDRDMA", "1")]));
        assert!(d.enabled);
        assert!(
            d.reason.contains("RCCL_FORCE_ENABLE_GDRDMA=1"),
            "{}",
            d.reason
        );
        // Any other value, or garbage, does not force.
        for v in ["0", "-1", "2", "yes"] {
            let d = amd(&host(&t, &[("RCCL_FORCE_ENABLE_GDRDMA", v)]));
            assert!(!d.enabled, "{v}");
        }
    }

    #[test]
    fn amd_kfd_in_each_dir() {
        for dir in MEMORY_PEERS_DIRS {
            let t = TempTree::new("pm-amd");
            t.file(&format!("{dir}/amdkfd/version"), b"1\n");
            let d = amd(&host(&t, &[]));
            assert!(d.enabled, "{dir}");
            assert!(d.reason.contains("amdkfd"), "{}", d.reason);
        }
    }

    #[test]
    fn amd_any_memory_peers_subdir() {
        let t = TempTree::new("pm-amd-any");
        t.dir("/sys/kernel/memory_peers/some_client");
        let d = amd(&host(&t, &[]));
        assert!(d.enabled);
        assert!(d.reason.contains("some_client"), "{}", d.reason);
        // An empty memory_peers dir is not enough.
        let e = TempTree::new("pm-amd-empty");
        e.dir("/sys/kernel/mm/memory_peers");
        assert!(!amd(&host(&e, &[])).enabled);
    }

    #[test]
    fn amd_hyperv_rule() {
        let t = TempTree::new("pm-amd-hv");
        t.file("/sys/kernel/mm/memory_peers/amdkfd/version", b"1\n")
            .file(
                "/sys/devices/virtual/dmi/id/bios_version",
                b"Hyper-V UEFI Release v4.1\n",
            )
            .file("/proc/sys/kernel/numa_balancing", b"1\n");
        let blocked = amd(&host(&t, &[("NCCL_IB_PCI_RELAXED_ORDERING", "0")]));
        assert!(!blocked.enabled);
        assert!(blocked.reason.contains("Hyper-V"), "{}", blocked.reason);
        // Relaxed ordering left at its default (2) keeps GDR.
        assert!(amd(&host(&t, &[])).enabled);
        // numa_balancing off keeps GDR.
        t.file("/proc/sys/kernel/numa_balancing", b"0\n");
        assert!(amd(&host(&t, &[("NCCL_IB_PCI_RELAXED_ORDERING", "0")])).enabled);
    }
}
