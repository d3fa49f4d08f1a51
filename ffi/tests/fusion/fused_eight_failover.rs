//! Failover on an 8-rail vNIC: soft7 (the last rail) fails at a WR of the traffic
//! (`IBNET_SOFT_FAULTS=wr_fail=…:RetryExceeded` with `IBNET_SOFT_FAULTS_DEV=7`); every byte of
//! every message is still verified with its exact size, rail 7 ends out of use and the other
//! seven carry on, and each side says so in one WARN naming the rail.

use crate::eight;
use crate::util;

use std::time::Duration;

use eight::{fuse_eight, message, HCA};
use ibnet_nccl::log::Level;
use nccl_net_ibnet::api;
use util::*;

#[test]
fn the_last_of_eight_rails_fails_and_no_byte_is_lost() {
    if util::ran_in_child() {
        return;
    }
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "8"),
        ("NCCL_IB_HCA", HCA),
        ("IBNET_SOFT_FAULTS", "seed=7,wr_fail=41:RetryExceeded"),
        ("IBNET_SOFT_FAULTS_DEV", "7"),
    ];
    if !init_soft(&env) {
        return;
    }
    let d = fuse_eight();
    let (mut h, l) = listen_on(d);
    let (s, r, _) = establish_on(d, &mut h, l, Duration::from_secs(60));
    let _ = take_log();
    for m in 0..120usize {
        message(s, r, 8 * 1024 + (m * 7919) % (192 * 1024), m as u8);
    }
    let st = api::rail_stats(s).expect("fused send comm");
    assert_eq!(st.rails, 8);
    assert!(!st.live[7], "rail 7 failed: {st:?}");
    assert!(st.live[..7].iter().all(|&l| l), "the others live: {st:?}");
    assert!(st.rail_bytes[..7].iter().all(|&b| b > 0), "{st:?}");
    println!("per-rail bytes: {:?}, re-sent {}", st.rail_bytes, st.resent);
    let warns: Vec<String> = take_log()
        .into_iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, s)| s)
        .collect();
    assert!(
        (1..=2).contains(&warns.len()),
        "one WARN per side: {warns:?}"
    );
    assert!(
        warns.iter().all(|w| w.contains("rail 7 (soft7)")),
        "{warns:?}"
    );
    assert!(
        warns.iter().any(|w| w.starts_with("NET/IBNET : send comm")),
        "{warns:?}"
    );
    close(s, r, l);
}
