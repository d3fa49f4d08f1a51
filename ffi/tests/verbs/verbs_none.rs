//! `IBNET_PROVIDER=verbs` on a host without a verbs device: one WARN saying so (issue 13).

use crate::util;

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;

#[test]
fn verbs_without_a_device_warns_once() {
    if util::ran_in_child() {
        return;
    }
    std::env::set_var("IBNET_PROVIDER", "verbs");
    ibnet_nccl::log::set_sink(util::note);
    assert_eq!(api::init(None, -1, None, None), ncclResult_t::Success);
    let mut n = 0;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    let warns: Vec<String> = util::take_log()
        .into_iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, s)| s)
        .collect();
    if n > 0 {
        eprintln!("SKIP: this host has {n} verbs device(s)");
        return;
    }
    let no_dev: Vec<_> = warns
        .iter()
        .filter(|s| s.contains("IBNET_PROVIDER=verbs: no verbs device"))
        .collect();
    assert_eq!(no_dev.len(), 1, "{warns:?}");
}
