//! Tests only: a libibverbs table ([`Verbs`]) whose `ibv_query_gid` reads a GID table the
//! test sets ([`set_gids`]), so the GID choice of a [`VerbsDev`](super::device::VerbsDev) and
//! the comms made from it run without an RDMA device. CQs and QPs are heap objects of the
//! fake (each CQ with a context of its own whose `poll_cq` finds nothing), `ibv_modify_qp`
//! succeeds and records the state in the QP; every other call fails (none is made by the
//! tests that use it, except `close_device`/`dealloc_pd` when the context drops).
#![allow(unsafe_code)] // Stubs with libibverbs' C signatures; every block has a SAFETY comment.

use core::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;

use super::loader::Verbs;
use super::sys::*;

/// The fake port's GID table, by index (any port).
static GIDS: Mutex<Vec<[u8; 16]>> = Mutex::new(Vec::new());

/// Sets the GID table every later `ibv_query_gid` reads.
pub fn set_gids(gids: &[[u8; 16]]) {
    *GIDS.lock().unwrap_or_else(|e| e.into_inner()) = gids.to_vec();
}

unsafe extern "C" fn query_gid(_: *mut ibv_context, _: u8, i: c_int, out: *mut ibv_gid) -> c_int {
    let t = GIDS.lock().unwrap_or_else(|e| e.into_inner());
    match usize::try_from(i).ok().and_then(|i| t.get(i)) {
        Some(g) => {
            // SAFETY: the caller passes a writable ibv_gid (device.rs's query closure).
            unsafe { (*out).raw = *g };
            0
        }
        None => libc::EINVAL,
    }
}
unsafe extern "C" fn int0() -> c_int {
    0
}
unsafe extern "C" fn dev_list(_: *mut c_int) -> *mut *mut ibv_device {
    core::ptr::null_mut()
}
unsafe extern "C" fn free_list(_: *mut *mut ibv_device) {}
unsafe extern "C" fn dev_name(_: *mut ibv_device) -> *const c_char {
    c"fake".as_ptr()
}
unsafe extern "C" fn open(_: *mut ibv_device) -> *mut ibv_context {
    core::ptr::null_mut()
}
unsafe extern "C" fn close(_: *mut ibv_context) -> c_int {
    0
}
unsafe extern "C" fn query_dev(_: *mut ibv_context, _: *mut ibv_device_attr) -> c_int {
    libc::EINVAL
}
unsafe extern "C" fn query_port(_: *mut ibv_context, _: u8, _: *mut ibv_port_attr) -> c_int {
    libc::EINVAL
}
unsafe extern "C" fn alloc_pd(_: *mut ibv_context) -> *mut ibv_pd {
    core::ptr::null_mut()
}
unsafe extern "C" fn dealloc_pd(_: *mut ibv_pd) -> c_int {
    0
}
/// A fake CQ: the `ibv_cq` first (its pointer is the object's), then the context its
/// `context` points at (the data path reaches `poll_cq` through it).
#[repr(C)]
struct FakeCq {
    cq: ibv_cq,
    ctx: ibv_context,
}

unsafe extern "C" fn poll_none(_: *mut ibv_cq, _: c_int, _: *mut ibv_wc) -> c_int {
    0
}
unsafe extern "C" fn create_cq(
    _: *mut ibv_context,
    cqe: c_int,
    _: *mut c_void,
    _: *mut c_void,
    _: c_int,
) -> *mut ibv_cq {
    // SAFETY: all-zero is a valid ibv_cq and ibv_context (NULL pointers, no ops, zero fds).
    let mut f: Box<FakeCq> = Box::new(unsafe { core::mem::zeroed() });
    f.ctx.ops.poll_cq = Some(poll_none);
    f.cq.cqe = cqe;
    let p = Box::into_raw(f);
    // SAFETY: `p` is the live box just leaked; its context field lives as long as it does.
    unsafe { (*p).cq.context = core::ptr::addr_of_mut!((*p).ctx) };
    p as *mut ibv_cq
}
unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: `cq` came from `create_cq` (a leaked FakeCq whose first field it is) and is
    // destroyed once (the provider consumes its VCq).
    drop(unsafe { Box::from_raw(cq as *mut FakeCq) });
    0
}
unsafe extern "C" fn create_qp(_: *mut ibv_pd, ia: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    static QPN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0x100);
    // SAFETY: the provider passes an initialised ibv_qp_init_attr whose send CQ is a live
    // fake CQ.
    let (cq, context) = unsafe { ((*ia).send_cq, (*(*ia).send_cq).context) };
    Box::into_raw(Box::new(ibv_qp {
        context,
        qp_context: core::ptr::null_mut(),
        pd: core::ptr::null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: core::ptr::null_mut(),
        handle: 0,
        // Relaxed: a counter for distinct numbers only.
        qp_num: QPN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        state: IBV_QPS_RESET,
        qp_type: IBV_QPT_RC,
    }))
}
unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, _: c_int) -> c_int {
    // SAFETY: `qp` is a live fake QP and `attr` an initialised ibv_qp_attr (the provider's).
    unsafe { (*qp).state = (*attr).qp_state };
    0
}

unsafe extern "C" fn query_qp(
    _: *mut ibv_qp,
    _: *mut ibv_qp_attr,
    _: c_int,
    _: *mut ibv_qp_init_attr,
) -> c_int {
    libc::EINVAL
}
unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: `qp` came from `create_qp` (a leaked box) and is destroyed once (the provider
    // consumes its VQp).
    drop(unsafe { Box::from_raw(qp) });
    0
}
unsafe extern "C" fn reg_mr(_: *mut ibv_pd, _: *mut c_void, _: usize, _: c_int) -> *mut ibv_mr {
    core::ptr::null_mut()
}
unsafe extern "C" fn dereg_mr(_: *mut ibv_mr) -> c_int {
    libc::EINVAL
}
unsafe extern "C" fn get_event(_: *mut ibv_context, _: *mut ibv_async_event) -> c_int {
    -1
}
unsafe extern "C" fn ack_event(_: *mut ibv_async_event) {}
unsafe extern "C" fn event_str(_: c_int) -> *const c_char {
    c"fake event".as_ptr()
}

/// The fake table.
pub static VERBS: Verbs = Verbs {
    fork_init: int0,
    get_device_list: dev_list,
    free_device_list: free_list,
    get_device_name: dev_name,
    open_device: open,
    close_device: close,
    query_device: query_dev,
    query_port_compat: query_port,
    query_gid,
    alloc_pd,
    dealloc_pd,
    create_cq,
    destroy_cq,
    create_qp,
    modify_qp,
    query_qp,
    destroy_qp,
    reg_mr,
    dereg_mr,
    get_async_event: get_event,
    ack_async_event: ack_event,
    event_type_str: event_str,
    reg_mr_iova2: None,
    query_ece: None,
    set_ece: None,
    reg_dmabuf_mr: None,
    query_port_speed: None,
};
