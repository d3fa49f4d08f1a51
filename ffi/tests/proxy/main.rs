//! The proxy engine through this library, one test binary: the header's complete C example
//! ([`proxy_c_example`]), the C API's hooks over this library ([`proxy_capi_hooks`]), the
//! engine over ibnet's own `dlopen`ed `.so` ([`proxy_foreign_net`]), and the engine with its
//! "GPU" in another process ([`proxy_xproc`], which re-executes this binary for its helper).
//! Each module sets the same environment (`IBNET_PROVIDER=soft`, `NCCL_SOCKET_IFNAME=lo`); the
//! linked library and the `dlopen`ed one are two separate plugin instances. This binary's
//! global allocator is `proxy_xproc`'s counting one: it counts only on a thread that asked.
//! Needs feature `capi` (`ffi/Cargo.toml`).

mod proxy_c_example;
mod proxy_capi_hooks;
mod proxy_foreign_net;
mod proxy_xproc;
#[path = "../util/mod.rs"]
mod util;
