//! Holder crate for the loom models in `tests/`; run them with `RUSTFLAGS="--cfg loom" cargo test -p ibnet-loom --release`.
