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
//! dereferences the parent. A comm without a sink pays one branch per post and completion.
//! The sink keeps the handles of open events (keyed by its `ctx`, the request's slot index and
//! the QP index), so a comm without a profiler carries no storage for them; its methods run on
//! the data path and must not allocate or lock.

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
/// they take `&self`; per comm they get the [`Sink::ctx`] the comm was given.
pub trait QpEvents: Sync {
    /// Starts an event of request slot `req` on the comm's QP index `qp`, under `parent`
    /// (never 0), and keeps its handle.
    fn start(&self, ctx: usize, req: u8, qp: u8, parent: usize, ev: &QpEvent);
    /// Stops request slot `req`'s open events on QP index `qp` (`None`: all of them). With
    /// none open this does nothing.
    fn stop(&self, ctx: usize, req: u8, qp: Option<u8>);
}

/// A comm's sink: where its events go, the sink's per-comm context, and the device index its
/// events name.
#[derive(Clone, Copy)]
pub struct Sink {
    /// Where the events go.
    pub events: &'static dyn QpEvents,
    /// The sink's per-comm context (e.g. the address of the comm's table of open events).
    pub ctx: usize,
    /// The device index reported in [`QpEvent::device`].
    pub device: u32,
}

impl core::fmt::Debug for Sink {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sink")
            .field("ctx", &self.ctx)
            .field("device", &self.device)
            .finish()
    }
}

impl Sink {
    /// Starts an event of request slot `req` on QP index `qp`, if it has a parent.
    pub(super) fn start(&self, req: u8, qp: usize, parent: usize, ev: &QpEvent) {
        if parent != 0 {
            self.events.start(self.ctx, req, qp as u8, parent, ev);
        }
    }

    /// Stops request slot `req`'s open events on QP index `qp` (`None`: all of them).
    pub(super) fn stop(&self, req: u8, qp: Option<usize>) {
        self.events.stop(self.ctx, req, qp.map(|q| q as u8));
    }
}
