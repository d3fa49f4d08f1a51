//! Rail notices: how a fused sender tells the receiver that a failed rail's part of a message
//! arrived over another rail.
//!
//! A notice travels as one element of a [`FifoRing`](crate::fifo::FifoRing) slot (the same
//! publication protocol as the clear-to-send FIFO: fields, then `idx`, then a check hash, so a
//! torn element reads as "not yet", never as a notice). The receiver owns the ring; the slot is
//! the message's receive sequence number modulo the ring, the element the failed rail.
//!
//! ```text
//!  element of slot (seq % MAX_REQUESTS):  addr = seq   size = bytes the part carried
//!                                         rkey = NOTICE_KEY | rail   tag = non-empty mask
//! ```
//!
//! `size` is what the receiver adds to the receive's size (a single receive's, or for a
//! multi-receive that of the receive `tag` names); `tag` has bit `i` set when receive `i` of a
//! multi-receive got bytes from the part.

use super::vnic::MAX_DEVS_PER_NIC;
use crate::fifo::PostedRecv;

/// The high bits of a notice element's `rkey` (an element without them is not a notice).
pub const NOTICE_KEY: u32 = 0x4e4f_5400; // "NOT\0"

/// One rail's part of one message, delivered by another rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    /// The message's receive sequence number.
    pub seq: u64,
    /// The failed rail whose part this is.
    pub rail: u8,
    /// Bytes the part carried (single receive).
    pub bytes: u64,
    /// Multi-receive: bit `i` set when receive `i` got bytes from the part.
    pub mask: u32,
}

impl Notice {
    /// As a FIFO element.
    pub fn encode(&self) -> PostedRecv {
        PostedRecv {
            addr: self.seq,
            size: self.bytes,
            rkey: NOTICE_KEY | u32::from(self.rail),
            tag: self.mask,
        }
    }

    /// A FIFO element read from slot `seq`, checked: it names that slot's message and a rail
    /// below `rails`, and carries no more than the receive's `cap` bytes. `None`: a hostile or
    /// corrupt element.
    pub fn decode(e: &PostedRecv, seq: u64, rails: usize, cap: u64) -> Option<Self> {
        let rail = e.rkey.checked_sub(NOTICE_KEY)?;
        if e.rkey & !0xff != NOTICE_KEY
            || rail as usize >= rails.min(MAX_DEVS_PER_NIC)
            || e.addr != seq
            || e.size > cap
        {
            return None;
        }
        Some(Self {
            seq,
            rail: rail as u8,
            bytes: e.size,
            mask: e.tag,
        })
    }
}
