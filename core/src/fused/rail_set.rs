//! The per-rail bookkeeping both directions of a fused comm share ([`RailSet`]): the rails'
//! comms, which of them are in use, the rail news for the caller (failures, returns), the
//! resilience settings and the caller's clock, the stripe weights, the registrations of the
//! two rings on every rail, and the comm's stored [`Lifecycle`].

use core::ops::{Index, IndexMut};
use core::ptr::addr_of_mut;

use heapless::Vec;

use super::event::RailEvent;
use super::resilience::Resilience;
use super::stripe::{Weights, EQUAL_WEIGHTS};
use super::vnic::MAX_DEVS_PER_NIC;
use crate::comm::{RecvComm, SendComm};
use crate::error::{Error, Result};
use crate::lifecycle::Lifecycle;
use crate::provider::{Access, MrKeys, Provider, RegKind};

const N: usize = MAX_DEVS_PER_NIC;

/// A rail's comm, as a [`RailSet`] needs it: [`SendComm`] at the sender, [`RecvComm`] at
/// the receiver.
pub(super) trait Rail {
    /// The rail's own lifecycle (`Connecting` until its QPs are connected).
    fn lifecycle(&self) -> Lifecycle;
    /// Applies every completion already in the rail's queue.
    fn drain(&mut self) -> Result<()>;
    /// Closes the rail's comm.
    fn close(self) -> Result<()>;
}

impl<P: Provider> Rail for SendComm<P> {
    fn lifecycle(&self) -> Lifecycle {
        SendComm::lifecycle(self)
    }
    fn drain(&mut self) -> Result<()> {
        SendComm::drain(self)
    }
    fn close(self) -> Result<()> {
        SendComm::close(self)
    }
}

impl<P: Provider> Rail for RecvComm<P> {
    fn lifecycle(&self) -> Lifecycle {
        RecvComm::lifecycle(self)
    }
    fn drain(&mut self) -> Result<()> {
        RecvComm::drain(self)
    }
    fn close(self) -> Result<()> {
        RecvComm::close(self)
    }
}

/// The rails of one side of a fused comm and what it keeps per rail for either direction.
///
/// Its lifecycle is stored and moved by the comm's code: `Connecting` until every rail is
/// connected ([`Self::connected`]), then `Ready`; `RailDegraded` while a rail is out of use
/// ([`Self::take_out`]), `Ready` again once failback returned every rail
/// ([`Self::bring_back`]); `Failed(kind)` at the comm's first failure ([`Self::poison`]),
/// for good.
pub(super) struct RailSet<P: Provider, C> {
    /// Registrations of the notice ring (the sender's stage, the receiver's ring) on each
    /// rail, then of the back ring (the sender's ring, the receiver's stage).
    notice_mrs: Vec<(P, P::Mr), N>,
    back_mrs: Vec<(P, P::Mr), N>,
    /// The keys of those registrations, per rail.
    pub(super) notice_keys: [MrKeys; N],
    pub(super) back_keys: [MrKeys; N],
    comms: Vec<C, N>,
    /// Rails in use here.
    live: [bool; N],
    /// Rails whose own comm failed here (drained once; cleared when the rail returns).
    pub(super) broken: [bool; N],
    life: Lifecycle,
    /// Rails taken out of use since `take_events`, and returned since `take_returned`.
    events: Vec<RailEvent, N>,
    returned: Vec<u8, N>,
    /// Failover settings (`NCCL_IB_RESILIENCY_PORT_FAILOVER*`).
    pub(super) res: Resilience,
    /// The caller's clock, ms (`tick`).
    pub(super) now: u64,
    /// Each rail's stripe weight (`set_rail_weights`; both ends hold the same).
    pub(super) weights: Weights,
    /// Failback (`crate::fused::heal`), per rail: its generation (returns so far), when it
    /// may be tried next, and failed attempts in a row.
    pub(super) gen: [u32; N],
    pub(super) retry_at: [u64; N],
    pub(super) tries: [u32; N],
}

impl<P: Provider, C: Rail> RailSet<P, C> {
    /// Writes a set of no rail yet, connecting, at `p`, field by field (the rails' vector
    /// is large: it never passes through the stack).
    ///
    /// # Safety
    /// `p` is valid for writes and aligned for one `Self`; what it held is overwritten
    /// without being dropped.
    #[allow(unsafe_code)]
    pub(super) unsafe fn write_new(p: *mut Self) {
        // SAFETY: the caller's contract: `p` is valid and aligned for one `Self`; each field
        // is written exactly once through a raw field pointer, never read.
        unsafe {
            addr_of_mut!((*p).notice_mrs).write(Vec::new());
            addr_of_mut!((*p).back_mrs).write(Vec::new());
            addr_of_mut!((*p).notice_keys).write([MrKeys::default(); N]);
            addr_of_mut!((*p).back_keys).write([MrKeys::default(); N]);
            addr_of_mut!((*p).comms).write(Vec::new());
            addr_of_mut!((*p).live).write([false; N]);
            addr_of_mut!((*p).broken).write([false; N]);
            addr_of_mut!((*p).life).write(Lifecycle::Connecting);
            addr_of_mut!((*p).events).write(Vec::new());
            addr_of_mut!((*p).returned).write(Vec::new());
            addr_of_mut!((*p).res).write(Resilience::default());
            addr_of_mut!((*p).now).write(0);
            addr_of_mut!((*p).weights).write(EQUAL_WEIGHTS);
            addr_of_mut!((*p).gen).write([0; N]);
            addr_of_mut!((*p).retry_at).write([0; N]);
            addr_of_mut!((*p).tries).write([0; N]);
        }
        // Every field written above: this pattern names them all, so a new field that the
        // writes above miss does not compile.
        let _ = |s: &Self| {
            let Self {
                notice_mrs: _,
                back_mrs: _,
                notice_keys: _,
                back_keys: _,
                comms: _,
                live: _,
                broken: _,
                life: _,
                events: _,
                returned: _,
                res: _,
                now: _,
                weights: _,
                gen: _,
                retry_at: _,
                tries: _,
            } = s;
        };
    }

    /// Adds a rail, in use (at most N: `init` checks the count first).
    pub(super) fn push(&mut self, c: C) {
        self.live[self.comms.len()] = true;
        // Cannot fail: at most N rails (checked by the comm's `init`).
        let _ = self.comms.push(c);
    }

    /// Registers the notice ring at `notice` and the back ring at `back` (`bytes` each) on
    /// every rail's device in `devs`, with the access each names.
    pub(super) fn register(
        &mut self,
        devs: &[P],
        bytes: u64,
        notice: (u64, Access),
        back: (u64, Access),
    ) -> Result<()>
    where
        P: Clone,
    {
        for (i, d) in devs.iter().enumerate() {
            let mr = d.reg_mr(notice.0, bytes, notice.1, RegKind::Plain)?;
            self.notice_keys[i] = d.mr_keys(&mr);
            // Cannot fail: one entry per rail.
            let _ = self.notice_mrs.push((d.clone(), mr));
            let mr = d.reg_mr(back.0, bytes, back.1, RegKind::Plain)?;
            self.back_keys[i] = d.mr_keys(&mr);
            // Cannot fail: one entry per rail.
            let _ = self.back_mrs.push((d.clone(), mr));
        }
        Ok(())
    }

    /// How many rails.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.comms.len()
    }

    /// Rail `i`'s comm, if there is one.
    pub(super) fn get(&self, i: usize) -> Option<&C> {
        self.comms.get(i)
    }

    /// Rail `i`'s comm, mutable, if there is one.
    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut C> {
        self.comms.get_mut(i)
    }

    /// Whether rail `i` is in use (`false` past the rails).
    #[inline]
    pub(super) fn live(&self, i: usize) -> bool {
        self.live.get(i).copied().unwrap_or(false)
    }

    /// The first rail in use.
    pub(super) fn first_live(&self) -> Option<usize> {
        (0..self.comms.len()).find(|&i| self.live[i])
    }

    /// The rails in use, as a mask (bit `i`: rail `i`).
    pub(super) fn live_mask(&self) -> u8 {
        (0..self.comms.len())
            .filter(|&i| self.live[i])
            .fold(0, |m, i| m | 1 << i)
    }

    /// Where the comm is in its life (stored: see [`RailSet`]).
    #[inline]
    pub(super) fn lifecycle(&self) -> Lifecycle {
        self.life
    }

    /// Every rail's QPs may have connected: once none is connecting, the comm is `Ready`
    /// (`RailDegraded` with a rail out of use already).
    pub(super) fn connected(&mut self) {
        if self.life == Lifecycle::Connecting
            && self
                .comms
                .iter()
                .all(|c| c.lifecycle() != Lifecycle::Connecting)
        {
            self.life = self.use_state();
        }
    }

    /// `Ready` with every rail in use, `RailDegraded` otherwise.
    fn use_state(&self) -> Lifecycle {
        if self.live[..self.comms.len()].iter().all(|&l| l) {
            Lifecycle::Ready
        } else {
            Lifecycle::RailDegraded
        }
    }

    /// Takes rail `i` out of use after `e` and reports it (a [`RailEvent`] naming the first
    /// rail left in use, which is returned; `None`: none left).
    pub(super) fn take_out(&mut self, i: usize, e: Error) -> Option<usize> {
        self.live[i] = false;
        if self.life == Lifecycle::Ready {
            self.life = Lifecycle::RailDegraded;
        }
        let to = self.first_live();
        // Cannot fail: each rail is reported once per time out of use, and taken per call.
        let _ = self.events.push(RailEvent {
            rail: i as u8,
            error: e,
            to: to.map(|t| t as u8),
        });
        to
    }

    /// Rail `i`'s own comm failed with `e`. Where failover is off, or `e` is a failure no
    /// other rail can mend (a bug, a hostile peer), the comm fails with `e` (returned).
    /// Otherwise `Ok(true)` the first time: the rail is broken, and its completion queue
    /// drained (every completion already there applied; a rail whose CQ cannot be read, a
    /// fatal device event, says no more); `Ok(false)` for a rail broken already.
    pub(super) fn break_rail(&mut self, i: usize, e: Error) -> Result<bool> {
        if !self.res.fails_over(&e) {
            return Err(self.poison(e));
        }
        if self.broken[i] {
            return Ok(false);
        }
        self.broken[i] = true;
        let _ = self.comms[i].drain();
        Ok(true)
    }

    /// [`Self::take_out`], and with no rail left in use the comm fails with `e` (returned).
    pub(super) fn drop_out(&mut self, i: usize, e: Error) -> Result<()> {
        match self.take_out(i, e) {
            Some(_) => Ok(()),
            None => Err(self.poison(e)),
        }
    }

    /// Rail `i` returned (failback): in use again, no longer broken, its failed attempts
    /// forgotten, reported once; the comm is `Ready` again once every rail is back.
    pub(super) fn bring_back(&mut self, i: usize) {
        self.live[i] = true;
        self.broken[i] = false;
        self.tries[i] = 0;
        if self.life == Lifecycle::RailDegraded {
            self.life = self.use_state();
        }
        // Cannot fail: a rail returns once per generation, and is taken once per call.
        let _ = self.returned.push(i as u8);
    }

    /// Rail `i`'s next return attempt waits the start delay from now.
    pub(super) fn retry_later(&mut self, i: usize) {
        self.retry_at[i] = self.now.saturating_add(self.res.start_delay_ms);
    }

    /// A return attempt of rail `i` failed: one more in a row, the next after the start
    /// delay.
    pub(super) fn attempt_failed(&mut self, i: usize) {
        self.tries[i] += 1;
        self.retry_later(i);
    }

    /// Whether rail `i` failed as many return attempts in a row as it may
    /// ([`Resilience::attempts_max`]).
    pub(super) fn gave_up(&self, i: usize) -> bool {
        self.tries[i] >= self.res.attempts_max
    }

    /// The comm fails with `e` (the first failure's kind stays): returns `e`.
    pub(super) fn poison(&mut self, e: Error) -> Error {
        self.fail(&e);
        e
    }

    /// The comm failed with `e`, unless it failed already.
    pub(super) fn fail(&mut self, e: &Error) {
        if !matches!(self.life, Lifecycle::Failed(_)) {
            self.life = Lifecycle::Failed(e.kind());
        }
    }

    /// A failed comm refuses `op`, reported with the first failure's kind.
    #[inline]
    pub(super) fn check(&self, op: &'static str) -> Result<()> {
        if let Lifecycle::Failed(cause) = self.life {
            return Err(Error::Poisoned { op, cause });
        }
        Ok(())
    }

    /// Takes the rails that failed since the last call.
    pub(super) fn take_events(&mut self) -> Vec<RailEvent, N> {
        core::mem::take(&mut self.events)
    }

    /// Takes the rails that returned since the last call.
    pub(super) fn take_returned(&mut self) -> Vec<u8, N> {
        core::mem::take(&mut self.returned)
    }

    /// Whether either of those has anything.
    #[inline]
    pub(super) fn has_rail_news(&self) -> bool {
        !self.events.is_empty() || !self.returned.is_empty()
    }

    /// Sets each rail's stripe weight, rail order (rails past `w` keep theirs).
    pub(super) fn set_weights(&mut self, w: &[u32]) {
        for (d, s) in self.weights.iter_mut().zip(w) {
            *d = *s;
        }
    }

    /// Rail `i`'s stripe weight (0 past the most rails).
    pub(super) fn weight(&self, i: usize) -> u32 {
        self.weights.get(i).copied().unwrap_or(0)
    }

    /// Closes every rail (last first), then releases the registrations; the first error.
    pub(super) fn close(&mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some(r) = self.comms.pop() {
            let x = r.close();
            if first.is_ok() {
                first = x;
            }
        }
        while let Some((d, mr)) = self.notice_mrs.pop().or_else(|| self.back_mrs.pop()) {
            let x = d.dereg_mr(mr);
            if first.is_ok() {
                first = x;
            }
        }
        first
    }
}

impl<P: Provider, C> Index<usize> for RailSet<P, C> {
    type Output = C;
    #[inline(always)]
    fn index(&self, i: usize) -> &C {
        &self.comms[i]
    }
}

impl<P: Provider, C> IndexMut<usize> for RailSet<P, C> {
    #[inline(always)]
    fn index_mut(&mut self, i: usize) -> &mut C {
        &mut self.comms[i]
    }
}

/// What is left of a comm dropped without `close`: its registrations (its rails' comms
/// release their own).
impl<P: Provider, C> Drop for RailSet<P, C> {
    fn drop(&mut self) {
        while let Some((d, mr)) = self.notice_mrs.pop().or_else(|| self.back_mrs.pop()) {
            let _ = d.dereg_mr(mr);
        }
    }
}
