//! Starting, driving and aborting an operation: the entry points of progress.

use super::net::{CommRef, Net, PtrType};
use super::op::{OpState, Progress, ProxyOp};
use super::profiler::{NoProfiler, Profiler};
use super::state::{lookup, ProxyState};
use super::{round_up, Dir, Protocol, MAX_SUBS};
use crate::mem::MemProvider;
use ibnet_core::error::{Error, Result};

impl<N: Net, M: MemProvider, const C: usize> ProxyState<N, M, C> {
    /// Advances `op` as far as it can without waiting. Call it repeatedly (interleaved with
    /// other operations) until it reports `done`. After an error the operation is unusable:
    /// [`ProxyState::abort`] it.
    #[inline]
    pub fn progress(&mut self, op: &mut ProxyOp<N>) -> Result<Progress> {
        self.progress_with(op, &mut NoProfiler)
    }

    /// [`ProxyState::progress`], reporting events to `prof`.
    // A hint only: with the plain solo passes inlined here the compiler keeps this as one
    // frame per call (measured with callgrind, benches/callgrind.sh: forced into the caller's
    // loop, +6.8 instructions per step). `start` is out of line.
    #[inline]
    pub fn progress_with<P: Profiler>(
        &mut self,
        op: &mut ProxyOp<N>,
        prof: &mut P,
    ) -> Result<Progress> {
        // One test on the moving path (the common case); `Ready` and `Done` behind it.
        if op.state != OpState::Progress {
            if op.state == OpState::Ready {
                self.start(op, prof)?;
            }
            if op.state == OpState::Done {
                return Ok(Progress {
                    idle: true,
                    done: true,
                });
            }
        }
        // The plain one-sub shapes with no profiler watching first (compiled apart, inline
        // here); any other op takes the general passes.
        let idle = match op.dir {
            Dir::Send => match self.send_solo::<P>(op)? {
                Some(idle) => idle,
                None => self.send_progress(op, prof)?,
            },
            Dir::Recv => match self.recv_solo::<P>(op)? {
                Some(idle) => idle,
                None => self.recv_progress(op, prof)?,
            },
        };
        if op.ndone == op.subs.len() {
            for s in 0..op.subs.len() {
                prof.op_stop(s);
            }
            op.state = OpState::Done;
        }
        Ok(Progress {
            idle,
            done: op.state == OpState::Done,
        })
    }

    /// Gives up on `op`: deregisters the user buffers it registered. Outstanding network
    /// requests are left to the comm's close (free the connections next).
    pub fn abort(&mut self, op: &mut ProxyOp<N>) -> Result<()> {
        let mut first = Ok(());
        for sub in op.subs.iter_mut() {
            if !sub.own_mr {
                continue;
            }
            sub.own_mr = false;
            let (Some(mr), Ok(c)) = (
                sub.mhandle.take(),
                lookup(&self.conns, &self.gens, sub.conn),
            ) else {
                continue;
            };
            if let Some(r) = c.res.as_ref() {
                let e = self.net.dereg_mr(r.comm, mr);
                if first.is_ok() {
                    first = e;
                }
            }
        }
        op.state = OpState::Done;
        first
    }

    /// Sets each sub's `base`, registers user buffers, checks the op against its
    /// connections, and (receive) forms the groups.
    // Out of line: once per op, kept out of every progress call's frame.
    #[inline(never)]
    fn start<P: Profiler>(&mut self, op: &mut ProxyOp<N>, prof: &mut P) -> Result<()> {
        let p = op.protocol;
        let nsubs = op.subs.len();
        for s in 0..nsubs {
            let id = op.subs[s].conn;
            let c = lookup(&self.conns, &self.gens, id)?;
            let r = c.res()?;
            if c.dir != op.dir {
                return Err(Error::BadState {
                    op: "proxy op",
                    state: "connection of the other direction",
                });
            }
            let sub = &op.subs[s];
            if sub.reg && !c.req.shared {
                return Err(Error::BadState {
                    op: "registered sub",
                    state: "connection without shared buffers",
                });
            }
            if c.req.shared && p == Protocol::Simple && !sub.reg && op.slice_steps != 1 {
                return Err(Error::OutOfRange {
                    what: "slice_steps with shared buffers",
                    value: op.slice_steps as i64,
                    min: 1,
                    max: 1,
                });
            }
            let comm = r.comm;
            let proto_mr = r.mhandles[p.index()];
            let base = round_up(c.step, op.chunk_steps);
            let sub = &mut op.subs[s];
            sub.base = base;
            if let Some(Some(c)) = self.conns.get_mut(id.index()) {
                c.step = base + sub.nsteps;
            }
            prof.op_start(op.dir, s, sub.nsteps, sub.nbytes);
            if sub.reg && sub.nbytes > 0 {
                sub.mhandle =
                    Some(
                        self.net
                            .reg_mr(comm, sub.buff, sub.nbytes, PtrType::Device, None)?,
                    );
                sub.own_mr = true;
            } else {
                sub.mhandle = proto_mr;
                if sub.mhandle.is_none() && !sub.reg {
                    return Err(Error::Missing {
                        what: "protocol buffer of the connection",
                    });
                }
            }
        }
        if op.dir == Dir::Recv {
            self.group(op)?;
        }
        op.state = OpState::Progress;
        Ok(())
    }

    /// Orders receive subs so that subs sharing a comm are adjacent, in groups of at most the
    /// net's `max_recvs`.
    fn group(&self, op: &mut ProxyOp<N>) -> Result<()> {
        let n = op.subs.len();
        if n == 1 {
            // A group of one (what the walk below ends with; `start` checked the connection).
            op.subs[0].group = 1;
            return Ok(());
        }
        let mut comms: [Option<CommRef<N::Send, N::Recv>>; MAX_SUBS] = [None; MAX_SUBS];
        let mut maxr = [1usize; MAX_SUBS];
        for (s, sub) in op.subs.iter().enumerate() {
            let c = lookup(&self.conns, &self.gens, sub.conn)?;
            comms[s] = Some(c.res()?.comm);
            maxr[s] = c.props.max_recvs;
        }
        let mut k = 0;
        while k < n {
            let lead = op.order[k] as usize;
            let mut g = 1;
            while g < maxr[lead] && k + g < n {
                let want = comms[lead];
                let Some(j) = (k + g..n).find(|&j| comms[op.order[j] as usize] == want) else {
                    break;
                };
                op.order.swap(k + g, j);
                g += 1;
            }
            op.subs[lead].group = g as u8;
            k += g;
        }
        Ok(())
    }
}
