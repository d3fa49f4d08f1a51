//! `NCCL_IBVERBS_LIB` (NCCL 2.30's name for what `IBNET_IBVERBS_PATH` does) picks the
//! libibverbs: naming a library that cannot be loaded, the plugin does not fall back to the
//! system's; `init` succeeds with 0 devices and one WARN names the variable and the path.
//! (A process of its own: the library is resolved once per process.)

use crate::util;

use nccl_net_ibnet::api;
use nccl_net_ibnet::log::Level;
use nccl_net_ibnet::nccl::types::ncclResult_t;

#[test]
fn nccl_ibverbs_lib_names_the_libibverbs() {
    if util::ran_in_child() {
        return;
    }
    let path = "/nonexistent/ibnet-test/nccl-libibverbs-missing.so.1";
    std::env::remove_var("IBNET_PROVIDER");
    std::env::remove_var("IBNET_IBVERBS_PATH");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("NCCL_IBVERBS_LIB", path);
    nccl_net_ibnet::log::set_sink(util::note);
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
        .filter(|s| s.contains("NCCL_IBVERBS_LIB") && s.contains(path))
        .collect();
    assert_eq!(named.len(), 1, "{warns:?}");
}
