//! The merging rules of NCCL 2.28's IB transport, as pure functions over device descriptions
//! (no sysfs, no verbs: the callers read those and the tests feed strings).
//!
//! * **PCI path.** A device's PCI path is its sysfs device directory with the function digit
//!   zeroed (ports of one multi-port NIC merge) and, with `NCCL_IB_MERGE_VFS` (default on),
//!   the two device digits zeroed as well (virtual functions merge with their NIC):
//!   `…/0000:3b:01.3` → `…/0000:3b:00.0`.
//! * **`realPort`.** Devices are numbered in discovery order; a device's `realPort` is how many
//!   *earlier* devices are on the same NIC, where "same NIC" is a prefix match: the earlier
//!   path starts with this path less its last 4 characters (`NCCL_IB_MERGE_VFS`) or its last
//!   character (without); a shorter path compares whole. The exported port is `port + realPort`, so the two ports of a
//!   dual-port NIC (each `ibv` port 1 of its own function) read as ports 1 and 2.
//! * **Fusing** ([`fuse`]): a virtual NIC of more than one device needs `NCCL_IB_MERGE_NICS`
//!   and devices of one link layer. Its name is the devices' names joined by `+`
//!   ([`write_name`]), its speed the sum; everything else is rail 0's, except what every rail
//!   must honour: the pointer kinds are the ones all rails support and `maxComms` the smallest
//!   (a fused comm takes QPs on every rail).

use crate::fused::VNic;
use crate::Error;

/// Merges the sysfs device path `path` in place as NCCL does: function digit zeroed, and with
/// `merge_vfs` the two device digits too. Paths shorter than 4 bytes are left as they are.
pub fn merge_pci_path(path: &mut [u8], merge_vfs: bool) {
    let n = path.len();
    if n >= 4 {
        path[n - 1] = b'0';
        if merge_vfs {
            path[n - 3] = b'0';
            path[n - 4] = b'0';
        }
    }
}

/// Whether the device at (merged) path `this` is on the same NIC as the one at `earlier`: the
/// prefix of `this` without its last 4 characters (`merge_vfs`) or its last character is a
/// prefix of `earlier`.
pub fn same_nic(this: &str, earlier: &str, merge_vfs: bool) -> bool {
    let cut = if merge_vfs { 4 } else { 1 };
    // A path shorter than the cut compares whole (NCCL's length would wrap around).
    match this
        .len()
        .checked_sub(cut)
        .and_then(|keep| this.get(..keep))
    {
        Some(prefix) => earlier.starts_with(prefix),
        None => this == earlier,
    }
}

/// `realPort` of a device at `this` whose earlier devices have the paths `earlier` (a device
/// without a path has realPort 0 and never counts).
pub fn real_port<'a>(
    this: Option<&str>,
    earlier: impl IntoIterator<Item = Option<&'a str>>,
    merge_vfs: bool,
) -> i32 {
    let Some(this) = this else { return 0 };
    earlier
        .into_iter()
        .flatten()
        .filter(|e| same_nic(this, e, merge_vfs))
        .count() as i32
}

/// What [`fuse`] needs of one physical device.
#[derive(Debug, Clone)]
pub struct PhysDesc<'a> {
    /// Its name (`mlx5_0`).
    pub name: &'a str,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Mbps.
    pub speed: i32,
    /// `NCCL_PTR_*` mask.
    pub ptr_support: i32,
    /// `maxComms`.
    pub max_comms: i32,
}

/// A fused virtual NIC's own properties (the rest are rail 0's; its name is [`write_name`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fused {
    /// The sum of the rails' speeds (Mbps).
    pub speed: i32,
    /// The pointer kinds every rail supports.
    pub ptr_support: i32,
    /// The smallest `maxComms` of the rails.
    pub max_comms: i32,
}

/// Why a virtual NIC is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `NCCL_IB_MERGE_NICS=0` and more than one device.
    MergeNicsOff,
    /// Two rails have different link layers: rail 0's device number, then the other's.
    LinkLayers(u16, u16),
    /// A device index the description list does not have.
    NoSuchDevice(u16),
}

impl Refused {
    /// As the core's error (`ncclInvalidUsage`, as NCCL 2.28 answers).
    pub fn to_error(&self) -> Error {
        match self {
            Refused::MergeNicsOff => Error::Param {
                name: "NCCL_IB_MERGE_NICS",
                reason: "0: a virtual NIC of more than one device is refused",
            },
            Refused::LinkLayers(..) => Error::Param {
                name: "NCCL_IB_HCA",
                reason: "cannot fuse devices of different link layers; select NICs of one link \
                         type with NCCL_IB_HCA",
            },
            Refused::NoSuchDevice(_) => Error::Missing {
                what: "physical device of the virtual NIC",
            },
        }
    }
}

/// The properties of the virtual NIC `v` over the physical devices `phys` (indexed by device
/// number), or why it is refused.
pub fn fuse(v: &VNic, phys: &[PhysDesc<'_>], merge_nics: bool) -> Result<Fused, Refused> {
    if v.is_fused() && !merge_nics {
        return Err(Refused::MergeNicsOff);
    }
    let get = |d: u16| phys.get(d as usize).ok_or(Refused::NoSuchDevice(d));
    let d0 = v.devs()[0];
    let first = get(d0)?;
    let mut out = Fused {
        speed: 0,
        ptr_support: first.ptr_support,
        max_comms: first.max_comms,
    };
    for &d in v.devs() {
        let p = get(d)?;
        if p.link_layer != first.link_layer {
            return Err(Refused::LinkLayers(d0, d));
        }
        out.speed = out.speed.saturating_add(p.speed);
        out.ptr_support &= p.ptr_support;
        out.max_comms = out.max_comms.min(p.max_comms);
    }
    Ok(out)
}

/// Writes the name of the virtual NIC `v`: its devices' names joined by `+` (a device `phys`
/// lacks is skipped; [`fuse`] refuses it).
pub fn write_name(
    v: &VNic,
    phys: &[PhysDesc<'_>],
    out: &mut impl core::fmt::Write,
) -> core::fmt::Result {
    let names = v.devs().iter().filter_map(|&d| phys.get(usize::from(d)));
    for (i, p) in names.enumerate() {
        if i > 0 {
            out.write_char('+')?;
        }
        out.write_str(p.name)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
