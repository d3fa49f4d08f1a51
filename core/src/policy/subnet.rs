//! Subnet-aware routing, as NCCL 2.30 decides it (`NCCL_IB_SUBNET_AWARE_ROUTING`,
//! `NCCL_IB_SUBNET_PREFIX_LEN`), for RoCE fabrics where each NIC of a host sits on its own
//! subnet and only same-subnet NICs reach each other (multi-subnet direct-connect):
//!
//! ```text
//!  listen(dev)   the handle carries the GIDs of dev's first HANDLE_GIDS RoCE rails
//!                (listen_gids; InfiniBand rails are skipped; a free slot is all zeros)
//!  connect(dev)  no valid GID in the handle                    → dev (IB, routing off there)
//!                every RoCE rail of dev on a peer's subnet      → dev (a fused NIC stays fused)
//!                else the first other device, in device order, every RoCE rail of which
//!                  is on a peer's subnet                        → that device (one INFO)
//!                none                                          → dev (NCCL's fallback)
//! ```
//! "On a peer's subnet" ([`same_subnet`]): both GIDs of one family; IPv4-mapped GIDs
//! (`::ffff:a.b.c.d`) agree in their first `NCCL_IB_SUBNET_PREFIX_LEN` bits (1..=32, default
//! 24); IPv6 GIDs agree in their 64-bit subnet prefix (the prefix length does not apply). A
//! device with no RoCE rail (or whose rails' GIDs could not be read) never matches; an invalid
//! local GID (zero, link-local) is a rail that does not match.
//!
//! Validity and family are [`super::gid`]'s ([`valid`], [`family_of`]), the rules ibnet's GID
//! selection uses.

use super::gid::{family_of, valid};
use crate::params::AddrFamily;
use crate::verbs::{Gid, LinkLayer};
use crate::wire::HANDLE_GIDS;

/// Smallest `NCCL_IB_SUBNET_PREFIX_LEN` (NCCL's range is 1..=32).
pub const PREFIX_LEN_MIN: u8 = 1;
/// Largest `NCCL_IB_SUBNET_PREFIX_LEN`.
pub const PREFIX_LEN_MAX: u8 = 32;

/// One rail of a device as routing sees it: its link layer and the GID it would use now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rail {
    /// The port's link layer (only RoCE rails take part).
    pub link_layer: LinkLayer,
    /// The GID chosen for new connections.
    pub gid: Gid,
}

/// Where [`choose`] sends a connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The device NCCL asked for.
    Asked,
    /// Another device (its number), on the peer's subnet where the asked one is not.
    Other(usize),
}

/// The handle's GIDs for a listener whose device has `rails` (rail order): the GIDs of the
/// first [`HANDLE_GIDS`] RoCE rails, the remaining slots zero.
pub fn listen_gids(rails: impl IntoIterator<Item = Rail>) -> [Gid; HANDLE_GIDS] {
    let mut out = [Gid::default(); HANDLE_GIDS];
    let roce = rails
        .into_iter()
        .filter(|r| r.link_layer == LinkLayer::Ethernet);
    for (slot, r) in out.iter_mut().zip(roce) {
        *slot = r.gid;
    }
    out
}

/// Whether `a` and `b` are on one subnet: same family; IPv4-mapped: the first `prefix_len`
/// bits (clamped to 1..=32) of the IPv4 address agree; IPv6: the 64-bit subnet prefixes agree.
pub fn same_subnet(a: &Gid, b: &Gid, prefix_len: u8) -> bool {
    let fam = family_of(&a.0);
    if fam != family_of(&b.0) {
        return false;
    }
    match fam {
        AddrFamily::Inet => {
            let ip = |g: &Gid| u32::from_be_bytes([g.0[12], g.0[13], g.0[14], g.0[15]]);
            let n = u32::from(prefix_len.clamp(PREFIX_LEN_MIN, PREFIX_LEN_MAX));
            let mask = u32::MAX << (32 - n);
            ip(a) & mask == ip(b) & mask
        }
        AddrFamily::Inet6 => a.0[..8] == b.0[..8],
    }
}

/// Whether the valid local GID `local` is on the subnet of a valid GID of `remote`.
fn reaches_any(local: &Gid, remote: &[Gid], prefix_len: u8) -> bool {
    valid(&local.0)
        && remote
            .iter()
            .any(|r| valid(&r.0) && same_subnet(local, r, prefix_len))
}

/// Whether a device whose rails are `rails` reaches the peer that advertised `remote`: it has
/// at least one RoCE rail and every RoCE rail is on a subnet of `remote` (NCCL spreads a
/// comm's QPs over all rails, so one rail off the subnet would leave QPs without a path).
pub fn reaches(rails: &[Rail], remote: &[Gid], prefix_len: u8) -> bool {
    let mut roce = rails
        .iter()
        .filter(|r| r.link_layer == LinkLayer::Ethernet)
        .peekable();
    roce.peek().is_some() && roce.all(|r| reaches_any(&r.gid, remote, prefix_len))
}

/// The device a connect to the listener that advertised `remote` uses, NCCL asking for
/// `asked`; `devices[i]` holds device `i`'s rails (see the module doc for the rule).
pub fn choose<D: AsRef<[Rail]>>(
    remote: &[Gid],
    prefix_len: u8,
    asked: usize,
    devices: &[D],
) -> Route {
    if !remote.iter().any(|g| valid(&g.0)) {
        return Route::Asked;
    }
    let ok = |d: &D| reaches(d.as_ref(), remote, prefix_len);
    if devices.get(asked).is_some_and(ok) {
        return Route::Asked;
    }
    devices
        .iter()
        .enumerate()
        .find(|&(i, d)| i != asked && ok(d))
        .map_or(Route::Asked, |(i, _)| Route::Other(i))
}

#[cfg(test)]
mod tests;
