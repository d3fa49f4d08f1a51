//! [`RailSend`]: the send comm of a NIC of 1..=8 rails.

use core::net::SocketAddr;
use core::ops::DerefMut;

use crate::comm::{Done, SendComm, Sink, Truncation};
use crate::fused::{FusedSend, Resilience, Weights};
use crate::provider::{MrKeys, Provider};
use crate::request::ReqId;
use crate::wire::{QpInfo, RailList};
use crate::{Error, Result};

use super::infos::{self, Infos, RailNews, RailStats};
use crate::fused::MAX_DEVS_PER_NIC;
use crate::lifecycle::Lifecycle;

/// The send comm of a NIC: one rail (a [`SendComm`], today's fast path) or several (a
/// [`FusedSend`] in the box `B` the caller allocated, `Box<FusedSend<P>>` say: core never
/// allocates). Every method works for both; see the [module doc](crate::rails).
// The one-rail comm stays inline: the fast path has no indirection (the plugin boxes the
// whole comm once, at connect).
#[allow(clippy::large_enum_variant)]
pub enum RailSend<P: Provider + Clone, B: DerefMut<Target = FusedSend<P>>> {
    /// One rail.
    One(SendComm<P>),
    /// Several rails, striped.
    Striped(B),
}

impl<P: Provider + Clone, B: DerefMut<Target = FusedSend<P>>> RailSend<P, B> {
    /// How many rails.
    pub fn rails(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Striped(f) => f.rails(),
        }
    }

    /// Where the comm is in its life.
    pub fn lifecycle(&self) -> Lifecycle {
        match self {
            Self::One(c) => c.lifecycle(),
            Self::Striped(f) => f.lifecycle(),
        }
    }

    /// Each rail's QP info for the peer and this side's rail list (physical devices `devs`,
    /// rail order; several rails add the back ring and each rail's stripe weight).
    pub fn local_infos(&self, devs: &[u16]) -> (Infos, RailList) {
        match self {
            Self::One(c) => infos::single(devs, c.local_info()),
            Self::Striped(f) => infos::striped(
                devs,
                |i| f.local_info(i),
                &f.back_ring(),
                |i| f.rail_weight(i),
            ),
        }
    }

    /// Connects every rail to the acceptor's (`remote`, rail order; `peer`: its rail list,
    /// with the notice ring and speeds of several rails).
    pub fn connect(&mut self, remote: &[QpInfo], peer: &RailList) -> Result<()> {
        match self {
            Self::One(c) => c.connect(infos::first(remote)?),
            Self::Striped(f) => {
                for (i, info) in remote.iter().enumerate() {
                    f.connect(i, info)?;
                }
                let w = infos::agreed_weights(|i| f.rail_weight(i), peer);
                f.set_rail_weights(&w);
                f.set_notice_ring(&infos::rings(peer))
            }
        }
    }

    /// Sets this side's stripe weights (several rails; nothing for one).
    pub fn set_rail_weights(&mut self, w: &Weights) {
        if let Self::Striped(f) = self {
            f.set_rail_weights(w);
        }
    }

    /// Records the peer's socket address, for error messages (one rail; the rails of several
    /// name none).
    pub fn set_peer_addr(&mut self, a: SocketAddr) {
        if let Self::One(c) = self {
            c.set_peer_addr(a);
        }
    }

    /// Failover and failback (several rails; nothing for one).
    pub fn set_resilience(&mut self, r: Resilience) {
        if let Self::Striped(f) = self {
            f.set_resilience(r);
        }
    }

    /// Profiler events (one rail; several send none).
    pub fn set_events(&mut self, sink: Option<Sink>) {
        if let Self::One(c) = self {
            c.set_events(sink);
        }
    }

    /// Posts a send of `size` bytes at `addr`, tagged `tag`, registered with `keys` (rail
    /// order, at least [`Self::rails`] entries), under NCCL's profiler parent `parent` (one
    /// rail). `Ok(None)`: the receiver has posted no matching receive yet. `now` is the
    /// monotonic clock in ms, read only when a probe delay needs it.
    #[inline(always)]
    pub fn isend(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        keys: &[MrKeys],
        parent: usize,
        now: impl FnOnce() -> u64,
    ) -> Result<Option<ReqId>> {
        match self {
            Self::One(c) => c.isend_under(addr, size, tag, infos::key0(keys)?, parent),
            Self::Striped(f) => {
                if f.wants_clock() {
                    f.tick(now());
                }
                f.isend(addr, size, tag, keys)
            }
        }
    }

    /// Tests request `id` (`now` as for [`Self::isend`]).
    #[inline(always)]
    pub fn test(&mut self, id: ReqId, now: impl FnOnce() -> u64) -> Result<Option<Done>> {
        match self {
            Self::One(c) => c.test(id),
            Self::Striped(f) => {
                if f.wants_clock() {
                    f.tick(now());
                }
                f.test(id)
            }
        }
    }

    /// Later data calls are refused, reported as `e`.
    pub fn fail(&mut self, e: &Error) {
        match self {
            Self::One(c) => c.fail(e),
            Self::Striped(f) => f.fail(e),
        }
    }

    /// Whether [`Self::take_news`] has anything (always false for one rail).
    #[inline(always)]
    pub fn has_rail_news(&self) -> bool {
        match self {
            Self::One(_) => false,
            Self::Striped(f) => f.has_rail_news(),
        }
    }

    /// Rails taken out of use and returned since the last call, for the caller to log.
    pub fn take_news(&mut self) -> RailNews {
        match self {
            Self::One(_) => RailNews::default(),
            Self::Striped(f) => RailNews {
                failed: f.take_events(),
                returned: f.take_returned(),
            },
        }
    }

    /// The comm's first send cut to its receive's size, once.
    #[inline(always)]
    pub fn take_truncation(&mut self) -> Option<Truncation> {
        match self {
            Self::One(c) => c.take_truncation(),
            Self::Striped(f) => f.take_truncation(),
        }
    }

    /// What the rails carried (`None`: one rail, which keeps no such counters).
    pub fn stats(&self) -> Option<RailStats> {
        let Self::Striped(f) = self else { return None };
        let mut s = RailStats {
            rails: f.rails(),
            resent: f.resent_bytes(),
            ..RailStats::default()
        };
        for i in 0..s.rails.min(MAX_DEVS_PER_NIC) {
            s.rail_bytes[i] = f.rail_bytes(i);
            s.live[i] = f.rail_live(i);
        }
        Some(s)
    }

    /// Closes.
    pub fn close(self) -> Result<()> {
        match self {
            Self::One(c) => c.close(),
            Self::Striped(mut f) => f.close_in_place(),
        }
    }
}
