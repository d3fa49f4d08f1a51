//! The last healthy rail of a fused NIC failing (`IBNET_SOFT_FAULTS=wr_fail=…:RetryExceeded`
//! armed on both soft devices): the sender's call fails with `ncclRemoteError`, and the failure
//! has one WARN, the failing call's (naming the peer). The line saying which rail was the last is
//! INFO beside it, not a second WARN.

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use util::*;

#[test]
fn the_last_rail_failing_is_one_warn_the_failing_calls() {
    if util::ran_in_child() {
        return;
    }
    let Some((s, r, _l)) = fused_pair_faults_on("seed=7,wr_fail=41:RetryExceeded", None) else {
        return;
    };
    let len = 256 * 1024;
    let mut src = vec![7u8; len];
    let mut dst = vec![0u8; len];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    // Messages until the sender fails (both rails' 41st WR fails; a rail's failure moves its
    // traffic to the other, the second one fails the comm).
    let mut failed = None;
    'messages: for m in 0..400u32 {
        let rreq = post_recv(r, &mut dst, mr, 5);
        let mut sreq: *mut c_void = core::ptr::null_mut();
        let rc = api::isend(
            s,
            src.as_mut_ptr().cast(),
            len as u64,
            5,
            ms,
            core::ptr::null_mut(),
            &mut sreq,
        );
        if rc != ncclResult_t::Success {
            failed = Some(rc);
            break;
        }
        let (mut sd, mut rd, mut got) = (false, false, 0 as c_int);
        let t0 = Instant::now();
        while !(sd && rd) {
            assert!(t0.elapsed() < Duration::from_secs(30), "message {m} stuck");
            if !sd {
                let mut x = 0;
                let rc = api::test(sreq, &mut x, core::ptr::null_mut());
                if rc != ncclResult_t::Success {
                    failed = Some(rc);
                    break 'messages;
                }
                sd = x != 0;
            }
            if !rd {
                let mut x = 0;
                assert_eq!(api::test(rreq, &mut x, &mut got), ncclResult_t::Success);
                rd = x != 0;
            }
        }
    }
    assert_eq!(failed, Some(ncclResult_t::RemoteError), "the sender fails");
    let log = take_log();
    let warns: Vec<&String> = log
        .iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, t)| t)
        .collect();
    let last: Vec<&String> = log
        .iter()
        .filter(|(_, t)| t.contains("no healthy rail left: the comm fails"))
        .map(|(_, t)| t)
        .collect();
    println!("{warns:?}\n{last:?}");
    assert_eq!(last.len(), 1, "one line names the last rail: {log:?}");
    assert!(
        log.iter()
            .any(|(l, t)| *l == Level::Info && t.contains("no healthy rail left")),
        "at INFO: {log:?}"
    );
    let moved = warns
        .iter()
        .filter(|t| t.contains("its traffic moved to rail"))
        .count();
    let failing = warns
        .iter()
        .filter(|t| t.contains("isend") || t.contains("test"))
        .count();
    assert_eq!(moved, 1, "the first rail's failure: {warns:?}");
    assert_eq!(failing, 1, "the failing call's WARN, once: {warns:?}");
    assert_eq!(warns.len(), 2, "no other WARN: {warns:?}");
}
