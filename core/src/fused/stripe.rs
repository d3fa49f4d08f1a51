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
/// empty. Entries past `rails` are empty. (The stripe over rails `0..rails`:
/// [`stripe_set`]`(size, (1 << rails) - 1)`.)
pub fn stripe(size: u64, rails: usize) -> [Part; MAX_DEVS_PER_NIC] {
    let r = rails.clamp(1, MAX_DEVS_PER_NIC);
    stripe_set(size, ((1u16 << r) - 1) as u8)
}

/// The parts of a `size`-byte message over the rails of `set` (bit `i`: rail `i`; only the
/// low [`MAX_DEVS_PER_NIC`] bits count, an empty set is rail 0): the `j`-th rail of the set
/// takes `[j·c, (j+1)·c)` clipped to the message, with `c = ⌈⌈size / |set|⌉ / 128⌉ · 128`;
/// rails outside the set get nothing. Both ends of a fused comm cut a message with this, from
/// the set the sender striped it over (see `crate::fused`: the receiver's live-rail mask, less
/// the rails the sender knows are dead).
pub fn stripe_set(size: u64, set: u8) -> [Part; MAX_DEVS_PER_NIC] {
    let mut out = [Part::default(); MAX_DEVS_PER_NIC];
    let all = ((1u16 << MAX_DEVS_PER_NIC) - 1) as u8;
    let set = match set & all {
        0 => 1,
        s => s,
    };
    let r = u64::from(set.count_ones());
    let size = size.min(MAX_MSG_SIZE);
    let chunk = size.div_ceil(r).div_ceil(STRIPE_ALIGN) * STRIPE_ALIGN;
    let rails = out
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| set >> i & 1 == 1);
    for (j, (_, p)) in rails.enumerate() {
        let off = (j as u64 * chunk).min(size);
        *p = Part {
            off,
            len: (size - off).min(chunk),
        };
    }
    out
}
