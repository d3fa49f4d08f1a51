//! `ncclNet_v9_t` (NCCL 2.24–2.25): `size_t` sizes on isend/irecv, vProps and max-bytes
//! properties, `makeVDevice`.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

use super::types::*;
use super::v11::{self, fill_v9};
use crate::api;

/// `ncclNetProperties_v9_t` (= v10).
#[repr(C)]
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
const _: () = assert!(offset_of!(Props9, max_coll_bytes) == 96);

pub(crate) unsafe extern "C" fn get_properties(dev: c_int, props: *mut Props9) -> ncclResult_t {
    api::entry("getProperties", || {
        // SAFETY: valid or NULL (rejected).
        let out = unsafe { props.as_mut() }.ok_or(ibnet_core::Error::Missing { what: "props" })?;
        let p = api::properties(dev)?;
        fill_v9!(out, p, dev);
        Ok(())
    })
}

/// The v9 function table.
#[repr(C)]
#[allow(missing_docs)]
pub struct NetV9 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t,
    pub devices: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    pub get_properties: unsafe extern "C" fn(c_int, *mut Props9) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> ncclResult_t,
    pub connect: unsafe extern "C" fn(
        c_int,
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
const _: () = assert!(size_of::<NetV9>() == 20 * 8);
// SAFETY: immutable table of a static string and function pointers.
unsafe impl Sync for NetV9 {}

pub(crate) unsafe extern "C" fn init(log: ncclDebugLogger_t) -> ncclResult_t {
    api::init(None, NCCL_NET_TRAFFIC_CLASS_UNDEF, log)
}
pub(crate) unsafe extern "C" fn listen(
    dev: c_int,
    h: *mut c_void,
    l: *mut *mut c_void,
) -> ncclResult_t {
    api::listen(core::ptr::null_mut(), dev, h, l)
}
pub(crate) unsafe extern "C" fn connect(
    dev: c_int,
    h: *mut c_void,
    s: *mut *mut c_void,
    _d: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    api::connect(
        core::ptr::null_mut(),
        dev,
        h,
        s,
        Some(NCCL_NET_TRAFFIC_CLASS_UNDEF),
    )
}
unsafe extern "C" fn isend(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    api::isend(c, data, size as u64, tag, mh, req)
}
unsafe extern "C" fn irecv(
    c: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    api::irecv(c, n, data, api::Sizes::Size(sizes), tags, mh, req)
}

/// The exported v9 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v9: NetV9 = NetV9 {
    name: c"IBNet".as_ptr(),
    init,
    devices: v11::devices,
    get_properties,
    listen,
    connect,
    accept: v11::accept,
    reg_mr: v11::reg_mr,
    reg_mr_dma_buf: v11::reg_mr_dma_buf,
    dereg_mr: v11::dereg_mr,
    isend,
    irecv,
    iflush: v11::iflush,
    test: v11::test,
    close_send: v11::close_send,
    close_recv: v11::close_recv,
    close_listen: v11::close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
};
