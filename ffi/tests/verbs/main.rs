//! The verbs provider, one test binary, staged into the rxe VM by `scripts/rxe` (its name
//! matches `IBNET_RXE_RUST_TESTS`' default `^verbs`): no verbs device ([`verbs_none`]), an
//! unloadable `IBNET_IBVERBS_PATH` ([`verbs_named_lib`]) or `NCCL_IBVERBS_LIB`
//! ([`verbs_nccl_lib`]), and fused comms over two real verbs devices ([`verbs_fused`]). The
//! library is resolved and the plugin initialised once per process, so each test runs in a
//! process of its own ([`util::isolate`]).

#[path = "../util/mod.rs"]
mod util;
mod verbs_fused;
mod verbs_named_lib;
mod verbs_nccl_lib;
mod verbs_none;
