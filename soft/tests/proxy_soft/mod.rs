//! The proxy engine's simulated-GPU harness (`core/tests/proxy_common`, included by path: the
//! core cannot depend on this crate) over the soft provider.
#![allow(dead_code)]

#[path = "../../../core/tests/proxy_common/mod.rs"]
pub mod common;

use common::{Fabric, Report, Scenario};
use ibnet_soft::SoftProvider;

impl Fabric for SoftProvider {
    fn leaks(&self) -> Option<(usize, usize)> {
        // The soft provider does not count its objects; `InProcessNet` and the harness check that
        // every comm and registration was given back.
        None
    }
}

/// Runs `sc` over a freshly opened soft provider, shut down afterwards.
pub fn run(sc: Scenario) -> Report {
    let dev = SoftProvider::open().expect("open soft0");
    let d = dev.clone();
    let r = common::run_on(move || d, sc);
    dev.shutdown();
    r
}
