//! # ibnet-ffi
//!
//! The NCCL/RCCL net plugin `libnccl-net-ibnet.so` (and `libibnet.a` for static linking): NCCL's
//! entry points over a provider's comms.
//!
//! ```text
//!  abi/          exported ncclNetPlugin_v6..v12 tables (exports) of thin shims per signature
//!      │
//!  api/          version-agnostic entry points, one concern a file: entry (over ibnet-nccl's
//!      │         boundary; a caught panic poisons the comm), init, listen, connect, comm, mr,
//!      │         data
//!      ├── handles           comm/request/mhandle tokens; a lock-free slot table whose slot
//!      │                     state is each comm's lifecycle (live, poisoned)
//!      ├── connect_registry  connects in progress between NCCL's connect calls
//!      ├── handshake_io      the socket I/O and deadline of the core's handshake machines
//!      ├── sock, ifaddr      non-blocking TCP bootstrap on NCCL's interface
//!      ├── watch             a connected comm's peer liveness (its kept bootstrap socket)
//!      ├── subnet            NCCL_IB_SUBNET_AWARE_ROUTING: the listen handle's GIDs
//!      └── rail_log          one line per rail event of a virtual NIC
//!  plugin        init/finalize refcount, device discovery, bootstrap address
//!      ├── dev       provider dispatch: Dev, AnySend, AnyRecv (verbs or soft)
//!      ├── dev_cache a device's registration cache; its last holder deregisters what is left
//!      ├── nic, vdev a virtual NIC of 1..=8 devices (makeVDevice, merging rules) and its
//!      │             registrations
//!      ├── boxed     striped comms built in place on the heap (never whole on the stack)
//!      └── gpu, profiler  the GPU runtime's DMA-BUF probe; NCCL's profiler callback
//!  proxy         (feature capi) ibnet_proxy_create over this library's own table; the rest
//!                of the proxy C API is ibnet-proxy's `capi` feature, linked in
//! ```
//!
//! Below it: ibnet-core (comms, rails, policy, configuration table), ibnet-nccl (NCCL's ABI
//! types and tables, the environment reader, the logger, the panic boundary, the plugin
//! loader), the providers ibnet-verbs (libibverbs via `dlopen`) and ibnet-soft (soft0,
//! `IBNET_PROVIDER=soft`), ibnet-atomics and ibnet-hip.
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
//! are taken: the ABI shims and exported statics (`abi/`), `api/` (NCCL's pointers, the boxes
//! behind tokens; not `api::entry`), `sock`/`ifaddr` (libc sockets), `profiler` (NCCL's
//! callback), `boxed` (a striped comm built in place on the heap), `nic` and `dev_cache` (a registration's
//! box, reclaimed once; the cache built in place), `proxy`
//! (`ibnet_proxy_create`), and the `.fini_array` hook and `malloc_trim` at the last close in
//! `plugin`; every block has a `SAFETY` comment.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod api;
pub mod boxed;
pub mod connect_registry;
pub mod dev;
pub mod dev_cache;
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
