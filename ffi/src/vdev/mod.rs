//! Virtual NICs: `makeVDevice` and the properties of a fused NIC.
//!
//! NCCL numbers devices `0..devices()`. The first `nphys` are the physical devices (each its
//! own one-device vNIC, as NCCL 2.28's IB transport lists them); every vNIC that
//! `makeVDevice` fuses gets the next number, `nphys + i`, for the life of the process (2.28
//! never forgets a merged device either; NCCL keeps the number it was given across
//! `finalize`/`init`). The table holds at most [`MAX_VNICS`]; the rules a fusion must pass are
//! core's ([`ibnet_core::policy::merge`]).
//!
//! ```text
//!  makeVDevice({ndevs: 2, devs: [0, 1]})
//!    VNic::new (1..=8 distinct devices in range; 4 through v9–v11) ─▶ merge::fuse (NCCL_IB_MERGE_NICS, link
//!    layers) ─▶ FUSED.push(entry "mlx5_0+mlx5_1") ─▶ *d = nphys + i
//!  getProperties(nphys + i) ─▶ rail 0's properties, speed summed, vProps = [0, 1],
//!                             railId/planeId as NCCL 2.30 fuses them (`hca::fused_ids`)
//! ```
//!
//! The table is taken only on the control path (`makeVDevice`, `getProperties`, `devices`,
//! `listen`, `connect`); a comm resolves its vNIC once, when it is created.

use core::ffi::c_int;
use std::ffi::CString;
use std::sync::Mutex;

use ibnet_core::fused::VNic;
use ibnet_core::hca::Ids;
use ibnet_core::policy::merge;
use ibnet_core::Error;

use crate::dev::Props;
use crate::plugin::Plugin;
use ibnet_nccl::types::ncclNetVDeviceProps_v12_t;

/// The most fused vNICs one process makes (NCCL 2.28's `MAX_IB_VDEVS`).
pub const MAX_VNICS: usize = 128;

/// One fused vNIC: its devices and its name (a `'static` C string, since NCCL keeps the
/// properties' name pointer).
struct Entry {
    vnic: VNic,
    name: &'static std::ffi::CStr,
}

/// The fused vNICs, in the order they were made. Entries are never removed, so a number NCCL
/// holds stays valid and each name is leaked at most once per entry (bounded by
/// [`MAX_VNICS`]).
static FUSED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn table() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    FUSED.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many fused vNICs exist (`devices()` reports `nphys` plus this).
pub fn count() -> usize {
    table().len()
}

/// The vNIC that device number `dev` names, over a plugin with `nphys` physical devices:
/// a physical device for `dev < nphys`, else a fused vNIC; `None` when there is no such device.
pub fn resolve(nphys: usize, dev: c_int) -> Option<VNic> {
    let d = usize::try_from(dev).ok()?;
    if d < nphys {
        return u16::try_from(d).ok().map(VNic::single);
    }
    table().get(d - nphys).map(|e| e.vnic)
}

/// [`resolve`], or the error naming the device numbers in range.
pub fn lookup(nphys: usize, dev: c_int) -> Result<VNic, Error> {
    resolve(nphys, dev).ok_or(Error::OutOfRange {
        what: "dev",
        value: i64::from(dev),
        min: 0,
        max: (nphys + count()) as i64 - 1,
    })
}

/// The descriptions [`merge::fuse`] compares, one per physical device of `p`: properties,
/// link layer, name.
fn descriptions(p: &Plugin) -> Vec<(Props, u8, String)> {
    p.devs
        .iter()
        .map(|d| {
            let props = p.props(d);
            let name = d.name().to_string_lossy().into_owned();
            (props, d.port_info().link_layer as u8, name)
        })
        .collect()
}

/// Rail 0's properties with the fused rail and plane ids, the fused properties and the
/// fused name ([`merge::write_name`]), or why the fusion is refused.
fn fuse_props(p: &Plugin, v: &VNic) -> Result<(Props, merge::Fused, String), merge::Refused> {
    let descs = descriptions(p);
    let ids = |d: &(Props, u8, String)| Ids {
        rail: d.0.rail,
        plane: d.0.plane,
    };
    let all: Vec<Ids> = descs.iter().map(ids).collect();
    let members: Vec<Ids> = v.devs().iter().map(|&d| all[usize::from(d)]).collect();
    let fused_ids = ibnet_core::hca::fused_ids(&members, &all);
    let phys: Vec<merge::PhysDesc<'_>> = descs
        .iter()
        .map(|(pr, ll, name)| merge::PhysDesc {
            name,
            link_layer: *ll,
            speed: pr.speed,
            ptr_support: pr.ptr_support,
            max_comms: pr.max_comms,
        })
        .collect();
    let fused = merge::fuse(v, &phys, p.params.ib_merge_nics)?;
    let mut name = String::new();
    // Writing to a String cannot fail.
    let _ = merge::write_name(v, &phys, &mut name);
    let mut out = descs[v.devs()[0] as usize].0;
    (out.rail, out.plane) = (fused_ids.rail, fused_ids.plane);
    Ok((out, fused, name))
}

/// `makeVDevice`: the number of the vNIC fusing the first `ndevs` of `all` (the table's
/// `devs` array, whose length is the table's limit), or why not. One device is that device
/// itself (no table entry).
pub fn make(p: &Plugin, ndevs: c_int, all: &[c_int]) -> Result<c_int, Made> {
    let n = usize::try_from(ndevs).unwrap_or(usize::MAX);
    let devs = all.get(..n).ok_or(Made::Error(Error::OutOfRange {
        what: "devices in a virtual NIC",
        value: ndevs as i64,
        min: 1,
        max: all.len() as i64,
    }))?;
    if let Some(e) = repeated(devs, p.devs.len()) {
        return Err(Made::Error(e));
    }
    let v = VNic::new(devs, p.devs.len()).map_err(Made::Error)?;
    if !v.is_fused() {
        return Ok(c_int::from(v.devs()[0]));
    }
    let (_, fused, fused_name) = fuse_props(p, &v).map_err(Made::Refused)?;
    let mut t = table();
    if let Some(i) = t.iter().position(|e| e.vnic == v) {
        return Ok((p.devs.len() + i) as c_int);
    }
    if t.len() >= MAX_VNICS {
        return Err(Made::Error(Error::Full {
            what: "virtual NICs",
            cap: MAX_VNICS,
        }));
    }
    let name = CString::new(fused_name.clone()).unwrap_or_default();
    t.push(Entry {
        vnic: v,
        name: Box::leak(name.into_boxed_c_str()),
    });
    let d = p.devs.len() + t.len() - 1;
    ibnet_nccl::info!(
        ibnet_nccl::log::NET,
        "made virtual device [{d}] name={} speed={} ndevs={}",
        fused_name,
        fused.speed,
        v.ndevs()
    );
    Ok(d as c_int)
}

/// The first physical device (below `nphys`) that `devs` names twice, as the error saying so
/// and where. An index out of range is left to `VNic::new`, which names the range.
fn repeated(devs: &[c_int], nphys: usize) -> Option<Error> {
    let in_range = |d: c_int| usize::try_from(d).is_ok_and(|i| i < nphys);
    devs.iter().enumerate().find_map(|(again, &d)| {
        let first = devs[..again].iter().position(|&e| e == d)?;
        in_range(d).then_some(Error::Repeated {
            what: "physical device",
            list: "the virtual NIC's devs",
            value: i64::from(d),
            first,
            again,
        })
    })
}

/// Why [`make`] made nothing.
#[derive(Debug)]
pub enum Made {
    /// Bad arguments or a full table (one WARN).
    Error(Error),
    /// A fusion the rules refuse (`NCCL_IB_MERGE_NICS=0` is an INFO, as 2.28 logs it).
    Refused(merge::Refused),
}

/// The properties of the fused vNIC `v` (number `dev`): rail 0's, with the name, speed,
/// pointer kinds and `maxComms` of [`merge::fuse`] and `vProps` naming the rails.
pub fn props(p: &Plugin, v: &VNic) -> Result<Props, Error> {
    let (mut out, fused, _) = fuse_props(p, v).map_err(|r| r.to_error())?;
    let t = table();
    let name = t
        .iter()
        .find(|e| e.vnic == *v)
        .map(|e| e.name.as_ptr())
        .ok_or(Error::Missing {
            what: "virtual NIC",
        })?;
    out.name = name;
    out.speed = fused.speed;
    out.ptr_support = fused.ptr_support;
    out.max_comms = fused.max_comms;
    out.vprops = vprops(v);
    Ok(out)
}

/// `v` as NCCL's `ncclNetVDeviceProps_v12_t`.
pub fn vprops(v: &VNic) -> ncclNetVDeviceProps_v12_t {
    let mut out = ncclNetVDeviceProps_v12_t {
        ndevs: v.ndevs() as c_int,
        devs: [0; 8],
    };
    for (o, &d) in out.devs.iter_mut().zip(v.devs()) {
        *o = c_int::from(d);
    }
    out
}
