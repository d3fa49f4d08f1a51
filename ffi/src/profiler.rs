//! Plugin-level profiler events through NCCL's `profFunction` (`init` of v10/v11), as NCCL
//! 2.28's IB transport emits them: QP events (`ncclProfileQp`) with an
//! `ncclProfilerNetIbDescr_v1_t` descriptor and plugin id `NCCL_PROFILER_NET_TYPE_IB | 1`.
//!
//! The callback NCCL passes is process-wide (NCCL's `ncclProfilerCallback`); the last non-NULL
//! one `init` saw is kept in one atomic word. A comm takes a [`Sink`] at creation when a
//! callback is known then ([`sink`]); without one the data path pays a branch. The core decides
//! when events start and stop ([`ibnet_core::comm::events`]); this file only calls the function.
//! Its result is ignored: events are advisory, and the data path does not fail for them.
#![allow(unsafe_code)] // calling NCCL's callback; the block has a SAFETY comment.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use ibnet_core::comm::{QpEvent, QpEvents, QpOp, Sink};

use crate::nccl::types::{ncclProfilerCallback_t, ProfilerFn};

/// `ncclProfilerNetEventStart`.
pub const EVENT_START: c_int = 0;
/// `ncclProfilerNetEventStop`.
pub const EVENT_STOP: c_int = 1;
/// `NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER` (type in the upper 16 bits).
pub const PLUGIN_ID: i64 = (1 << 16) | 1;
/// `ncclProfileQp`, the descriptor's event type.
pub const PROFILE_QP: u8 = 1;
/// `IBV_WR_RDMA_WRITE`.
pub const IBV_WR_RDMA_WRITE: c_int = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
/// `IBV_WC_RECV_RDMA_WITH_IMM`: what a posted receive becomes (NCCL 2.28 leaves the field
/// unset for receives; ibnet names the completion it waits for).
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_int = 129;

/// The QP part of `ncclProfilerNetIbDescr_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetIbQpDescr {
    /// The plugin's device index.
    pub device: c_int,
    /// The work request id.
    pub wr_id: u64,
    /// The ibv opcode.
    pub opcode: c_int,
    /// The QP number.
    pub qp_num: c_int,
    /// Bytes of the work request.
    pub length: usize,
}

/// `ncclProfilerNetIbDescr_v1_t`: a type byte, then (in a union, 8-aligned) the QP fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetIbDescr {
    /// `ncclProfileQp`.
    pub kind: u8,
    /// The QP event's fields.
    pub qp: NetIbQpDescr,
}

const _: () = assert!(core::mem::offset_of!(NetIbDescr, qp) == 8);
const _: () = assert!(core::mem::offset_of!(NetIbQpDescr, wr_id) == 8);
const _: () = assert!(core::mem::offset_of!(NetIbQpDescr, length) == 24);
const _: () = assert!(core::mem::size_of::<NetIbDescr>() == 40);

/// The callback's address, 0 when none was given.
static CALLBACK: AtomicUsize = AtomicUsize::new(0);

/// Remembers NCCL's callback (`init`); NULL keeps the one already known.
pub fn set(cb: ncclProfilerCallback_t) {
    if let Some(f) = cb {
        // Relaxed: the word is the whole message (a function address); readers only call it.
        CALLBACK.store(f as usize, Ordering::Relaxed);
    }
}

/// Forgets the callback (tests).
pub fn clear() {
    // Relaxed: as in `set`.
    CALLBACK.store(0, Ordering::Relaxed);
}

fn callback() -> Option<ProfilerFn> {
    // Relaxed: as in `set`.
    let a = CALLBACK.load(Ordering::Relaxed);
    // SAFETY: a non-zero value was stored by `set` from a `ProfilerFn`, and function pointers
    // round-trip through `usize` on every platform Rust supports; the callback stays valid
    // while NCCL is loaded (it is NCCL's own function).
    (a != 0).then(|| unsafe { core::mem::transmute::<usize, ProfilerFn>(a) })
}

/// The sink for a new comm of device `dev_index`, if NCCL gave a profiler callback.
pub fn sink(dev_index: u8) -> Option<Sink> {
    callback().map(|_| Sink {
        events: &NCCL_EVENTS,
        device: u32::from(dev_index),
    })
}

/// The [`QpEvents`] that calls NCCL's callback.
struct NcclEvents;

static NCCL_EVENTS: NcclEvents = NcclEvents;

fn descr(ev: &QpEvent) -> NetIbDescr {
    NetIbDescr {
        kind: PROFILE_QP,
        qp: NetIbQpDescr {
            device: ev.device as c_int,
            wr_id: ev.wr_id,
            opcode: match ev.op {
                QpOp::Write => IBV_WR_RDMA_WRITE,
                QpOp::WriteWithImm => IBV_WR_RDMA_WRITE_WITH_IMM,
                QpOp::Recv => IBV_WC_RECV_RDMA_WITH_IMM,
            },
            qp_num: ev.qpn as c_int,
            length: ev.length as usize,
        },
    }
}

fn call(handle: &mut *mut c_void, kind: c_int, parent: usize, id: i64, data: *mut c_void) {
    if let Some(f) = callback() {
        // SAFETY: NCCL's callback with its documented arguments: a valid out/in handle slot,
        // the parent NCCL passed with the request (never NULL on start), and a descriptor
        // that lives on our stack for the call (NULL on stop).
        let _ = unsafe { f(handle, kind, parent as *mut c_void, id, data) };
    }
}

impl QpEvents for NcclEvents {
    fn start(&self, parent: usize, ev: &QpEvent) -> usize {
        let mut d = descr(ev);
        let mut h: *mut c_void = core::ptr::null_mut();
        call(
            &mut h,
            EVENT_START,
            parent,
            PLUGIN_ID,
            (&mut d as *mut NetIbDescr).cast(),
        );
        h as usize
    }

    fn stop(&self, handle: usize) {
        let mut h = handle as *mut c_void;
        call(&mut h, EVENT_STOP, 0, 0, core::ptr::null_mut());
    }
}
