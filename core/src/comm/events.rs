//! Plugin-level profiler events: one "QP event" per request and QP it is posted on, as NCCL
//! 2.28's IB transport reports them through the `profFunction` of `init` (v10/v11).
//!
//! ```text
//!  isend (its multi-receive goes out)   per QP posted, per send r:   start(parent_r, {qp, WRITE…})
//!  irecv                                per QP posted, per buffer r: start(parent_r, {qp, RECV})
//!  test: completion on QP q             the request's events on q:   stop
//!  test: request done                   any event still open:        stop
//! ```
//!
//! Every started event is stopped exactly once (NCCL 2.28 may stop one twice; we do not). A
//! request with no parent (NCCL passed a NULL `phandle`) starts none, because NCCL's callback
//! dereferences the parent. A comm without a sink pays one branch per post and completion; with
//! one, the hot path stays allocation- and lock-free (the sink is called with values on the
//! stack and the handles live in the request, at most [`MAX_REQ_EVENTS`] per request).

use crate::request::{ReqEvents, MAX_REQ_EVENTS};

/// What an event describes (NCCL's `ncclProfilerNetIbDescr_v1_t`, type `ncclProfileQp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEvent {
    /// The plugin's device index.
    pub device: u32,
    /// The work request id (sends: the packed request indices; receives: the request index).
    pub wr_id: u64,
    /// What was posted.
    pub op: QpOp,
    /// The QP number.
    pub qpn: u32,
    /// Bytes of this request the work request moves (receives: 0, not known yet).
    pub length: u64,
}

/// The operation a QP event covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpOp {
    /// An RDMA WRITE of a send's data.
    Write,
    /// The RDMA WRITE with immediate that ends a send's data (or carries it all).
    WriteWithImm,
    /// A posted receive, consumed by the peer's write with immediate.
    Recv,
}

/// Where events go. Implementations are shared by every comm of a process (`'static`), so
/// they take `&self`, and must not allocate or lock (they run on the data path).
pub trait QpEvents: Sync {
    /// Starts an event under `parent` (never 0). Returns the handle to stop it with, or 0
    /// when no event was started (the profiler does not want this kind).
    fn start(&self, parent: usize, ev: &QpEvent) -> usize;
    /// Stops an event [`QpEvents::start`] returned (never 0).
    fn stop(&self, handle: usize);
}

/// A comm's sink and the device index its events name.
#[derive(Clone, Copy)]
pub struct Sink {
    /// Where the events go.
    pub events: &'static dyn QpEvents,
    /// The device index reported in [`QpEvent::device`].
    pub device: u32,
}

impl core::fmt::Debug for Sink {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sink")
            .field("device", &self.device)
            .finish()
    }
}

impl Sink {
    /// Starts an event of `req` on QP index `qp` under parent `parent`, if it has one and
    /// room is left.
    pub(super) fn start(&self, req: &mut ReqEvents, parent: usize, qp: usize, ev: &QpEvent) {
        let n = req.n as usize;
        if parent == 0 || n >= MAX_REQ_EVENTS {
            return;
        }
        let h = self.events.start(parent, ev);
        if h != 0 {
            req.handle[n] = h;
            req.qp[n] = qp as u8;
            req.n += 1;
        }
    }

    /// Stops `req`'s open events on QP index `qp` (`None`: all of them).
    pub(super) fn stop(&self, req: &mut ReqEvents, qp: Option<usize>) {
        let n = req.n as usize;
        for (h, &q) in req.handle[..n].iter_mut().zip(&req.qp[..n]) {
            if *h != 0 && qp.is_none_or(|qp| q as usize == qp) {
                self.events.stop(*h);
                *h = 0;
            }
        }
    }
}
