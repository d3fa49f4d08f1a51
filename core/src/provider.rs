//! The Provider seam: the subset of RDMA verbs the protocol uses.
//!
//! A provider is one opened device port with its protection domain. ibnet's comms are generic
//! over it, so the same protocol code runs over libibverbs (`ibnet-ffi`), over the software
//! provider (`ibnet-soft`) and over test doubles (`ibnet-testkit`).
//!
//! Semantics every implementation keeps (those of an RC queue pair):
//! * Posting returns at once; bytes move asynchronously; completions appear later in the CQ
//!   the QP was created with.
//! * Work requests on one QP execute in order. A `WriteWithImm`'s completion at the target
//!   implies that every earlier write on that QP is visible there.
//! * A `WriteWithImm` consumes one posted receive at the target and completes it with opcode
//!   [`WcOpcode::RecvRdmaWithImm`], the immediate and the byte length of that write.
//! * Only signaled send WRs produce a completion on the initiator; unsignaled ones are retired
//!   by the next signaled completion on the same QP.
//! * Every remote access is checked against the target's registrations and rkey; a violation
//!   completes with [`WcStatus::RemoteAccessError`] and moves the QP to the error state, after
//!   which its outstanding and later WRs complete with [`WcStatus::WrFlushError`].
//! * Nothing here allocates or blocks: `post_*` and `poll_cq` are hot-path calls.

use crate::error::Result;
use crate::fifo::FifoRing;
pub use crate::verbs::{
    Access, AsyncFailure, Completion, ConnectAttr, DevName, Ece, Gid, LinkLayer, MrKeys, Mtu,
    PortInfo, ProviderAddr, QpAttr, RegKind, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
    PROVIDER_ADDR_MAX,
};

/// The verbs subset ibnet's protocol uses, for one device port and protection domain.
///
/// A provider value is a cheap handle (comms hold one each); device-wide state behind it is
/// shared. Methods take `&self`; per-object exclusivity is expressed by `&mut` on the QP or CQ.
pub trait Provider {
    /// A completion queue.
    type Cq;
    /// A reliable-connected queue pair.
    type Qp;
    /// A memory registration.
    type Mr;
    /// Stable, registered-able memory for a FIFO ring (e.g. `Box<FifoRing>`). The ring must not
    /// move while registered: peers write into it.
    type Fifo: core::ops::Deref<Target = FifoRing>;

    /// The port this provider drives.
    fn port_info(&self) -> PortInfo;
    /// The device's name, for error messages (`mlx5_0`); empty by default.
    fn dev_name(&self) -> DevName {
        DevName::EMPTY
    }
    /// Allocates a zeroed FIFO ring (control path: connect/accept only).
    fn alloc_fifo(&self) -> Result<Self::Fifo>;
    /// Creates a CQ with room for `depth` completions.
    fn create_cq(&self, depth: u32) -> Result<Self::Cq>;
    /// Creates an RC QP in the RESET/INIT state bound to `cq` for sends and receives.
    fn create_qp(&self, cq: &Self::Cq, attr: &QpAttr) -> Result<Self::Qp>;
    /// The QP's number, to send to the peer.
    fn qp_num(&self, qp: &Self::Qp) -> u32;
    /// Takes the QP to RTS, connected to the remote QP described by `attr`.
    fn connect_qp(&self, qp: &mut Self::Qp, attr: &ConnectAttr) -> Result<()>;
    /// Takes a QP in any state (the error state, after a failure) back through RESET to RTS,
    /// connected to the same remote QP as before (`attr`, the attributes `connect_qp` had):
    /// its outstanding send WRs and posted receives are dropped without completions
    /// (completions already in the CQ stay), as `ibv_modify_qp` to RESET does. The peer's QP
    /// must be reset too before the two exchange anything (a fused comm's failback does both,
    /// `crate::fused`). Not supported by default.
    fn reset_qp(&self, qp: &mut Self::Qp, attr: &ConnectAttr) -> Result<()> {
        let _ = (qp, attr);
        Err(crate::error::Error::Provider {
            call: "reset_qp (not supported by this provider)",
            errno: 95, // EOPNOTSUPP
        })
    }
    /// The QP's ECE options (`ibv_query_ece`); `Ok(None)` when the provider or device has no
    /// ECE (the default), which is not an error.
    fn query_ece(&self, qp: &Self::Qp) -> Result<Option<Ece>> {
        let _ = qp;
        Ok(None)
    }
    /// Applies the peer's ECE options to a QP before it is connected (`ibv_set_ece`);
    /// `Ok(false)` when not supported (the default).
    fn set_ece(&self, qp: &mut Self::Qp, ece: &Ece) -> Result<bool> {
        let _ = (qp, ece);
        Ok(false)
    }
    /// Posts a chain of send WRs, executed in order. All or nothing: on error none was posted.
    fn post_send(&self, qp: &mut Self::Qp, wrs: &[SendWr]) -> Result<()>;
    /// Posts one zero-SGE receive (consumed by a write with immediate).
    fn post_recv(&self, qp: &mut Self::Qp, wr_id: u64) -> Result<()>;
    /// Whether an asynchronous event made the device, or the comm whose CQ is `cq`, unusable
    /// (`None`: no such event; the default, for a provider without async events). Every data
    /// call checks it first, so a call that would only wait (an `isend` before the
    /// clear-to-send) sees a dead device too: it must be cheap (an atomic load or two, no
    /// lock, syscall or allocation).
    fn async_failure(&self, cq: &Self::Cq) -> Option<AsyncFailure> {
        let _ = cq;
        None
    }
    /// Polls up to `out.len()` completions; returns how many were written.
    fn poll_cq(&self, cq: &mut Self::Cq, out: &mut [Completion]) -> Result<usize>;
    /// Registers `[addr, addr + len)`.
    fn reg_mr(&self, addr: u64, len: u64, access: Access, kind: RegKind) -> Result<Self::Mr>;
    /// The keys of a registration.
    fn mr_keys(&self, mr: &Self::Mr) -> MrKeys;
    /// Deregisters.
    fn dereg_mr(&self, mr: Self::Mr) -> Result<()>;
    /// Destroys a QP (outstanding WRs are dropped).
    fn destroy_qp(&self, qp: Self::Qp) -> Result<()>;
    /// Destroys a CQ.
    fn destroy_cq(&self, cq: Self::Cq) -> Result<()>;
}
