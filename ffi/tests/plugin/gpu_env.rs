//! `IBNET_GPU` set to a value it does not take: GPU-direct is off and one WARN says why (a typo
//! must not turn GPU-direct off silently). (A process of its own: the decision is made once per
//! process.)

use crate::util;

use ibnet_nccl::log::Level;

#[test]
fn a_malformed_ibnet_gpu_is_one_warn_and_gpu_direct_off() {
    if util::ran_in_child() {
        return;
    }
    std::env::set_var("IBNET_GPU", "cdua");
    ibnet_nccl::log::set_sink(util::note);
    let g = nccl_net_ibnet::gpu::gpu_direct();
    assert!(!g.possible(true), "GPU-direct must be off");
    let warns: Vec<String> = util::take_log()
        .into_iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, s)| s)
        .collect();
    let named: Vec<_> = warns.iter().filter(|s| s.contains("IBNET_GPU")).collect();
    assert_eq!(named.len(), 1, "{warns:?}");
}
