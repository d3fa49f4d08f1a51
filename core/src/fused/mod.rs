//! NIC fusion (multi-rail) and rail failover: one virtual NIC over up to
//! [`MAX_DEVS_PER_NIC`] physical devices ("rails"), and comms that stripe every message across
//! them and survive the loss of all rails but one.
//!
//! # Virtual NICs
//! A *virtual NIC* ([`VNic`]) names the physical devices it fuses, in rail order. NCCL asks for
//! one with `makeVDevice` (refused with `NCCL_IB_MERGE_NICS=0`); its properties are rail 0's
//! with the speeds summed (`ibnet_ffi::vdev`, which also holds the merging rules that need the
//! devices' descriptions: link layers, PCI paths, `realPort`).
//!
//! # Fused comms
//! A fused comm is one ordinary comm per rail ([`FusedSend`] holds a
//! [`SendComm`](crate::comm::SendComm) per rail, [`FusedRecv`] a
//! [`RecvComm`](crate::comm::RecvComm)), paired by rail index, each with its own CQ, QPs, FIFO
//! and request pool, so a one-device comm pays nothing for fusion. A receive is posted on
//! every rail (the whole buffer, with that rail's rkey): each rail's receiver writes its own
//! clear-to-send into its own FIFO, as NCCL 2.28 sends clear-to-send per device. A send waits
//! until every live rail has the receive posted ([`SendComm::peek`](crate::comm::SendComm::peek)),
//! then cuts the message with [`stripe`] (rail `i` carries bytes `[i·c, (i+1)·c)`, `c` a
//! multiple of 128) and posts each part on its rail at its offset in the receive buffer
//! ([`SendComm::isend_at`](crate::comm::SendComm::isend_at)). Each rail completes its part with
//! its own write-with-immediate; the receive is done when every rail's part is, and its size is
//! the sum of the parts' real byte counts (each rail's immediate, or for a multi-receive each
//! rail's row of its sizes FIFO).
//!
//! ```text
//!  FusedRecv::irecv(buf)          rail 0: RecvComm::irecv(buf, rkey0) ── CTS ─▶ rail 0 FIFO
//!                                 rail 1: RecvComm::irecv(buf, rkey1) ── CTS ─▶ rail 1 FIFO
//!  FusedSend::isend(data, size)   peek both ─▶ stripe ─▶ rail 0: isend_at(data+0, c, roff 0)
//!                                                        rail 1: isend_at(data+c, size-c, roff c)
//!  test: done when every rail's part is (sender: acknowledged; receiver: its immediate)
//! ```
//!
//! # Rail failover (beyond NCCL 2.28)
//! A rail fails when its sub-comm returns an error: a failed completion (retry exceeded, flush
//! after the QP went to error, a fatal async event such as port down, which the provider
//! reports through `poll_cq`) or a failed post. From then on that rail is out of use on that
//! side ([`RailEvent`] says which rail and where its traffic went; the caller logs it once).
//!
//! *Sender.* Every part the failed rail had not had acknowledged is **lost**: the sender writes
//! the same bytes again, on the first live rail that has this message's receive, to the same
//! offsets of the receive buffer (with that rail's rkey, from that rail's clear-to-send). A
//! write of the same bytes to the same addresses is idempotent, so a part that did land before
//! its acknowledgement was lost is harmless to repeat. The moved write is an RDMA WRITE without
//! immediate ([`SendComm::iwrite`](crate::comm::SendComm::iwrite)): the receiver's completion
//! queue sees nothing of it, so no rail's receive accounting shifts. Once every moved part of a
//! message is **acknowledged** (the RC acknowledgement: the bytes are placed), the sender
//! writes one **notice** for the message into the receiver's notice ring (a
//! [`FifoRing`](crate::fifo::FifoRing) registered on every rail; slot = the message's receive
//! sequence number, one element per moved rail: see [`Notice`]). The message is done at the
//! sender when the notice is acknowledged too. Later messages still use the fixed stripe of
//! all rails: a dead rail's part of a new message is written by a live rail and noticed the
//! same way, so both ends always agree on the geometry without a renegotiation. A notice or a
//! moved part whose carrier fails is lost again and moved by the next live rail; the notice
//! is written again with every rail moved so far, so two notices landing in either order
//! leave the same content. No live rail left is the comm's error, as for one device.
//!
//! *Receiver.* A rail's part of a message is done by the rail's own completion
//! (write-with-immediate) or by a notice naming that rail, whichever comes first; the other is
//! ignored, so no byte is counted twice. While a message waits, `test` reads its notice slot
//! (one Acquire load, only for an unfinished message of a fused comm). A notice takes its rail
//! out of use at the receiver (new receives are not posted there). A rail whose own calls fail
//! at the receiver (its clear-to-send write fails, say) is taken out of use likewise: its
//! receives that had completed count, the others wait for notices, and the receiver writes a
//! **back notice** (slot = rail, in the sender's back ring, registered on every rail) over a
//! live rail. A sender that finds no clear-to-send on a live rail reads that slot before it
//! waits, and fails the rail over if it is set; so a failure only the receiver saw does not
//! leave the sender waiting for a clear-to-send that will never come.
//!
//! ```text
//!  sender                                   receiver
//!  rail 1: part of m fails (retry exceeded)
//!  rail 0: WRITE part → buf+off (rkey0) ──▶ bytes placed (no completion)
//!          ◀── ack
//!  rail 0: WRITE notice{m, rail 1, bytes} ─▶ notice ring slot m
//!          ◀── ack: m done                   test(m): rail 0 immediate ✓, notice(rail 1) ✓ → done
//! ```
//!
//! Nothing here is shared between threads: a fused comm is driven by one thread, as every comm,
//! and the notice ring uses the FIFO's publication protocol (whose orderings the loom model
//! `loom_fifo` checks), so fusion adds no atomic protocol of its own.
//!
//! *Multi-receives.* A rail completes all of a multi-receive's receives at once (one
//! write-with-immediate and one sizes FIFO row per rail), so a multi-receive is noticed as a
//! group ([`GroupNotice`]): once every send of the group is posted, none has a part still lost
//! or moving, the send of receive 0 writes one notice whose element `i` names the rails moved
//! (by any send of the group) and send `i`'s whole size. The receiver counts each rail it names
//! once, for every receive, with that rail's part of each send's size as [`stripe`] cuts it
//! (both sides stripe over the same rails), so exact sizes are still reported per receive. A
//! send of the group is done at the sender when the whole group is (every part acknowledged,
//! the group's notice acknowledged). The single-receive notice is unchanged; a peer that
//! predates group notices decodes none from the new element and fails the comm cleanly
//! (`BadFifoElem`), as its own multi-receive failover did.
//!
//! Limits: a moved write that repeats a part which had landed
//! (its acknowledgement lost) can land after the receiver completed the message (bytes
//! identical, so only a buffer the receiver reused meanwhile for other data would see them).

mod event;
mod notice;
mod recv;
mod send;
mod stripe;
mod vnic;

pub use event::RailEvent;
pub use notice::{GroupNotice, Notice, GROUP_NOTICE_KEY, NOTICE_KEY};
pub use recv::{FusedBuf, FusedRecv};
pub use send::FusedSend;
pub use stripe::{stripe, stripe_set, Part, STRIPE_ALIGN};
pub use vnic::{VNic, MAX_DEVS_PER_NIC};

#[cfg(test)]
mod tests;
