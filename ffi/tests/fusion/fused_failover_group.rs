//! Rail failover inside a multi-receive group, through the plugin API: a fused NIC over two
//! soft devices whose second rail fails (`IBNET_SOFT_FAULTS=wr_fail=…:RetryExceeded` on soft1
//! only) while the sends of one group are being posted. (A file of its own: the plugin and
//! its log are per process.)

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api::{self, Sizes};
use util::*;

/// Drives `req` one step; whether it is done (`sizes`: a receive's sizes out, or NULL).
fn poll(req: *mut c_void, sizes: *mut c_int, what: &str) -> bool {
    let mut x = 0;
    let rc = api::test(req, &mut x, sizes);
    assert_eq!(rc, ncclResult_t::Success, "{what}: {:?}", take_log());
    x != 0
}

/// Rail 1 fails between two sends of one multi-receive group: the sends posted before the
/// failure were striped over both rails, those after over rail 0 alone, and the group's
/// notice carries each send's own stripe. Every receive of every group reports its exact
/// size and holds exactly its bytes.
#[test]
fn a_rail_failing_inside_a_multi_receive_group_loses_no_byte() {
    if util::ran_in_child() {
        return;
    }
    let Some((s, r, l)) = fused_pair("seed=7,wr_fail=41:RetryExceeded") else {
        return;
    };
    const N: usize = 4;
    let len = 64 * 1024;
    let mut src = vec![vec![0u8; len]; N];
    let mut dst = vec![vec![0u8; len]; N];
    let ms: Vec<_> = src.iter_mut().map(|b| reg(s, b)).collect();
    let mut mr: Vec<_> = dst.iter_mut().map(|b| reg(r, b)).collect();
    let tags: [c_int; N] = [1, 2, 3, 4];
    // A group whose sends were posted on both sides of the failure (as the sender saw it).
    let mut straddled = None;
    for g in 0..100usize {
        let n: [usize; N] = core::array::from_fn(|i| 1 + (g * 7919 + i * 3571) % len);
        for (i, b) in src.iter_mut().enumerate() {
            for (k, x) in b.iter_mut().enumerate() {
                *x = (k as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add((g * N + i) as u32) as u8;
            }
        }
        dst.iter_mut().for_each(|b| b.fill(0));
        let mut data: Vec<*mut c_void> = dst.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
        let sizes = [len; N];
        let mut rreq = core::ptr::null_mut();
        let rc = api::irecv(
            r,
            N as c_int,
            data.as_mut_ptr(),
            Sizes::Size(sizes.as_ptr()),
            tags.as_ptr(),
            mr.as_mut_ptr(),
            core::ptr::null_mut(),
            &mut rreq,
        );
        assert_eq!(rc, ncclResult_t::Success, "irecv {g}: {:?}", take_log());
        let mut sreq = [core::ptr::null_mut::<c_void>(); N];
        let mut live_at_post = [true; N];
        let (mut rd, mut got, mut sd) = (false, [0 as c_int; N], [false; N]);
        let t0 = Instant::now();
        for i in 0..N {
            while sreq[i].is_null() {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "group {g}: send {i} not posted"
                );
                let p = src[i].as_mut_ptr().cast();
                let rc = api::isend(
                    s,
                    p,
                    n[i] as u64,
                    tags[i],
                    ms[i],
                    core::ptr::null_mut(),
                    &mut sreq[i],
                );
                assert_eq!(rc, ncclResult_t::Success, "isend {g}.{i}: {:?}", take_log());
                rd = rd || poll(rreq, got.as_mut_ptr(), "recv");
            }
            live_at_post[i] = api::rail_stats(s).unwrap().live[1];
            // Let the sender see its completions (and a failure) before the next send.
            for _ in 0..20 {
                sd[i] = sd[i] || poll(sreq[i], core::ptr::null_mut(), "send");
            }
        }
        while !(rd && sd.iter().all(|d| *d)) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "group {g} stuck: {:?}",
                take_log()
            );
            for i in 0..N {
                sd[i] = sd[i] || poll(sreq[i], core::ptr::null_mut(), "send");
            }
            rd = rd || poll(rreq, got.as_mut_ptr(), "recv");
        }
        for i in 0..N {
            assert_eq!(got[i], n[i] as c_int, "group {g}, receive {i}: exact size");
            assert_eq!(
                dst[i][..n[i]],
                src[i][..n[i]],
                "group {g}, receive {i}: bytes"
            );
        }
        if straddled.is_none() && live_at_post.contains(&true) && live_at_post.contains(&false) {
            straddled = Some((g, live_at_post));
        }
    }
    let st = api::rail_stats(s).unwrap();
    println!(
        "straddled {straddled:?}; per-rail bytes {:?}; resent {} B",
        &st.rail_bytes[..2],
        st.resent
    );
    assert_eq!(
        st.live[..2],
        [true, false],
        "rail 1 failed, rail 0 carries on"
    );
    assert!(
        straddled.is_some(),
        "the failure fell between two sends of one group (else this test misses its case)"
    );
    for (c, m) in ms
        .into_iter()
        .map(|m| (s, m))
        .chain(mr.into_iter().map(|m| (r, m)))
    {
        assert_eq!(api::dereg_mr(c, m), ncclResult_t::Success);
    }
    close(s, r, l);
}
