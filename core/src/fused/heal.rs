//! Failback: a failed rail of a fused comm returns to striping once both ends see it healthy
//! (NCCL 2.30's `NCCL_IB_RESILIENCY_PORT_RECOVERY`, on ibnet's own protocol).
//!
//! # Protocol
//! A rail out of use on a side (failed there, or taken out because the peer did) stays out
//! for `start_delay_ms`; then the two sides bring it back in three steps, each proven by an
//! RDMA operation that completed, so neither side relies on a clock of the other:
//!
//! ```text
//!  sender                                         receiver
//!  rail i out; start delay; nothing of this side   rail i out; start delay;
//!  in flight on it (no part, moved part or notice  its DROP back notice (if any) acknowledged
//!  posted there): reset its QPs to RTS (same
//!  remote QPNs, `Provider::reset_qp`), give up
//!  its requests; publish READY(i, g) in its own
//!  back ring ─────────────────────────────────────▶ READ of READY(i, g) over a live rail c
//!                                                   (repeated until seen; each try ≤ ack timeout)
//!                                                   seen: drain rail i's CQ (applies the parts
//!                                                   the sender had acknowledged); every other
//!                                                   part of rail i still awaited comes by notice;
//!                                                   reset its QPs, give up its requests,
//!                                                   next FIFO sequence = the comm's (s)
//!                                         ◀──────── probe: READ of READY(i, g) over rail i itself
//!                                                   (the path works both ways, both QPs in RTS)
//!                                                   done: WRITE JOIN(i, g, s) into the sender's
//!                                                   back ring over rail c; rail i live; receives
//!                                                   from s on carry it in their mask
//!  clear-to-send of s on rail c (after JOIN on the same QP) ◀── irecv(s): mask ∋ i, CTS on
//!  mask ∋ i, JOIN(i, g, s) seen: rail i's FIFO                  every live rail, i included
//!  head = s, rail i live: message s is striped
//!  over it again (one INFO: the rail returned)
//! ```
//!
//! `g`, the rail's generation, counts its returns on each side, so a control word of an
//! earlier round never passes for one of this round: the sender's back ring holds, per rail
//! and generation, the receiver's DROP (written by the receiver), the sender's READY (read
//! by the receiver) and the receiver's JOIN (written by the receiver), each in a slot of its
//! own ([`ctl_seq`]), with the FIFO's publication protocol (fields, `idx` with `Release`,
//! check), so no new atomic protocol.
//!
//! # Why no byte is lost or written twice
//! * The sender resets rail i only once nothing of it is in flight there: every part it had
//!   posted on the rail is acknowledged (the receiver has its completion queued: RC) or failed
//!   (it goes again elsewhere and is told by a notice). So when the receiver sees READY, what
//!   it drains from rail i's queue is every part acknowledged there, and every other part of
//!   rail i it still waits for is one the sender failed: it comes by notice. The receiver's
//!   reset drops only receives no write can still consume.
//! * A message whose receive was posted before `s` never uses rail i again at the sender (it
//!   rejoins at `s`), so its part of rail i, if the mask named it, is told by a notice (empty,
//!   the sender striped it over the others). Such a late notice does not take the returned
//!   rail out again: only notices of messages from `s` on do.
//! * The rejoin point is `s`, a FIFO sequence number both sides hold: the receiver's
//!   clear-to-send of `s` on rail i is the rail's first, and the sender's rail FIFO head is set
//!   to `s`. JOIN is written on the same QP before the clear-to-send of `s` on rail c, so a
//!   sender that sees that clear-to-send sees JOIN. (If it did not, rail i is not live at the
//!   sender for `s`: its part is empty and told by a notice, which takes the rail out at the
//!   receiver again: a lost round of failback, never a lost byte.)
//! * Any failure during a round (a READ, the probe, the reset) is an attempt that failed; the
//!   rail stays out and is tried again after the start delay, at most `attempts_max` times in a
//!   row. A rail that fails again after returning fails over as any rail does.
//!
//! Nothing is written outside registered memory: READY is read from, and JOIN written into,
//! the sender's back ring (registered on every rail, remote read and write), into and from the
//! receiver's back stage (registered on every rail).

use crate::fifo::PostedRecv;
use crate::request::ReqId;

/// Where a rail's round of failback stands at the receiver (`FusedRecv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Out of use (or live): nothing in flight.
    Idle,
    /// Reading the sender's READY over live rail `carrier` (posted at `since`, ms).
    Reading {
        /// The live rail the READ goes on.
        carrier: u8,
        /// Its request.
        id: ReqId,
        /// When it was posted.
        since: u64,
    },
    /// The rail is reset; its probe, a READ over the rail itself, is in flight.
    Probing {
        /// Its request.
        id: ReqId,
        /// When it was posted.
        since: u64,
    },
}

/// The high bits of a READY or JOIN element's `rkey` (`"HEL\0"`).
pub const HEAL_KEY: u32 = 0x4845_4c00;

/// What a control word of the sender's back ring says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctl {
    /// The receiver took the rail out of use (the back notice; a `Notice` element).
    Drop = 0,
    /// The sender reset the rail and waits for the receiver.
    Ready = 1,
    /// The receiver reset the rail, probed it, and posts on it from sequence `at` on.
    Join = 2,
}

/// The back-ring sequence number of control word `kind` for `rail` in generation `gen`: one
/// slot per (rail, kind) for three generations in a row, so words of one round never share a
/// slot, and `idx` (sequence + 1) tells a word of this round from an older one.
pub fn ctl_seq(kind: Ctl, rail: usize, gen: u32) -> u64 {
    rail as u64 + 8 * (3 * u64::from(gen) + kind as u64)
}

/// A READY (`at` 0) or JOIN element of `rail`, generation `gen`.
pub fn encode(kind: Ctl, rail: usize, gen: u32, at: u64) -> PostedRecv {
    PostedRecv {
        addr: at,
        size: u64::from(gen),
        rkey: HEAL_KEY | (kind as u32) << 4 | rail as u32,
        tag: 0,
    }
}

/// The `at` of a READY or JOIN element of `rail`, generation `gen`, checked; `None`: not one.
pub fn decode(e: &PostedRecv, kind: Ctl, rail: usize, gen: u32) -> Option<u64> {
    let key = HEAL_KEY | (kind as u32) << 4 | rail as u32;
    (e.rkey == key && e.size == u64::from(gen) && e.tag == 0).then_some(e.addr)
}
