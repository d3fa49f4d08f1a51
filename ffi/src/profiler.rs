//! Plugin-level profiler events through NCCL's `profFunction` (`init` of v10/v11), as NCCL
//! 2.28's IB transport emits them: QP events (`ncclProfileQp`) with an
//! `ncclProfilerNetIbDescr_v1_t` descriptor and plugin id `NCCL_PROFILER_NET_TYPE_IB | 1`.
//!
//! The callback NCCL passes is process-wide (NCCL's `ncclProfilerCallback`); the last non-NULL
//! one `init` saw is kept in one atomic word. A comm created while a callback is known gets an
//! [`EventTable`] (the handles of its open events, heap-allocated with the comm) and a [`Sink`]
//! naming it ([`EventTable::for_comm`]); without one the data path pays a branch and the comm
//! carries no table. The core decides when events start and stop
//! ([`ibnet_core::comm::events`]); this file calls the function and keeps the handles. The
//! callback's result is ignored: events are advisory, and the data path does not fail for them.
#![allow(unsafe_code)] // calling NCCL's callback; the block has a SAFETY comment.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use ibnet_core::comm::{QpEvent, QpEvents, QpOp, Sink};
use ibnet_core::fifo::MAX_REQUESTS;

use ibnet_nccl::types::{ncclProfilerCallback_t, ProfilerFn};

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

/// Most QP events one request keeps open: NCCL 2.28 starts one per buffer and QP the request
/// is posted on; beyond this many (a multi-receive of 8 split over several QPs) the rest are
/// not started.
pub const MAX_REQ_EVENTS: usize = 8;

/// One request slot's open events: handle and QP index of each (a handle of 0: stopped).
/// Atomics (all `Relaxed`: one thread at a time drives a comm's data path, as NCCL does) only
/// make the table shareable behind the `'static` sink without `unsafe` cells.
#[derive(Default)]
struct ReqSlot {
    handle: [AtomicUsize; MAX_REQ_EVENTS],
    qp: [AtomicU8; MAX_REQ_EVENTS],
    n: AtomicU8,
}

/// A comm's open profiler events, per request slot (allocated with the comm, only when NCCL
/// gave a profiler callback; it must outlive the comm, which stops its events at close).
pub struct EventTable {
    slots: [ReqSlot; MAX_REQUESTS],
}

impl EventTable {
    /// The table and sink for a new comm of device `dev_index`, if NCCL gave a profiler
    /// callback. The sink names the table by address: keep the box alive (and unmoved: it is a
    /// box) until the comm is closed.
    pub fn for_comm(dev_index: u8) -> Option<(Box<Self>, Sink)> {
        callback()?;
        let t = Box::new(Self {
            slots: core::array::from_fn(|_| ReqSlot::default()),
        });
        let sink = Sink {
            events: &NCCL_EVENTS,
            ctx: &*t as *const Self as usize,
            device: u32::from(dev_index),
        };
        Some((t, sink))
    }
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

/// The table a sink's `ctx` names.
fn table(ctx: usize) -> &'static EventTable {
    // SAFETY: `ctx` is the address of a boxed `EventTable` that `EventTable::for_comm` made for
    // this comm's sink; the comm's box keeps it alive (declared after the comm, so dropped
    // after the comm's last stop) and never moves it. The 'static is never held past a call.
    unsafe { &*(ctx as *const EventTable) }
}

impl QpEvents for NcclEvents {
    fn start(&self, ctx: usize, req: u8, qp: u8, parent: usize, ev: &QpEvent) {
        let slot = &table(ctx).slots[req as usize % MAX_REQUESTS];
        // Relaxed (here and below): see `ReqSlot`.
        let n = slot.n.load(Ordering::Relaxed) as usize;
        if n >= MAX_REQ_EVENTS {
            return;
        }
        let mut d = descr(ev);
        let mut h: *mut c_void = core::ptr::null_mut();
        call(
            &mut h,
            EVENT_START,
            parent,
            PLUGIN_ID,
            (&mut d as *mut NetIbDescr).cast(),
        );
        if !h.is_null() {
            slot.handle[n].store(h as usize, Ordering::Relaxed);
            slot.qp[n].store(qp, Ordering::Relaxed);
            slot.n.store(n as u8 + 1, Ordering::Relaxed);
        }
    }

    fn stop(&self, ctx: usize, req: u8, qp: Option<u8>) {
        let slot = &table(ctx).slots[req as usize % MAX_REQUESTS];
        // Relaxed (here and below, as in `start`): see `ReqSlot`; one thread at a time drives
        // the comm's data path, so there is no cross-thread pair to make.
        let n = slot.n.load(Ordering::Relaxed) as usize;
        let mut open = 0;
        for (h, q) in slot.handle[..n].iter().zip(&slot.qp[..n]) {
            let v = h.load(Ordering::Relaxed);
            if v == 0 {
                continue;
            }
            if qp.is_some_and(|qp| q.load(Ordering::Relaxed) != qp) {
                open += 1;
                continue;
            }
            let mut e = v as *mut c_void;
            call(&mut e, EVENT_STOP, 0, 0, core::ptr::null_mut());
            h.store(0, Ordering::Relaxed);
        }
        if open == 0 {
            slot.n.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibnet_nccl::types::ncclResult_t;

    static STARTS: AtomicUsize = AtomicUsize::new(0);
    static STOPS: AtomicUsize = AtomicUsize::new(0);

    /// This test's parent; events of other parents (other tests' comms) are not counted.
    const PARENT: usize = 0x77;
    /// Handles this callback gives: TAG | n.
    const TAG: usize = 0x7700_0000;

    /// A callback as NCCL's: a start gets a fresh non-NULL handle. It never panics (it is
    /// called through `extern "C"`); what it saw is checked by the test.
    unsafe extern "C" fn cb(
        eh: *mut *mut c_void,
        kind: c_int,
        ph: *mut c_void,
        id: i64,
        ext: *mut c_void,
    ) -> ncclResult_t {
        // Relaxed (every counter here): statistics read by the thread that made the calls.
        if kind == EVENT_START && ph as usize == PARENT && id == PLUGIN_ID && !ext.is_null() {
            // SAFETY: the plugin passes its descriptor for the call.
            let d = unsafe { &*(ext as *const NetIbDescr) };
            if (d.kind, d.qp.device, d.qp.opcode, d.qp.length) == (PROFILE_QP, 2, 1, 64) {
                let n = STARTS.fetch_add(1, Ordering::Relaxed) + 1;
                // SAFETY: `eh` is the plugin's handle slot for this call.
                unsafe { *eh = (TAG | n) as *mut c_void };
            }
        } else if kind == EVENT_STOP && ext.is_null() {
            // SAFETY: a stop passes the started handle's slot.
            if unsafe { *eh } as usize & TAG == TAG {
                STOPS.fetch_add(1, Ordering::Relaxed);
            }
        }
        ncclResult_t::Success
    }

    #[test]
    fn a_request_keeps_at_most_eight_events_and_each_stops_once() {
        set(Some(cb));
        let (t, sink) = EventTable::for_comm(2).expect("a callback is set");
        let ev = QpEvent {
            device: 2,
            wr_id: 5,
            op: QpOp::WriteWithImm,
            qpn: 0x11,
            length: 64,
        };
        // Ten events of request 5 over QPs 0 and 1: eight are started.
        for i in 0..10u8 {
            sink.events.start(sink.ctx, 5, i % 2, PARENT, &ev);
        }
        // Relaxed (this and the STOPS loads below): `cb` counted on this thread, during the
        // `start`/`stop` calls; program order suffices.
        assert_eq!(STARTS.load(Ordering::Relaxed), MAX_REQ_EVENTS);
        sink.events.stop(sink.ctx, 5, Some(1));
        assert_eq!(STOPS.load(Ordering::Relaxed), 4, "QP 1's four");
        sink.events.stop(sink.ctx, 5, Some(1));
        assert_eq!(STOPS.load(Ordering::Relaxed), 4, "never twice");
        sink.events.stop(sink.ctx, 5, None);
        assert_eq!(STOPS.load(Ordering::Relaxed), 8, "the rest");
        // The slot is free again for the request index's next user.
        sink.events.start(sink.ctx, 5, 0, PARENT, &ev);
        sink.events.stop(sink.ctx, 5, None);
        assert_eq!(STOPS.load(Ordering::Relaxed), 9);
        drop(t);
        clear();
    }
}
