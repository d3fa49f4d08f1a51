//! Receive progress (NCCL's `recvProxyProgress`).
//!
//! Subs are grouped at start (subs sharing a net comm, up to `max_recvs` per group); a group
//! moves in lockstep through four stages, all run by each call, each as far as it can (NCCL
//! moves one step per stage and returns after the first stage that moved; draining all four
//! hands data over with fewer calls). Each call runs
//! **retire** (4) first, so that slots the GPU consumed since the previous call are reposted
//! by this one rather than the next:
//! 1. **post**: multi-receives per group, each covering the next slice of every member that still
//!    has steps (depth-limited to `min(STEPS, SHARED_STEPS / nsubs)`, 1 for registered subs).
//!    Dedicated buffers: the slot's place in the buffer. Shared buffers: a shared slot whose
//!    offset goes into `connFifo`. Registered: the user buffer, once the GPU set the size at
//!    `base` (its kernel started), at most 1 GiB. Tag = the peer's rank.
//! 2. **receive**: `test` multi-receives, oldest first, while they complete; registered subs short of their total move
//!    on to one more piece; when data landed in GPU memory and the connection needs it, flush
//!    (a GDR-copy read, or `iflush` of the non-empty buffers) — SIMPLE only.
//! 3. **hand over**: once a step's flush (if any) completed, store `tail = base + transmitted`
//!    (Release; once, at the end, for a registered sub).
//! 4. **retire**: the GPU's `head` (Acquire) says which steps it consumed; those slots may be
//!    reposted (and the plugin told with `irecv_consumed`).

use super::mem::MemProvider;
use super::net::{CommRef, Net, NetBuf, SizeReport};
use super::op::{Group, ProxyOp, Sub};
use super::pools::shared_offset;
use super::profiler::{OpEvent, Profiler, StepEvent};
use super::shared::{load_step, store_step, RecvMem, SIZE_EMPTY};
use super::state::{lookup, Conn, ProxyState, Resources};
use super::{Dir, Protocol, MAX_RECVS, MAX_SUBS, SHARED_STEPS, STEPS};
use crate::error::{Error, Result};

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// One pass over a receive op; returns whether it was idle.
    pub(super) fn recv_progress<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        prof: &mut P,
    ) -> Result<bool> {
        // Each stage drains its work per group (it revisits a group while it moves), so a call
        // can post, complete and hand over several steps. Retire first: slots the GPU consumed
        // since the last call are reposted by this one.
        // The groups are fixed once the op started; walked four times below, so listed once
        // (one sub, the common case: one group, no walk at all).
        let solo = [Group::SOLO];
        let mut list;
        let groups: &[Group] = if op.subs.len() == 1 {
            &solo
        } else {
            list = [Group::SOLO; MAX_SUBS];
            let mut n = 0;
            for (slot, g) in list.iter_mut().zip(op.group_walk()) {
                *slot = g;
                n += 1;
            }
            &list[..n]
        };
        let max_depth = STEPS.min(SHARED_STEPS / op.subs.len()) as u64;
        let mut moved = false;
        for &g in groups {
            moved |= self.recv_retire(op, g, prof)?;
        }
        for &g in groups {
            while self.recv_post(op, g, max_depth, prof)? {
                moved = true; // post this group's next slice too (bounded by the depth)
            }
        }
        for &g in groups {
            while self.recv_test(op, g, prof)? {
                moved = true; // test its next receive too (bounded: `received` grew)
            }
        }
        for &g in groups {
            while self.recv_hand_over(op, g, prof)? {
                moved = true; // hand over its next step too (bounded: `transmitted` grew)
            }
        }
        Ok(!moved)
    }

    /// Stage 1 for one group: posts one multi-receive covering the next slice of every member
    /// that still has steps (at most `max_depth` ahead of `done`); returns whether it posted.
    fn recv_post<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        g: Group,
        max_depth: u64,
        prof: &mut P,
    ) -> Result<bool> {
        let p = op.protocol;
        let slice = op.slice_steps;
        let nsubs = op.subs.len();
        let mut bufs = heapless::Vec::<NetBuf<N::Mr>, MAX_RECVS>::new();
        let mut comm = None;
        for (k, si) in g.members(&op.order) {
            let sub = &mut op.subs[si];
            if sub.posted >= sub.nsteps {
                continue;
            }
            let depth = if sub.reg { 1 } else { max_depth };
            if sub.posted >= sub.done + depth {
                return Ok(false);
            }
            let c = lookup(&self.conns, &self.gens, sub.conn)?;
            let r = c.res()?;
            comm = Some(r.comm);
            let step = sub.base + sub.posted;
            let slot = RecvMem::<STEPS>::slot(step);
            let fifo = &r.recv_mem.get().conn_fifo;
            let (addr, mut size) = if p == Protocol::Simple && c.req.shared {
                if sub.reg {
                    // Touch the user buffer only once the GPU kernel has started.
                    if fifo[RecvMem::<STEPS>::slot(sub.base)].size().is_none() {
                        return Ok(false);
                    }
                    (sub.buff, sub.nbytes.min(self.cfg.max_net_size.max(1)))
                } else {
                    let b = r.bufs[p.index()].ok_or(Error::Missing {
                        what: "shared buffer",
                    })?;
                    let sslot = (sub.posted % max_depth) as usize * nsubs + k;
                    let off = shared_offset(self.cfg.p2p_chunk_size, c.req.channel, sslot)?;
                    fifo[slot].set_offset(off);
                    (b.cpu + off as u64, self.cfg.p2p_chunk_size)
                }
            } else {
                let b = r.bufs[p.index()].ok_or(Error::Missing {
                    what: "protocol buffer of the connection",
                })?;
                let step_size = b.size / STEPS;
                (
                    b.cpu + (slot * step_size) as u64,
                    step_size * slice as usize,
                )
            };
            size = size.min(sub.nbytes);
            prof.step_start(si, sub.posted, sub.posted + slice);
            let mr = sub.mhandle.ok_or(Error::Missing {
                what: "memory handle",
            })?;
            sub.posted_sizes[(sub.posted % STEPS as u64) as usize] = size;
            bufs.push(NetBuf {
                addr,
                size,
                tag: c.req.tp_remote_rank,
                mr,
            })
            .map_err(|_| Error::Full {
                what: "buffers in one multi-receive",
                cap: MAX_RECVS,
            })?;
        }
        let cnt = bufs.len();
        if cnt == 0 {
            return Ok(false);
        }
        let Some(CommRef::Recv(rc)) = comm else {
            return Err(Error::BadState {
                op: "recv progress",
                state: "send comm",
            });
        };
        let Some(req) = self.net.irecv(rc, &bufs)? else {
            return Ok(false);
        };
        let ls = &mut op.subs[g.lead];
        let ri = (ls.posted % STEPS as u64) as usize;
        ls.requests[ri] = Some(req);
        ls.req_count[ri] = cnt as u8;
        for (_, si) in g.members(&op.order) {
            let sub = &mut op.subs[si];
            sub.posted += slice;
            prof.op_state(si, OpEvent::RecvPosted, sub.posted, sub.trans_size);
            prof.step_state(si, sub.posted - slice, sub.posted, StepEvent::RecvWait);
        }
        Ok(true)
    }

    /// Stage 2 for one group: tests its oldest posted multi-receive; when done, accounts every
    /// member's bytes and starts the flush. Returns whether it completed.
    fn recv_test<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        g: Group,
        prof: &mut P,
    ) -> Result<bool> {
        let p = op.protocol;
        let slice = op.slice_steps;
        let lead = g.lead;
        let (posted, step) = (op.subs[lead].posted, op.subs[lead].received);
        if posted <= step {
            return Ok(false);
        }
        let ri = (step % STEPS as u64) as usize;
        let lc = lookup(&self.conns, &self.gens, op.subs[lead].conn)?;
        let comm = lc.res()?.comm;
        let CommRef::Recv(rc) = comm else {
            return Err(Error::BadState {
                op: "recv progress",
                state: "send comm",
            });
        };
        let req = op.subs[lead].requests[ri].ok_or(Error::BadState {
            op: "recv progress",
            state: "no request for a posted step",
        })?;
        let mut sizes = [0usize; MAX_RECVS];
        if !self.net.test(comm, req, &mut sizes)? {
            return Ok(false);
        }
        let cnt = op.subs[lead].req_count[ri] as usize;
        let flags = lc.props.sizes == SizeReport::Flags && cnt > 1;
        let mut need_flush = false;
        let mut total = 0usize;
        let mut idx = 0;
        let mut fl = heapless::Vec::<NetBuf<N::Mr>, MAX_RECVS>::new();
        let mut gdc_flush = None;
        for (_, si) in g.members(&op.order) {
            let sub = &mut op.subs[si];
            // The lead's connection is already at hand (a group of one: no second lookup).
            let c = if si == lead {
                lc
            } else {
                lookup(&self.conns, &self.gens, sub.conn)?
            };
            let r = c.res()?;
            let mut size = 0;
            if sub.received < sub.nsteps {
                let raw = sizes[idx.min(MAX_RECVS - 1)];
                idx += 1;
                size = match (flags, raw) {
                    (true, 0) => 0,
                    (true, _) => sub.posted_sizes[ri],
                    (false, n) => n,
                };
                total += size;
                let fifo = &r.recv_mem.get().conn_fifo;
                if c.req.use_gdr && c.req.need_flush {
                    need_flush = true;
                    gdc_flush = gdc_flush.or(r.gdc_flush);
                    if let Some(mr) = sub.mhandle {
                        // At most one buffer per group member (≤ MAX_RECVS).
                        let _ = fl.push(NetBuf {
                            addr: landed_at(c, r, sub, p)?,
                            size,
                            tag: c.req.tp_remote_rank,
                            mr,
                        });
                    }
                }
                if sub.reg && sub.piece_done(size) {
                    // Release: pairs with the GPU's Acquire poll; ordered before the `tail`
                    // store that ends the registered receive.
                    fifo[RecvMem::<STEPS>::slot(sub.base)].publish(SIZE_EMPTY);
                }
            }
            sub.received += slice;
            sub.trans_size += size as u64;
            prof.op_state(si, OpEvent::RecvReceived, sub.received, sub.trans_size);
            prof.step_state(
                si,
                sub.received - slice,
                sub.received,
                StepEvent::RecvFlushWait,
            );
        }
        let ls = &mut op.subs[lead];
        ls.requests[ri] = None;
        ls.consumed[ri] = Some(req);
        if total > 0 && p == Protocol::Simple && need_flush {
            if let Some(w) = gdc_flush {
                self.mem.flush_read(w.get());
            } else if !fl.is_empty() {
                let fr = self.net.iflush(rc, &fl)?;
                op.subs[lead].requests[ri] = fr;
            }
        }
        Ok(true)
    }

    /// Stage 3 for one group: once its oldest received step's flush (if any) completed, moves
    /// every member's `tail`. Returns whether it handed over.
    fn recv_hand_over<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        g: Group,
        prof: &mut P,
    ) -> Result<bool> {
        let slice = op.slice_steps;
        let lead = g.lead;
        let (received, step) = (op.subs[lead].received, op.subs[lead].transmitted);
        if received <= step {
            return Ok(false);
        }
        let ri = (step % STEPS as u64) as usize;
        if let Some(req) = op.subs[lead].requests[ri] {
            let comm = lookup(&self.conns, &self.gens, op.subs[lead].conn)?
                .res()?
                .comm;
            let mut sizes = [0usize; MAX_RECVS];
            if !self.net.test(comm, req, &mut sizes)? {
                return Ok(false);
            }
            op.subs[lead].requests[ri] = None;
        }
        for (_, si) in g.members(&op.order) {
            let sub = &mut op.subs[si];
            sub.transmitted += slice;
            prof.op_state(
                si,
                OpEvent::RecvTransmitted,
                sub.transmitted,
                sub.trans_size,
            );
            prof.step_state(
                si,
                sub.transmitted - slice,
                sub.transmitted,
                StepEvent::RecvGpuWait,
            );
            if step < sub.nsteps {
                let r = lookup(&self.conns, &self.gens, sub.conn)?.res()?;
                let tail = if sub.reg {
                    (sub.transmitted == sub.nsteps).then_some(sub.base + slice)
                } else {
                    Some(sub.base + sub.transmitted)
                };
                if let Some(t) = tail {
                    store_step(r.proxy_word(Dir::Recv), t);
                    self.mem.store_fence();
                }
            }
        }
        Ok(true)
    }

    /// Stage 4 for one group: retires every step the GPU consumed (its `head`), telling the
    /// plugin with `irecv_consumed`. Returns whether one moved.
    fn recv_retire<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        g: Group,
        prof: &mut P,
    ) -> Result<bool> {
        let slice = op.slice_steps;
        let lead = g.lead;
        let mut moved = false;
        for (_, si) in g.members(&op.order) {
            let sub = &op.subs[si];
            if sub.done == sub.nsteps || sub.transmitted <= sub.done {
                continue;
            }
            let r = lookup(&self.conns, &self.gens, sub.conn)?.res()?;
            let comm = r.comm;
            let head = if sub.reg {
                sub.base + sub.nsteps
            } else {
                load_step(&r.send_mem.get().head)
            };
            loop {
                let sub = &op.subs[si];
                // LL and LL128 may acknowledge empty sends early: never pass `transmitted`.
                if head <= sub.base + sub.done || sub.transmitted <= sub.done {
                    break;
                }
                let ci = (sub.done % STEPS as u64) as usize;
                if let Some(req) = op.subs[lead].consumed[ci].take() {
                    if let CommRef::Recv(rc) = comm {
                        let n = op.subs[lead].req_count[ci] as usize;
                        self.net.irecv_consumed(rc, n, req)?;
                    }
                }
                let sub = &mut op.subs[si];
                sub.done += slice;
                prof.step_stop(si, sub.done - slice, sub.done);
                prof.op_state(si, OpEvent::RecvDone, sub.done, sub.trans_size);
                moved = true;
                if sub.done == sub.nsteps {
                    if sub.own_mr {
                        if let Some(mr) = sub.mhandle.take() {
                            sub.own_mr = false;
                            self.net.dereg_mr(comm, mr)?;
                        }
                    }
                    op.ndone += 1;
                    break;
                }
            }
        }
        Ok(moved)
    }
}

/// Where `sub`'s step `received` landed (what a flush reads back).
fn landed_at<N: Net>(c: &Conn<N>, r: &Resources<N>, sub: &Sub<N>, p: Protocol) -> Result<u64> {
    if sub.reg {
        return Ok(sub.buff);
    }
    let slot = RecvMem::<STEPS>::slot(sub.base + sub.received);
    if c.req.shared && p == Protocol::Simple {
        let fifo = &r.recv_mem.get().conn_fifo;
        return Ok(r.bufs[p.index()].map_or(0, |b| b.cpu) + fifo[slot].offset() as u64);
    }
    let b = r.bufs[p.index()].ok_or(Error::Missing {
        what: "protocol buffer",
    })?;
    Ok(b.cpu + (slot * (b.size / STEPS)) as u64)
}
