//! [`RailRecv`]: the receive comm of a NIC of 1..=8 rails.

use core::net::SocketAddr;
use core::ops::DerefMut;

use crate::comm::{Done, RecvComm, Sink};
use crate::fused::{FusedRecv, Resilience, Weights};
use crate::provider::Provider;
use crate::request::ReqId;
use crate::wire::RailList;
use crate::{Error, Result};

use super::infos::{self, Infos, RailNews, RailStats};
use crate::fused::{FusedBuf as RailBuf, MAX_DEVS_PER_NIC};
use crate::lifecycle::Lifecycle;

/// The receive comm of a NIC: one rail (a [`RecvComm`], today's fast path) or several (a
/// [`FusedRecv`] in the box `B` the caller allocated). Every method works for both; see the
/// [module doc](crate::rails).
// The one-rail comm stays inline: the fast path has no indirection (the plugin boxes the
// whole comm once, at connect).
#[allow(clippy::large_enum_variant)]
pub enum RailRecv<P: Provider + Clone, B: DerefMut<Target = FusedRecv<P>>> {
    /// One rail.
    One(RecvComm<P>),
    /// Several rails, striped.
    Striped(B),
}

impl<P: Provider + Clone, B: DerefMut<Target = FusedRecv<P>>> RailRecv<P, B> {
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

    /// Joins the sender's rails (several rails; nothing for one): its back ring and speeds
    /// from its rail list `peer`, with this side's speeds `local` giving the stripe weights
    /// both ends use ([`infos::agreed_weights`]), which this side's rail list then announces.
    pub fn join(&mut self, peer: &RailList, local: &Weights) -> Result<()> {
        let Self::Striped(f) = self else {
            return Ok(());
        };
        f.set_back_ring(&infos::rings(peer))?;
        f.set_rail_weights(&infos::agreed_weights(|i| local[i], peer));
        Ok(())
    }

    /// Each rail's QP info for the peer and this side's rail list (physical devices `devs`,
    /// rail order; several rails add the notice ring and each rail's stripe weight).
    pub fn local_infos(&self, devs: &[u16]) -> (Infos, RailList) {
        match self {
            Self::One(c) => infos::single(devs, c.local_info()),
            Self::Striped(f) => infos::striped(
                devs,
                |i| f.local_info(i),
                &f.notice_ring(),
                |i| f.rail_weight(i),
            ),
        }
    }

    /// Records the peer's socket address, for error messages (one rail).
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

    /// Posts the receives `bufs` (their keys on every rail), under NCCL's profiler parents
    /// `parents` (one per buffer; one rail). `now` is the monotonic clock in ms, read only
    /// when a probe delay needs it.
    #[inline(always)]
    pub fn irecv(
        &mut self,
        bufs: &[RailBuf],
        parents: &[usize],
        now: impl FnOnce() -> u64,
    ) -> Result<Option<ReqId>> {
        match self {
            Self::One(c) => c.irecv_under(bufs, parents),
            Self::Striped(f) => {
                if f.wants_clock() {
                    f.tick(now());
                }
                f.irecv(bufs)
            }
        }
    }

    /// Flushes the receives `bufs` (GPU-direct's RDMA READ; `Ok(None)`: nothing to flush).
    pub fn iflush(&mut self, bufs: &[RailBuf]) -> Result<Option<ReqId>> {
        match self {
            Self::One(c) => c.iflush(bufs),
            Self::Striped(f) => f.iflush(bufs),
        }
    }

    /// Tests request `id` (`now` as for [`Self::irecv`]).
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

    /// Which rails are in use (`None`: one rail).
    pub fn stats(&self) -> Option<RailStats> {
        let Self::Striped(f) = self else { return None };
        let mut s = RailStats {
            rails: f.rails(),
            ..RailStats::default()
        };
        for i in 0..s.rails.min(MAX_DEVS_PER_NIC) {
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
