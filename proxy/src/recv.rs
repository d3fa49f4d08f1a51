//! Receive progress (NCCL's `recvProxyProgress`).
//!
//! Subs are grouped at start (subs sharing a net comm, up to `max_recvs` per group); a group
//! moves in lockstep through four stages, all run by each call, each as far as it can (NCCL
//! moves one step per stage and returns after the first stage that moved; draining all four
//! hands data over with fewer calls). Each call makes one pass per group: it looks the group's
//! connections up once, then runs the four stages on them. Groups are independent (their own
//! subs, requests and slots), so finishing one group before the next keeps every group's order.
//! A pass runs **retire** (4) first, so that slots the GPU consumed since the previous call are
//! reposted by this one rather than the next:
//! 1. **post**: multi-receives per group, each covering the next slice of every member that still
//!    has steps (depth-limited to `min(STEPS, SHARED_STEPS / nsubs)`, 1 for registered subs).
//!    Dedicated buffers: the slot's place in the buffer. Shared buffers: a shared slot whose
//!    offset goes into `connFifo`. Registered: the user buffer, once the GPU set the size at
//!    `base` (its kernel started), at most 1 GiB. Tag = the peer's rank.
//! 2. **receive**: `test` multi-receives posted by earlier passes (this pass's clear-to-send
//!    has only just left: their data cannot be there), oldest first, while they complete;
//!    registered subs short of their total move on to one more piece; when data landed in GPU memory and the connection needs it, flush
//!    (a GDR-copy read, or `iflush` of the non-empty buffers) — SIMPLE only.
//! 3. **hand over**: once a step's flush (if any) completed, store `tail = base + transmitted`
//!    (Release; once, at the end, for a registered sub).
//! 4. **retire**: the GPU's `head` (Acquire) says which steps it consumed; those slots may be
//!    reposted (and the plugin told with `irecv_consumed`). A plain receive (no flush) keeps
//!    its request where `post` put it until then; others move it aside at **receive**, since a
//!    flush request takes its place.
//!
//! A one-sub op of the plain shape (no user buffer, no shared SIMPLE buffer, no flush) with no
//! profiler watching takes the same stages compiled apart, in `recv_solo`.

use super::mem::MemProvider;
use super::net::{CommRef, Net, NetBuf, SizeReport};
use super::op::{Group, ProxyOp, Sub};
use super::pools::shared_offset;
use super::profiler::{OpEvent, Profiler, StepEvent};
use super::shared::{load_step, store_step, MemRef, RecvMem, SIZE_EMPTY};
use super::state::{lookup, Conn, ProxyConfig, ProxyState, Resources};
use super::{Dir, Protocol, MAX_RECVS, SHARED_STEPS, STEPS};
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::AtomicU64;

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// One pass over a receive op; returns whether it was idle.
    // Out of line: apart from the other direction's pass its registers spill less (measured
    // with callgrind, benches/callgrind.sh).
    #[inline(never)]
    pub(super) fn recv_progress<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        prof: &mut P,
    ) -> Result<bool> {
        let ProxyState {
            net,
            mem,
            cfg,
            conns,
            gens,
            ..
        } = self;
        let shape = Shape {
            cfg,
            mem,
            p: op.protocol,
            slice: op.slice_steps,
            nsubs: op.subs.len(),
            // One sub (the common case) needs no division.
            max_depth: match op.subs.len() {
                1 => STEPS as u64,
                // `max(1)`: an op without subs is done at once, never a division by zero.
                n => STEPS.min(SHARED_STEPS / n.max(1)) as u64,
            },
        };
        // One sub, the common case: one group, no walk.
        if op.subs.len() == 1 {
            let links = [Link::of(conns, gens, &op.subs[0])?];
            let c = links[0].c;
            // The plain shape (no user buffer, no shared SIMPLE buffer, no flush) compiled
            // apart: its stages skip those branches.
            let user_buf = op.subs[0].reg;
            let shared_buf = shape.p == Protocol::Simple && c.req.shared;
            let flush = c.req.use_gdr && c.req.need_flush;
            let plain = !(user_buf || shared_buf || flush);
            let moved = if plain {
                GroupPass::<_, _, true, true>::new(&shape, &links, Group::SOLO)?
                    .run(net, op, prof)?
            } else {
                GroupPass::<_, _, true, false>::new(&shape, &links, Group::SOLO)?
                    .run(net, op, prof)?
            };
            return Ok(!moved);
        }
        // The groups are fixed once the op started; the walk is a copy of the group order, so
        // the stages may change the subs meanwhile.
        let mut moved = false;
        for g in op.group_walk() {
            let lead = Link::of(conns, gens, &op.subs[g.lead])?;
            let mut links = [lead; MAX_RECVS];
            if g.len > MAX_RECVS {
                return Err(Error::Full {
                    what: "buffers in one multi-receive",
                    cap: MAX_RECVS,
                });
            }
            for (j, l) in links.iter_mut().enumerate().take(g.len).skip(1) {
                *l = Link::of(conns, gens, &op.subs[op.order[g.start + j] as usize])?;
            }
            let pass = GroupPass::<_, _, false, false>::new(&shape, &links[..g.len], g)?;
            moved |= pass.run(net, op, prof)?;
        }
        Ok(!moved)
    }
}

/// What every group of one receive op shares in one progress call.
struct Shape<'a, M> {
    cfg: &'a ProxyConfig,
    mem: &'a M,
    p: Protocol,
    slice: u64,
    nsubs: usize,
    /// Slices posted ahead of `done`: `min(STEPS, SHARED_STEPS / nsubs)` (1 when registered).
    max_depth: u64,
}

/// A group member's connection and its resources, looked up once per progress call.
struct Link<'a, N: Net> {
    c: &'a Conn<N>,
    r: &'a Resources<N>,
    /// The `tail` word the proxy stores (`r.proxy_word(Dir::Recv)`), looked up once.
    tail: &'a AtomicU64,
}

impl<N: Net> Clone for Link<'_, N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<N: Net> Copy for Link<'_, N> {}

impl<'a, N: Net> Link<'a, N> {
    fn of(conns: &'a [Option<Conn<N>>], gens: &[u16], sub: &Sub<N>) -> Result<Self> {
        let c = lookup(conns, gens, sub.conn)?;
        let r = c.res()?;
        Ok(Self {
            c,
            r,
            tail: r.proxy_word(Dir::Recv),
        })
    }
}

/// One group's pass: its members' connections (`links[j]` is the member at group position
/// `j`, the leader first; `g.len` of them) and its receive comm.
/// `ONE`: a group of one (the common case), compiled apart so its member loops unroll.
/// `PLAIN` (with `ONE` only): the caller checked that the sub is not registered, its buffer is
/// not a shared SIMPLE one and it needs no flush.
struct GroupPass<'s, 'a, N: Net, M, const ONE: bool, const PLAIN: bool> {
    shape: &'s Shape<'a, M>,
    g: Group,
    links: &'s [Link<'a, N>],
    rc: N::Recv,
}

impl<'s, 'a, N: Net, M: MemProvider, const ONE: bool, const PLAIN: bool>
    GroupPass<'s, 'a, N, M, ONE, PLAIN>
{
    /// A pass over group `g`, whose members' connections are `links`.
    fn new(shape: &'s Shape<'a, M>, links: &'s [Link<'a, N>], g: Group) -> Result<Self> {
        // Grouping put subs of one comm together: the leader's comm is the group's.
        let Some(CommRef::Recv(rc)) = links.first().map(|l| l.r.comm) else {
            return Err(Error::BadState {
                op: "recv progress",
                state: "send comm",
            });
        };
        Ok(Self {
            shape,
            g,
            links,
            rc,
        })
    }

    /// Members.
    #[inline(always)]
    fn len(&self) -> usize {
        if ONE {
            1
        } else {
            self.links.len()
        }
    }

    /// Sub index of the member at group position `j`.
    #[inline(always)]
    fn member(&self, op: &ProxyOp<N>, j: usize) -> usize {
        if ONE {
            self.lead() // the leader is the group's only member
        } else {
            op.order[self.g.start + j] as usize
        }
    }

    /// Sub index of the group's leader (a constant for a group of one).
    #[inline(always)]
    fn lead(&self) -> usize {
        if ONE {
            Group::SOLO.lead
        } else {
            self.g.lead
        }
    }

    /// The four stages, each drained (each loop is bounded: its counter grows or it stops);
    /// returns whether one moved.
    #[inline(always)]
    fn run<P: Profiler>(&self, net: &mut N, op: &mut ProxyOp<N>, prof: &mut P) -> Result<bool> {
        let mut moved = self.retire(net, op, prof)?;
        // Receives posted by this pass are tested from the next one: their clear-to-send
        // leaves with this post, so their data cannot be there yet (an RDMA sender writes only
        // after seeing it), and testing them would only fail.
        let old = op.subs[self.lead()].posted;
        while self.post(net, op, prof)? {
            moved = true;
        }
        // The sizes `test` fills, set up once per pass (a group's test resets what it reads).
        let mut sizes = [0usize; MAX_RECVS];
        while self.test(net, op, prof, old, &mut sizes)? {
            moved = true;
        }
        while self.hand_over(net, op, prof)? {
            moved = true;
        }
        Ok(moved)
    }

    /// Stage 1: posts one multi-receive covering the next slice of every member that still
    /// has steps (at most `max_depth` ahead of `done`); returns whether it posted.
    #[inline(always)]
    fn post<P: Profiler>(&self, net: &mut N, op: &mut ProxyOp<N>, prof: &mut P) -> Result<bool> {
        let (req, cnt) = if ONE {
            let si = self.lead();
            let sub = &mut op.subs[si];
            if sub.posted >= sub.nsteps {
                return Ok(false);
            }
            let Some(b) = self.member_buf(0, si, sub, prof)? else {
                return Ok(false);
            };
            (net.irecv(self.rc, &[b])?, 1)
        } else {
            let mut bufs = heapless::Vec::<NetBuf<N::Mr>, MAX_RECVS>::new();
            for j in 0..self.len() {
                let si = self.member(op, j);
                let sub = &mut op.subs[si];
                if sub.posted >= sub.nsteps {
                    continue;
                }
                let Some(b) = self.member_buf(j, si, sub, prof)? else {
                    return Ok(false);
                };
                bufs.push(b).map_err(|_| Error::Full {
                    what: "buffers in one multi-receive",
                    cap: MAX_RECVS,
                })?;
            }
            if bufs.is_empty() {
                return Ok(false);
            }
            (net.irecv(self.rc, &bufs)?, bufs.len())
        };
        let Some(req) = req else {
            return Ok(false);
        };
        let slice = self.shape.slice;
        let ls = &mut op.subs[self.lead()];
        let ri = (ls.posted % STEPS as u64) as usize;
        ls.requests[ri] = Some(req);
        ls.req_count[ri] = cnt as u8;
        for j in 0..self.len() {
            let si = self.member(op, j);
            let sub = &mut op.subs[si];
            sub.posted += slice;
            prof.op_state(si, OpEvent::RecvPosted, sub.posted, sub.trans_size);
            prof.step_state(si, sub.posted - slice, sub.posted, StepEvent::RecvWait);
        }
        Ok(true)
    }

    /// The buffer member `j` (sub `si`, which still has steps) receives its next slice into,
    /// or `None` when it cannot post yet (depth reached; registered: the kernel not started).
    #[inline(always)]
    fn member_buf<P: Profiler>(
        &self,
        j: usize,
        si: usize,
        sub: &mut Sub<N>,
        prof: &mut P,
    ) -> Result<Option<NetBuf<N::Mr>>> {
        let Shape {
            cfg,
            p,
            slice,
            nsubs,
            max_depth,
            ..
        } = *self.shape;
        let depth = if !PLAIN && sub.reg { 1 } else { max_depth };
        if sub.posted >= sub.done + depth {
            return Ok(None);
        }
        let Link { c, r, .. } = self.links[j];
        let step = sub.base + sub.posted;
        let slot = RecvMem::<STEPS>::slot(step);
        let fifo = &r.recv_mem.get().conn_fifo;
        let (addr, mut size) = if !PLAIN && p == Protocol::Simple && c.req.shared {
            if sub.reg {
                // Touch the user buffer only once the GPU kernel has started.
                if fifo[RecvMem::<STEPS>::slot(sub.base)].size().is_none() {
                    return Ok(None);
                }
                (sub.buff, sub.nbytes.min(cfg.max_net_size.max(1)))
            } else {
                let b = r.bufs[p.index()].ok_or(Error::Missing {
                    what: "shared buffer",
                })?;
                let sslot = (sub.posted % max_depth) as usize * nsubs + self.g.start + j;
                let off = shared_offset(cfg.p2p_chunk_size, c.req.channel, sslot)?;
                fifo[slot].set_offset(off);
                (b.cpu + off as u64, cfg.p2p_chunk_size)
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
        if !PLAIN {
            // Read back only for a multi-receive whose sizes come as flags (never plain).
            sub.posted_sizes[(sub.posted % STEPS as u64) as usize] = size;
        }
        Ok(Some(NetBuf {
            addr,
            size,
            tag: c.req.tp_remote_rank,
            mr,
        }))
    }

    /// Stage 2: tests the group's oldest posted multi-receive (only one that was posted before
    /// `posted`, the leader's count when the pass began, and not yet seen done); when done,
    /// accounts every member's bytes and starts the flush. Returns whether it completed.
    #[inline(always)]
    fn test<P: Profiler>(
        &self,
        net: &mut N,
        op: &mut ProxyOp<N>,
        prof: &mut P,
        posted: u64,
        sizes: &mut [usize; MAX_RECVS],
    ) -> Result<bool> {
        let Shape { p, slice, .. } = *self.shape;
        let lead = self.lead();
        let step = op.subs[lead].received;
        if posted <= step {
            return Ok(false);
        }
        let ri = (step % STEPS as u64) as usize;
        let Some(req) = op.subs[lead].requests[ri] else {
            return Err(Error::BadState {
                op: "recv progress",
                state: "no request for a posted step",
            });
        };
        if ONE {
            sizes[0] = 0;
        } else {
            *sizes = [0; MAX_RECVS];
        }
        if !net.test(CommRef::Recv(self.rc), req, sizes)? {
            return Ok(false);
        }
        let cnt = op.subs[lead].req_count[ri] as usize;
        let flags = !PLAIN
            && self
                .links
                .first()
                .is_some_and(|l| l.c.props.sizes == SizeReport::Flags)
            && cnt > 1;
        let mut need_flush = false;
        let mut total = 0usize;
        let mut idx = 0;
        let mut fl = heapless::Vec::<NetBuf<N::Mr>, MAX_RECVS>::new();
        let mut gdc_flush = None;
        for (j, &Link { c, r, .. }) in self.links[..self.len()].iter().enumerate() {
            let si = self.member(op, j);
            let sub = &mut op.subs[si];
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
                if !PLAIN && c.req.use_gdr && c.req.need_flush {
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
                if !PLAIN && sub.reg && sub.piece_done(size) {
                    // Release: pairs with the GPU's Acquire poll; ordered before the `tail`
                    // store that ends the registered receive.
                    let fifo = &r.recv_mem.get().conn_fifo;
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
        if !PLAIN {
            let flush = need_flush && total > 0 && p == Protocol::Simple;
            self.start_flush(net, op, ri, req, flush.then_some((gdc_flush, &fl[..])))?;
        }
        Ok(true)
    }

    /// After a (non-plain) multi-receive of ring slot `ri` completed: its request `req` moves to
    /// `consumed`, and when the data needs a `flush` ([`Flush`]), it starts: a read of the
    /// GDR-copy flush word if any, else an `iflush` of the buffers, whose request takes the slot
    /// in `requests`.
    /// A plain receive never flushes: its request stays in `requests` until `retire` (its
    /// slot is reposted only after that), saving the move to `consumed`.
    #[inline(always)]
    fn start_flush(
        &self,
        net: &mut N,
        op: &mut ProxyOp<N>,
        ri: usize,
        req: N::Req,
        flush: Flush<'_, N::Mr>,
    ) -> Result<()> {
        let lead = self.lead();
        let ls = &mut op.subs[lead];
        ls.requests[ri] = None;
        ls.consumed[ri] = Some(req);
        match flush {
            Some((Some(w), _)) => self.shape.mem.flush_read(w.get()),
            Some((None, fl)) if !fl.is_empty() => {
                op.subs[lead].requests[ri] = net.iflush(self.rc, fl)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Stage 3: once the group's oldest received step's flush (if any) completed, moves every
    /// member's `tail`. Returns whether it handed over.
    #[inline(always)]
    fn hand_over<P: Profiler>(
        &self,
        net: &mut N,
        op: &mut ProxyOp<N>,
        prof: &mut P,
    ) -> Result<bool> {
        let slice = self.shape.slice;
        let lead = self.lead();
        let (received, step) = (op.subs[lead].received, op.subs[lead].transmitted);
        if received <= step {
            return Ok(false);
        }
        let ri = (step % STEPS as u64) as usize;
        // A plain sub never flushes: no request waits here.
        if let (false, Some(req)) = (PLAIN, op.subs[lead].requests[ri]) {
            let mut sizes = [0usize; MAX_RECVS];
            if !net.test(CommRef::Recv(self.rc), req, &mut sizes)? {
                return Ok(false);
            }
            op.subs[lead].requests[ri] = None;
        }
        for (j, link) in self.links[..self.len()].iter().enumerate() {
            let si = self.member(op, j);
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
                let tail = if !PLAIN && sub.reg {
                    (sub.transmitted == sub.nsteps).then_some(sub.base + slice)
                } else {
                    Some(sub.base + sub.transmitted)
                };
                if let Some(t) = tail {
                    store_step(link.tail, t);
                    self.shape.mem.store_fence();
                }
            }
        }
        Ok(true)
    }

    /// Stage 4: retires every step the GPU consumed (its `head`), telling the plugin with
    /// `irecv_consumed`. Returns whether one moved.
    #[inline(always)]
    fn retire<P: Profiler>(&self, net: &mut N, op: &mut ProxyOp<N>, prof: &mut P) -> Result<bool> {
        let slice = self.shape.slice;
        let lead = self.lead();
        let mut moved = false;
        for (j, link) in self.links[..self.len()].iter().enumerate() {
            let si = self.member(op, j);
            let sub = &op.subs[si];
            if sub.done == sub.nsteps || sub.transmitted <= sub.done {
                continue;
            }
            let r = link.r;
            let head = if !PLAIN && sub.reg {
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
                let ls = &mut op.subs[lead];
                let held = if PLAIN {
                    &mut ls.requests[ci]
                } else {
                    &mut ls.consumed[ci]
                };
                if let Some(req) = held.take() {
                    let n = op.subs[lead].req_count[ci] as usize;
                    net.irecv_consumed(self.rc, n, req)?;
                }
                let sub = &mut op.subs[si];
                sub.done += slice;
                prof.step_stop(si, sub.done - slice, sub.done);
                prof.op_state(si, OpEvent::RecvDone, sub.done, sub.trans_size);
                moved = true;
                if sub.done == sub.nsteps {
                    sub.release_own_mr(net, r.comm)?;
                    op.ndone += 1;
                    break;
                }
            }
        }
        Ok(moved)
    }
}

/// A completed receive's flush, when it needs one: the GDR-copy flush word (if the connection
/// has one) and the buffers to `iflush` otherwise.
type Flush<'a, M> = Option<(Option<MemRef<AtomicU64>>, &'a [NetBuf<M>])>;

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
