//! The C entry points of the exported tables, one per distinct signature. Each only adapts
//! its version's arguments and calls [`crate::api`] (which checks every pointer, catches
//! panics and maps errors); names say which versions use them (`_int`: v6–v8 `int` sizes,
//! `_size`: v9 `size_t`, `_ph`: v10–v12 with profiler handles, `_dev`: v6–v10 without ctx,
//! `_v11`: v11 and v12).
#![allow(unsafe_code)] // C entry points (`unsafe extern "C"`); every block has a SAFETY comment.

use core::ffi::{c_int, c_void};

use crate::api;
use ibnet_nccl::props::VersionProps;
use ibnet_nccl::types::*;

type V = *mut c_void;
type PV = *mut *mut c_void;
type DevH = *mut *mut ncclNetDeviceHandle_t;

/// `init(logger)` (v6–v9).
pub(crate) unsafe extern "C" fn init_log(log: ncclDebugLogger_t) -> ncclResult_t {
    api::init(None, NCCL_NET_TRAFFIC_CLASS_UNDEF, log, None)
}
/// `init(logger, profiler)` (v10).
pub(crate) unsafe extern "C" fn init_log_prof(
    log: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    api::init(None, NCCL_NET_TRAFFIC_CLASS_UNDEF, log, prof)
}
/// `init(ctx, commId, config, logger, profiler)` (v11).
pub(crate) unsafe extern "C" fn init_v11(
    ctx: PV,
    _comm_id: u64,
    cfg: *mut ncclNetCommConfig_t,
    log: ncclDebugLogger_t,
    prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes a valid config or NULL.
    let tc = unsafe { cfg.as_ref() }.map_or(NCCL_NET_TRAFFIC_CLASS_UNDEF, |c| c.traffic_class);
    api::init(Some(ctx), tc, log, prof)
}
/// `finalize(ctx)` (v11).
pub(crate) unsafe extern "C" fn finalize(ctx: V) -> ncclResult_t {
    api::finalize(ctx)
}
/// `setNetAttr` (v11).
pub(crate) unsafe extern "C" fn set_net_attr(ctx: V, a: *mut ncclNetAttr_t) -> ncclResult_t {
    api::set_net_attr(ctx, a)
}
/// `makeVDevice` over a struct of `N` devices (v9–v11: 4, v12: 8): the device number of a
/// fused NIC (`api::make_vdevice`).
pub(crate) unsafe extern "C" fn make_vdevice<const N: usize>(
    d: *mut c_int,
    props: *mut VDevProps<N>,
) -> ncclResult_t {
    api::make_vdevice(d, props)
}

/// `devices`.
pub(crate) unsafe extern "C" fn devices(n: *mut c_int) -> ncclResult_t {
    api::devices(n)
}
/// `getProperties` into version `P`'s struct.
pub(crate) unsafe extern "C" fn get_properties<P: VersionProps>(
    dev: c_int,
    props: *mut P,
) -> ncclResult_t {
    api::entry("getProperties", || {
        // SAFETY: valid or NULL (rejected).
        let out = unsafe { props.as_mut() }.ok_or(ibnet_core::Error::Missing { what: "props" })?;
        *out = P::from_props(&api::properties(dev)?, dev);
        Ok(())
    })
}

/// `listen(dev, …)` (v6–v10).
pub(crate) unsafe extern "C" fn listen_dev(dev: c_int, h: V, l: PV) -> ncclResult_t {
    api::listen(core::ptr::null_mut(), dev, h, l)
}
/// `listen(ctx, dev, …)` (v11).
pub(crate) unsafe extern "C" fn listen_v11(ctx: V, dev: c_int, h: V, l: PV) -> ncclResult_t {
    api::listen(ctx, dev, h, l)
}
/// `connect` without a device handle (v6).
pub(crate) unsafe extern "C" fn connect_v6(dev: c_int, h: V, s: PV) -> ncclResult_t {
    // SAFETY: the same arguments; the device-handle out-pointer is unused.
    unsafe { connect_dev(dev, h, s, core::ptr::null_mut()) }
}
/// `connect(dev, …, devHandle)` (v7–v9).
pub(crate) unsafe extern "C" fn connect_dev(dev: c_int, h: V, s: PV, _d: DevH) -> ncclResult_t {
    api::connect(
        core::ptr::null_mut(),
        dev,
        h,
        s,
        Some(NCCL_NET_TRAFFIC_CLASS_UNDEF),
    )
}
/// `connect(dev, config, …)` (v10).
pub(crate) unsafe extern "C" fn connect_v10(
    dev: c_int,
    cfg: *mut ncclNetCommConfig_t,
    h: V,
    s: PV,
    _d: DevH,
) -> ncclResult_t {
    // SAFETY: NCCL passes a valid config or NULL.
    let tc = unsafe { cfg.as_ref() }.map_or(NCCL_NET_TRAFFIC_CLASS_UNDEF, |c| c.traffic_class);
    api::connect(core::ptr::null_mut(), dev, h, s, Some(tc))
}
/// `connect(ctx, dev, …)` (v11): the traffic class comes from the ctx.
pub(crate) unsafe extern "C" fn connect_v11(
    ctx: V,
    dev: c_int,
    h: V,
    s: PV,
    _d: DevH,
) -> ncclResult_t {
    api::connect(ctx, dev, h, s, None)
}
/// `accept` without a device handle (v6).
pub(crate) unsafe extern "C" fn accept_v6(l: V, r: PV) -> ncclResult_t {
    api::accept(l, r)
}
/// `accept` (v7+).
pub(crate) unsafe extern "C" fn accept(l: V, r: PV, _d: DevH) -> ncclResult_t {
    api::accept(l, r)
}
/// `closeListen`.
pub(crate) unsafe extern "C" fn close_listen(c: V) -> ncclResult_t {
    api::close_listen(c)
}

/// A negative `int` size (v6–v8): an `OutOfRange` error through `entry`'s WARN.
fn negative_size(call: &str, size: c_int) -> ncclResult_t {
    api::entry(call, || {
        Err(ibnet_core::Error::OutOfRange {
            what: "size",
            value: size as i64,
            min: 0,
            max: c_int::MAX as i64,
        })
    })
}

/// `regMr` with an `int` size (v6, v7).
pub(crate) unsafe extern "C" fn reg_mr_int(
    c: V,
    data: V,
    size: c_int,
    ty: c_int,
    mh: PV,
) -> ncclResult_t {
    if size < 0 {
        return negative_size("regMr", size);
    }
    api::reg_mr(c, data, size as u64, ty, None, mh)
}
/// `regMr` (v8+).
pub(crate) unsafe extern "C" fn reg_mr(
    c: V,
    data: V,
    size: usize,
    ty: c_int,
    mh: PV,
) -> ncclResult_t {
    api::reg_mr(c, data, size as u64, ty, None, mh)
}
/// `regMrDmaBuf`.
pub(crate) unsafe extern "C" fn reg_mr_dma_buf(
    c: V,
    data: V,
    size: usize,
    ty: c_int,
    off: u64,
    fd: c_int,
    mh: PV,
) -> ncclResult_t {
    api::reg_mr(c, data, size as u64, ty, Some((off, fd)), mh)
}
/// `deregMr`.
pub(crate) unsafe extern "C" fn dereg_mr(c: V, mh: V) -> ncclResult_t {
    api::dereg_mr(c, mh)
}

/// `isend` with an `int` size (v6–v8).
pub(crate) unsafe extern "C" fn isend_int(
    c: V,
    data: V,
    size: c_int,
    tag: c_int,
    mh: V,
    req: PV,
) -> ncclResult_t {
    if size < 0 {
        if !req.is_null() {
            // SAFETY: non-NULL request pointer from NCCL.
            unsafe { *req = core::ptr::null_mut() };
        }
        return negative_size("isend", size);
    }
    api::isend(c, data, size as u64, tag, mh, core::ptr::null_mut(), req)
}
/// `isend` with a `size_t` size (v9).
pub(crate) unsafe extern "C" fn isend_size(
    c: V,
    data: V,
    size: usize,
    tag: c_int,
    mh: V,
    req: PV,
) -> ncclResult_t {
    api::isend(c, data, size as u64, tag, mh, core::ptr::null_mut(), req)
}
/// `isend` with a profiler handle (v10, v11).
pub(crate) unsafe extern "C" fn isend_ph(
    c: V,
    data: V,
    size: usize,
    tag: c_int,
    mh: V,
    ph: V,
    req: PV,
) -> ncclResult_t {
    api::isend(c, data, size as u64, tag, mh, ph, req)
}
/// `irecv` with `int` sizes (v6–v8).
pub(crate) unsafe extern "C" fn irecv_int(
    c: V,
    n: c_int,
    data: PV,
    sizes: *mut c_int,
    tags: *mut c_int,
    mh: PV,
    req: PV,
) -> ncclResult_t {
    api::irecv(
        c,
        n,
        data,
        api::Sizes::Int(sizes),
        tags,
        mh,
        core::ptr::null_mut(),
        req,
    )
}
/// `irecv` with `size_t` sizes (v9).
pub(crate) unsafe extern "C" fn irecv_size(
    c: V,
    n: c_int,
    data: PV,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: PV,
    req: PV,
) -> ncclResult_t {
    let none = core::ptr::null_mut();
    api::irecv(c, n, data, api::Sizes::Size(sizes), tags, mh, none, req)
}
/// `irecv` with profiler handles (v10, v11).
#[allow(clippy::too_many_arguments)] // the C signature
pub(crate) unsafe extern "C" fn irecv_ph(
    c: V,
    n: c_int,
    data: PV,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: PV,
    ph: PV,
    req: PV,
) -> ncclResult_t {
    api::irecv(c, n, data, api::Sizes::Size(sizes), tags, mh, ph, req)
}
/// `iflush`.
pub(crate) unsafe extern "C" fn iflush(
    c: V,
    n: c_int,
    data: PV,
    sizes: *mut c_int,
    mh: PV,
    req: PV,
) -> ncclResult_t {
    api::iflush(c, n, data, sizes, mh, req)
}
/// `test`.
pub(crate) unsafe extern "C" fn test(r: V, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t {
    api::test(r, done, sizes)
}
/// `closeSend`.
pub(crate) unsafe extern "C" fn close_send(c: V) -> ncclResult_t {
    api::close_send(c)
}
/// `closeRecv`.
pub(crate) unsafe extern "C" fn close_recv(c: V) -> ncclResult_t {
    api::close_recv(c)
}
