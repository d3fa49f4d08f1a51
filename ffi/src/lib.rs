//! # ibnet-ffi
//!
//! The NCCL/RCCL net plugin `libnccl-net-ibnet.so` (and `libibnet.a` for static linking):
//!
//! ```text
//!  abi/          exported ncclNetPlugin_v6..v11 tables (exports) of thin shims per signature
//!      │
//!  api/          version-agnostic entry points, one concern a file: entry (over boundary;
//!      │         a caught panic poisons the comm), init, listen, connect, comm, mr, data
//!      ├── handles           comm/request/mhandle tokens; a lock-free slot table whose slot
//!      │                     state is each comm's lifecycle (live, poisoned)
//!      ├── connect_registry  connects in progress between NCCL's connect calls
//!      ├── handshake_io      the socket I/O and deadline of the core's handshake machines
//!      ├── sock, ifaddr      non-blocking TCP bootstrap on NCCL's interface
//!      ├── watch             a connected comm's peer liveness (its kept bootstrap socket)
//!  plugin        init/finalize refcount, device discovery, bootstrap address
//!      ├── dev       provider dispatch: Dev, AnySend, AnyRecv, AnyMr, registration cache types
//!      ├── nic, vdev virtual NICs (makeVDevice, merging rules) and a fused NIC's registrations
//!      ├── boxed     fused comms built in place on the heap (never whole on the stack)
//!      ├── verbs/    libibverbs via dlopen: sys, loader, device discovery, Provider impl
//!      ├── (soft)    ibnet-soft's soft0 as dev::Dev::Soft (IBNET_PROVIDER=soft; no module here)
//!      └── env, log  NCCL variables; logging through NCCL's logger ("NET/IBNET")
//!  proxy/        (feature capi) ibnet-proxy's engine over a plugin's C table (ForeignNet)
//!                and its C API, ibnet_proxy_*
//!      └── foreign/  the one loader of plugin .so files (v11..v6), also used by ibnet-tools
//!  boundary      the one panic boundary of every exported function (catch_unwind, one
//!                WARN, error → ncclResult_t); imports only nccl and log
//!  nccl/         ground floor: ncclResult_t and ABI types, ncclNetProperties_vN_t,
//!                ncclNet_v6_t..v11_t (each defined once, for export and import)
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
//! are taken: the ABI shims and exported statics (`abi/`), the table types' `Sync`
//! (`nccl::tables`), `api/` (NCCL's pointers, the boxes behind tokens; not `api::entry`),
//! `foreign` (dlopen and calls into a plugin), `sock`/`ifaddr` (libc sockets), `log` (NCCL's
//! logger), `verbs::{loader, device, provider}`, `proxy`, and the `.fini_array` hook and
//! `malloc_trim` at the last close in `plugin`; every block has a `SAFETY` comment.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod api;
pub mod boxed;
pub mod connect_registry;
pub mod dev;
pub mod gpu;
pub mod handles;
pub mod handshake_io;
pub mod ifaddr;
pub mod nic;
pub mod plugin;
pub mod profiler;
#[cfg(feature = "capi")]
pub mod proxy;
pub mod rail_log;
pub use ibnet_atomics::slot;
pub mod sock;
pub mod subnet;
pub mod vdev;
pub mod watch;
