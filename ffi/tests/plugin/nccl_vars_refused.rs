//! The NCCL 2.29–2.32 `NCCL_IB_*` variables that ibnet does not honour (issue 28 point 5): each
//! one set to a value ibnet won't honour is exactly ONE WARN naming it and saying why
//! (mlx5-only, GPU-initiated, not implemented yet, or meaning not public); set to the value
//! ibnet already behaves like, it is no WARN; a malformed value is one WARN and the default
//! stands. Table-driven: one plugin life (v11 `init` … `finalize`) per row, which reads the
//! environment again.

use crate::util;

use std::ffi::c_void;

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::abi::exports::ncclNetPlugin_v11 as NET;

/// (variable, value, WARNs naming it, a word the WARN must carry).
const ROWS: &[(&str, &str, usize, &str)] = &[
    // Set to a value ibnet won't honour: one WARN each, saying why.
    (
        "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS",
        "1",
        1,
        "not honoured",
    ),
    (
        "NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME",
        "1",
        1,
        "not honoured",
    ),
    ("NCCL_IB_OOO_RQ", "1", 1, "mlx5"),
    ("NCCL_IB_EVENT_BASED_LB", "1", 1, "not public"),
    ("NCCL_IB_EVENT_BASED_LB_REMOTE", "1", 1, "not public"),
    ("NCCL_IB_RAIL_POLICY", "CX9_BLOCK", 1, "not public"),
    ("NCCL_IB_RAIL_POLICY", "CX", 1, "not public"),
    ("NCCL_IB_RAIL_POLICY", "ROUND", 1, "unrecognized"),
    ("NCCL_IB_SORT_MERGE_NICS", "1", 1, "not public"),
    ("NCCL_IB_VR_RAILS_PER_SOCKET", "2", 1, "not public"),
    ("NCCL_IB_VR_SOCKET_COUNT", "2", 1, "not public"),
    ("NCCL_IB_WQE_LATENCY_REPORT", "1", 1, "not public"),
    ("NCCL_IB_WQE_LATENCY_THRESHOLD_NS", "1000", 1, "not public"),
    ("NCCL_IB_DATA_DIRECT", "1", 1, "mlx5"),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE",
        "5",
        1,
        "not honoured",
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT",
        "4000",
        1,
        "not honoured",
    ),
    // Malformed: one WARN naming it (and no second one refusing it), the default stands.
    ("NCCL_IB_OOO_RQ", "yes", 1, "default"),
    ("NCCL_IB_DEVICE_PCI_ORDER", "x", 1, "default"),
    ("NCCL_IB_QUERY_PORT_SPEED", "2a", 1, "default"),
    ("NCCL_IB_SUBNET_PREFIX_LEN", "33", 1, "default"),
    ("NCCL_IB_SUBNET_PREFIX_LEN", "0", 1, "default"),
    ("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS", "-3", 1, "default"),
    // The value ibnet already behaves like: no WARN.
    ("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS", "-2", 0, ""),
    ("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS", "0", 0, ""),
    ("NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME", "-2", 0, ""),
    ("NCCL_IB_OOO_RQ", "0", 0, ""),
    ("NCCL_IB_SUBNET_AWARE_ROUTING", "0", 0, ""),
    ("NCCL_IB_SUBNET_AWARE_ROUTING", "1", 0, ""),
    ("NCCL_IB_SUBNET_PREFIX_LEN", "16", 0, ""),
    ("NCCL_IB_SUBNET_PREFIX_LEN", "24", 0, ""),
    ("NCCL_IB_RAIL_POLICY", "NONE", 0, ""),
    ("NCCL_IB_DATA_DIRECT", "0", 0, ""),
    ("NCCL_IB_DEVICE_PCI_ORDER", "0", 0, ""),
    ("NCCL_IB_DEVICE_PCI_ORDER", "1", 0, ""),
    ("NCCL_IB_QUERY_PORT_SPEED", "0", 0, ""),
    ("NCCL_IB_QUERY_PORT_SPEED", "1", 0, ""),
    ("NCCL_IB_RESILIENCY_PORT_RECOVERY", "1", 0, ""),
    ("NCCL_IB_RESILIENCY_PORT_FAILOVER", "0", 0, ""),
    // Malformed resiliency values: one WARN, the default stands.
    (
        "NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY",
        "10ms",
        1,
        "default",
    ),
];

/// One plugin life with `name=value` set; the WARN lines it logged.
fn warns_with(name: &str, value: &str) -> Vec<String> {
    std::env::set_var(name, value);
    util::take_log();
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: the v11 table's init with a valid ctx out-pointer, no config, no logger.
    let rc =
        unsafe { (NET.init.expect("in the table"))(&mut ctx, 0, std::ptr::null_mut(), None, None) };
    assert_eq!(rc, ncclResult_t::Success, "{name}={value}");
    // SAFETY: the ctx init returned.
    let rc = unsafe { (NET.finalize.expect("in the table"))(ctx) };
    assert_eq!(rc, ncclResult_t::Success);
    std::env::remove_var(name);
    util::take_log()
        .into_iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, s)| s)
        .collect()
}

#[test]
fn each_refused_variable_is_one_warn_naming_it() {
    if util::ran_in_child() {
        return;
    }
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    std::env::remove_var("IBNET_PROVIDER");
    ibnet_nccl::log::set_sink(util::note);
    let mut bad = Vec::new();
    for &(name, value, want, word) in ROWS {
        let warns = warns_with(name, value);
        let named: Vec<_> = warns
            .iter()
            .filter(|s| s.contains(&format!("{name}=")) || s.contains(&format!("{name} ")))
            .collect();
        let ok = named.len() == want
            && named
                .iter()
                .all(|s| s.to_lowercase().contains(&word.to_lowercase()));
        if !ok {
            bad.push(format!(
                "{name}={value}: want {want} WARN(s) with {word:?}, got {named:?}"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
