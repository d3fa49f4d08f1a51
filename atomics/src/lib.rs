//! # ibnet-atomics
//!
//! The lock-free state the plugin (`ibnet-ffi`) shares between threads, in a crate of its own so
//! that the loom models (`tests/loom`) run this very code as ordinary modules:
//!
//! * [`slot`]: one slot of the plugin's comm token table (publish, lock-free lookup, poison,
//!   free with a generation);
//! * [`event_flags`]: what a verbs device's async-event thread shares with its comms (per-comm
//!   and device-fatal failure flags, the CQ/QP registries).
//!
//! Atomics come from `ibnet_core::sync`, `Arc`/`Mutex` from std; both switch to loom's under
//! `--cfg loom`. Their users re-export them where they used to live
//! (`ibnet_ffi::slot`, `ibnet_verbs::event_flags`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod event_flags;
pub mod slot;
