//! # ibnet-proxy
//!
//! The proxy engine: NCCL's net transport (`net.cc`) as an allocation-free, `no_std` library.
//!
//! Inside NCCL a *proxy thread* sits between the GPU kernels and the net plugin. For every
//! connection the GPU and the proxy share a ring of [`STEPS`] buffer slots and three counters;
//! the proxy turns "the GPU filled slot k" into `isend`, and "the network filled slot k" into a
//! signal the GPU waits on. This module is that engine, over any [`Net`] (any plugin's C table in
//! `ibnet-ffi`, or ibnet's own comms in one process through `ibnet_testkit::InProcessNet`) and
//! any [`MemProvider`] (CUDA, HIP, or plain host memory for tests).
//!
//! ```text
//!  send connection                                   recv connection
//!  GPU (producer)          proxy                     proxy                 GPU (consumer)
//!  wait head+8 > k  ◀──── head = k+1 (credit)        irecv slot k ───▶ NIC writes slot k
//!  write slot k                ▲                     test done, flush
//!  fifo[k%8].size = n ───┐     │ size = -1, then     tail = k+1 ────────▶ wait tail > k
//!  tail = k+1 ───────────┴──▶ test tail/size/flags   ◀──── head = k+1      read slot k
//!                             isend slot k ─▶ NIC    retire, repost slot k
//! ```
//!
//! Pieces, one file each:
//! * [`shared`]: the `#[repr(C)]` memory the GPU and the proxy exchange ([`SendMem`] `head`,
//!   [`RecvMem`] `tail` + `connFifo`), with the orderings of every access;
//! * [`device`]: the GPU side of that protocol, as a reference for host-side producers,
//!   simulators and the loom models;
//! * [`map`]: the connection map (memory banks, bank+offset encoding) a connection's buffers
//!   are described with;
//! * [`net`]: the [`Net`] trait the engine drives (`ibnet_testkit::in_process`: `Net` over ibnet's
//!   comms, in one process, the double for tests and benches);
//! * [`mem`]: the [`MemProvider`] trait (allocation, DMA-BUF, GDR-copy words and flush);
//! * [`lines`]: LL / LL128 readiness checks;
//! * [`profiler`]: proxy op/step events, no-op by default;
//! * [`state`]: the [`ProxyState`] (connection table, shared pools, shared comms);
//!   [`lifecycle`]: setup/connect/free, `build` (private): a connection's resources in
//!   stages; [`pools`]: shared buffers and shared comms;
//! * [`export`], [`xmap`], [`attach`]: the connection map across processes (PXN): a bank's
//!   export descriptor, the validated message the GPU's process receives, and its mapping
//!   there;
//! * [`op`]: a proxy operation and its sub-operations; `send` and `recv` (private): progress.
//!
//! # Driving it
//! ```text
//!  let mut px = ProxyState::<_, _, 64>::new(net, mem, ProxyConfig::default());
//!  let (r, handle) = px.setup(Dir::Recv, recv_req)?;     // listens, returns the handle
//!  let (s, _)      = px.setup(Dir::Send, send_req)?;
//!  // call each until it returns Some (Ok(None): not yet):
//!  px.connect_send(s, &handle)?;  px.connect_recv(r, peer_rank)?;
//!  let view = px.device_view(s)?;                        // what the GPU kernel is given
//!  let mut op = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1);
//!  op.push(SubArgs::new(s, nsteps, nbytes))?;
//!  while !px.progress(&mut op)?.done {}
//!  px.free(s)?;
//! ```
//! One thread drives a `ProxyState` (the proxy thread); the GPU (or its simulator) touches only
//! the shared memory. When the GPU runs in another process (`SetupReq::gpu_process` differs from
//! `ProxyConfig::process_id`; NCCL's PXN), the map's banks are exported and that process maps
//! them from [`ProxyState::export_map`]'s [`xmap::XMap`] with [`attach::Attached`]. Nothing here allocates: memory comes from the [`MemProvider`], comms from
//! the [`Net`], and every table has a fixed capacity whose exhaustion is an error.
//!
//! `unsafe` code is denied at the crate root and allowed only in the shared-memory and
//! memory-provider modules ([`shared`], [`device`], [`mem`], [`xmap`]) and, with the `capi`
//! feature, in `capi` (C callbacks, POSIX shared memory), each block with a `SAFETY` comment.
//!
//! Feature `capi` (off by default; `ibnet-ffi` turns it on for its C API): the C-facing
//! memory table, shared-memory banks and C profiler, with std and libc. Without it the crate
//! is `no_std` and allocation-free. Errors, atomics (the loom facade) and the FIFO's limits come from
//! `ibnet-core`.

#![cfg_attr(not(any(test, loom, feature = "capi")), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod attach;
mod build;
#[cfg(feature = "capi")]
pub mod capi;
pub mod device;
pub mod export;
pub mod lifecycle;
pub mod lines;
pub mod map;
pub mod mem;
pub mod net;
pub mod op;
pub mod pools;
pub mod profiler;
mod recv;
mod recv_solo;
mod send;
mod send_solo;
mod setup;
pub mod shared;
mod start;
pub mod state;
pub mod xmap;

pub use device::{DeviceRecv, DeviceSend};
pub use export::{BankDesc, HandleKind};
pub use lifecycle::{DeviceView, SetupReq};
pub use map::{Bank, ConnectMap, MapOffset};
pub use mem::{MemKind, MemProvider, Region};
pub use net::{CommRef, Net, NetBuf, NetHandle, NetProps, PtrType, SizeReport};
pub use op::{OpState, Progress, ProxyOp, SubArgs};
pub use profiler::{NoProfiler, OpEvent, Profiler, StepEvent};
pub use shared::{ConnFifo, RecvMem, SendMem};
pub use state::{ConnId, ProxyConfig, ProxyState};

/// Slots in a connection's ring (`NCCL_STEPS`).
pub const STEPS: usize = 8;
/// Slots per channel in shared-buffer mode (`NCCL_SHARED_STEPS`).
pub const SHARED_STEPS: usize = 16;
/// Sub-operations in one proxy operation. With [`SHARED_STEPS`] / `nsubs` as the depth limit,
/// 16 keeps every sub at least one step deep.
pub const MAX_SUBS: usize = 16;
/// The most bytes one network operation carries: registered user buffers are split at 1 GiB
/// (`MAX_NET_SIZE`: a power of two rather than `INT_MAX`).
pub const MAX_NET_SIZE: usize = 1 << 30;
/// Receives in one multi-receive (the plugin API's limit).
pub const MAX_RECVS: usize = ibnet_core::fifo::MAX_RECVS;

/// `connFifo` mode: data sits at the slot's fixed place in the dedicated buffer.
pub const MODE_NORMAL: u32 = 0;
/// `connFifo` mode: data sits at `connFifo[slot].offset` in the shared buffer.
pub const MODE_OFFSET: u32 = 1;

/// The three protocols, numbered as NCCL's `NCCL_PROTO_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Protocol {
    /// LL: 16-byte lines of two (data, flag) 8-byte halves; the flags make each line
    /// self-validating, so the proxy needs no `tail`.
    Ll = 0,
    /// LL128: 128-byte lines whose last 8-byte word is a flag; the proxy checks the flags only
    /// when the buffer is in host memory.
    Ll128 = 1,
    /// SIMPLE: plain data; `connFifo` size and `tail` say a slot is ready.
    Simple = 2,
}

impl Protocol {
    /// All protocols, in index order.
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];
    /// Index into per-protocol arrays.
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The number of protocols (`NCCL_NUM_PROTOCOLS`).
pub const NUM_PROTOCOLS: usize = 3;

/// Which way a connection moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// GPU → network.
    Send,
    /// Network → GPU.
    Recv,
}

/// `x` rounded up to a multiple of `m` (`m` ≥ 1).
#[inline]
pub(crate) fn round_up(x: u64, m: u64) -> u64 {
    let m = m.max(1);
    x.div_ceil(m) * m
}
