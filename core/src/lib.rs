//! # ibnet-core
//!
//! The allocation-free, lock-free protocol core of ibnet, the Rust network plugin for NCCL and
//! RCCL. Everything that decides *what* goes on the wire lives here; everything that touches the
//! operating system (sockets, `dlopen`, environment variables, logging sinks, threads) lives in
//! the crates that depend on this one.
//!
//! ```text
//!  ffi / soft / tools            (std: sockets, libibverbs, env, logging)
//!        │  bytes, completions, memory registrations
//!        ▼
//!  handshake ── wire            connect/accept state machines over byte buffers
//!  comm ─┬─ fifo                receiver-posted FIFO of clear-to-send elements
//!        ├─ request             fixed request pool, `wr_id` packing
//!        └─ provider            the verbs subset: QPs, CQ, post, poll, register
//!             └─ verbs          the values they exchange (WRs, completions, GIDs)
//!  fused ─┬─ comm                one comm per rail: striped messages, rail failover
//!         └─ fifo                failover notices ride the FIFO's publication protocol
//!  mr_cache                     per-device, lock-free registration cache
//!  config                       the one table of environment variables (static data)
//!  params, hca                  the plugin's variables, typed; the `NCCL_IB_HCA` grammar
//!  sync                         the one facade for atomics (switches to loom)
//! ```
//!
//! * `#![no_std]` outside tests and loom builds; no `alloc`.
//! * Fixed capacities everywhere; exhausting one is an [`Error`], never a panic.
//! * The core reads no clock and performs no I/O: callers feed bytes and completions in.
//! * `unsafe` code is denied at the crate root and allowed only in [`mr_cache`] (the
//!   registration value cell, through [`sync::UnsafeCell`], and building a cache in place),
//!   [`fused`]'s in-place constructors (`FusedSend::init`, `FusedRecv::init`: a fused comm is
//!   written field by field into the caller's memory, never whole on the stack), each block with a
//!   `SAFETY` comment.
//!
//! The proxy engine built on this core is its own crate, `ibnet-proxy`.
#![cfg_attr(not(any(test, loom)), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod comm;
pub mod config;
pub mod error;
pub mod fifo;
pub mod fused;
pub mod handshake;
pub mod hca;
pub mod lifecycle;
pub mod mr_cache;
pub mod params;
pub mod policy;
pub mod provider;
pub mod rails;
pub mod request;
pub mod sync;
pub mod verbs;
pub mod wire;

pub use error::{Error, ErrorKind, Result};
