//! A proxy operation: up to [`MAX_SUBS`] sub-operations (one per connection) moving
//! `nsteps` ring steps each, in one protocol (NCCL's `ncclProxyArgs` / `ncclProxySubArgs`).
//!
//! Per sub the engine counts, in steps relative to the sub's `base`:
//! ```text
//!  send:  done ≤ transmitted ≤ posted ≤ nsteps        recv: done ≤ transmitted ≤ received ≤ posted
//!         posted:      credits given to the GPU              posted:      irecv issued
//!         transmitted: isend issued                          received:    network delivered
//!         done:        network completed, slot returned      transmitted: flushed, tail moved
//!                                                            done:        GPU consumed (head)
//! ```
//! `base` is the connection's running step counter rounded up to `chunk_steps`; counters
//! move by `slice_steps`. A registered sub (`reg_buff`) sends/receives straight from a user
//! buffer: one step as far as the GPU is concerned, split on the network into pieces of at
//! most [`MAX_NET_SIZE`](super::MAX_NET_SIZE) bytes.
//!
//! Receive operations group subs that share a net comm (up to the net's `max_recvs`) into one
//! multi-receive; a group moves in lockstep. Grouping only reorders an internal index: sub
//! `i` stays sub `i` for the caller.

use super::net::{CommRef, Net};
use super::state::ConnId;
use super::{Dir, Protocol, MAX_SUBS, STEPS};
use ibnet_core::error::{Error, Result};

/// One sub-operation as the caller describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubArgs {
    /// The connection.
    pub conn: ConnId,
    /// Ring steps to move (a multiple of the op's `slice_steps`).
    pub nsteps: u64,
    /// Bytes to move (caps each step's network size).
    pub nbytes: usize,
    /// Registered mode: the user buffer's address (SIMPLE, shared-buffer connections only).
    pub reg_buff: Option<u64>,
}

impl SubArgs {
    /// `nsteps` steps through the connection's buffers.
    pub fn new(conn: ConnId, nsteps: u64, nbytes: usize) -> Self {
        Self {
            conn,
            nsteps,
            nbytes,
            reg_buff: None,
        }
    }
    /// `nbytes` straight from/to the user buffer at `buff` (one GPU step).
    pub fn registered(conn: ConnId, buff: u64, nbytes: usize) -> Self {
        Self {
            conn,
            nsteps: 1,
            nbytes,
            reg_buff: Some(buff),
        }
    }
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpState {
    /// Not started: the first `progress` sets bases and registers user buffers.
    Ready,
    /// Moving.
    Progress,
    /// Every sub is done.
    Done,
}

/// The result of one `progress` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Nothing moved (the caller may back off).
    pub idle: bool,
    /// The operation is finished.
    pub done: bool,
}

/// A sub-operation's state.
pub(crate) struct Sub<N: Net> {
    pub conn: ConnId,
    pub nsteps: u64,
    pub nbytes: usize,
    /// Registered mode: the current position in the user buffer.
    pub buff: u64,
    pub reg: bool,
    pub base: u64,
    pub posted: u64,
    pub transmitted: u64,
    pub received: u64,
    pub done: u64,
    pub trans_size: u64,
    pub mhandle: Option<N::Mr>,
    /// The engine registered `mhandle` for this sub (and deregisters it).
    pub own_mr: bool,
    pub requests: [Option<N::Req>; STEPS],
    /// Receive: bytes posted per step (index `posted % STEPS`).
    pub posted_sizes: [usize; STEPS],
    /// Receive (group leader): buffers in the multi-receive of each step.
    pub req_count: [u8; STEPS],
    /// Receive (group leader): completed multi-receives awaiting `irecv_consumed`.
    pub consumed: [Option<N::Req>; STEPS],
    /// Receive: size of the group this sub leads (0 when not a leader).
    pub group: u8,
}

impl<N: Net> Sub<N> {
    /// A finished sub (its last step retired, send or receive) gives back the user-buffer
    /// registration the engine made for it in `start`, once.
    #[inline]
    pub fn release_own_mr(&mut self, net: &mut N, comm: CommRef<N::Send, N::Recv>) -> Result<()> {
        if self.own_mr {
            if let Some(mr) = self.mhandle.take() {
                self.own_mr = false;
                net.dereg_mr(comm, mr)?;
            }
        }
        Ok(())
    }

    /// Registered mode: `size` bytes of the user buffer moved. `true` when that was the rest
    /// (the user buffer is free); otherwise the sub moves on to one more piece (1 GiB splits).
    pub fn piece_done(&mut self, size: usize) -> bool {
        if size < self.nbytes {
            self.buff += size as u64;
            self.nbytes -= size;
            self.nsteps += 1;
            false
        } else {
            true
        }
    }
}

/// A proxy operation. Build it with [`ProxyOp::new`] and [`ProxyOp::push`], then call
/// [`ProxyState::progress`](super::ProxyState::progress) until it reports `done`.
pub struct ProxyOp<N: Net> {
    pub(crate) dir: Dir,
    pub(crate) protocol: Protocol,
    pub(crate) slice_steps: u64,
    pub(crate) chunk_steps: u64,
    /// The subs. A `u8` length: with heapless' default `usize` length, rustc folded `Vec::new()`
    /// into a constant that it wrote out as a 4 KiB `memset` per `ProxyOp::new` (measured with
    /// callgrind: ~130 instructions per step of a 64-step op); a `u8` length leaves the storage
    /// uninitialised as intended.
    pub(crate) subs: heapless::Vec<Sub<N>, MAX_SUBS, u8>,
    /// Receive: sub indices in group order.
    pub(crate) order: [u8; MAX_SUBS],
    pub(crate) state: OpState,
    pub(crate) ndone: usize,
}

impl<N: Net> ProxyOp<N> {
    /// An empty operation. `slice_steps` (1..=[`STEPS`]) is how many steps one network
    /// operation covers; `chunk_steps` (≥ `slice_steps`) is the alignment of each sub's
    /// `base`.
    // Always inline: the caller then builds the op in place; out of line, the 4 KiB op was
    // copied out of the `Result` into the caller's variable (a `memcpy` per op, measured with
    // callgrind: ~14 instructions per step of a 64-step op).
    #[inline(always)]
    pub fn new(dir: Dir, protocol: Protocol, slice_steps: u64, chunk_steps: u64) -> Result<Self> {
        if slice_steps == 0 || slice_steps > STEPS as u64 {
            return Err(Error::OutOfRange {
                what: "slice_steps",
                value: slice_steps as i64,
                min: 1,
                max: STEPS as i64,
            });
        }
        if chunk_steps < slice_steps || chunk_steps > STEPS as u64 {
            return Err(Error::OutOfRange {
                what: "chunk_steps",
                value: chunk_steps as i64,
                min: slice_steps as i64,
                max: STEPS as i64,
            });
        }
        Ok(Self {
            dir,
            protocol,
            slice_steps,
            chunk_steps,
            subs: heapless::Vec::new(),
            order: core::array::from_fn(|i| i as u8),
            state: OpState::Ready,
            ndone: 0,
        })
    }

    /// Adds a sub-operation (before the first `progress`).
    pub fn push(&mut self, a: SubArgs) -> Result<()> {
        if self.state != OpState::Ready {
            return Err(Error::BadState {
                op: "ProxyOp::push",
                state: "started",
            });
        }
        if a.nsteps == 0 || !a.nsteps.is_multiple_of(self.slice_steps) {
            return Err(Error::OutOfRange {
                what: "sub nsteps (a positive multiple of slice_steps)",
                value: a.nsteps as i64,
                min: self.slice_steps as i64,
                max: i64::MAX,
            });
        }
        if a.reg_buff.is_some() && (self.protocol != Protocol::Simple || a.nsteps != 1) {
            return Err(Error::BadState {
                op: "registered sub",
                state: "needs SIMPLE and one step",
            });
        }
        let sub = Sub {
            conn: a.conn,
            nsteps: a.nsteps,
            nbytes: a.nbytes,
            buff: a.reg_buff.unwrap_or(0),
            reg: a.reg_buff.is_some(),
            base: 0,
            posted: 0,
            transmitted: 0,
            received: 0,
            done: 0,
            trans_size: 0,
            mhandle: None,
            own_mr: false,
            requests: [None; STEPS],
            posted_sizes: [0; STEPS],
            req_count: [0; STEPS],
            consumed: [None; STEPS],
            group: 0,
        };
        self.subs.push(sub).map_err(|_| Error::Full {
            what: "proxy op subs",
            cap: MAX_SUBS,
        })
    }

    /// The operation's state.
    pub fn state(&self) -> OpState {
        self.state
    }
    /// Whether a sub still holds a registration of a user buffer that `start` made for it: a
    /// started op that has neither finished (which deregisters it) nor been aborted.
    pub fn holds_registrations(&self) -> bool {
        self.subs.iter().any(|s| s.own_mr)
    }
    /// Sub-operations.
    pub fn nsubs(&self) -> usize {
        self.subs.len()
    }
    /// Bytes sub `i` moved on the network so far.
    pub fn bytes(&self, i: usize) -> u64 {
        self.subs.get(i).map_or(0, |s| s.trans_size)
    }
    /// The `base` step of sub `i` (set by the first `progress`).
    pub fn base(&self, i: usize) -> u64 {
        self.subs.get(i).map_or(0, |s| s.base)
    }
    /// Size of the receive group led by position `k` of the group order, for tests and
    /// diagnostics: `(sub index, group size)` of every group.
    pub fn groups(&self) -> heapless::Vec<(usize, usize), MAX_SUBS> {
        self.group_walk().map(|g| (g.lead, g.len)).collect()
    }

    /// The receive groups in order. A copy of the group order: the progress stages change the
    /// subs while they walk.
    pub(crate) fn group_walk(&self) -> Groups {
        let mut len = [1u8; MAX_SUBS];
        for (k, l) in len.iter_mut().enumerate().take(self.subs.len()) {
            *l = self.subs[self.order[k] as usize].group.max(1);
        }
        Groups {
            order: self.order,
            len,
            n: self.subs.len(),
            k: 0,
        }
    }
}

/// A receive group: positions `start..start + len` of the op's group order, led by the sub at
/// `start` (which holds the group's requests).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Group {
    /// First position in the group order.
    pub start: usize,
    /// Members.
    pub len: usize,
    /// The leading sub's index.
    pub lead: usize,
}

impl Group {
    /// The one group of a one-sub op (sub 0 leads itself).
    pub const SOLO: Self = Self {
        start: 0,
        len: 1,
        lead: 0,
    };
}

/// Iterator over the groups of a receive op ([`ProxyOp::group_walk`]); a copy walks again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Groups {
    order: [u8; MAX_SUBS],
    len: [u8; MAX_SUBS],
    n: usize,
    k: usize,
}

impl Iterator for Groups {
    type Item = Group;

    fn next(&mut self) -> Option<Group> {
        if self.k >= self.n {
            return None;
        }
        let g = Group {
            start: self.k,
            len: (self.len[self.k] as usize).min(self.n - self.k),
            lead: self.order[self.k] as usize,
        };
        self.k += g.len;
        Some(g)
    }
}
