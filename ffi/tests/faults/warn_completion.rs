//! A completion error's WARN names the device it happened on: over two soft devices with every
//! send WR of `soft1` failing (`IBNET_SOFT_FAULTS=wr_fail=1:RetryExceeded`,
//! `IBNET_SOFT_FAULTS_DEV=1`), a comm on device 1 fails with "got completion … hca soft1".

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use util::*;

#[test]
fn a_completion_error_names_the_soft_device() {
    if util::ran_in_child() {
        return;
    }
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "2"),
        ("IBNET_SOFT_FAULTS", "seed=1,wr_fail=1:RetryExceeded"),
        ("IBNET_SOFT_FAULTS_DEV", "1"),
    ];
    if !init_soft(&env) {
        return;
    }
    let (mut h, l) = listen_on(1);
    let (s, r, _) = establish_on(1, &mut h, l, Duration::from_secs(30));
    take_log();
    let mut src = vec![0x5au8; 4096];
    let mut dst = vec![0u8; 4096];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let rreq = post_recv(r, &mut dst, mr, 7);
    let mut sreq: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    // Every WR of soft1 fails: the receive's clear-to-send or the send's data write completes
    // in error, and the call that sees it fails.
    let failed = loop {
        assert!(t0.elapsed() < Duration::from_secs(30), "no call failed");
        let (mut done, mut size): (c_int, c_int) = (0, 0);
        if sreq.is_null() {
            let p = src.as_mut_ptr() as *mut c_void;
            let rc = api::isend(s, p, 4096, 7, ms, core::ptr::null_mut(), &mut sreq);
            if rc != ncclResult_t::Success {
                break rc;
            }
        } else {
            let rc = api::test(sreq, &mut done, core::ptr::null_mut());
            if rc != ncclResult_t::Success {
                break rc;
            }
        }
        let rc = api::test(rreq, &mut done, &mut size);
        if rc != ncclResult_t::Success {
            break rc;
        }
    };
    assert_eq!(failed, ncclResult_t::RemoteError);
    let warns: Vec<String> = take_log()
        .into_iter()
        .filter(|(lv, m)| *lv == Level::Warn && m.contains("got completion"))
        .map(|(_, m)| m)
        .collect();
    assert!(!warns.is_empty(), "a completion-error WARN");
    for w in &warns {
        assert!(w.contains(" hca soft1 "), "the WARN names the device: {w}");
    }
    let _ = (api::close_send(s), api::close_recv(r), api::close_listen(l));
}
