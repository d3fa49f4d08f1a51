//! The receiver's half of failback (protocol: `crate::fused::heal`): a rail out of use is
//! brought back once the sender's READY is read over a live rail; its QPs are reset, a READ
//! over the rail itself proves the path, and a JOIN tells the sender from which receive on
//! the rail carries parts again.

use heapless::Vec;

use super::{add_sizes, FusedRecv, Kind, Leg, N};
use crate::error::Result;
use crate::fifo::{FifoElem, FifoRing, PostedRecv, MAX_RECVS, MAX_REQUESTS};
use crate::fused::heal::{ctl_seq, decode, encode, Ctl, Phase};
use crate::provider::{Provider, Sge};

impl<P: Provider + Clone> FusedRecv<P> {
    /// The caller's monotonic clock, in ms (the core reads none). Call before each call when
    /// [`Self::wants_clock`].
    #[inline]
    pub fn tick(&mut self, now_ms: u64) {
        self.rails.now = now_ms;
    }

    /// Whether the comm counts time (failback on): the caller then feeds [`Self::tick`].
    #[inline]
    pub fn wants_clock(&self) -> bool {
        self.rails.res.wants_clock()
    }

    /// Rails that returned to striping since the last call (each once per return), for the
    /// caller to log.
    pub fn take_returned(&mut self) -> Vec<u8, N> {
        self.rails.take_returned()
    }

    /// Rail `i` went out of use here: its first return attempt waits the start delay.
    pub(super) fn went_out(&mut self, i: usize) {
        self.rails.retry_later(i);
        self.round_at[i] = 0;
        self.phase[i] = Phase::Idle;
    }

    /// One step of failback for every rail out of use here.
    #[inline]
    pub(super) fn heal_step(&mut self) -> Result<()> {
        // Failback off (the default): one flag test, the rails' walk kept out of line.
        if self.rails.res.recovery {
            self.heal_rails()
        } else {
            Ok(())
        }
    }

    /// [`Self::heal_step`]'s work, with failback on.
    #[inline(never)]
    fn heal_rails(&mut self) -> Result<()> {
        for d in 0..self.rails.len() {
            if let Some((c, id)) = self.join_pending[d] {
                match self.rails[c as usize].test(id) {
                    Ok(None) => {}
                    Ok(Some(_)) => self.join_pending[d] = None,
                    Err(e) => {
                        self.join_pending[d] = None;
                        self.rail_down(c as usize, e)?;
                    }
                }
            }
        }
        for i in 0..self.rails.len() {
            if self.rails.live(i) || self.rails.gave_up(i) {
                continue;
            }
            match self.phase[i] {
                Phase::Idle => self.read_ready(i)?,
                Phase::Reading { carrier, id, since } => {
                    let c = carrier as usize;
                    match self.rails[c].test(id) {
                        Ok(None) if self.rails.now >= since + self.rails.res.ack_timeout_ms => {
                            self.attempt_failed(i)
                        }
                        Ok(None) => {}
                        Ok(Some(_)) => self.ready_read(i)?,
                        Err(e) => {
                            self.phase[i] = Phase::Idle;
                            self.rail_down(c, e)?;
                        }
                    }
                }
                Phase::Probing { id, since } => match self.rails[i].test(id) {
                    Ok(Some(_)) => self.join(i)?,
                    Ok(None) if self.rails.now < since + self.rails.res.ack_timeout_ms => {}
                    // The path does not work yet (or no longer): the QPs went to the error
                    // state again; the next round resets them again.
                    _ => self.attempt_failed(i),
                },
            }
        }
        Ok(())
    }

    /// A round of rail `i` that failed: tried again after the start delay.
    fn attempt_failed(&mut self, i: usize) {
        self.rails.attempt_failed(i);
        self.phase[i] = Phase::Idle;
        self.round_at[i] = 0;
    }

    /// Where the READY word of rail `i` lies in the sender's back ring (and in the back
    /// stage, which a READ fills at the same offset): its sequence number and local bytes.
    fn ready_word(&self, i: usize, lkey: u32) -> (u64, Sge) {
        let seq = ctl_seq(Ctl::Ready, i, self.rails.gen[i]);
        let off = FifoRing::<MAX_REQUESTS>::slot_offset(FifoRing::<MAX_REQUESTS>::slot_of(seq));
        let sge = Sge {
            addr: self.back_stage.base_addr() + off as u64,
            len: core::mem::size_of::<FifoElem>() as u32,
            lkey,
        };
        (seq, sge)
    }

    /// Rail `i` idle and out of use: once its delay passed and the sender heard of its
    /// drop, reads the sender's READY over the first live rail.
    fn read_ready(&mut self, i: usize) -> Result<()> {
        let bit = 1u8 << i;
        let early = self.rails.now < self.rails.retry_at[i];
        if early || self.back_needed & !self.back_told & bit != 0 {
            return Ok(());
        }
        let Some(c) = self.rails.first_live() else {
            return Ok(());
        };
        if self.round_at[i] == 0 {
            self.round_at[i] = self.rails.now.max(1);
        } else if self.rails.now >= self.round_at[i] + self.rails.res.ack_timeout_ms {
            // No READY for a whole ack timeout: the sender is not there yet (or never).
            self.attempt_failed(i);
            return Ok(());
        }
        let (_, local) = self.ready_word(i, self.rails.back_keys[c].lkey);
        let off = local.addr - self.back_stage.base_addr();
        let ring = self.back_ring[c];
        match self.rails[c].iread(local, ring.addr + off, ring.rkey) {
            Ok(id) => {
                self.phase[i] = Phase::Reading {
                    carrier: c as u8,
                    id,
                    since: self.rails.now,
                };
                Ok(())
            }
            Err(e) => self.rail_down(c, e),
        }
    }

    /// The READ of rail `i`'s READY completed: if the sender is ready, rail `i` is drained,
    /// reset and probed; if not, read again at the next step (a millisecond on).
    fn ready_read(&mut self, i: usize) -> Result<()> {
        let (seq, _) = self.ready_word(i, 0);
        let mut out = [PostedRecv::default(); MAX_RECVS];
        let ready = matches!(self.back_stage.poll(seq, &mut out), Ok(Some(_)))
            && decode(&out[0], Ctl::Ready, i, self.rails.gen[i]).is_some();
        self.phase[i] = Phase::Idle;
        if !ready {
            self.rails.retry_at[i] = self.rails.now + 1;
            return Ok(());
        }
        self.settle(i)?;
        for p in self.back_pending.iter_mut() {
            if p.is_some_and(|(c, _)| c as usize == i) {
                *p = None; // written again over a live rail
            }
        }
        if self.rails[i].revive(self.seq).is_err() {
            self.attempt_failed(i);
            return Ok(());
        }
        let (_, local) = self.ready_word(i, self.rails.back_keys[i].lkey);
        let off = local.addr - self.back_stage.base_addr();
        let ring = self.back_ring[i];
        match self.rails[i].iread(local, ring.addr + off, ring.rkey) {
            Ok(id) => {
                self.phase[i] = Phase::Probing {
                    id,
                    since: self.rails.now,
                }
            }
            Err(_) => self.attempt_failed(i),
        }
        Ok(())
    }

    /// Before rail `i` is reset: every part the sender had acknowledged on it is in its
    /// queue (the sender is READY: nothing of it is in flight there), so it is applied; every
    /// other part of the rail still awaited is one the sender failed, and comes by notice.
    fn settle(&mut self, i: usize) -> Result<()> {
        let _ = self.rails[i].drain();
        for k in 0..self.msgs.len() {
            let m = self.msgs[k];
            let Leg::Native(sub) = m.legs[i] else {
                continue;
            };
            if !m.used || m.kind == Kind::Flush {
                self.msgs[k].legs[i] = Leg::Done;
                continue;
            }
            match self.rails[i].completed(sub) {
                Ok(Some(d)) => {
                    let m = &mut self.msgs[k];
                    m.legs[i] = Leg::Done;
                    add_sizes(m, &d.sizes);
                }
                Ok(None) => self.msgs[k].legs[i] = Leg::Notice,
                Err(e) => return Err(self.rails.poison(e)),
            }
        }
        Ok(())
    }

    /// Rail `i`'s probe completed: JOIN is written into the sender's back ring over a live
    /// rail (before that rail's clear-to-send of the next receive, on the same QP), and the
    /// rail is live again from the next receive on.
    fn join(&mut self, i: usize) -> Result<()> {
        let Some(c) = self.rails.first_live() else {
            self.attempt_failed(i);
            return Ok(());
        };
        let (g, at) = (self.rails.gen[i], self.seq);
        let (off, len) = self
            .back_stage
            .publish(ctl_seq(Ctl::Join, i, g), &[encode(Ctl::Join, i, g, at)]);
        let local = Sge {
            addr: self.back_stage.base_addr() + off as u64,
            len: len as u32,
            lkey: self.rails.back_keys[c].lkey,
        };
        let ring = self.back_ring[c];
        match self.rails[c].iwrite(local, ring.addr + off as u64, ring.rkey) {
            Ok(id) => self.join_pending[i] = Some((c as u8, id)),
            Err(e) => {
                self.attempt_failed(i);
                return self.rail_down(c, e);
            }
        }
        let bit = 1u8 << i;
        // Receives were posted on the other rails since the reset: the rail's first
        // clear-to-send is the one of `at`, at FIFO sequence number `at`.
        self.rails[i].set_fifo_tail(at);
        self.joined_at[i] = at;
        self.rails.gen[i] += 1;
        self.phase[i] = Phase::Idle;
        self.back_needed &= !bit;
        self.back_told &= !bit;
        self.back_pending[i] = None;
        self.rails.bring_back(i);
        Ok(())
    }
}
