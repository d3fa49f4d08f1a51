//! The plugin tables [`super::CNet`] drives, as NCCL lays them out, with every entry nullable
//! (a plugin leaving a required entry NULL is reported, never called): `ncclNet_v11_t`
//! (NCCL 2.28) and `ncclNet_v8_t` (NCCL 2.19–2.22, still exported by most plugins, ibnet's
//! included).

use core::ffi::{c_char, c_int, c_void};

use crate::abi::types::{
    ncclDebugLogger_t, ncclNetAttr_t, ncclNetCommConfig_t, ncclNetDeviceHandle_t,
    ncclNetVDeviceProps_t, ncclProfilerCallback_t, ncclResult_t,
};
use crate::abi::v11::Props11;
use crate::abi::v8::Props8;

/// Result of every entry.
pub type R = ncclResult_t;
/// An opaque plugin pointer.
pub type V = *mut c_void;

/// `ncclNet_v11_t` with every entry nullable (layout identical to NCCL's).
#[repr(C)]
#[allow(missing_docs)]
pub struct TableV11 {
    pub name: *const c_char,
    pub init: Option<
        unsafe extern "C" fn(
            *mut V,
            u64,
            *mut ncclNetCommConfig_t,
            ncclDebugLogger_t,
            ncclProfilerCallback_t,
        ) -> R,
    >,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> R>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut Props11) -> R>,
    pub listen: Option<unsafe extern "C" fn(V, c_int, V, *mut V) -> R>,
    pub connect:
        Option<unsafe extern "C" fn(V, c_int, V, *mut V, *mut *mut ncclNetDeviceHandle_t) -> R>,
    pub accept: Option<unsafe extern "C" fn(V, *mut V, *mut *mut ncclNetDeviceHandle_t) -> R>,
    pub reg_mr: Option<unsafe extern "C" fn(V, V, usize, c_int, *mut V) -> R>,
    pub reg_mr_dma_buf: Option<unsafe extern "C" fn(V, V, usize, c_int, u64, c_int, *mut V) -> R>,
    pub dereg_mr: Option<unsafe extern "C" fn(V, V) -> R>,
    pub isend: Option<unsafe extern "C" fn(V, V, usize, c_int, V, V, *mut V) -> R>,
    pub irecv: Option<
        unsafe extern "C" fn(V, c_int, *mut V, *mut usize, *mut c_int, *mut V, *mut V, *mut V) -> R,
    >,
    pub iflush: Option<unsafe extern "C" fn(V, c_int, *mut V, *mut c_int, *mut V, *mut V) -> R>,
    pub test: Option<unsafe extern "C" fn(V, *mut c_int, *mut c_int) -> R>,
    pub close_send: Option<unsafe extern "C" fn(V) -> R>,
    pub close_recv: Option<unsafe extern "C" fn(V) -> R>,
    pub close_listen: Option<unsafe extern "C" fn(V) -> R>,
    pub get_device_mr: Option<unsafe extern "C" fn(V, V, *mut V) -> R>,
    pub irecv_consumed: Option<unsafe extern "C" fn(V, c_int, V) -> R>,
    pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_t) -> R>,
    pub finalize: Option<unsafe extern "C" fn(V) -> R>,
    pub set_net_attr: Option<unsafe extern "C" fn(V, *mut ncclNetAttr_t) -> R>,
}
const _: () = assert!(core::mem::size_of::<TableV11>() == 22 * 8);

/// `ncclNet_v8_t` with every entry nullable (layout identical to NCCL's).
#[repr(C)]
#[allow(missing_docs)]
pub struct TableV8 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t) -> R>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> R>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut Props8) -> R>,
    pub listen: Option<unsafe extern "C" fn(c_int, V, *mut V) -> R>,
    pub connect:
        Option<unsafe extern "C" fn(c_int, V, *mut V, *mut *mut ncclNetDeviceHandle_t) -> R>,
    pub accept: Option<unsafe extern "C" fn(V, *mut V, *mut *mut ncclNetDeviceHandle_t) -> R>,
    pub reg_mr: Option<unsafe extern "C" fn(V, V, usize, c_int, *mut V) -> R>,
    pub reg_mr_dma_buf: Option<unsafe extern "C" fn(V, V, usize, c_int, u64, c_int, *mut V) -> R>,
    pub dereg_mr: Option<unsafe extern "C" fn(V, V) -> R>,
    pub isend: Option<unsafe extern "C" fn(V, V, c_int, c_int, V, *mut V) -> R>,
    pub irecv:
        Option<unsafe extern "C" fn(V, c_int, *mut V, *mut c_int, *mut c_int, *mut V, *mut V) -> R>,
    pub iflush: Option<unsafe extern "C" fn(V, c_int, *mut V, *mut c_int, *mut V, *mut V) -> R>,
    pub test: Option<unsafe extern "C" fn(V, *mut c_int, *mut c_int) -> R>,
    pub close_send: Option<unsafe extern "C" fn(V) -> R>,
    pub close_recv: Option<unsafe extern "C" fn(V) -> R>,
    pub close_listen: Option<unsafe extern "C" fn(V) -> R>,
    pub get_device_mr: Option<unsafe extern "C" fn(V, V, *mut V) -> R>,
    pub irecv_consumed: Option<unsafe extern "C" fn(V, c_int, V) -> R>,
}
const _: () = assert!(core::mem::size_of::<TableV8>() == 19 * 8);
