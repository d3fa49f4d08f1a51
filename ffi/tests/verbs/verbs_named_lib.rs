//! `IBNET_IBVERBS_PATH` naming a library that cannot be loaded: the plugin does not fall back to
//! the system's libibverbs; `init` succeeds with 0 devices and one WARN names the variable and
//! the path. (A process of its own: the library is resolved once per process.)

use crate::util;

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;

#[test]
fn a_named_libibverbs_that_cannot_load_is_one_warn_and_no_devices() {
    if util::ran_in_child() {
        return;
    }
    let path = "/nonexistent/ibnet-test/libibverbs-missing.so.1";
    std::env::remove_var("IBNET_PROVIDER");
    std::env::set_var("IBNET_IBVERBS_PATH", path);
    ibnet_nccl::log::set_sink(util::note);
    assert_eq!(api::init(None, -1, None, None), ncclResult_t::Success);
    let mut n = -1;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    assert_eq!(n, 0, "no fallback to the system's libibverbs");
    let warns: Vec<String> = util::take_log()
        .into_iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, s)| s)
        .collect();
    let named: Vec<_> = warns
        .iter()
        .filter(|s| s.contains("IBNET_IBVERBS_PATH") && s.contains(path))
        .collect();
    assert_eq!(named.len(), 1, "{warns:?}");
}
