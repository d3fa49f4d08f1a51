//! Types shared by every ABI version: `ncclResult_t`, constants, the device handle, the v10/v11
//! comm config and net attributes (layouts from NCCL 2.28.9 `src/include/plugin/net/net_v*.h`).

use core::ffi::{c_int, c_void};
use core::mem::{offset_of, size_of};

/// `ncclResult_t`.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub enum ncclResult_t {
    Success = 0,
    UnhandledCudaError = 1,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6,
    InProgress = 7,
}

/// `NCCL_NET_HANDLE_MAXSIZE`.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// `NCCL_PTR_HOST`.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `NCCL_PTR_CUDA`.
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const NCCL_PTR_DMABUF: c_int = 0x4;
/// `NCCL_NET_MAX_DEVS_PER_NIC`.
pub const NCCL_NET_MAX_DEVS_PER_NIC: usize = 4;
/// `NCCL_NET_OPTIONAL_RECV_COMPLETION`: a value NCCL may preset in `*request` before `irecv`.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// `NCCL_MAX_NET_SIZE_BYTES` (1 TiB): the cap for `maxP2pBytes`/`maxCollBytes`.
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// `MAX_COLLNET_SIZE` (512 MiB): NCCL's IB plugin's `maxCollBytes`.
pub const MAX_COLLNET_SIZE: usize = 512 << 20;

/// `ncclNetDeviceType`: HOST = 0.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
/// `NCCL_NET_DEVICE_INVALID_VERSION`.
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;

/// `ncclNetDeviceHandle_v7_t` (v8–v11 are typedefs of it). ibnet never offloads, so it only
/// appears behind pointers.
#[repr(C)]
pub struct ncclNetDeviceHandle_t {
    /// `ncclNetDeviceType`.
    pub net_device_type: c_int,
    /// Version.
    pub net_device_version: c_int,
    /// Device-side handle.
    pub handle: *mut c_void,
    /// Size of `handle`.
    pub size: usize,
    /// Needs proxy progress.
    pub needs_proxy_progress: c_int,
}

/// `ncclNetVDeviceProps_v9_t` … `_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclNetVDeviceProps_t {
    /// Number of physical devices fused.
    pub ndevs: c_int,
    /// Their indices.
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC],
}

/// `ncclNetCommConfig_v10_t` / `_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetCommConfig_t {
    /// Traffic class, or `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
    pub traffic_class: c_int,
}

/// `ncclNetCommAttr_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct ncclNetCommAttr_t {
    pub max_concurrent_peers: i32,
    pub min_concurrent_peers: i32,
    pub max_flows_per_peer: i32,
    pub min_flows_per_peer: i32,
}

/// `ncclNetAttr_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct ncclNetAttr_t {
    pub send_comm_attr: ncclNetCommAttr_t,
    pub recv_comm_attr: ncclNetCommAttr_t,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

/// `ncclDebugLogger_t`.
#[allow(non_camel_case_types)]
pub type ncclDebugLogger_t = Option<crate::log::Logger>;
/// `ncclProfilerCallback_t` (unused by ibnet; kept opaque).
#[allow(non_camel_case_types)]
pub type ncclProfilerCallback_t = Option<unsafe extern "C" fn()>;

const _: () = assert!(size_of::<ncclNetDeviceHandle_t>() == 32);
const _: () = assert!(size_of::<ncclNetVDeviceProps_t>() == 20);
const _: () = assert!(size_of::<ncclNetCommConfig_t>() == 4);
const _: () = assert!(size_of::<ncclNetAttr_t>() == 44);
const _: () = assert!(offset_of!(ncclNetAttr_t, proto) == 40);
const _: () = assert!(size_of::<ncclResult_t>() == 4);
