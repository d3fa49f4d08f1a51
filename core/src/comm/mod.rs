//! Send and receive comms: the data path of `net_ib`, generic over a [`Provider`](crate::provider::Provider).
//!
//! A connection is a [`SendComm`] on one side and a [`RecvComm`] on the other, each with its
//! own CQ, `nqps` RC queue pairs paired by index, and a request pool.
//!
//! ```text
//!  RecvComm (receiver drives)                        SendComm (sender matches)
//!  irecv(bufs):                                      isend(data, tag):
//!    post_recv on nqps_data QPs ─────────────┐         poll FIFO slot `head` (all nreqs posted?)
//!    stage {addr,size,rkey,tag,idx} ×n       │         match tag, check size ≤ posted size
//!    RDMA WRITE staged elems ─────FIFO──────────────▶  once every receive of the slot matched:
//!      (signaled once per lap)               │           RDMA WRITE data, split over QPs in
//!                                            │           128-byte-aligned chunks (optional)
//!  test: RECV_RDMA_WITH_IMM ◀──────────────────────────  WRITE_WITH_IMM: a single receive's
//!        sizes: the immediate (one receive)  │           size as immediate (a separate 0-byte
//!        or the sizes FIFO row (several),    │           one above the adaptive-routing
//!        each ≤ the buffer posted            └─────────  threshold); a multi-receive's sizes
//!                                                        into the receiver's sizes FIFO, with
//!                                                        a bitmask of non-empty sends as imm
//!  iflush: RDMA READ of 1 byte on a loopback QP        test: signaled completion retires every
//!                                                        request packed in the wr_id
//! ```
//!
//! Both sides use one thread at a time (NCCL's proxy thread). Nothing here allocates; every
//! capacity is fixed and exhausting one is an error.
//!
//! A comm's life is one state (`Life`, in `base.rs`):
//! ```text
//!  SendComm::new ─▶ Unconnected ──connect──▶ Connected ──failed completion──▶ Poisoned
//!  RecvComm::new ─────────────(connects)───▶ Connected        or post
//! ```
//! Data calls need `Connected`; a poisoned comm reported its error once, with the peer, and
//! every later data call fails fast with `Error::Poisoned` (its first error's kind). What a
//! fused comm's failover needs still works on it: `drain`, `completed`, `unposted`, `close`.

mod base;
pub mod events;
mod recv;
mod send;
mod types;

pub use events::{QpEvent, QpEvents, QpOp, Sink};
pub use recv::RecvComm;
pub use send::{Peeked, SendComm, MAX_MSG_SIZE};
pub use types::{CommConfig, Done, RecvBuf, RecvView, TruncNote, Truncation};
