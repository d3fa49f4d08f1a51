//! Holder crate for the criterion benchmarks in `benches/`.
