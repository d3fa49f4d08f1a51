//! `ncclNet_v8_t` (NCCL 2.19–2.23): `int` sizes on isend/irecv, `size_t` on regMr, properties
//! with `regIsGlobal`.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::ffi::{c_char, c_int, c_void};
use core::mem::size_of;

use super::types::*;
use super::{v11, v9};
use crate::api;

/// `ncclNetProperties_v8_t`.
#[repr(C)]
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

unsafe extern "C" fn get_properties(dev: c_int, props: *mut Props8) -> ncclResult_t {
    api::entry("getProperties", || {
        // SAFETY: valid or NULL (rejected).
        let o = unsafe { props.as_mut() }.ok_or(ibnet_core::Error::Missing { what: "props" })?;
        let p = api::properties(dev)?;
        *o = Props8 {
            name: p.name as *mut c_char,
            pci_path: p.pci_path as *mut c_char,
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: 1,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: NCCL_NET_DEVICE_HOST,
            net_device_version: NCCL_NET_DEVICE_INVALID_VERSION,
        };
        Ok(())
    })
}

/// The v8 function table.
#[repr(C)]
#[allow(missing_docs)]
pub struct NetV8 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t,
    pub devices: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    pub get_properties: unsafe extern "C" fn(c_int, *mut Props8) -> ncclResult_t,
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
        c_int,
        c_int,
        *mut c_void,
        *mut *mut c_void,
    ) -> ncclResult_t,
    pub irecv: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut c_int,
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
}
const _: () = assert!(size_of::<NetV8>() == 19 * 8);
// SAFETY: immutable table of a static string and function pointers.
unsafe impl Sync for NetV8 {}

pub(crate) unsafe extern "C" fn isend_int(
    c: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mh: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    if size < 0 {
        if !req.is_null() {
            // SAFETY: non-NULL request pointer from NCCL.
            unsafe { *req = core::ptr::null_mut() };
        }
        return api::entry("isend", || {
            Err(ibnet_core::Error::OutOfRange {
                what: "size",
                value: size as i64,
                min: 0,
                max: c_int::MAX as i64,
            })
        });
    }
    api::isend(c, data, size as u64, tag, mh, req)
}
pub(crate) unsafe extern "C" fn irecv_int(
    c: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    api::irecv(c, n, data, api::Sizes::Int(sizes), tags, mh, req)
}

/// The exported v8 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v8: NetV8 = NetV8 {
    name: c"IBNet".as_ptr(),
    init: v9::init,
    devices: v11::devices,
    get_properties,
    listen: v9::listen,
    connect: v9::connect,
    accept: v11::accept,
    reg_mr: v11::reg_mr,
    reg_mr_dma_buf: v11::reg_mr_dma_buf,
    dereg_mr: v11::dereg_mr,
    isend: isend_int,
    irecv: irecv_int,
    iflush: v11::iflush,
    test: v11::test,
    close_send: v11::close_send,
    close_recv: v11::close_recv,
    close_listen: v11::close_listen,
    get_device_mr: None,
    irecv_consumed: None,
};
