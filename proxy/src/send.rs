//! Send progress (NCCL's `sendProxyProgress`).
//!
//! Each call walks the subs and, per sub, runs these stages in turn, each as far as it can
//! (NCCL does one action per sub per call; draining each stage costs fewer calls per step):
//! 1. **post**: give the GPU credit for one more slice (depth-limited to
//!    `min(STEPS, SHARED_STEPS / nsubs)`). Dedicated buffers: credits are implied by `head`
//!    (the ring starts with `STEPS` credits). Shared buffers: pick the slice's shared slot,
//!    write its offset into `connFifo`, then store `head = base + posted - STEPS` (Release);
//!    a registered sub posts one credit only.
//! 2. **transmit**: when the slot is ready — `connFifo` size set and `tail` past the step
//!    (SIMPLE, LL128), plus every line flag for LL, and for LL128 in host memory — `isend` it
//!    (tag = this rank), up to `STEPS` in flight.
//! 3. **complete**: `test` the oldest send; when done, reset the slot's size to -1 and then
//!    store `head = base + done` (Release; dedicated buffers). A registered send whose piece
//!    was short of the rest moves on to one more piece (1 GiB splits); the last piece resets the
//!    size the GPU set at `base`, telling it the user buffer is free.
//!
//! A one-sub op of the plain shape (dedicated SIMPLE buffer, no user buffer) with no profiler
//! watching takes the same stages compiled apart, in `send_solo`.

use super::lines::{ll128_ready, ll_ready, LL128_LINE, LL_LINE};
use super::mem::MemProvider;
use super::net::Net;
use super::op::{ProxyOp, Sub};
use super::pools::shared_offset;
use super::profiler::{OpEvent, Profiler, StepEvent};
use super::shared::{load_step, store_step, BufView, RecvMem, SIZE_EMPTY};
use super::state::ProxyState;
use super::state::{check_gpu_size, lookup, Buf, Conn, ProxyConfig, Resources};
use super::{Dir, Protocol, MAX_RECVS, SHARED_STEPS, STEPS};
use ibnet_core::error::{Error, Result};
use ibnet_core::sync::AtomicU64;

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// One pass over a send op; returns whether it was idle.
    // Out of line: apart from the other direction's pass its registers spill less (measured
    // with callgrind, benches/callgrind.sh).
    #[inline(never)]
    pub(super) fn send_progress<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        prof: &mut P,
    ) -> Result<bool> {
        let nsubs = op.subs.len();
        // One sub (the common case): no division, no walk.
        if nsubs == 1 {
            let (moved, finished) = self.send_sub(op, 0, STEPS as u64, prof)?;
            op.ndone += finished as usize;
            return Ok(!moved);
        }
        // `max(1)`: an op without subs is done at once, never a division by zero.
        let max_depth = STEPS.min(SHARED_STEPS / nsubs.max(1)) as u64;
        let mut idle = true;
        for s in 0..nsubs {
            let (moved, finished) = self.send_sub(op, s, max_depth, prof)?;
            idle &= !moved;
            op.ndone += finished as usize;
        }
        Ok(idle)
    }

    /// Sub `s`'s three stages (nothing when it is done): whether one moved and whether the sub
    /// finished.
    #[inline(always)]
    fn send_sub<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        s: usize,
        max_depth: u64,
        prof: &mut P,
    ) -> Result<(bool, bool)> {
        let nsubs = op.subs.len();
        let sub = &mut op.subs[s];
        if sub.done == sub.nsteps {
            return Ok((false, false));
        }
        let conn = lookup(&self.conns, &self.gens, sub.conn)?;
        let res = conn.res()?;
        let comm = res.send_comm()?;
        let pass = SendPass {
            s,
            nsubs,
            p: op.protocol,
            slice: op.slice_steps,
            max_depth,
            cfg: &self.cfg,
            conn,
            res,
            comm,
            recv_mem: res.recv_mem.get(),
            head: res.proxy_word(Dir::Send),
            shared: conn.req.shared,
            buf: res.bufs[op.protocol.index()].as_ref(),
        };
        // The common shape (dedicated SIMPLE buffer, no user buffer) compiled apart: its
        // stages skip the shared-buffer, registered and LL/LL128 branches.
        if !pass.shared && !sub.reg && pass.p == Protocol::Simple {
            pass.stages::<true, _, _>(sub, &mut self.net, &self.mem, prof)
        } else {
            pass.stages::<false, _, _>(sub, &mut self.net, &self.mem, prof)
        }
    }
}

/// One sub's pass: the op's shape and the sub's connection, for the three stages.
struct SendPass<'a, N: Net> {
    /// The sub's index (for the profiler and its shared slots).
    s: usize,
    nsubs: usize,
    p: Protocol,
    slice: u64,
    /// Credits ahead of `done`: `min(STEPS, SHARED_STEPS / nsubs)`.
    max_depth: u64,
    cfg: &'a ProxyConfig,
    conn: &'a Conn<N>,
    res: &'a Resources<N>,
    comm: N::Send,
    /// What the per-step stages read, looked up once per call: the ring's `RecvMem`, the
    /// counter the proxy writes (`head`, or its GDR-copy word), shared-buffer mode and the
    /// protocol's buffer.
    recv_mem: &'a RecvMem,
    head: &'a AtomicU64,
    shared: bool,
    buf: Option<&'a Buf>,
}

impl<N: Net> SendPass<'_, N> {
    /// The three stages: [`Self::post`], [`Self::transmit`], then stage 3 here, which retires
    /// every finished send, oldest first. Returns whether one moved and whether the sub
    /// finished. `PLAIN`: the caller checked that the connection has dedicated buffers, the
    /// protocol is SIMPLE and the sub is not registered.
    // Inlined into `send_progress` (its one frame per call): since a one-sub op takes its
    // sub's stages directly, this measured fewer instructions than a frame of its own per
    // shape (callgrind, benches/callgrind.sh: -17.8 per step).
    #[inline(always)]
    fn stages<const PLAIN: bool, M: MemProvider, P: Profiler>(
        &self,
        sub: &mut Sub<N>,
        net: &mut N,
        mem: &M,
        prof: &mut P,
    ) -> Result<(bool, bool)> {
        let mut moved = self.post::<PLAIN, _, _>(sub, mem, prof)?;
        moved |= self.transmit::<PLAIN, _>(sub, net, prof)?;
        // Stage 3: retire.
        let (s, slice) = (self.s, self.slice);
        let (r, shared) = (self.res, !PLAIN && self.shared);
        let reg = !PLAIN && sub.reg;
        let recv_mem = self.recv_mem;
        let mut finished = false;
        let mut sizes = [0usize; MAX_RECVS];
        while sub.done < sub.transmitted {
            let step = sub.base + sub.done;
            let slot = RecvMem::<STEPS>::slot(step);
            let Some(req) = sub.requests[slot] else {
                return Err(Error::BadState {
                    op: "send progress",
                    state: "no request for a transmitted step",
                });
            };
            sizes[0] = 0;
            if !net.test(r.comm, req, &mut sizes)? {
                break;
            }
            sub.requests[slot] = None;
            if reg && sub.piece_done(sizes[0]) {
                // The user buffer is free: tell the GPU (Release: the network is done reading
                // it; pairs with the GPU's Acquire poll of `size`).
                recv_mem.conn_fifo[RecvMem::<STEPS>::slot(sub.base)].publish(SIZE_EMPTY);
            }
            sub.done += slice;
            let head = if shared {
                None
            } else if reg {
                (sub.done == sub.nsteps).then_some(sub.base + slice)
            } else {
                Some(sub.base + sub.done)
            };
            if reg {
                if let Some(h) = head {
                    store_step(self.head, h);
                }
            } else {
                recv_mem.retire(step, head.map(|h| (self.head, h)));
            }
            if head.is_some() {
                mem.store_fence();
            }
            prof.step_stop(s, sub.done - slice, sub.done);
            prof.op_state(s, OpEvent::SendDone, sub.done, sub.trans_size);
            moved = true;
            if sub.done == sub.nsteps {
                sub.release_own_mr(net, r.comm)?;
                finished = true;
            }
        }
        Ok((moved, finished))
    }

    /// Stage 1: posts every credit the depth allows; returns whether one moved.
    #[inline(always)]
    fn post<const PLAIN: bool, M: MemProvider, P: Profiler>(
        &self,
        sub: &mut Sub<N>,
        mem: &M,
        prof: &mut P,
    ) -> Result<bool> {
        let (s, slice) = (self.s, self.slice);
        if PLAIN && !P::PER_STEP {
            // A dedicated buffer's credits are implied by `head`: with no profiler watching,
            // the whole run of credits is one addition (the loop below ends at the same count).
            let end = sub.nsteps.min(sub.done + self.max_depth);
            if sub.posted >= end {
                return Ok(false);
            }
            let gap = end - sub.posted;
            sub.posted += if slice == 1 {
                gap
            } else {
                gap.div_ceil(slice) * slice
            };
            return Ok(true);
        }
        let recv_mem = self.recv_mem;
        let mut moved = false;
        while sub.posted < sub.nsteps && sub.posted < sub.done + self.max_depth {
            prof.step_start(s, sub.posted, sub.posted + slice);
            if !PLAIN && self.shared {
                let step = sub.base + sub.posted;
                if !sub.reg {
                    let slot = (sub.posted % self.max_depth) as usize * self.nsubs + s;
                    let off = shared_offset(self.cfg.p2p_chunk_size, self.conn.req.channel, slot)?;
                    recv_mem.conn_fifo[RecvMem::<STEPS>::slot(step)].set_offset(off);
                }
                sub.posted += slice;
                // A registered sub gets one credit: the GPU hands over the whole buffer.
                if !sub.reg || sub.posted == slice {
                    let head = (sub.base + sub.posted).wrapping_sub(STEPS as u64);
                    store_step(self.head, head);
                    mem.store_fence();
                }
            } else {
                sub.posted += slice;
            }
            prof.op_state(s, OpEvent::SendPosted, sub.posted, sub.trans_size);
            prof.step_state(s, sub.posted - slice, sub.posted, StepEvent::SendGpuWait);
            moved = true;
        }
        Ok(moved)
    }

    /// Stage 2: `isend`s every slot the GPU filled, up to `STEPS` in flight; returns whether
    /// one moved.
    // Out of line: the `isend` loop in a frame of its own, apart from the other two stages
    // (measured with callgrind, benches/callgrind.sh: inlined, +41 per step).
    #[inline(never)]
    fn transmit<const PLAIN: bool, P: Profiler>(
        &self,
        sub: &mut Sub<N>,
        net: &mut N,
        prof: &mut P,
    ) -> Result<bool> {
        let (s, slice) = (self.s, self.slice);
        let mut moved = false;
        if sub.transmitted >= sub.posted {
            return Ok(false);
        }
        let (mr, tag) = (sub.mhandle, self.conn.req.tp_rank);
        // Neither `posted` nor `done` moves in this stage: the bound is computed once.
        let limit = sub.posted.min(sub.done + STEPS as u64);
        while sub.transmitted < limit {
            let step = sub.base + sub.transmitted;
            let Some((addr, size)) = self.ready::<PLAIN>(sub, step)? else {
                break;
            };
            prof.op_state(
                s,
                OpEvent::SendRemFifoWait,
                sub.transmitted + slice,
                sub.trans_size,
            );
            let Some(mr) = mr else {
                return Err(Error::Missing {
                    what: "memory handle",
                });
            };
            let Some(req) = net.isend(self.comm, addr, size, tag, mr)? else {
                break;
            };
            sub.requests[RecvMem::<STEPS>::slot(step)] = Some(req);
            sub.transmitted += slice;
            sub.trans_size += size as u64;
            prof.op_state(s, OpEvent::SendTransmitted, sub.transmitted, sub.trans_size);
            prof.step_state(
                s,
                sub.transmitted - slice,
                sub.transmitted,
                StepEvent::SendWait,
            );
            moved = true;
        }
        Ok(moved)
    }

    /// Whether `step`'s slot is ready to send: `(address, size)`. SIMPLE and LL128: `connFifo`
    /// size set and `tail` past the step; LL: every line flag; LL128 in host memory: every line
    /// flag too. Registered: the GPU moved `tail` past `base` (the user buffer is ready).
    #[inline(always)]
    fn ready<const PLAIN: bool>(&self, sub: &Sub<N>, step: u64) -> Result<Option<(u64, usize)>> {
        let recv_mem = self.recv_mem;
        if !PLAIN && sub.reg {
            let go = load_step(&recv_mem.tail) > sub.base;
            return Ok(go.then(|| (sub.buff, sub.nbytes.min(self.cfg.max_net_size.max(1)))));
        }
        let p = if PLAIN { Protocol::Simple } else { self.p };
        let Some(size) = recv_mem.ready(step, step, p != Protocol::Ll) else {
            return Ok(None);
        };
        let size = size as usize;
        let Some(b) = self.buf else {
            return Err(Error::Missing {
                what: "protocol buffer of the connection",
            });
        };
        let slot = RecvMem::<STEPS>::slot(step);
        let (off, room) = if !PLAIN && self.shared && p == Protocol::Simple {
            let off = recv_mem.conn_fifo[slot].offset() as usize;
            (off, self.cfg.p2p_chunk_size)
        } else {
            let step_size = b.size / STEPS;
            (slot * step_size, step_size * self.slice as usize)
        };
        check_gpu_size(size, off, room, b.size)?;
        let addr = b.cpu + off as u64;
        let lines_ok = match p {
            Protocol::Ll => {
                let v = BufView::new(&b.region, addr, round(size, LL_LINE))?;
                ll_ready(&v, size, step)
            }
            // With GPU-direct the data is in device memory, ordered by `tail`.
            Protocol::Ll128 if !self.conn.req.use_gdr => {
                let v = BufView::new(&b.region, addr, round(size, LL128_LINE))?;
                ll128_ready(&v, size, step)
            }
            _ => true,
        };
        Ok(lines_ok.then_some((addr, size)))
    }
}

#[inline]
fn round(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}
