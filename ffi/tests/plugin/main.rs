//! The plugin's lifecycle and limits, one test binary: init without an IP interface
//! ([`init_no_ip`]), `IBNET_GPU` ([`gpu_env`]), the refused NCCL variables
//! ([`nccl_vars_refused`]), a malformed `IBNET_LOG_STDERR` ([`log_stderr_malformed`]), shared listen ports ([`server_port_reuse`]), subnet-aware routing ([`subnet`]), per-registration
//! `mhandle`s ([`mhandles`]), the MR cache and open/close cycles ([`open_close`]),
//! registrations left at `finalize` ([`finalize_left_mrs`]), `maxP2pBytes` ([`max_p2p`]) and
//! zero allocations at the entry points ([`zero_alloc`]). Each
//! test sets its environment and initialises the plugin (some count the process's fds and RSS),
//! so each runs in a process of its own ([`util::isolate`]).
//!
//! This binary's global allocator is `zero_alloc`'s counting one: it counts only on a thread
//! that armed it, and only `zero_alloc` arms one.

mod finalize_left_mrs;
mod gpu_env;
mod init_no_ip;
mod log_stderr_malformed;
mod max_p2p;
mod mhandles;
mod nccl_vars_refused;
mod open_close;
mod server_port_reuse;
mod subnet;
#[path = "../util/mod.rs"]
mod util;
mod zero_alloc;
