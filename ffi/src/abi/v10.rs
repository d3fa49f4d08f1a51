//! `ncclNet_v10_t` (NCCL 2.26–2.27): `init(log, prof)`, the comm config passed to `connect`,
//! `phandle(s)` on isend/irecv. Properties as v9.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::ffi::{c_char, c_int, c_void};
use core::mem::size_of;

use super::types::*;
use super::v11;
use super::v9::Props9;
use crate::api;

/// The v10 function table.
#[repr(C)]
#[allow(missing_docs)]
pub struct NetV10 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ncclDebugLogger_t, ncclProfilerCallback_t) -> ncclResult_t,
    pub devices: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    pub get_properties: unsafe extern "C" fn(c_int, *mut Props9) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> ncclResult_t,
    pub connect: unsafe extern "C" fn(
        c_int,
        *mut ncclNetCommConfig_t,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut ncclNetDeviceHandle_t,
    ) -> ncclResult_t,
    pub accept: unsafe extern "C" fn(
        *mut c_void,
        *mut *mut c_void,
        *mut *mut ncclNetDeviceHandle_t,
    ) -> ncclResult_t,
    pub reg_mr: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        c_int,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub reg_mr_dma_buf: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        c_int,
        u64,
        c_int,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub dereg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void) -> ncclResult_t,
    pub isend: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        c_int,
        *mut c_void,
        *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub irecv: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut usize,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub iflush: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub test: unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> ncclResult_t,
    pub close_send: unsafe extern "C" fn(*mut c_void) -> ncclResult_t,
    pub close_recv: unsafe extern "C" fn(*mut c_void) -> ncclResult_t,
    pub close_listen: unsafe extern "C" fn(*mut c_void) -> ncclResult_t,
    pub get_device_mr:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> ncclResult_t>,
    pub irecv_consumed:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> ncclResult_t>,
    pub make_vdevice:
        Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_t) -> ncclResult_t>,
}
const _: () = assert!(size_of::<NetV10>() == 20 * 8);
// SAFETY: immutable table of a static string and function pointers.
unsafe impl Sync for NetV10 {}

unsafe extern "C" fn init(log: ncclDebugLogger_t, _prof: ncclProfilerCallback_t) -> ncclResult_t {
    api::init(None, NCCL_NET_TRAFFIC_CLASS_UNDEF, log)
}
unsafe extern "C" fn listen(dev: c_int, h: *mut c_void, l: *mut *mut c_void) -> ncclResult_t {
    api::listen(core::ptr::null_mut(), dev, h, l)
}
unsafe extern "C" fn connect(
    dev: c_int,
    cfg: *mut ncclNetCommConfig_t,
    h: *mut c_void,
    s: *mut *mut c_void,
    _d: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes a valid config or NULL.
    let tc = unsafe { cfg.as_ref() }.map_or(NCCL_NET_TRAFFIC_CLASS_UNDEF, |c| c.traffic_class);
    api::connect(core::ptr::null_mut(), dev, h, s, Some(tc))
}

/// The exported v10 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v10: NetV10 = NetV10 {
    name: c"IBNet".as_ptr(),
    init,
    devices: v11::devices,
    get_properties: super::v9::get_properties,
    listen,
    connect,
    accept: v11::accept,
    reg_mr: v11::reg_mr,
    reg_mr_dma_buf: v11::reg_mr_dma_buf,
    dereg_mr: v11::dereg_mr,
    isend: v11::isend,
    irecv: v11::irecv,
    iflush: v11::iflush,
    test: v11::test,
    close_send: v11::close_send,
    close_recv: v11::close_recv,
    close_listen: v11::close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
};
