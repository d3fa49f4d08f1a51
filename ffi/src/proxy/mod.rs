//! The proxy engine (`ibnet_proxy`) over any net plugin's C table, and its C API (feature
//! `capi`, on by default).
//!
//! * [`foreign_net`]: [`ForeignNet`], the engine's `Net` over a plugin loaded by
//!   [`ibnet_nccl::foreign`] (from a path, or this library's own `ncclNetPlugin_v11`);
//! * [`capi`]: `ibnet_proxy_*`, declared and documented with a complete example in
//!   `include/ibnet.h`; [`capi_xproc`]: its cross-process, logger and profiler functions;
//! * [`mem`], [`shm`], [`cprofiler`]: the engine's memory behind the C API, shared-memory
//!   banks, and the C profiler: `ibnet_proxy::capi`'s (the engine crate's `capi` feature),
//!   re-exported here.
//!
//! These three files stay here, not in `ibnet-proxy`, because they need ffi's foreign loader,
//! NCCL types, logger, panic boundary ([`ibnet_nccl::boundary`]) and the plugin's own table
//! (`ibnet-proxy` depending on ffi would be a cycle).
#![allow(unsafe_code)]

pub mod capi;
pub mod capi_xproc;
pub use ibnet_proxy::capi::{cprofiler, foreign_net, mem, shm};

pub use foreign_net::{ForeignNet, Ptr};
pub use ibnet_nccl::foreign::Version;
pub use mem::{CMemTable, ProxyMem};
pub use shm::{PeerWatch, ShmBank};
