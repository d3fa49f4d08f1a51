//! The proxy engine (`ibnet_core::proxy`) over any net plugin's C table, and its C API.
//!
//! * [`cnet`]: [`CNet`], the engine's `Net` over an `ncclNet_v11_t` or `ncclNet_v8_t` (loaded
//!   from a path with `dlopen`, or this library's own `ncclNetPlugin_v11`); [`tables`]: those
//!   tables' layouts;
//! * [`mem`]: the engine's memory behind the C API (the caller's allocator or host memory);
//! * [`capi`]: `ibnet_proxy_*`, declared and documented with a complete example in
//!   `include/ibnet.h`.
#![allow(unsafe_code)]

pub mod capi;
pub mod cnet;
pub mod mem;
pub mod tables;

pub use cnet::{CNet, Ptr, Version};
pub use mem::{CMemTable, ProxyMem};
pub use tables::{TableV11, TableV8};
