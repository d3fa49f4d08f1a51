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
//! and request pool, so a one-device comm pays nothing for fusion. What both directions keep
//! per rail lives once, in `rail_set.rs`'s `RailSet` (which rails are in use, the rail news
//! for the caller, the resilience settings and clock, the stripe weights, failback's retry
//! state, the rings' registrations) with the comm's stored
//! [`Lifecycle`](crate::lifecycle::Lifecycle): connecting until every rail is connected,
//! ready, rail-degraded while a rail is out of use (ready again once failback returned every
//! rail), failed at the comm's first failure no rail mends. A receive is posted on
//! every rail in use at the receiver (the whole buffer, with that rail's rkey): each rail's
//! receiver writes its own clear-to-send into its own FIFO, as NCCL 2.28 sends clear-to-send
//! per device, and every one of them carries the same **live-rail mask** `M` (bit `r`: rail
//! `r` in use at the receiver when it posted; the FIFO element's `rails` word, covered by its
//! check, see [`crate::fifo`]). A send waits until every rail of `M` that is live here has the
//! receive posted ([`SendComm::peek`](crate::comm::SendComm::peek)), then stripes the message
//! over `S = M ∩ L` (`L`: the rails live at the sender) with [`stripe_set`] (the `j`-th rail of
//! `S` carries bytes `[j·c, (j+1)·c)`, `c` a multiple of 128; with every rail in use this is
//! [`stripe`]) and posts each part on its rail at its offset in the receive buffer
//! ([`SendComm::isend_at`](crate::comm::SendComm::isend_at)). Each rail completes its part with
//! its own write-with-immediate; the receive is done when every rail of `M` has its part, and
//! its size is the sum of the parts' real byte counts (each rail's immediate, or for a
//! multi-receive each rail's row of its sizes FIFO).
//!
//! ```text
//!  FusedRecv::irecv(buf)          M = live rails here
//!                                 rail 0: RecvComm::irecv_rails(buf, rkey0, M) ─ CTS ─▶ rail 0 FIFO
//!                                 rail 1: RecvComm::irecv_rails(buf, rkey1, M) ─ CTS ─▶ rail 1 FIFO
//!  FusedSend::isend(data, size)   peek M's live rails ─▶ S = M ∩ L ─▶ stripe_set(size, S)
//!                                   rail 0: isend_at(data+0, c, roff 0)
//!                                   rail 1: isend_at(data+c, size-c, roff c)
//!  test: done when every rail of M has its part (sender: acknowledged; receiver: its immediate)
//! ```
//!
//! # Rail failover (beyond NCCL 2.28)
//! A rail fails when its sub-comm returns an error: a failed completion (retry exceeded, flush
//! after the QP went to error, a fatal async event such as port down, which the provider
//! reports through `poll_cq`) or a failed post. From then on that rail is out of use on that
//! side for good ([`RailEvent`] says which rail and where its traffic went; the caller logs it
//! once). Whether a rail fails over at all, and for which failures, is [`Resilience`]
//! (`NCCL_IB_RESILIENCY_PORT_FAILOVER*`): off, or for a failure no rail can mend (an access
//! error), the comm fails as a plain one. Without failback a rail never comes back, so `M` and
//! `L` only shrink; with it ([`heal`], `NCCL_IB_RESILIENCY_PORT_RECOVERY`), a rail out of use
//! returns once both ends reset and proved it, from a receive sequence number both know (its
//! JOIN), so `M` and `L` grow again at one message that both sides agree on.
//!
//! ## The geometry of a message: who decides, and how the other side knows
//! The receiver decides `M` when it posts, and keeps it with the receive. The sender decides
//! `S ⊆ M` when it posts the send, and keeps it with the message. The receiver counts a rail
//! of `M` done by its own completion (the sender posted a part there) or by a **notice**
//! naming it (the sender did not, or its part went over another rail); a rail outside `M` it
//! never waits for. So the receiver never needs `S` but where it must cut a part itself (a
//! multi-receive's notice, below), and there the notice carries it. No state is shared: each
//! side reads the other's decision from a message that was complete when it was read (a FIFO
//! element or notice verified by its check), so there is no race between a failure and a
//! message's geometry. Per rail `r` of a message, at the sender (`Leg` in `send.rs`):
//!
//! | `r`                     | sender                                  | receiver learns         |
//! |-------------------------|-----------------------------------------|-------------------------|
//! | `r ∉ M`                 | nothing (`Done`)                        | nothing: not waited for |
//! | `r ∈ M`, `r ∈ S`        | part on `r` (`Native` → `Done`)         | `r`'s immediate         |
//! | `r ∈ M`, failed in flight | part again on a live rail (`Lost` → `Moving` → `Moved`) | notice (bytes) |
//! | `r ∈ M`, `r ∉ L` at post | empty part (`Lost` → `Moved` at once)  | notice (0 bytes)        |
//!
//! Steady state after a failure, once both sides know: `M` leaves the rail out, so messages
//! are striped over the live rails with no notice and nothing written twice. Only two kinds of
//! message pay: those **in flight** on the rail when the sender learned of its failure (their
//! unacknowledged parts are written again: the only bytes re-sent), and those whose receive was
//! posted before the receiver learned (`r ∈ M`, `r ∉ L`: one notice, no bytes). The first
//! notice naming the rail takes it out of use at the receiver, so its next `M` leaves it out.
//! A rail the receiver left out of `M` while the sender still uses it is one the receiver took
//! out of use itself: the sender takes it out of use too, as it does on the receiver's back
//! notice (below): no new part goes on it, and its parts in flight stay there until they are
//! acknowledged or fail.
//!
//! ## The rule that loses nothing: acknowledged or told, counted once
//! The two sides learn of a failure at different times and by different paths (the sender from
//! its completions or the receiver's back notice or mask, the receiver from its completions or
//! a notice), and a part can be in flight on the rail meanwhile. What keeps every part counted
//! exactly once is one fact of RC and two rules built on it:
//!
//! * *RC:* a write-with-immediate is **acknowledged** at the sender exactly when it was placed
//!   at the receiver and its completion is queued there. A responder in the error state
//!   acknowledges nothing (a provider must hold to this: the soft provider refuses a delivery
//!   into a receive it flushed, `ibnet_soft`'s "Errors").
//! * *Sender:* a part acknowledged on its own rail needs nothing more; a part whose own write
//!   **failed** (or was never posted) is written again elsewhere and **told** by a notice, and
//!   only such a part. A rail the sender fails is drained first (every completion in its queue
//!   applied, also after the error): what it had acknowledged is done. A rail taken out of use
//!   because the *receiver* dropped it keeps its parts in flight until each is acknowledged or
//!   fails; so a part is never written again while its first write may still land, and no
//!   write lands after the receiver finished the message (and reused its buffer).
//! * *Receiver:* a part counts by its own completion or by a notice, whichever comes first,
//!   the other ignored. A failure **never** turns a posted receive into one that waits for a
//!   notice only: a rail that failed here is drained, and keeps being drained while receives
//!   wait on it, since the sender had some of them acknowledged (it tells none of those) and
//!   failed the others (it tells all of those).
//!
//! (Issue 29: the receiver used to give up, on its own rail failure, every receive it had not
//! yet seen complete, and wait for notices; a part the sender had acknowledged meanwhile, its
//! completion still queued, dropped from a poll after the error, or, on the soft provider,
//! delivered into the failed QP and then flushed, got neither, and the message hung.)
//!
//! *Sender.* Every part the failed rail had not had acknowledged (its completion queue drained
//! first) is **lost**: the sender writes the same bytes again, on the first live rail that has this message's receive, to the same
//! offsets of the receive buffer (with that rail's rkey, from that rail's clear-to-send). A
//! write of the same bytes to the same addresses is idempotent, so a part that did land before
//! its acknowledgement was lost is harmless to repeat. The moved write is an RDMA WRITE without
//! immediate ([`SendComm::iwrite`](crate::comm::SendComm::iwrite)): the receiver's completion
//! queue sees nothing of it, so no rail's receive accounting shifts. Once every moved part of a
//! message is **acknowledged** (the RC acknowledgement: the bytes are placed), the sender
//! writes one **notice** for the message into the receiver's notice ring (a
//! [`FifoRing`](crate::fifo::FifoRing) registered on every rail; slot = the message's receive
//! sequence number, one element per moved rail with the bytes its part carried: see
//! [`Notice`]). The message is done at the sender when the notice is acknowledged too. A
//! notice or a moved part whose carrier fails is lost again and moved by the next live rail;
//! the notice is written again with every rail moved so far, so two notices landing in either
//! order leave the same content. No live rail left is the comm's error, as for one device.
//!
//! *Receiver.* A rail's part of a message is done by the rail's own completion
//! (write-with-immediate) or by a notice naming that rail, whichever comes first; the other is
//! ignored, so no byte is counted twice. While a message waits, `test` reads its notice slot
//! (one Acquire load, only for an unfinished message of a fused comm). A notice naming a rail
//! outside the receive's `M` is refused as hostile. A notice takes its rail out of use at the
//! receiver (new receives are not posted there and `M` leaves it out). A rail whose own calls
//! fail at the receiver (its clear-to-send write fails, say) is taken out of use likewise: its
//! completion queue is drained (good completions applied, flushed receives skipped), and
//! stays drained while receives wait on it, each completing by its completion or a notice
//! (the rule above); and the receiver writes a **back notice** (slot = rail, in the sender's back ring, registered on every rail) over a
//! live rail. A sender that finds no clear-to-send on a live rail of `M` reads that slot
//! before it waits, and fails the rail over if it is set; so a failure only the receiver saw
//! does not leave the sender waiting for a clear-to-send that will never come (the receives
//! posted after it leave the rail out of `M`, which tells the sender as well).
//!
//! ```text
//!  sender                                   receiver
//!  rail 1: part of m fails (retry exceeded)
//!  rail 0: WRITE part → buf+off (rkey0) ──▶ bytes placed (no completion)
//!          ◀── ack
//!  rail 0: WRITE notice{m, rail 1, bytes} ─▶ notice ring slot m
//!          ◀── ack: m done                   test(m): rail 0 immediate ✓, notice(rail 1) ✓ → done
//!                                            rail 1 out of use here: next M = {0}
//!  m+1 (posted with M = {0, 1}): S = {0}
//!  rail 0: part = whole message ──────────▶ rail 0 immediate ✓
//!  rail 0: WRITE notice{m+1, rail 1, 0 B} ─▶ notice(rail 1) ✓ → done
//!  m+2 (posted with M = {0}): S = {0}
//!  rail 0: part = whole message ──────────▶ rail 0 immediate ✓ → done   (no notice)
//! ```
//!
//! *Hostile input.* A clear-to-send whose mask is empty, names a rail the comm lacks, leaves
//! out the rail it arrived on, or differs between rails fails the comm (`BadFifoElem`), as a
//! hostile notice does.
//!
//! *Orderings.* Fusion adds no atomic protocol of its own: a fused comm is driven by one
//! thread, as every comm, and the clear-to-send's mask, the notice ring and the back ring all
//! use the FIFO's publication protocol (fields `Relaxed`, then `idx` with `Release`, paired
//! with the reader's `Acquire` load of `idx`; then the check; see [`crate::fifo`], whose
//! orderings the loom model `loom_fifo` checks). The mask is one more field under that `idx`
//! and check.
//!
//! *Multi-receives.* A rail completes all of a multi-receive's receives at once (one
//! write-with-immediate and one sizes FIFO row per rail), so a multi-receive is noticed as a
//! group ([`GroupNotice`]): once every send of the group is posted, none has a part still lost
//! or moving, the send of receive 0 writes one notice whose element `i` names the rails moved
//! (by any send of the group), send `i`'s whole size and the rails `S_i` send `i` was striped
//! over (the sends of a group share `M` but may differ in `S`: a rail can fail between two of
//! them, and then the earlier sends' parts on it, which its rail had not posted yet, are lost
//! and moved). The receiver counts each rail it names once, for every receive, with that
//! rail's part of each send's size as [`stripe_set`] cuts it over `S_i`, so exact sizes are
//! still reported per receive. A send of the group is done at the sender when the whole group
//! is (every part acknowledged, the group's notice acknowledged).
//!
//! Limits: with several QPs per rail (`NCCL_IB_QPS_PER_CONNECTION` > 1), a rail that fails on
//! one QP at the sender may still carry parts on its others, which the drain does not wait
//! for: such a part is written again too, and its first write can land after the receiver
//! completed the message (bytes identical, so only a buffer the receiver reused meanwhile for
//! other data would see them). With one QP per rail, completions come in order and a part is
//! written again only once its first write failed.
//! A rail the sender knew was dead when a message was posted keeps that message's receive
//! posted on the rail at the receiver until the notice takes the rail out of use there (a
//! receive request of that rail's comm is not reused; at most the receives in flight).

mod event;
pub mod heal;
mod notice;
mod rail_set;
mod recv;
mod resilience;
mod send;
mod stripe;
mod vnic;

pub use event::RailEvent;
pub use notice::{GroupNotice, Notice, GROUP_NOTICE_KEY, NOTICE_KEY};
pub use recv::{FusedBuf, FusedRecv};
pub use resilience::{recoverable, Resilience};
pub use send::FusedSend;
pub use stripe::{stripe, stripe_set, stripe_weighted, Part, Weights, EQUAL_WEIGHTS, STRIPE_ALIGN};
pub use vnic::{VNic, MAX_DEVS_PER_NIC};

#[cfg(test)]
mod tests;
