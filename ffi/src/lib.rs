//! # ibnet-ffi
//!
//! The NCCL/RCCL net plugin `libnccl-net-ibnet.so` (and `libibnet.a` for static linking):
//!
//! ```text
//!  abi/v6..v11   exported ncclNetPlugin_vN tables (thin shims per ABI version)
//!      │
//!  api           version-agnostic entry points: checks, catch_unwind, error → ncclResult_t
//!      │
//!  plugin        init/finalize refcount, devices, provider dispatch
//!      ├── verbs/    libibverbs via dlopen: sys, loader, device discovery, Provider impl
//!      ├── soft      ibnet-soft's soft0 (IBNET_PROVIDER=soft)
//!      ├── sock, ifaddr, shake   non-blocking TCP bootstrap on NCCL's interface, driving the
//!      │                         core's handshake machines
//!      └── env, log  NCCL variables; logging through NCCL's logger ("NET/IBNET")
//! ```
//!
//! Runtime dependencies: libc only. libibverbs is loaded with `dlopen` when present; without it
//! (or without RDMA devices) the plugin loads and reports zero devices.
//!
//! Thread safety: device state is shared and immutable or atomic; a comm is used by one thread
//! at a time (NCCL's proxy thread). No panic crosses `extern "C"`. Nothing is written to stdout.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod api;
pub mod env;
pub mod gpu;
pub mod ifaddr;
pub mod log;
pub mod plugin;
pub mod shake;
pub mod sock;
pub mod verbs;
