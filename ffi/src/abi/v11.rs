//! `ncclNet_v11_t` (NCCL 2.28): per-communicator `init(ctx, commId, config)`, `finalize`,
//! `setNetAttr`, `maxMultiRequestSize`. NCCL reads this table in place.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

use super::types::*;
use crate::api;

/// `ncclNetProperties_v11_t`.
#[repr(C)]
#[allow(missing_docs)]
pub struct Props11 {
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
    pub max_multi_request_size: c_int,
}
const _: () = assert!(size_of::<Props11>() == 112);
const _: () = assert!(offset_of!(Props11, vprops) == 64);
const _: () = assert!(offset_of!(Props11, max_p2p_bytes) == 88);
const _: () = assert!(offset_of!(Props11, max_multi_request_size) == 104);

/// Fills the v9–v11 property fields shared by all three.
macro_rules! fill_v9 {
    ($out:expr, $p:expr, $dev:expr) => {{
        $out.name = $p.name as *mut c_char;
        $out.pci_path = $p.pci_path as *mut c_char;
        $out.guid = $p.guid;
        $out.ptr_support = $p.ptr_support;
        $out.reg_is_global = 1;
        $out.force_flush = $p.force_flush as c_int;
        $out.speed = $p.speed;
        $out.port = $p.port;
        $out.latency = $p.latency;
        $out.max_comms = $p.max_comms;
        $out.max_recvs = $p.max_recvs;
        $out.net_device_type = NCCL_NET_DEVICE_HOST;
        $out.net_device_version = NCCL_NET_DEVICE_INVALID_VERSION;
        $out.vprops = ncclNetVDeviceProps_t {
            ndevs: 1,
            devs: [$dev, 0, 0, 0],
        };
        // One isend is one RDMA write of at most 1 GiB (the core's MAX_MSG_SIZE, NCCL's
        // MAX_NET_SIZE): NCCL splits larger point-to-point transfers to this size.
        $out.max_p2p_bytes = ibnet_core::comm::MAX_MSG_SIZE as usize;
        $out.max_coll_bytes = MAX_COLLNET_SIZE;
    }};
}
pub(crate) use fill_v9;

/// The v11 function table.
#[repr(C)]
#[allow(missing_docs)]
pub struct NetV11 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(
        *mut *mut c_void,
        u64,
        *mut ncclNetCommConfig_t,
        ncclDebugLogger_t,
        ncclProfilerCallback_t,
    ) -> ncclResult_t,
    pub devices: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    pub get_properties: unsafe extern "C" fn(c_int, *mut Props11) -> ncclResult_t,
    pub listen:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut *mut c_void) -> ncclResult_t,
    pub connect: unsafe extern "C" fn(
        *mut c_void,
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
    pub finalize: unsafe extern "C" fn(*mut c_void) -> ncclResult_t,
    pub set_net_attr: unsafe extern "C" fn(*mut c_void, *mut ncclNetAttr_t) -> ncclResult_t,
}
const _: () = assert!(size_of::<NetV11>() == 22 * 8);
// SAFETY: the table is immutable and holds a static string and function pointers.
unsafe impl Sync for NetV11 {}

unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    _comm_id: u64,
    cfg: *mut ncclNetCommConfig_t,
    log: ncclDebugLogger_t,
    _prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes a valid config or NULL.
    let tc = unsafe { cfg.as_ref() }.map_or(NCCL_NET_TRAFFIC_CLASS_UNDEF, |c| c.traffic_class);
    api::init(Some(ctx), tc, log)
}
unsafe extern "C" fn get_properties(dev: c_int, props: *mut Props11) -> ncclResult_t {
    api::entry("getProperties", || {
        // SAFETY: valid or NULL (rejected).
        let out = unsafe { props.as_mut() }.ok_or(ibnet_core::Error::Missing { what: "props" })?;
        let p = api::properties(dev)?;
        fill_v9!(out, p, dev);
        out.max_multi_request_size = 1;
        Ok(())
    })
}
pub(crate) unsafe extern "C" fn listen(
    ctx: *mut c_void,
    dev: c_int,
    h: *mut c_void,
    l: *mut *mut c_void,
) -> ncclResult_t {
    api::listen(ctx, dev, h, l)
}
unsafe extern "C" fn connect(
    ctx: *mut c_void,
    dev: c_int,
    h: *mut c_void,
    s: *mut *mut c_void,
    _d: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    api::connect(ctx, dev, h, s, None)
}
pub(crate) unsafe extern "C" fn accept(
    l: *mut c_void,
    r: *mut *mut c_void,
    _d: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    api::accept(l, r)
}
pub(crate) unsafe extern "C" fn reg_mr(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    mh: *mut *mut c_void,
) -> ncclResult_t {
    api::reg_mr(c, data, size as u64, ty, None, mh)
}
pub(crate) unsafe extern "C" fn reg_mr_dma_buf(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    off: u64,
    fd: c_int,
    mh: *mut *mut c_void,
) -> ncclResult_t {
    api::reg_mr(c, data, size as u64, ty, Some((off, fd)), mh)
}
pub(crate) unsafe extern "C" fn dereg_mr(c: *mut c_void, mh: *mut c_void) -> ncclResult_t {
    api::dereg_mr(c, mh)
}
pub(crate) unsafe extern "C" fn isend(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    _ph: *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    api::isend(c, data, size as u64, tag, mh, req)
}
pub(crate) unsafe extern "C" fn irecv(
    c: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut *mut c_void,
    _ph: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    api::irecv(c, n, data, api::Sizes::Size(sizes), tags, mh, req)
}
pub(crate) unsafe extern "C" fn iflush(
    c: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mh: *mut *mut c_void,
    req: *mut *mut c_void,
) -> ncclResult_t {
    api::iflush(c, n, data, sizes, mh, req)
}
pub(crate) unsafe extern "C" fn test(
    r: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> ncclResult_t {
    api::test(r, done, sizes)
}
pub(crate) unsafe extern "C" fn close_send(c: *mut c_void) -> ncclResult_t {
    api::close_send(c)
}
pub(crate) unsafe extern "C" fn close_recv(c: *mut c_void) -> ncclResult_t {
    api::close_recv(c)
}
pub(crate) unsafe extern "C" fn close_listen(c: *mut c_void) -> ncclResult_t {
    api::close_listen(c)
}
pub(crate) unsafe extern "C" fn devices(n: *mut c_int) -> ncclResult_t {
    api::devices(n)
}
unsafe extern "C" fn finalize(ctx: *mut c_void) -> ncclResult_t {
    api::finalize(ctx)
}
unsafe extern "C" fn set_net_attr(ctx: *mut c_void, a: *mut ncclNetAttr_t) -> ncclResult_t {
    api::set_net_attr(ctx, a)
}

/// The exported v11 table.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v11: NetV11 = NetV11 {
    name: c"IBNet".as_ptr(),
    init,
    devices,
    get_properties,
    listen,
    connect,
    accept,
    reg_mr,
    reg_mr_dma_buf,
    dereg_mr,
    isend,
    irecv,
    iflush,
    test,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    // NULL: ibnet does not fuse NICs; NCCL then uses each physical device as its own NIC.
    make_vdevice: None,
    finalize,
    set_net_attr,
};
