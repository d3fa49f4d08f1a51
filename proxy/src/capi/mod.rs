//! The engine's C-facing pieces that need nothing of the plugin (feature `capi`, with std, libc
//! and ibnet-nccl): `ibnet-ffi` builds its C API (`ibnet_proxy_*` in `include/ibnet.h`,
//! `ffi/src/proxy`) on them, and re-exports them there.
//!
//! * [`foreign_net`]: [`ForeignNet`], the engine's [`Net`](crate::Net) over any NCCL net
//!   plugin's C table (ibnet-nccl's loader);
//! * [`mem`]: the engine's memory behind the C API, [`ProxyMem`] (the caller's allocator,
//!   [`CMemTable`], or host memory);
//! * `mem_hooks`: the optional callbacks of the caller's memory table (GDR copy, DMA-BUF,
//!   export/import);
//! * [`shm`]: POSIX shared memory for host banks (export/import across processes) and a
//!   watch on the other process;
//! * [`cprofiler`]: the C profiler (`ibnet_proxy_event_t`, `ibnet_proxy_profiler_t`).
//!
//! What stays in ffi (`capi.rs`, `capi_xproc.rs`) is the exported functions themselves: a NULL
//! plugin path means the plugin's own table, which only ffi has.
#![allow(unsafe_code)]

pub mod cprofiler;
pub mod foreign_net;
pub mod mem;
mod mem_hooks;
pub mod shm;

pub use cprofiler::{CEvent, CProfiler};
pub use foreign_net::{ForeignNet, Ptr};
pub use mem::{CMemTable, ProxyMem};
pub use shm::{PeerWatch, ShmBank};
