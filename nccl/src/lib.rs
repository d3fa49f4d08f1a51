//! # ibnet-nccl
//!
//! What a net plugin gets from NCCL and gives back to it, shared by the plugin (ibnet-ffi), the
//! proxy engine's C API (ibnet-proxy's `capi` feature), the verbs provider (ibnet-verbs) and
//! the tools (ibnet-tools):
//!
//! ```text
//!  types, props, tables   NCCL's net plugin ABI as data: ncclResult_t, constants, the
//!                         device handle, ncclNetProperties_vN_t, ncclNet_v6_t..v12_t (each
//!                         defined once: ibnet-ffi exports them, foreign/ reads them); layouts
//!                         from NCCL 2.28.9 and 2.30.7 src/include/plugin/net/net_v*.h
//!  foreign/               the one loader of NCCL net plugins from a .so (v12..v6) and the
//!                         version-specific calls into them
//!  env                    the one reader of the process environment (variables declared in
//!                         ibnet_core::config only)
//!  log                    logging through the logger NCCL passes to init ("NET/IBNET")
//!  boundary               the panic boundary of every exported function: catch_unwind, one
//!                         WARN, error → ncclResult_t
//! ```
//!
//! The ABI files import nothing else of the crate; `log` imports `types` and `env`; `boundary`
//! imports `types` and `log`; `foreign` imports the ABI files.
//!
//! `unsafe` code is denied at the crate root and allowed only where C is called: `log` (NCCL's
//! logger), `tables` (the tables' `Sync`) and `foreign` (dlopen and calls into a plugin); every
//! block has a `SAFETY` comment.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod boundary;
pub mod env;
pub mod foreign;
pub mod log;
pub mod props;
pub mod tables;
pub mod types;
