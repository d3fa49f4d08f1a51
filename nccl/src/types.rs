//! Types shared by every ABI version: `ncclResult_t`, constants, the device handle, the v10/v11
//! comm config and net attributes, the logger (layouts from NCCL 2.28.9 and 2.30.7
//! `src/include/plugin/net/net_v*.h`).

use core::ffi::{c_char, c_int, c_ulong, c_void};
use core::mem::{offset_of, size_of};

/// `ncclResult_t`: a C `int`, not a Rust enum, because a foreign plugin's table returns it and
/// may return any value (an out-of-range value read into a Rust enum would be undefined
/// behaviour). The named values are associated constants, usable in patterns.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct ncclResult_t(pub c_int);

#[allow(non_upper_case_globals)]
impl ncclResult_t {
    /// `ncclSuccess`.
    pub const Success: Self = Self(0);
    /// `ncclUnhandledCudaError`.
    pub const UnhandledCudaError: Self = Self(1);
    /// `ncclSystemError`.
    pub const SystemError: Self = Self(2);
    /// `ncclInternalError`.
    pub const InternalError: Self = Self(3);
    /// `ncclInvalidArgument`.
    pub const InvalidArgument: Self = Self(4);
    /// `ncclInvalidUsage`.
    pub const InvalidUsage: Self = Self(5);
    /// `ncclRemoteError`.
    pub const RemoteError: Self = Self(6);
    /// `ncclInProgress`.
    pub const InProgress: Self = Self(7);

    /// NCCL's name for the value (`ncclSuccess`, …; `unknown ncclResult_t` for any other).
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "ncclSuccess",
            1 => "ncclUnhandledCudaError",
            2 => "ncclSystemError",
            3 => "ncclInternalError",
            4 => "ncclInvalidArgument",
            5 => "ncclInvalidUsage",
            6 => "ncclRemoteError",
            7 => "ncclInProgress",
            _ => "unknown ncclResult_t",
        }
    }
}

impl core::fmt::Debug for ncclResult_t {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// `NCCL_NET_HANDLE_MAXSIZE`.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// `NCCL_PTR_HOST`.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `NCCL_PTR_CUDA`.
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const NCCL_PTR_DMABUF: c_int = 0x4;
/// `NCCL_NET_MAX_DEVS_PER_NIC` of v9–v11 (`NCCL_NET_MAX_DEVS_PER_NIC_V11`).
pub const NCCL_NET_MAX_DEVS_PER_NIC: usize = 4;
/// `NCCL_NET_MAX_DEVS_PER_NIC_V12` (NCCL 2.30+).
pub const NCCL_NET_MAX_DEVS_PER_NIC_V12: usize = 8;
/// `NCCL_NET_ID_UNDEF`: v12's `railId`/`planeId` when not set.
pub const NCCL_NET_ID_UNDEF: i16 = -1;
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

/// `ncclNetVDeviceProps_vN_t` with room for `N` devices: 4 in v9–v11, 8 in v12.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevProps<const N: usize> {
    /// Number of physical devices fused.
    pub ndevs: c_int,
    /// Their indices.
    pub devs: [c_int; N],
}

impl<const N: usize> Default for VDevProps<N> {
    fn default() -> Self {
        Self {
            ndevs: 0,
            devs: [0; N],
        }
    }
}

impl<const N: usize> VDevProps<N> {
    /// The same list in a struct of `M` devices; past `M`, devices are dropped and `ndevs`
    /// is cut to `M` (only a v12 vNIC of more than 4 devices read through v9–v11, which
    /// NCCL never does: one process loads one table).
    pub fn resize<const M: usize>(&self) -> VDevProps<M> {
        let mut out = VDevProps::<M>::default();
        let n = usize::try_from(self.ndevs).unwrap_or(0).min(N).min(M);
        out.devs[..n].copy_from_slice(&self.devs[..n]);
        out.ndevs = n as c_int;
        out
    }
}

/// `ncclNetVDeviceProps_v9_t` … `_v11_t`.
#[allow(non_camel_case_types)]
pub type ncclNetVDeviceProps_t = VDevProps<NCCL_NET_MAX_DEVS_PER_NIC>;
/// `ncclNetVDeviceProps_v12_t`.
#[allow(non_camel_case_types)]
pub type ncclNetVDeviceProps_v12_t = VDevProps<NCCL_NET_MAX_DEVS_PER_NIC_V12>;

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

/// The function behind `ncclDebugLogger_t`: `void (*)(ncclDebugLogLevel, unsigned long flags,
/// const char* file, int line, const char* fmt, ...)`.
pub type DebugLogFn = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);
/// `ncclDebugLogger_t`.
#[allow(non_camel_case_types)]
pub type ncclDebugLogger_t = Option<DebugLogFn>;
/// The profiler callback NCCL passes to `init` (v10/v11):
/// `(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData)`.
pub type ProfilerFn = unsafe extern "C" fn(
    e_handle: *mut *mut c_void,
    kind: c_int,
    p_handle: *mut c_void,
    plugin_id: i64,
    ext_data: *mut c_void,
) -> ncclResult_t;
/// `ncclProfilerCallback_t` (ibnet-ffi's `profiler` module).
#[allow(non_camel_case_types)]
pub type ncclProfilerCallback_t = Option<ProfilerFn>;

const _: () = assert!(size_of::<ncclNetDeviceHandle_t>() == 32);
const _: () = assert!(size_of::<ncclNetVDeviceProps_t>() == 20);
const _: () = assert!(size_of::<ncclNetVDeviceProps_v12_t>() == 36);
const _: () = assert!(size_of::<ncclNetCommConfig_t>() == 4);
const _: () = assert!(size_of::<ncclNetAttr_t>() == 44);
const _: () = assert!(offset_of!(ncclNetAttr_t, proto) == 40);
const _: () = assert!(size_of::<ncclResult_t>() == 4);
