//! A comm of one NIC: one send comm and one receive comm per direction, over 1..=
//! [`MAX_DEVS_PER_NIC`] rails (the physical devices of the NIC that NCCL's device number
//! names: one for a physical device, up to eight for a virtual NIC made by `makeVDevice`).
//!
//! This is the one type a plugin holds per direction ([`RailSend`], [`RailRecv`]); what a
//! comm of one rail and a comm of many do differently stays behind it:
//!
//! ```text
//!             RailSend / RailRecv  (this module: one API for 1..=8 rails)
//!              │                         │
//!   1 rail ────┘                         └──── 2..=8 rails
//!   comm::SendComm / RecvComm             fused::FusedSend / FusedRecv (in a box `B` the
//!   (today's fast path, unchanged:        caller allocates: core never does): striping,
//!    one match arm more per call)         failover, failback, notices; one comm per rail
//! ```
//!
//! A single rail is a plain comm: no notice ring, no live-rail mask, the wire format of one
//! device (so a one-rail comm talks to any ibnet of the same wire version), and each data
//! call costs one branch more than calling [`SendComm`](crate::comm::SendComm) directly.
//! The caller passes registrations as [`RailKeys`] (the buffer's keys on every rail, rail 0
//! first) and receive buffers as [`RailBuf`], whatever the rail count.
//!
//! The comm's lifecycle is [`Lifecycle`]: connecting, ready, rail-degraded (a rail out of
//! use, the comm still moving data on the others), failed.

mod infos;
mod recv;
mod send;

pub use crate::fused::{FusedBuf as RailBuf, Resilience, VNic, MAX_DEVS_PER_NIC};
pub use crate::lifecycle::Lifecycle;
pub use infos::{agreed_weights, rings, speed_units, Infos, RailKeys, RailNews, RailStats};
pub use recv::RailRecv;
pub use send::RailSend;
