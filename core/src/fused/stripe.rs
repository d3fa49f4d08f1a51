//! How one message is cut across the rails of a fused comm.

use super::vnic::MAX_DEVS_PER_NIC;
use crate::comm::MAX_MSG_SIZE;

/// Rail parts are multiples of this many bytes (but the last), so LL/LL128 lines stay whole
/// (the same alignment as a message split over QPs).
pub const STRIPE_ALIGN: u64 = 128;

/// One rail's part of a message: `len` bytes at offset `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Part {
    /// Offset in the message (and in the receive buffer).
    pub off: u64,
    /// Length (0: the rail carries only its completion).
    pub len: u64,
}

/// The parts of a `size`-byte message over `rails` rails (1..=[`MAX_DEVS_PER_NIC`]): rail `i`
/// takes `[i·c, (i+1)·c)` clipped to the message, with `c = ⌈⌈size / rails⌉ / 128⌉ · 128`.
/// The parts are disjoint and cover the message exactly; a small message leaves the last rails
/// empty. Entries past `rails` are empty.
pub fn stripe(size: u64, rails: usize) -> [Part; MAX_DEVS_PER_NIC] {
    let mut out = [Part::default(); MAX_DEVS_PER_NIC];
    let r = rails.clamp(1, MAX_DEVS_PER_NIC) as u64;
    let size = size.min(MAX_MSG_SIZE);
    let chunk = size.div_ceil(r).div_ceil(STRIPE_ALIGN) * STRIPE_ALIGN;
    for (i, p) in out.iter_mut().enumerate().take(r as usize) {
        let off = (i as u64 * chunk).min(size);
        *p = Part {
            off,
            len: (size - off).min(chunk),
        };
    }
    out
}
