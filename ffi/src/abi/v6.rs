//! `ncclNet_v6_t` (NCCL 2.12–2.13): no device handles, no getDeviceMr/irecvConsumed.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::ffi::{c_char, c_int, c_void};
use core::mem::size_of;

use super::types::*;
use super::{v11, v7, v8, v9};
use crate::api;

/// `ncclNetProperties_v6_t`.
#[repr(C)]
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

unsafe extern "C" fn get_properties(dev: c_int, props: *mut Props6) -> ncclResult_t {
    api::entry("getProperties", || {
        // SAFETY: valid or NULL (rejected).
        let o = unsafe { props.as_mut() }.ok_or(ibnet_core::Error::Missing { what: "props" })?;
        let p = api::properties(dev)?;
        *o = Props6 {
            name: p.name as *mut c_char,
            pci_path: p.pci_path as *mut c_char,
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
        };
        Ok(())
    })
}

unsafe extern "C" fn connect(dev: c_int, h: *mut c_void, s: *mut *mut c_void) -> ncclResult_t {
    api::connect(
        core::ptr::null_mut(),
        dev,
        h,
        s,
        Some(NCCL_NET_TRAFFIC_CLASS_UNDEF),
    )
}
unsafe extern "C" fn accept(l: *mut c_void, r: *mut *mut c_void) -> ncclResult_t {
    api::accept(l, r)
}

/// The v6 function table.
#[repr(C)]
#[allow(missing_docs)]
pub struct NetV6 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ncclDebugLogger_t) -> ncclResult_t,
    pub devices: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    pub get_properties: unsafe extern "C" fn(c_int, *mut Props6) -> ncclResult_t,
    pub listen: unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> ncclResult_t,
    pub connect: unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> ncclResult_t,
    pub accept: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> ncclResult_t,
    pub reg_mr: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        c_int,
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
}
const _: () = assert!(size_of::<NetV6>() == 17 * 8);
// SAFETY: immutable table of a static string and function pointers.
unsafe impl Sync for NetV6 {}

/// The exported v6 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v6: NetV6 = NetV6 {
    name: c"IBNet".as_ptr(),
    init: v9::init,
    devices: v11::devices,
    get_properties,
    listen: v9::listen,
    connect,
    accept,
    reg_mr: v7::reg_mr_int,
    reg_mr_dma_buf: v11::reg_mr_dma_buf,
    dereg_mr: v11::dereg_mr,
    isend: v8::isend_int,
    irecv: v8::irecv_int,
    iflush: v11::iflush,
    test: v11::test,
    close_send: v11::close_send,
    close_recv: v11::close_recv,
    close_listen: v11::close_listen,
};
