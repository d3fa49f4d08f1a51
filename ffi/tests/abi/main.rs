//! The ABI checks, one test binary: `include/ibnet.h` against the Rust C API ([`header`]) and
//! `verbs::sys` against the system's `verbs.h` ([`layout`]). Neither initialises the plugin.

mod header;
mod layout;
