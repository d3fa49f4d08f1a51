//! The sender's half of failback (protocol: `crate::fused::heal`): a rail out of use, once
//! nothing of this side is in flight on it, is reset and announced READY; a clear-to-send
//! whose mask names it, with the receiver's JOIN naming that message, makes it live again.

use heapless::Vec;

use super::{FusedSend, Leg, N};
use crate::comm::Peeked;
use crate::error::{Error, Result};
use crate::fifo::{PostedRecv, MAX_RECVS};
use crate::fused::heal::{ctl_seq, decode, encode, Ctl};
use crate::provider::Provider;

impl<P: Provider + Clone> FusedSend<P> {
    /// Rails that returned to striping since the last call (each once per return), for the
    /// caller to log.
    pub fn take_returned(&mut self) -> Vec<u8, N> {
        self.rails.take_returned()
    }

    /// One step of failback for every rail out of use here: once its start delay passed and
    /// nothing of this side is in flight on it, its QPs are reset (`SendComm::revive`) and
    /// READY is published in the back ring for the receiver to read. A reset that fails is a
    /// failed attempt (tried again after the start delay, `attempts_max` in a row at most).
    #[inline]
    pub(super) fn heal_step(&mut self) {
        // Failback off (the default): one flag test, the rails' walk kept out of line.
        if self.rails.res.recovery {
            self.heal_rails();
        }
    }

    /// [`Self::heal_step`]'s work, with failback on.
    #[inline(never)]
    fn heal_rails(&mut self) {
        for i in 0..self.rails.len() {
            if self.rails.live(i)
                || self.ready[i]
                || self.rails.gave_up(i)
                || self.rails.now < self.rails.retry_at[i]
                || self.rail_busy(i)
            {
                continue;
            }
            let head = self.rails[i].fifo_head();
            match self.rails[i].revive(head) {
                Ok(()) => {
                    let g = self.rails.gen[i];
                    self.back
                        .publish(ctl_seq(Ctl::Ready, i, g), &[encode(Ctl::Ready, i, g, 0)]);
                    self.ready[i] = true;
                }
                Err(_) => self.rails.attempt_failed(i),
            }
        }
    }

    /// Whether anything of this side is in flight on rail `i`: a part posted there, a part
    /// or notice it carries for another rail.
    fn rail_busy(&self, i: usize) -> bool {
        self.msgs.iter().filter(|m| m.used).any(|m| {
            matches!(m.legs[i], Leg::Native(_))
                || m.legs
                    .iter()
                    .any(|l| matches!(l, Leg::Moving { carrier, .. } if *carrier as usize == i))
                || m.telling.is_some_and(|(c, _, _)| c as usize == i)
        })
    }

    /// For the message at `seq`, whose receiver's mask is `posted`: every READY rail of the
    /// mask whose JOIN names `seq` is live again from it (FIFO head `seq`, its clear-to-send
    /// put in `peeks`). `Ok(false)`: such a rail's clear-to-send has not landed yet (call
    /// again). A JOIN naming an earlier message, or `seq` once a send of its multi-receive
    /// went without the rail (the rejoin point passed unseen), ends the round: the rail stays
    /// out, and the receiver, told of it by that message's notice, takes it out again (a lost
    /// round, no lost byte).
    pub(super) fn rejoin(
        &mut self,
        seq: u64,
        posted: u8,
        peeks: &mut [Option<Peeked>; N],
        tag: u32,
    ) -> Result<bool> {
        #[allow(clippy::needless_range_loop)] // `i` indexes the comm's per-rail state too
        for i in 0..self.rails.len() {
            if !self.ready[i] || posted >> i & 1 == 0 {
                continue;
            }
            let g = self.rails.gen[i];
            let mut out = [PostedRecv::default(); MAX_RECVS];
            let at = match self.back.poll(ctl_seq(Ctl::Join, i, g), &mut out) {
                Ok(None) => continue,
                Ok(Some(_)) => decode(&out[0], Ctl::Join, i, g),
                Err(_) => None,
            };
            let Some(at) = at.filter(|&at| at <= seq) else {
                if at.is_none() {
                    return Err(self.rails.poison(Error::BadFifoElem {
                        field: "rail JOIN from the receiver",
                        value: i as u64,
                        peer: Default::default(),
                    }));
                }
                continue; // the rail rejoins at a later message
            };
            self.ready[i] = false;
            self.rails.gen[i] += 1;
            // Only at the first send of a multi-receive's slot: a rail that missed an earlier
            // send of it would never complete the slot (its sends are posted together).
            let begun = self.msgs.iter().any(|m| m.used && m.seq == seq);
            if at < seq || begun {
                self.rails.attempt_failed(i);
                continue;
            }
            self.rails[i].set_fifo_head(at);
            self.rails.bring_back(i);
            match self.rails[i].peek(tag) {
                Ok(Some(p)) => peeks[i] = Some(p),
                Ok(None) => return Ok(false),
                Err(e) => self.fail_rail(i, e)?,
            }
        }
        Ok(true)
    }
}
