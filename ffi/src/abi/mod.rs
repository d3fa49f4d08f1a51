//! The exported plugin tables `ncclNetPlugin_v6` … `ncclNetPlugin_v12` ([`exports`]), whose
//! entries are the C functions of [`shims`]. A shim only adapts one version's arguments
//! (`int` vs `size_t` sizes, ctx/config arguments, property layouts) and calls the
//! version-agnostic [`crate::api`]; the table types themselves are [`ibnet_nccl::tables`].

pub mod exports;
pub mod shims;
