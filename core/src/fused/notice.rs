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
//! `size` is what the receiver adds to the receive's size (the part as the sender's stripe cut
//! it: 0 for a rail the sender knew was dead before it posted the message, so it striped the
//! message over the others); `tag` has bit 0 set when the part carried bytes. This is a single
//! receive's notice: a multi-receive's is a [`GroupNotice`] (one element per receive), told
//! apart by its key. The same element, in slot `r` of the sender's back ring, is the receiver's
//! back notice that it took rail `r` out of use (`seq` 0, no bytes).

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

/// The failed rails' parts of every send of one multi-receive, delivered by other rails (or,
/// for a rail the sender knew was dead before it posted the send, by none: the part is empty).
///
/// A multi-receive's rail completes all of its receives at once (one write-with-immediate
/// and one sizes FIFO row per rail), so the notice names rails for the whole group: the slot
/// holds one element per receive, each naming the same rails, its send's whole size and the
/// rails that send was striped over, from which the receiver cuts each rail's part with
/// [`stripe_set`](super::stripe_set), as the sender did.
///
/// ```text
///  element i of slot (seq % MAX_REQUESTS):  addr = seq   size = send i's bytes (all rails)
///                                           rkey = GROUP_NOTICE_KEY | rails
///                                           tag  = i | stripe << 8
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
    /// The rails its send was striped over (bit `r`: rail `r`).
    pub stripe: u8,
}

impl GroupNotice {
    /// As a FIFO element.
    pub fn encode(&self) -> PostedRecv {
        PostedRecv {
            addr: self.seq,
            size: self.size,
            rkey: GROUP_NOTICE_KEY | u32::from(self.rails),
            tag: u32::from(self.index) | u32::from(self.stripe) << 8,
        }
    }

    /// Element `index` read from slot `seq`, checked against the receive: it names that slot
    /// and receive, a non-empty set of rails and a non-empty stripe both inside `posted` (the
    /// live-rail mask the receive was posted with), and no more than the receive's `cap`
    /// bytes. `None`: a hostile or corrupt element.
    pub fn decode(e: &PostedRecv, seq: u64, index: usize, posted: u8, cap: u64) -> Option<Self> {
        let set = e.rkey.checked_sub(GROUP_NOTICE_KEY)?;
        let stripe = e.tag >> 8;
        let outside = |m: u32| m == 0 || m & !u32::from(posted) != 0;
        if e.rkey & !0xff != GROUP_NOTICE_KEY
            || outside(set)
            || outside(stripe)
            || e.addr != seq
            || e.tag & 0xff != index as u32
            || e.size > cap
        {
            return None;
        }
        Some(Self {
            seq,
            rails: set as u8,
            index: index as u8,
            size: e.size,
            stripe: stripe as u8,
        })
    }
}
