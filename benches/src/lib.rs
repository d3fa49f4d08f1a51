//! Holder crate for the benchmarks in `benches/`, and the rigs they share.

pub mod rig;
