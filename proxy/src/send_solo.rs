//! Send progress for the common shape, compiled apart: one sub, dedicated SIMPLE buffer, not
//! registered, no profiler watching (`Profiler::PER_STEP` false).
//!
//! The same three stages as [`super::send`] (post, transmit, complete), in the same order and
//! with the same effects on the sub's counters, the ring and the network, written for that
//! shape only: no pass structure in memory, the sub's counters in locals within each stage
//! (stored back once, also when a stage stops on an error), the transmit loop in a frame of
//! its own with only what it reads as arguments. A completed send's request is left in its
//! slot until the slot's next `isend` overwrites it (only transmitted steps are tested). Any
//! other shape takes the general path; an op may move between the two (a profiler on some
//! calls only): they keep the same counters.

use super::mem::MemProvider;
use super::net::{CommRef, Net};
use super::op::{ProxyOp, Sub};
use super::profiler::Profiler;
use super::shared::{store_step, RecvMem};
use super::state::{check_gpu_size, lookup, Buf, ProxyState};
use super::{Dir, Protocol, STEPS};
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::AtomicU64;

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// One pass over a send op of the plain shape: `Ok(None)` when the op is not of that shape
    /// or a profiler watches per step (the caller takes the general path), else whether it
    /// was idle.
    #[inline(always)]
    pub(super) fn send_solo<P: Profiler>(&mut self, op: &mut ProxyOp<N>) -> Result<Option<bool>> {
        if P::PER_STEP || op.subs.len() != 1 {
            return Ok(None);
        }
        let moved = self.send_solo_pass(op)?;
        if let Some((_, true)) = moved {
            op.ndone += 1;
        }
        Ok(moved.map(|(m, _)| !m))
    }

    /// [`ProxyState::send_solo`]'s pass over the one sub: `Ok(None)` when it is not of the
    /// plain shape, else whether a stage moved and whether the sub finished.
    #[inline(always)]
    fn send_solo_pass(&mut self, op: &mut ProxyOp<N>) -> Result<Option<(bool, bool)>> {
        let slice = op.slice_steps;
        let simple = op.protocol == Protocol::Simple;
        let sub = &mut op.subs[0];
        if sub.done == sub.nsteps {
            return Ok(Some((false, false)));
        }
        let conn = lookup(&self.conns, &self.gens, sub.conn)?;
        let res = conn.res()?;
        let comm = res.send_comm()?;
        if conn.req.shared || sub.reg || !simple {
            return Ok(None);
        }
        let ring = res.recv_mem.get();
        // Stage 1, post: a dedicated buffer's credits are implied by `head`, so the run of
        // credits the depth allows is one addition.
        let end = sub.nsteps.min(sub.done + STEPS as u64);
        let mut moved = false;
        if sub.posted < end {
            let gap = end - sub.posted;
            sub.posted += if slice == 1 {
                gap
            } else {
                gap.div_ceil(slice) * slice
            };
            moved = true;
        }
        // Stage 2, transmit (only when a posted step is not yet sent and the receiver has
        // posted its next receive: a pass that finds it not posted, the usual idle pass, skips
        // transmit's frame; the GPU's size of a step is checked when the step can be sent).
        let limit = sub.posted.min(sub.done + STEPS as u64);
        if sub.transmitted < limit && self.net.send_ready(comm) {
            let Some(buf) = res.bufs[Protocol::Simple.index()].as_ref() else {
                return Err(Error::Missing {
                    what: "protocol buffer of the connection",
                });
            };
            let tag = conn.req.tp_rank;
            moved |= transmit(&mut self.net, sub, comm, ring, buf, tag, slice, limit)?;
        }
        // Stage 3, complete.
        let head = res.proxy_word(Dir::Send);
        let (m, finished) = complete(&mut self.net, &self.mem, sub, comm, ring, head, slice)?;
        Ok(Some((moved | m, finished)))
    }
}

/// Stage 2: `isend`s every slot the GPU filled (`connFifo` size set, `tail` past the step)
/// from `transmitted` up to `limit`; returns whether one was sent.
// Out of line: the `isend` loop (with the comm's inlined `isend`) in a frame of its own, apart
// from the completion loop (measured with callgrind, benches/callgrind.sh).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn transmit<N: Net>(
    net: &mut N,
    sub: &mut Sub<N>,
    comm: N::Send,
    ring: &RecvMem,
    b: &Buf,
    tag: u32,
    slice: u64,
    limit: u64,
) -> Result<bool> {
    let (base, start) = (sub.base, sub.transmitted);
    // `start` set the handle of a sub that is not registered (its connection's buffer).
    let Some(mr) = sub.mhandle else {
        return Err(Error::Missing {
            what: "memory handle",
        });
    };
    let step_size = b.size / STEPS;
    let room = step_size * slice as usize;
    let (mut t, mut bytes) = (start, 0u64);
    let r = loop {
        let step = base + t;
        let Some(size) = ring.ready(step, step, true) else {
            break Ok(());
        };
        let size = size as usize;
        let slot = RecvMem::<STEPS>::slot(step);
        let off = slot * step_size;
        if let Err(e) = check_gpu_size(size, off, room, b.size) {
            break Err(e);
        }
        match net.isend(comm, b.cpu + off as u64, size, tag, mr) {
            Ok(Some(req)) => sub.requests[slot] = Some(req),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
        t += slice;
        bytes += size as u64;
        if t >= limit {
            break Ok(());
        }
    };
    sub.transmitted = t;
    sub.trans_size += bytes;
    r.map(|()| t != start)
}

/// Stage 3: retires every finished send, oldest first: resets each one's slot size, then
/// stores `head = base + done` once for the run (Release: the GPU that sees the new `head` sees
/// every reset before it). Returns whether one moved and whether the sub finished.
#[inline(always)]
fn complete<N: Net, M: MemProvider>(
    net: &mut N,
    mem: &M,
    sub: &mut Sub<N>,
    comm: N::Send,
    ring: &RecvMem,
    head: &AtomicU64,
    slice: u64,
) -> Result<(bool, bool)> {
    let (base, start, end) = (sub.base, sub.done, sub.transmitted);
    let mut d = start;
    let r = loop {
        if d >= end {
            break Ok(());
        }
        let step = base + d;
        let slot = RecvMem::<STEPS>::slot(step);
        let Some(req) = sub.requests[slot] else {
            break Err(Error::BadState {
                op: "send progress",
                state: "no request for a transmitted step",
            });
        };
        // A send's byte count is not needed here (not registered: no piece to move on to).
        match net.test_send(comm, req) {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(e) => break Err(e),
        }
        // The request stays in its slot until the slot's next `isend` overwrites it (only
        // transmitted steps are tested).
        d += slice;
        ring.retire(step, None);
    };
    if d != start {
        // One `head` for the run (Release: covers every size reset above).
        store_step(head, base + d);
        mem.store_fence();
    }
    sub.done = d;
    r?;
    let finished = d != start && d == sub.nsteps;
    if finished {
        sub.release_own_mr(net, CommRef::Send(comm))?;
    }
    Ok((d != start, finished))
}
