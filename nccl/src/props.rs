//! `ncclNetProperties_vN_t` for every ABI version, and [`Props`], the version-agnostic
//! properties both directions go through:
//!
//! ```text
//!  export (ffi's abi/):  plugin device ── Props ── PropsN::from_props(p, dev) ──▶ NCCL's struct
//!  import (foreign): plugin's struct ── PropsN::to_props() ── Props ──▶ ForeignNet / ibnet-perf
//! ```
//! v10's struct is v9's. Fields a version lacks read as their v12 meaning's neutral value
//! (`regIsGlobal`/`forceFlush` false, `railId`/`planeId` -1).

use core::ffi::{c_char, c_int};
use core::mem::{offset_of, size_of};

use super::types::{
    ncclNetVDeviceProps_t, ncclNetVDeviceProps_v12_t, MAX_COLLNET_SIZE, NCCL_NET_DEVICE_HOST,
    NCCL_NET_DEVICE_INVALID_VERSION, NCCL_NET_ID_UNDEF,
};

/// A device's properties, version-agnostic.
#[derive(Debug, Clone, Copy)]
pub struct Props {
    /// Device name (NUL-terminated, owned by the device or the foreign plugin).
    pub name: *const c_char,
    /// PCI path or NULL.
    pub pci_path: *const c_char,
    /// GUID.
    pub guid: u64,
    /// `NCCL_PTR_*` mask.
    pub ptr_support: i32,
    /// `regIsGlobal` (v8+): a registration serves every comm of the device.
    pub reg_is_global: bool,
    /// Mbps.
    pub speed: i32,
    /// Port.
    pub port: i32,
    /// µs.
    pub latency: f32,
    /// Max comms.
    pub max_comms: i32,
    /// Max receives per multi-receive.
    pub max_recvs: i32,
    /// Force a flush (v9+).
    pub force_flush: bool,
    /// The physical devices of a virtual NIC (v9+, up to 8 in v12); `ndevs` 0: the device
    /// itself.
    pub vprops: ncclNetVDeviceProps_v12_t,
    /// `railId` (v12; -1 unset): from the `NCCL_IB_HCA` entry that selected the device.
    pub rail: i16,
    /// `planeId` (v12; -1 unset): likewise.
    pub plane: i16,
}

/// `ncclNetProperties_v6_t`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct Props6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}
const _: () = assert!(size_of::<Props6>() == 48);

/// `ncclNetProperties_v7_t`: v6 and the device-offload type/version.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct Props7 {
    pub v6: Props6,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}
const _: () = assert!(size_of::<Props7>() == 56);

/// `ncclNetProperties_v8_t`: v7 with `regIsGlobal` after `ptrSupport`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct Props8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}
const _: () = assert!(size_of::<Props8>() == 64);

/// `ncclNetProperties_v9_t` (= v10): `forceFlush`, vNIC properties and max-bytes.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct Props9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub vprops: ncclNetVDeviceProps_t,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}
const _: () = assert!(size_of::<Props9>() == 104);
const _: () = assert!(offset_of!(Props9, vprops) == 64);
const _: () = assert!(offset_of!(Props9, max_coll_bytes) == 96);

/// `ncclNetProperties_v11_t`: v9 and `maxMultiRequestSize`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct Props11 {
    pub v9: Props9,
    pub max_multi_request_size: c_int,
}
const _: () = assert!(size_of::<Props11>() == 112);
const _: () = assert!(offset_of!(Props11, v9) + offset_of!(Props9, max_p2p_bytes) == 88);
const _: () = assert!(offset_of!(Props11, max_multi_request_size) == 104);

/// `ncclNetProperties_v12_t` (NCCL 2.30+): v11's fields with room for 8 devices in `vProps`
/// (so the sizes move), then `railId` and `planeId`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct Props12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub vprops: ncclNetVDeviceProps_v12_t,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}
// 2.30.7's net_v12.h: vProps 36 B at 64, maxP2pBytes at 104, railId at 124, size 128.
const _: () = assert!(size_of::<Props12>() == 128);
const _: () = assert!(offset_of!(Props12, vprops) == 64);
const _: () = assert!(offset_of!(Props12, max_p2p_bytes) == 104);
const _: () = assert!(offset_of!(Props12, max_coll_bytes) == 112);
const _: () = assert!(offset_of!(Props12, max_multi_request_size) == 120);
const _: () = assert!(offset_of!(Props12, rail_id) == 124);
const _: () = assert!(offset_of!(Props12, plane_id) == 126);

/// The vNIC list a device reports: its fused devices, or itself alone.
fn vprops(p: &Props, dev: c_int) -> ncclNetVDeviceProps_v12_t {
    if p.vprops.ndevs > 0 {
        return p.vprops;
    }
    let mut devs = [0; 8];
    devs[0] = dev;
    ncclNetVDeviceProps_v12_t { ndevs: 1, devs }
}

/// Converting one version's struct from and to [`Props`].
pub trait VersionProps: Copy {
    /// NCCL's struct for device `dev` with properties `p` (what ibnet exports).
    fn from_props(p: &Props, dev: c_int) -> Self;
    /// The version-agnostic view of a struct a plugin filled in.
    fn to_props(&self) -> Props;
}

/// `Props` → a struct literal with the fields every version has, plus `$extra`.
macro_rules! out {
    ($p:expr, { $($extra:tt)* }) => {
        Self {
            name: $p.name as *mut c_char,
            pci_path: $p.pci_path as *mut c_char,
            guid: $p.guid,
            ptr_support: $p.ptr_support,
            speed: $p.speed,
            port: $p.port,
            latency: $p.latency,
            max_comms: $p.max_comms,
            max_recvs: $p.max_recvs,
            $($extra)*
        }
    };
}

/// A struct with the fields every version has → `Props` (with `regIsGlobal`, `forceFlush`).
macro_rules! back {
    ($s:expr, $reg:expr, $flush:expr) => {
        back!($s, $reg, $flush, ncclNetVDeviceProps_v12_t::default())
    };
    ($s:expr, $reg:expr, $flush:expr, $vprops:expr) => {
        Props {
            name: $s.name,
            pci_path: $s.pci_path,
            guid: $s.guid,
            ptr_support: $s.ptr_support,
            reg_is_global: $reg,
            speed: $s.speed,
            port: $s.port,
            latency: $s.latency,
            max_comms: $s.max_comms,
            max_recvs: $s.max_recvs,
            force_flush: $flush,
            vprops: $vprops,
            rail: NCCL_NET_ID_UNDEF,
            plane: NCCL_NET_ID_UNDEF,
        }
    };
}

impl VersionProps for Props6 {
    fn from_props(p: &Props, _dev: c_int) -> Self {
        out!(p, {})
    }
    fn to_props(&self) -> Props {
        back!(self, false, false)
    }
}

impl VersionProps for Props7 {
    fn from_props(p: &Props, dev: c_int) -> Self {
        Self {
            v6: Props6::from_props(p, dev),
            net_device_type: NCCL_NET_DEVICE_HOST,
            net_device_version: NCCL_NET_DEVICE_INVALID_VERSION,
        }
    }
    fn to_props(&self) -> Props {
        self.v6.to_props()
    }
}

impl VersionProps for Props8 {
    fn from_props(p: &Props, _dev: c_int) -> Self {
        out!(p, {
            reg_is_global: p.reg_is_global as c_int,
            net_device_type: NCCL_NET_DEVICE_HOST,
            net_device_version: NCCL_NET_DEVICE_INVALID_VERSION,
        })
    }
    fn to_props(&self) -> Props {
        back!(self, self.reg_is_global != 0, false)
    }
}

impl VersionProps for Props9 {
    fn from_props(p: &Props, dev: c_int) -> Self {
        out!(p, {
            reg_is_global: p.reg_is_global as c_int,
            force_flush: p.force_flush as c_int,
            net_device_type: NCCL_NET_DEVICE_HOST,
            net_device_version: NCCL_NET_DEVICE_INVALID_VERSION,
            vprops: vprops(p, dev).resize(),
            // The most one isend moves and `test` can report (the core's MAX_MSG_SIZE, 2 GiB
            // − 128: `test`'s sizes are `int`): NCCL splits larger transfers to this size.
            max_p2p_bytes: ibnet_core::comm::MAX_MSG_SIZE as usize,
            max_coll_bytes: MAX_COLLNET_SIZE,
        })
    }
    fn to_props(&self) -> Props {
        back!(
            self,
            self.reg_is_global != 0,
            self.force_flush != 0,
            self.vprops.resize()
        )
    }
}

impl VersionProps for Props11 {
    fn from_props(p: &Props, dev: c_int) -> Self {
        Self {
            v9: Props9::from_props(p, dev),
            max_multi_request_size: 1,
        }
    }
    fn to_props(&self) -> Props {
        self.v9.to_props()
    }
}

impl VersionProps for Props12 {
    fn from_props(p: &Props, dev: c_int) -> Self {
        let v9 = Props9::from_props(p, dev);
        Self {
            name: v9.name,
            pci_path: v9.pci_path,
            guid: v9.guid,
            ptr_support: v9.ptr_support,
            reg_is_global: v9.reg_is_global,
            force_flush: v9.force_flush,
            speed: v9.speed,
            port: v9.port,
            latency: v9.latency,
            max_comms: v9.max_comms,
            max_recvs: v9.max_recvs,
            net_device_type: v9.net_device_type,
            net_device_version: v9.net_device_version,
            vprops: vprops(p, dev),
            max_p2p_bytes: v9.max_p2p_bytes,
            max_coll_bytes: v9.max_coll_bytes,
            max_multi_request_size: 1,
            rail_id: p.rail,
            plane_id: p.plane,
        }
    }
    fn to_props(&self) -> Props {
        Props {
            rail: self.rail_id,
            plane: self.plane_id,
            ..back!(
                self,
                self.reg_is_global != 0,
                self.force_flush != 0,
                self.vprops
            )
        }
    }
}
