//! The one configuration table: every environment variable ibnet knows, declared once.
//!
//! Each [`Var`] carries its name, type and range ([`Kind`]), default, the NCCL (or RCCL)
//! version it came from ([`Since`]), who acts on it ([`Reader`]) and its doc line, which is also
//! the "what ibnet does" column of README's variable table ([`readme::Table`] renders it; a test
//! keeps README equal to it). The tables are split by concern:
//!
//! | file | variables |
//! | --- | --- |
//! | [`nccl_ib`] | NCCL's `NCCL_IB_*`, `NCCL_SOCKET_*`, `NCCL_GDR_*`, `NCCL_IBVERBS_LIB`, and the 2.29–2.32 ones ibnet refuses |
//! | [`ibnet`] | ibnet's own `IBNET_*` (plugin, loader, log, tools) |
//! | [`soft`] | the soft provider's `IBNET_SOFT_*` |
//! | [`gpu`] | the GPU runtime's (`ibnet-hip`): `IBNET_GPU`, `IBNET_CUDA_LIB`, `RCCL_*`, … |
//!
//! The core reads no environment: this is static data and typed parsing ([`Kind::parse`]),
//! without allocation. `ibnet-ffi`'s `env.rs` is the one reader of the process environment; it
//! reads only names declared here and passes the typed values down (`Params`, the soft
//! provider's config, the GPU runtime's `Env`).
//!
//! ```text
//!  config::{nccl_ib, ibnet, soft, gpu}   Var { name, kind, default, since, reader, doc }
//!        │ find(name), Kind::parse(value), refusal(var, value)
//!        ▼
//!  nccl/src/env.rs  getenv(name) for each declared name ─▶ Params::set / soft / hip-shim Env
//! ```
//!
//! To add a variable: add one [`Var`] to the file of its concern (and, when the plugin stores
//! it, one field and one `store` line in [`crate::params`]); README's table is regenerated from
//! here (`core/tests/config_readme.rs` prints the expected text when they differ).

pub mod gpu;
pub mod ibnet;
pub mod int;
pub mod nccl_ib;
pub mod readme;
pub mod soft;
pub mod var;

pub use int::parse_int;
pub use var::{Kind, Reader, Since, Value, Var, Why};

/// Every table, in README's order.
pub const TABLES: [&[Var]; 4] = [nccl_ib::VARS, ibnet::VARS, soft::VARS, gpu::VARS];

/// Every variable, in README's order.
pub fn all() -> impl Iterator<Item = &'static Var> {
    TABLES.iter().flat_map(|t| t.iter())
}

/// The variable named `name`, if ibnet declares it.
pub fn find(name: &str) -> Option<&'static Var> {
    all().find(|v| v.name == name)
}

#[cfg(test)]
mod tests;
