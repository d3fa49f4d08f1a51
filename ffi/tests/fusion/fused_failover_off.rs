//! `NCCL_IB_RESILIENCY_PORT_FAILOVER=0`: a fused NIC whose rail 1 fails
//! (`IBNET_SOFT_FAULTS=wr_fail=…:RetryExceeded` on soft1) fails the comm as NCCL without
//! failover does: the sender's call returns `ncclRemoteError`, no traffic is moved to rail 0
//! (no "traffic moved" WARN, no byte written again), and every message before the failure
//! arrived whole.

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use util::*;

#[test]
fn failover_off_fails_the_comm_with_its_first_rail() {
    if util::ran_in_child() {
        return;
    }
    std::env::set_var("NCCL_IB_RESILIENCY_PORT_FAILOVER", "0");
    let Some((s, r, _l)) = fused_pair("seed=7,wr_fail=41:RetryExceeded") else {
        return;
    };
    let len = 64 * 1024;
    let mut src = vec![0u8; len];
    let mut dst = vec![0u8; len];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let mut failed = None;
    let mut whole = 0;
    'messages: for m in 0..400u32 {
        for (i, b) in src.iter_mut().enumerate() {
            *b = (i as u32 ^ m).wrapping_mul(2654435761) as u8;
        }
        dst.fill(0);
        let rreq = post_recv(r, &mut dst, mr, 5);
        let mut sreq: *mut c_void = core::ptr::null_mut();
        let (mut sd, mut rd, mut got) = (false, false, 0 as c_int);
        let t0 = Instant::now();
        while !(sd && rd) {
            assert!(t0.elapsed() < Duration::from_secs(30), "message {m} stuck");
            let rc = if sreq.is_null() {
                let p = src.as_mut_ptr().cast();
                api::isend(s, p, len as u64, 5, ms, core::ptr::null_mut(), &mut sreq)
            } else if !sd {
                let mut x = 0;
                let rc = api::test(sreq, &mut x, core::ptr::null_mut());
                sd = x != 0;
                rc
            } else {
                ncclResult_t::Success
            };
            if rc != ncclResult_t::Success {
                failed = Some(rc);
                break 'messages;
            }
            if !rd {
                let mut x = 0;
                assert_eq!(api::test(rreq, &mut x, &mut got), ncclResult_t::Success);
                rd = x != 0;
            }
        }
        assert_eq!(got, len as c_int, "message {m}");
        assert_eq!(dst, src, "message {m}: bytes");
        whole += 1;
    }
    assert_eq!(
        failed,
        Some(ncclResult_t::RemoteError),
        "the sender fails at rail 1's failure ({whole} messages went first)"
    );
    let log = take_log();
    assert!(
        !log.iter().any(|(_, t)| t.contains("traffic moved")),
        "nothing failed over: {log:?}"
    );
}
