//! Receive progress for the common shape, compiled apart: one sub (a group of one), not
//! registered, no shared SIMPLE buffer, no flush, no profiler watching
//! (`Profiler::PER_STEP` false).
//!
//! The same four stages as [`super::recv`] (retire, post, receive, hand over), in the same
//! order and with the same effects on the sub's counters, the ring and the network, written
//! for that shape only: no pass or group structure in memory, each stage's run looked up once
//! (the buffer, step size and memory handle for the posts; the GPU's `head` for the retires;
//! one `tail` store for a run of landed steps). When the net needs no `irecv_consumed`
//! ([`Net::IRECV_CONSUMED`] false), retired steps' requests are left in their slots until the
//! slots' next posts overwrite them (only steps posted since are tested). Any other shape takes
//! the general path; an op may move between the two (a profiler on some calls only): they keep
//! the same counters.

use super::mem::MemProvider;
use super::net::{CommRef, Net, NetBuf};
use super::op::{ProxyOp, Sub};
use super::profiler::Profiler;
use super::shared::{load_step, store_step, RecvMem};
use super::state::{lookup, ProxyState};
use super::{Dir, Protocol, STEPS};
use ibnet_core::error::{Error, Result};

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// One pass over a receive op of the plain shape: `Ok(None)` when the op is not of that
    /// shape or a profiler watches per step (the caller takes the general path), else whether
    /// it was idle.
    #[inline(always)]
    pub(super) fn recv_solo<P: Profiler>(&mut self, op: &mut ProxyOp<N>) -> Result<Option<bool>> {
        if P::PER_STEP || op.subs.len() != 1 {
            return Ok(None);
        }
        Ok(self.recv_solo_pass(op)?.map(|moved| !moved))
    }

    /// [`ProxyState::recv_solo`]'s pass over the one sub: `Ok(None)` when it is not of the
    /// plain shape, else whether a stage moved.
    #[inline(always)]
    fn recv_solo_pass(&mut self, op: &mut ProxyOp<N>) -> Result<Option<bool>> {
        let (slice, p) = (op.slice_steps, op.protocol);
        let ProxyState {
            net,
            mem,
            conns,
            gens,
            ..
        } = self;
        let ProxyOp { subs, ndone, .. } = op;
        let sub = &mut subs[0];
        let c = lookup(conns, gens, sub.conn)?;
        let r = c.res()?;
        let CommRef::Recv(rc) = r.comm else {
            return Err(Error::BadState {
                op: "recv progress",
                state: "send comm",
            });
        };
        let shared_buf = p == Protocol::Simple && c.req.shared;
        let flush = c.req.use_gdr && c.req.need_flush;
        if sub.reg || shared_buf || flush {
            return Ok(None);
        }
        let mut moved = false;
        // Stage 4, retire (first, so that slots the GPU consumed since the last call are
        // reposted by this one): the run of consumed steps from one look at `head`.
        if sub.done != sub.nsteps && sub.transmitted > sub.done {
            let head = load_step(&r.send_mem.get().head);
            moved = retire(net, sub, r.comm, rc, head, slice)?;
            if moved && sub.done == sub.nsteps {
                *ndone += 1;
            }
        }
        // Stage 1, post: every slot the depth allows, the buffer, step size and memory handle
        // looked up once. Receives posted now are tested from the next call: their
        // clear-to-send leaves with this post, so their data cannot be there yet.
        let old = sub.posted;
        let end = sub.nsteps.min(sub.done + STEPS as u64);
        if sub.posted < end {
            let b = r.bufs[p.index()].ok_or(Error::Missing {
                what: "protocol buffer of the connection",
            })?;
            let mr = sub.mhandle.ok_or(Error::Missing {
                what: "memory handle",
            })?;
            let step_size = b.size / STEPS;
            let size = (step_size * slice as usize).min(sub.nbytes);
            let (tag, base) = (c.req.tp_remote_rank, sub.base);
            // The count in a local, stored back once (also when an `irecv` fails).
            let mut posted = old;
            let r = loop {
                let slot = RecvMem::<STEPS>::slot(base + posted);
                let buf = NetBuf {
                    addr: b.cpu + (slot * step_size) as u64,
                    size,
                    tag,
                    mr,
                };
                let req = match net.irecv(rc, &[buf]) {
                    Ok(Some(req)) => req,
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                };
                let ri = (posted % STEPS as u64) as usize;
                sub.requests[ri] = Some(req);
                if N::IRECV_CONSUMED {
                    // Read back only by `irecv_consumed`.
                    sub.req_count[ri] = 1;
                }
                posted += slice;
                if posted >= end {
                    break Ok(());
                }
            };
            moved |= posted != old;
            sub.posted = posted;
            r?;
        }
        // Stage 2, receive: the receives posted by earlier calls, oldest first, while they
        // complete. A plain receive's request stays in `requests` until retire.
        if sub.received < old {
            moved |= receive(net, sub, rc, old, slice)?;
        }
        // Stage 3, hand over: no flush to wait for, so the run of landed steps is handed over
        // with one store of its last `tail` (Release).
        let (received, step) = (sub.received, sub.transmitted);
        if received > step {
            sub.transmitted = received;
            if step < sub.nsteps {
                store_step(r.proxy_word(Dir::Recv), sub.base + received);
                mem.store_fence();
            }
            moved = true;
        }
        Ok(Some(moved))
    }
}

/// Stage 2 of [`ProxyState::recv_solo`]: tests the receives posted before `old` (the posted
/// count when the pass began), oldest first, while they complete; returns whether one did.
/// `received < old <= nsteps`: every receive tested here carries a step's bytes.
#[inline(always)]
fn receive<N: Net>(
    net: &mut N,
    sub: &mut Sub<N>,
    rc: N::Recv,
    old: u64,
    slice: u64,
) -> Result<bool> {
    let (start, mut bytes) = (sub.received, 0u64);
    let mut received = start;
    let r = loop {
        if received >= old {
            break Ok(());
        }
        let ri = (received % STEPS as u64) as usize;
        let Some(req) = sub.requests[ri] else {
            break Err(Error::BadState {
                op: "recv progress",
                state: "no request for a posted step",
            });
        };
        match net.test_recv1(rc, req) {
            Ok(Some(size)) => bytes += size as u64,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
        received += slice;
    };
    sub.received = received;
    sub.trans_size += bytes;
    r.map(|()| received != start)
}

/// Stage 4 of [`ProxyState::recv_solo`]: retires the steps the GPU consumed (`head`), never
/// past `transmitted` (LL and LL128 may acknowledge empty sends early); returns whether one
/// moved. `done` and `transmitted` are multiples of the slice, so the run stops at `nsteps` at
/// the latest: the sub's end is checked once, after it.
#[inline(always)]
fn retire<N: Net>(
    net: &mut N,
    sub: &mut Sub<N>,
    comm: CommRef<N::Send, N::Recv>,
    rc: N::Recv,
    head: u64,
    slice: u64,
) -> Result<bool> {
    let end = head.saturating_sub(sub.base).min(sub.transmitted);
    let mut done = sub.done;
    if end <= done {
        return Ok(false);
    }
    if !N::IRECV_CONSUMED {
        // Nothing to hand back: the run is one count (its steps' requests stay until the next
        // posts of their slots overwrite them; only steps posted since are tested).
        done = if slice == 1 {
            end
        } else {
            done + (end - done).div_ceil(slice) * slice
        };
    }
    while done < end {
        let ci = (done % STEPS as u64) as usize;
        if let Some(req) = sub.requests[ci].take() {
            if let Err(e) = net.irecv_consumed(rc, usize::from(sub.req_count[ci]), req) {
                sub.done = done;
                return Err(e);
            }
        }
        done += slice;
    }
    sub.done = done;
    if done == sub.nsteps {
        sub.release_own_mr(net, comm)?;
    }
    Ok(true)
}
