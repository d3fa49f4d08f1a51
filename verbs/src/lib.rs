//! # ibnet-verbs
//!
//! The verbs provider of the ibnet plugin: libibverbs, bound by hand and loaded with `dlopen`
//! (see `shared/reference/verbs-binding.md`), and core's `Provider` over it. ibnet-ffi
//! discovers devices with it and builds comms on its ports, as it does on ibnet-soft's.
//!
//! * [`sys`]: `#[repr(C)]` declarations, checked against `verbs.h` by ibnet-ffi's
//!   `tests/abi/layout.rs`.
//! * [`loader`]: `dlopen` + `dlvsym` of the calls used; the inline data-path calls go through
//!   `context->ops`.
//! * [`device`]: discovery of ports, GIDs, speeds and PCI paths as NCCL does it;
//!   [`discovery`]: the values of the plugin's `Params` it reads.
//! * [`events`]: async events: device-wide or per comm (by QP / CQ); [`event_flags`]: the
//!   flags they set and the data path checks (loom-checked).
//! * [`provider`]: the [`ibnet_core::provider::Provider`] implementation.
//! * [`qp`]: connecting a QP (modify retry, routing, ECE).
//! * `fake` (tests only): a libibverbs table over a GID table the test sets.

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod device;
pub mod discovery;
pub use ibnet_atomics::event_flags;
pub mod events;
#[cfg(test)]
mod fake;
pub mod loader;
pub mod provider;
pub mod qp;
pub mod sys;
