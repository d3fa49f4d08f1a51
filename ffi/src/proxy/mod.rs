//! The proxy engine (`ibnet_proxy`) over any net plugin's C table, and its C API.
//!
//! * [`foreign_net`]: [`ForeignNet`], the engine's `Net` over a plugin loaded by
//!   [`crate::foreign`] (from a path, or this library's own `ncclNetPlugin_v11`);
//! * [`mem`]: the engine's memory behind the C API (the caller's allocator or host memory);
//! * [`shm`]: POSIX shared memory for host banks (export/import across processes) and a
//!   watch on the other process;
//! * [`capi`]: `ibnet_proxy_*`, declared and documented with a complete example in
//!   `include/ibnet.h`; [`capi_xproc`]: its cross-process, logger and profiler functions;
//! * `mem_hooks`: the optional callbacks of the caller's memory table (GDR copy, DMA-BUF,
//!   export/import).
#![allow(unsafe_code)]

pub mod capi;
pub mod capi_xproc;
pub mod cprofiler;
pub mod foreign_net;
pub mod mem;
mod mem_hooks;
pub mod shm;

pub use crate::foreign::Version;
pub use foreign_net::{ForeignNet, Ptr};
pub use mem::{CMemTable, ProxyMem};
pub use shm::{PeerWatch, ShmBank};
