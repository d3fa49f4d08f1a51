//! The engine's C API (feature `capi`, with std, libc and ibnet-nccl): `ibnet_proxy_*`,
//! declared and documented with a complete example in `include/ibnet.h`, built into the
//! plugin's `.so`/`.a` because ibnet-ffi enables this feature.
//!
//! * [`entry`]: the exported functions (engine over a plugin's C table, connections,
//!   operations, progress), except `ibnet_proxy_create`, which ibnet-ffi exports over
//!   [`entry::create`] because a NULL plugin path means the plugin's own table;
//!   [`entry_xproc`]: the cross-process, logger and profiler functions. Every one runs under
//!   ibnet-nccl's panic boundary, the plugin's as well;
//! * [`foreign_net`]: [`ForeignNet`], the engine's [`Net`](crate::Net) over any NCCL net
//!   plugin's C table (ibnet-nccl's loader);
//! * [`mem`]: the engine's memory behind the C API, [`ProxyMem`] (the caller's allocator,
//!   [`CMemTable`], or host memory);
//! * `mem_hooks`: the optional callbacks of the caller's memory table (GDR copy, DMA-BUF,
//!   export/import);
//! * [`shm`]: POSIX shared memory for host banks (export/import across processes) and a
//!   watch on the other process;
//! * [`cprofiler`]: the C profiler (`ibnet_proxy_event_t`, `ibnet_proxy_profiler_t`).

#![allow(unsafe_code)]

pub mod cprofiler;
pub mod entry;
pub mod entry_xproc;
pub mod foreign_net;
pub mod mem;
mod mem_hooks;
pub mod shm;

pub use cprofiler::{CEvent, CProfiler};
pub use foreign_net::{ForeignNet, Ptr};
pub use mem::{CMemTable, ProxyMem};
pub use shm::{PeerWatch, ShmBank};
