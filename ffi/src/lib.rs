//! # ibnet-ffi
//!
//! The NCCL/RCCL net plugin `libnccl-net-ibnet.so` (and `libibnet.a` for static linking):
//!
//! ```text
//!  abi/v6..v11   exported ncclNetPlugin_vN tables (thin shims per ABI version)
//!      │
//!  api           version-agnostic entry points: checks, catch_unwind, error → ncclResult_t
//!      │         (handles: comm/request tokens in a fixed, lock-free slot table)
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
//! Thread safety: device state is shared and immutable or atomic. NCCL runs a comm's data path
//! (`isend`/`irecv`/`iflush`/`test`, then close) on one thread at a time (its proxy progress
//! thread), while its proxy service thread may call `regMr`/`deregMr` on the same comm
//! concurrently: those read only the comm's device and registration cache, which are never
//! mutated after creation (see [`api`]). Comms and requests reach NCCL as tokens of
//! [`handles`], so a stale or foreign one is an error, not a dereference; closing a comm while
//! another thread is inside a call on it is outside the plugin contract. No panic crosses
//! `extern "C"`; a caught one poisons the comm it happened on. Nothing is written to stdout.
//!
//! `unsafe` code is denied at the crate root and allowed only where C is called or C's pointers
//! are taken: the ABI shims (`abi/v*`), `api`, `sock`/`ifaddr` (libc sockets), `log` (NCCL's
//! logger), `verbs::{loader, device, provider}`, `proxy`, and the `.fini_array` hook in
//! `plugin`; every block has a `SAFETY` comment.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod api;
pub mod env;
pub mod foreign;
pub mod gpu;
pub mod handles;
pub mod ifaddr;
pub mod log;
pub mod nccl;
pub mod plugin;
pub mod proxy;
pub mod shake;
pub mod sock;
pub mod verbs;
