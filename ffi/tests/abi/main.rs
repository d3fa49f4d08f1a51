//! The ABI checks, one test binary: `include/ibnet.h` against the Rust C API ([`header`]),
//! `ibnet_verbs::sys` against the system's `verbs.h` ([`layout`]), and every exported table v6…v12 of
//! the built `.so` through the foreign loader ([`foreign_versions`]). None initialises the plugin
//! linked into this binary; `foreign_versions` sets the environment of the `dlopen`ed copy it
//! loads, which the other two never load.

mod foreign_versions;
// The header's proxy API is the Rust C API of feature `capi`.
#[cfg(feature = "capi")]
mod header;
mod layout;
