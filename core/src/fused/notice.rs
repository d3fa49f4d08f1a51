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
//! `size` is what the receiver adds to the receive's size; `tag` has bit 0 set when the part
//! carried bytes. This is a single receive's notice: a multi-receive's is a [`GroupNotice`]
//! (one element per receive), told apart by its key.

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

/// The high bits of a multi-receive notice element's `rkey` (`"NOM\0"`; a peer that predates
/// multi-receive failover decodes it as no [`Notice`] and fails the comm cleanly, as it did).
pub const GROUP_NOTICE_KEY: u32 = 0x4e4f_4d00;

/// The failed rails' parts of every send of one multi-receive, delivered by other rails.
///
/// A multi-receive's rail completes all of its receives at once (one write-with-immediate
/// and one sizes FIFO row per rail), so the notice names rails for the whole group: the slot
/// holds one element per receive, each naming the same rails and its send's whole size, from
/// which the receiver cuts each rail's part with the stripe both sides use.
///
/// ```text
///  element i of slot (seq % MAX_REQUESTS):  addr = seq   size = send i's bytes (all rails)
///                                           rkey = GROUP_NOTICE_KEY | rails   tag = i
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupNotice {
    /// The multi-receive's sequence number.
    pub seq: u64,
    /// Bit `r` set: rail `r`'s part of every send of the group arrived over another rail.
    pub rails: u8,
    /// The receive this element describes.
    pub index: u8,
    /// The bytes its send carried, over all rails.
    pub size: u64,
}

impl GroupNotice {
    /// As a FIFO element.
    pub fn encode(&self) -> PostedRecv {
        PostedRecv {
            addr: self.seq,
            size: self.size,
            rkey: GROUP_NOTICE_KEY | u32::from(self.rails),
            tag: u32::from(self.index),
        }
    }

    /// Element `index` read from slot `seq`, checked: it names that slot and receive, a
    /// non-empty set of rails below `rails`, and no more than the receive's `cap` bytes.
    /// `None`: a hostile or corrupt element.
    pub fn decode(e: &PostedRecv, seq: u64, index: usize, rails: usize, cap: u64) -> Option<Self> {
        let set = e.rkey.checked_sub(GROUP_NOTICE_KEY)?;
        let all = (1u32 << rails.min(MAX_DEVS_PER_NIC)) - 1;
        if e.rkey & !0xff != GROUP_NOTICE_KEY
            || set == 0
            || set & !all != 0
            || e.addr != seq
            || e.tag as usize != index
            || e.size > cap
        {
            return None;
        }
        Some(Self {
            seq,
            rails: set as u8,
            index: index as u8,
            size: e.size,
        })
    }
}
