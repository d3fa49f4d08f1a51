//! Rail failover through the plugin API: a fused NIC over two soft devices whose second rail
//! fails (`IBNET_SOFT_FAULTS=wr_fail=…:RetryExceeded` armed on soft1 only with
//! `IBNET_SOFT_FAULTS_DEV=1`; the failing WR is a sender's data write). The comm carries on
//! over rail 0: every byte of every message is verified, each receive reports its exact size,
//! one WARN names the failed rail and where its traffic went, and the bytes written again are
//! only what was in flight at the failure: messages after it are striped over rail 0 alone.

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_core::fused::stripe;
use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api::{self, Sizes};
use util::*;

#[test]
fn a_failed_rail_moves_its_traffic_and_no_byte_is_lost() {
    if util::ran_in_child() {
        return;
    }
    let Some((s, r, l)) = fused_pair("seed=7,wr_fail=41:RetryExceeded") else {
        return;
    };
    let len = 256 * 1024;
    let mut src = vec![0u8; len];
    let mut dst = vec![0u8; len];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let mut failed_at = None;
    // Rail 1's bytes when the sender saw it fail: it carries nothing after.
    let mut carried_at_failure = 0;
    for m in 0..200u32 {
        let n = 1000 + (m as usize * 977) % (len - 1000);
        for (i, b) in src.iter_mut().enumerate() {
            *b = (i as u32).wrapping_mul(2654435761).wrapping_add(m) as u8;
        }
        dst.fill(0);
        let mut data = [dst.as_mut_ptr() as *mut c_void];
        let (sizes, tags, mut mhs) = ([len], [5 as c_int], [mr]);
        let mut rreq = core::ptr::null_mut();
        let rc = api::irecv(
            r,
            1,
            data.as_mut_ptr(),
            Sizes::Size(sizes.as_ptr()),
            tags.as_ptr(),
            mhs.as_mut_ptr(),
            core::ptr::null_mut(),
            &mut rreq,
        );
        assert_eq!(rc, ncclResult_t::Success, "irecv {m}: {:?}", take_log());
        let mut sreq: *mut c_void = core::ptr::null_mut();
        let (mut sd, mut rd, mut got) = (false, false, 0 as c_int);
        let t0 = Instant::now();
        while !(sd && rd) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "message {m} stuck: {:?}",
                take_log()
            );
            if sreq.is_null() {
                let p = src.as_mut_ptr() as *mut c_void;
                let rc = api::isend(s, p, n as u64, 5, ms, core::ptr::null_mut(), &mut sreq);
                assert_eq!(rc, ncclResult_t::Success, "isend {m}: {:?}", take_log());
            } else if !sd {
                let mut x = 0;
                let rc = api::test(sreq, &mut x, core::ptr::null_mut());
                assert_eq!(rc, ncclResult_t::Success, "send {m}: {:?}", take_log());
                sd = x != 0;
            }
            if !rd {
                let mut x = 0;
                let rc = api::test(rreq, &mut x, &mut got);
                assert_eq!(rc, ncclResult_t::Success, "recv {m}: {:?}", take_log());
                rd = x != 0;
            }
        }
        assert_eq!(got, n as c_int, "message {m}: exact size");
        assert_eq!(&dst[..n], &src[..n], "message {m}: bytes");
        let st = api::rail_stats(s).unwrap();
        if failed_at.is_none() && !st.live[1] {
            failed_at = Some(m);
            carried_at_failure = st.rail_bytes[1];
        }
    }
    let st = api::rail_stats(s).unwrap();
    let log = take_log();
    let warns: Vec<&String> = log
        .iter()
        .filter(|(l, t)| *l == Level::Warn && t.contains("rail 1 (soft1)"))
        .map(|(_, t)| t)
        .collect();
    println!(
        "rail 1 failed at message {failed_at:?}; per-rail bytes {:?}; resent {} B; {warns:?}",
        &st.rail_bytes[..2],
        st.resent
    );
    assert_eq!(
        st.live[..2],
        [true, false],
        "rail 1 failed, rail 0 carries on"
    );
    assert!(
        failed_at.is_some_and(|m| m < 199),
        "the fault hit before the end"
    );
    assert!(
        warns.iter().any(|t| t.contains("moved to rail 0 (soft0)")),
        "one line names the failed rail and where its traffic went: {log:?}"
    );
    assert!(warns.len() <= 2, "once per side: {warns:?}");
    // One message is in flight at a time here (each is tested to completion on both sides
    // before the next is posted), so at most one message's rail-1 part was in flight when the
    // rail failed: that bounds what went twice (before, every later message's rail-1 part
    // went again too: 9.7 MB for these 200 messages).
    let window = 1;
    let bound = window * stripe(len as u64, 2)[1].len;
    assert!(
        st.resent <= bound,
        "{} B re-sent, more than the {window} message(s) in flight ({bound} B)",
        st.resent
    );
    assert_eq!(
        st.rail_bytes[1], carried_at_failure,
        "rail 1 carried nothing after it failed"
    );
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(r, mr), ncclResult_t::Success);
    close(s, r, l);
}
