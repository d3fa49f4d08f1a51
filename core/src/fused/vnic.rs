//! [`VNic`]: which physical devices a virtual NIC fuses, as a value (NCCL's
//! `ncclNetVDeviceProps_t`), with the checks every fused vNIC must pass.

use crate::error::{Error, Result};

/// The most physical devices one virtual NIC fuses (NCCL 2.30's `NCCL_IB_MAX_DEVS_PER_NIC`, 8;
/// ffi's v9–v11 tables refuse more than 4, the size of their `makeVDevice` struct).
pub const MAX_DEVS_PER_NIC: usize = crate::wire::MAX_RAILS;
// Rail sets travel as one byte (clear-to-send masks, notices, stripes).
const _: () = assert!(MAX_DEVS_PER_NIC <= 8);

/// The physical devices of one virtual NIC, in rail order: rail `i` is device `devs()[i]`.
///
/// Always 1..=[`MAX_DEVS_PER_NIC`] distinct device indices (the constructor refuses anything
/// else), so code holding a `VNic` never re-checks its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VNic {
    n: u8,
    devs: [u16; MAX_DEVS_PER_NIC],
}

impl VNic {
    /// A vNIC of one physical device (no fusion).
    pub const fn single(dev: u16) -> Self {
        let mut devs = [0; MAX_DEVS_PER_NIC];
        devs[0] = dev;
        Self { n: 1, devs }
    }

    /// The vNIC fusing `devs` (in that rail order), each below `ndev_phys`.
    ///
    /// Refused: no device, more than [`MAX_DEVS_PER_NIC`], an index out of range or negative,
    /// a device named twice.
    pub fn new(devs: &[i32], ndev_phys: usize) -> Result<Self> {
        if devs.is_empty() || devs.len() > MAX_DEVS_PER_NIC {
            return Err(Error::OutOfRange {
                what: "devices in a virtual NIC",
                value: devs.len() as i64,
                min: 1,
                max: MAX_DEVS_PER_NIC as i64,
            });
        }
        let mut v = Self {
            n: 0,
            devs: [0; MAX_DEVS_PER_NIC],
        };
        for &d in devs {
            let idx = usize::try_from(d)
                .ok()
                .filter(|&i| i < ndev_phys)
                .and_then(|i| u16::try_from(i).ok())
                .ok_or(Error::OutOfRange {
                    what: "physical device of a virtual NIC",
                    value: d as i64,
                    min: 0,
                    max: ndev_phys as i64 - 1,
                })?;
            if v.devs().contains(&idx) {
                return Err(Error::OutOfRange {
                    what: "physical device named twice in a virtual NIC",
                    value: d as i64,
                    min: 0,
                    max: ndev_phys as i64 - 1,
                });
            }
            v.devs[v.n as usize] = idx;
            v.n += 1;
        }
        Ok(v)
    }

    /// The physical devices, rail 0 first.
    pub fn devs(&self) -> &[u16] {
        &self.devs[..self.n as usize]
    }

    /// How many rails (physical devices) the vNIC has.
    pub fn ndevs(&self) -> usize {
        self.n as usize
    }

    /// More than one device: comms over it are fused.
    pub fn is_fused(&self) -> bool {
        self.n > 1
    }

    /// Whether the two ends of a connection use different physical devices (what
    /// `NCCL_IB_WARN_RAIL_LOCAL` reports): the devices both lists share are fewer than the
    /// longer list. Device indices are compared as numbers, as NCCL does (both hosts number
    /// their devices in PCI order).
    pub fn rails_differ(&self, remote: &[u16]) -> bool {
        let common = self.devs().iter().filter(|d| remote.contains(d)).count();
        common < self.ndevs().max(remote.len())
    }
}
