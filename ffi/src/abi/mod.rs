//! The exported plugin tables, one module per NCCL net ABI version. Each version's functions
//! only adapt arguments (int vs size_t sizes, ctx/config arguments, property layouts) and call
//! the version-agnostic [`crate::api`].

pub mod types;
pub mod v10;
pub mod v11;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;
