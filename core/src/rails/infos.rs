//! What the two ends of a comm tell each other about its rails (QP infos, rail lists, stripe
//! weights), and what a comm tells its caller about them (rails failed and returned): pure
//! functions of their inputs.

use heapless::Vec;

use crate::fused::{RailEvent, Weights};
use crate::provider::MrKeys;
use crate::wire::{QpInfo, RailInfo, RailList, RemoteBuf};
use crate::{Error, Result};

use crate::fused::MAX_DEVS_PER_NIC;

/// QP infos of a comm's rails, rail order.
pub type Infos = Vec<QpInfo, MAX_DEVS_PER_NIC>;

/// Rails taken out of use and rails returned to striping since the caller last asked (a
/// comm of several rails; always empty for one).
#[derive(Debug, Default)]
pub struct RailNews {
    /// Rails taken out of use: which, why, where their traffic went.
    pub failed: Vec<RailEvent, MAX_DEVS_PER_NIC>,
    /// Rails that returned to striping (failback).
    pub returned: Vec<u8, MAX_DEVS_PER_NIC>,
}

/// A one-rail comm's infos: its QP `info`, on the first device of `devs`.
pub(super) fn single(devs: &[u16], info: QpInfo) -> (Infos, RailList) {
    let mut v = Infos::new();
    // Cannot fail: capacity ≥ 1.
    let _ = v.push(info);
    (v, RailList::single(devs.first().copied().unwrap_or(0)))
}

/// A comm of several rails: `info(i)` per rail of `devs`, and the rail list with `ring` (the
/// comm's notice or back ring as each rail reaches it) and the stripe weight `weight(i)`.
pub(super) fn striped(
    devs: &[u16],
    info: impl Fn(usize) -> Option<QpInfo>,
    ring: &[RemoteBuf],
    weight: impl Fn(usize) -> u32,
) -> (Infos, RailList) {
    let mut v = Infos::new();
    let mut l = RailList::default();
    for (i, (&d, r)) in devs.iter().zip(ring).enumerate() {
        if let Some(q) = info(i) {
            // Cannot fail: at most MAX_DEVS_PER_NIC rails.
            let _ = v.push(q);
            let _ = l.0.push(RailInfo {
                dev: d,
                ring: Some(*r),
                speed: u16::try_from(weight(i)).unwrap_or(u16::MAX),
            });
        }
    }
    (v, l)
}

/// A rail's stripe weight from its port speed in Mb/s: units of 100 Mb/s, as the rail list
/// carries it (0: unknown; at least 1 for any known speed, at most `u16::MAX`).
pub fn speed_units(mbps: i32) -> u32 {
    match u32::try_from(mbps) {
        Ok(m) if m > 0 => m.div_ceil(100).min(u32::from(u16::MAX)),
        _ => 0,
    }
}

/// The stripe weights both ends of a comm use: per rail, the smaller of this side's
/// (`local(i)`) and the peer's speed from its rail list, so both compute the same (a 0, an
/// unknown speed, makes the shares equal).
pub fn agreed_weights(local: impl Fn(usize) -> u32, peer: &RailList) -> Weights {
    let mut w = [0; MAX_DEVS_PER_NIC];
    for (i, (d, r)) in w.iter_mut().zip(&peer.0).enumerate() {
        *d = local(i).min(u32::from(r.speed));
    }
    w
}

/// The rings a peer's rail list names, rail order (a ring missing from the list of a comm of
/// several rails was refused by the handshake).
pub fn rings(peer: &RailList) -> Vec<RemoteBuf, MAX_DEVS_PER_NIC> {
    peer.0.iter().map(|r| r.ring.unwrap_or_default()).collect()
}

/// The only rail's info of a one-rail comm.
pub(super) fn first(infos: &[QpInfo]) -> Result<&QpInfo> {
    infos.first().ok_or(Error::Missing {
        what: "the peer's QP info",
    })
}

/// Rail 0's keys of a registration.
#[inline(always)]
pub(super) fn key0(keys: &[MrKeys]) -> Result<MrKeys> {
    keys.first().copied().ok_or(Error::Missing {
        what: "the buffer's registration keys",
    })
}

/// A registration's keys on each rail of a NIC, rail order (entries past the rail count are
/// unused).
pub type RailKeys = [MrKeys; MAX_DEVS_PER_NIC];

/// What a comm's rails did, for tests and tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RailStats {
    /// Rails of the comm.
    pub rails: usize,
    /// Bytes each rail carried (sender of a comm of several rails; 0 otherwise).
    pub rail_bytes: [u64; MAX_DEVS_PER_NIC],
    /// Whether each rail is still in use.
    pub live: [bool; MAX_DEVS_PER_NIC],
    /// Bytes written again on another rail after their rail failed (sender).
    pub resent: u64,
}
