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

/// Each rail's weight in a stripe (rail `i`: entry `i`): its speed, in any unit (only ratios
/// count); a 0 (a speed unknown) anywhere in the set makes the shares equal.
pub type Weights = [u32; MAX_DEVS_PER_NIC];

/// Equal weights: the stripe of [`stripe_set`].
pub const EQUAL_WEIGHTS: Weights = [1; MAX_DEVS_PER_NIC];

/// The parts of a `size`-byte message over the rails of `set` (bit `i`: rail `i`; only the
/// low [`MAX_DEVS_PER_NIC`] bits count, an empty set is rail 0): the `j`-th rail of the set
/// takes `[j·c, (j+1)·c)` clipped to the message, with `c = ⌈⌈size / |set|⌉ / 128⌉ · 128`;
/// rails outside the set get nothing. (Equal shares: [`stripe_weighted`] with equal weights.)
pub fn stripe_set(size: u64, set: u8) -> [Part; MAX_DEVS_PER_NIC] {
    stripe_weighted(size, set, &EQUAL_WEIGHTS)
}

/// The parts of a `size`-byte message over the rails of `set` (as [`stripe_set`]), each
/// rail's share proportional to its weight in `w`: the `j`-th rail of the set ends at
/// `size · (w₀ + … + w_j) / W` rounded to a multiple of 128 (the last at `size`), `W` the set's
/// total weight, so every part but the last is a multiple of 128 long and a small message may
/// leave a light rail empty. When the set's weights are all equal, or one is 0 (unknown),
/// this is [`stripe_set`]'s equal cut exactly. Both ends of a fused comm cut a message with
/// this, from the set the sender striped it over (see `crate::fused`: the receiver's
/// live-rail mask, less the rails the sender knows are dead) and the weights both agreed on
/// in the handshake.
pub fn stripe_weighted(size: u64, set: u8, w: &Weights) -> [Part; MAX_DEVS_PER_NIC] {
    let all = ((1u16 << MAX_DEVS_PER_NIC) - 1) as u8;
    let set = match set & all {
        0 => 1,
        s => s,
    };
    let size = size.min(MAX_MSG_SIZE);
    let in_set = |i: &usize| set >> i & 1 == 1;
    let first = w[set.trailing_zeros() as usize];
    let mut ws = (0..MAX_DEVS_PER_NIC).filter(in_set).map(|i| w[i]);
    if ws.clone().all(|x| x == first) || ws.any(|x| x == 0) {
        return stripe_equal(size, set);
    }
    let total: u128 = (0..MAX_DEVS_PER_NIC)
        .filter(in_set)
        .map(|i| u128::from(w[i]))
        .sum();
    let mut out = [Part::default(); MAX_DEVS_PER_NIC];
    let (mut cum, mut prev) = (0u128, 0u64);
    let last = (u8::BITS - 1 - set.leading_zeros()) as usize;
    for i in (0..MAX_DEVS_PER_NIC).filter(in_set) {
        cum += u128::from(w[i]);
        let end = if i == last {
            size
        } else {
            // ≤ size < 2³¹ (the quotient), so the casts and the rounding stay in range.
            let x = (u128::from(size) * cum / total) as u64;
            ((x + STRIPE_ALIGN / 2) / STRIPE_ALIGN * STRIPE_ALIGN).clamp(prev, size)
        };
        out[i] = Part {
            off: prev,
            len: end - prev,
        };
        prev = end;
    }
    out
}

/// [`stripe_set`]'s equal cut of a `size`-byte message (at most [`MAX_MSG_SIZE`]) over the
/// non-empty `set`.
fn stripe_equal(size: u64, set: u8) -> [Part; MAX_DEVS_PER_NIC] {
    let mut out = [Part::default(); MAX_DEVS_PER_NIC];
    let r = u64::from(set.count_ones());
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
