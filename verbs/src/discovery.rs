//! What verbs discovery (`device::discover`) reads of the plugin's [`Params`], in the shapes it
//! uses: the discovery slice of the one typed configuration, built in one function
//! ([`Discovery::from_params`]), as `CommConfig` is the per-comm slice. It carries the 2.29/2.30
//! device-order and port-speed choices (`NCCL_IB_DEVICE_PCI_ORDER`,
//! `NCCL_IB_QUERY_PORT_SPEED`) for discovery to apply, and RoCE GID auto-selection as core
//! decides it from the params ([`Auto::from_params`]).

use ibnet_core::hca::HcaFilter;
use ibnet_core::params::{AddrFamily, Params, RelaxedOrdering};
use ibnet_core::policy::gid::Auto;

/// The values verbs discovery uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Discovery {
    /// `NCCL_IB_DISABLE`: no verbs devices.
    pub ib_disable: bool,
    /// `NCCL_IB_HCA` as `Params::set` parsed it (empty: every device).
    pub hca: HcaFilter,
    /// `NCCL_IB_GID_INDEX` (-1: auto-select).
    pub gid_index: i64,
    /// `NCCL_IB_ROUTABLE_FLID_GID_INDEX`.
    pub routable_flid_gid_index: u8,
    /// What RoCE GID auto-selection looks for (`NCCL_IB_ADDR_FAMILY`, `NCCL_IB_ADDR_RANGE`,
    /// `NCCL_IB_ROCE_VERSION_NUM`, and whether the user set the family or range), as
    /// [`Auto::from_params`] reads them.
    pub gid_auto: Auto,
    /// `NCCL_IB_ADAPTIVE_ROUTING` (-2: on for InfiniBand, off for RoCE).
    pub adaptive_routing: i64,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (0 off, 1 on, 2 auto).
    pub relaxed_ordering: i64,
    /// `NCCL_DMABUF_ENABLE`.
    pub dmabuf_enable: bool,
    /// `NCCL_IB_MERGE_VFS`.
    pub merge_vfs: bool,
    /// `NCCL_IB_DEVICE_PCI_ORDER` ([`Params::device_pci_order`]): number devices in PCI-path
    /// order (NCCL 2.29+).
    pub device_pci_order: bool,
    /// `NCCL_IB_QUERY_PORT_SPEED` ([`Params::query_port_speed`]): take the speed from
    /// `ibv_query_port_speed` where libibverbs has it (NCCL 2.30+).
    pub query_port_speed: bool,
}

impl Default for Discovery {
    fn default() -> Self {
        Self::from_params(&Params::default())
    }
}

/// `AF_INET` / `AF_INET6` for a family.
pub fn family(f: AddrFamily) -> i32 {
    match f {
        AddrFamily::Inet => libc::AF_INET,
        AddrFamily::Inet6 => libc::AF_INET6,
    }
}

impl Discovery {
    /// The discovery slice of `p`.
    pub fn from_params(p: &Params) -> Self {
        Self {
            ib_disable: p.ib_disable,
            hca: p.hca.clone(),
            gid_index: p.ib_gid_index.map_or(-1, i64::from),
            routable_flid_gid_index: p.ib_routable_flid_gid_index,
            gid_auto: Auto::from_params(p),
            adaptive_routing: p.ib_adaptive_routing.map_or(-2, i64::from),
            relaxed_ordering: match p.ib_pci_relaxed_ordering {
                RelaxedOrdering::Off => 0,
                RelaxedOrdering::On => 1,
                RelaxedOrdering::Auto => 2,
            },
            dmabuf_enable: p.dmabuf_enable,
            merge_vfs: p.ib_merge_vfs,
            device_pci_order: p.device_pci_order(),
            query_port_speed: p.query_port_speed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_mirrors_the_params() {
        let d = Discovery::default();
        assert_eq!(
            (d.gid_index, d.adaptive_routing, d.relaxed_ordering),
            (-1, -2, 2)
        );
        assert!(d.device_pci_order && d.query_port_speed, "NCCL's defaults");
        assert!(
            !d.gid_auto.strict,
            "family and range unset: NCCL's GID fallback"
        );
        let mut p = Params::default();
        for (n, v) in [
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_ADDR_RANGE", "10.0.0.0/8"),
            ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
            ("NCCL_IB_DEVICE_PCI_ORDER", "0"),
            ("NCCL_IB_QUERY_PORT_SPEED", "0"),
            ("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "2"),
        ] {
            p.set(n, v).unwrap();
        }
        let d = Discovery::from_params(&p);
        assert_eq!(d.gid_index, 3);
        assert_eq!(d.gid_auto, Auto::from_params(&p));
        assert!(d.gid_auto.range.is_some() && d.gid_auto.strict);
        assert_eq!(d.adaptive_routing, 1);
        assert_eq!(d.routable_flid_gid_index, 2);
        assert!(!d.device_pci_order && !d.query_port_speed);
    }
}
