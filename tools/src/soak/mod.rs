//! `ibnet-soak`: a long, byte-verified run through a plugin's C ABI between two processes.
//!
//! The driver spawns the peer process; each of `threads` thread pairs (one thread in each
//! process, each its own plugin `init`, as NCCL communicators are) connects `comms` lanes,
//! half sent by each side. Every request of a lane is drawn from the run seed ([`plan`]):
//! a multi-receive of width 1..8, distinct random tags, sizes from 0 up to the request
//! limit (16 MiB by default), sends issued in shuffled order; every byte is verified against
//! a pattern of the seed and message index, with guard bytes after each message ([`lane`]).
//! After `--seconds` the pairs agree where to stop ([`worker`]) and drain; each process prints
//! its counts, resident memory and open descriptors at start and end ([`procstat`]).
//!
//! `unsafe` is allowed in [`lane`] only: passing the lane's own buffers to the plugin.

/// Most receives in one request (`NCCL_NET_IB_MAX_RECVS`).
pub const MAX_WIDTH: usize = crate::net::MAX_RECVS;

#[allow(unsafe_code)]
pub mod lane;
pub mod link;
pub mod plan;
pub mod procstat;
pub mod stats;
pub mod worker;
