//! A fused NIC through the plugin API over two soft devices (`IBNET_SOFT_DEVICES=2`):
//! `makeVDevice` of both, its properties, listen/connect/accept on it (one comm per rail, the
//! rail list in the handshake), registrations on both rails, messages striped over both rails
//! with every byte verified, a multi-receive reporting each exact size, and traffic counted on
//! each rail. The failover case is `fused_failover.rs` (its own process: a fault knob).

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};
use nccl_net_ibnet::api::{self, Sizes};
use util::*;

fn pair(dev: c_int) -> (*mut c_void, *mut c_void, *mut c_void) {
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let mut l = core::ptr::null_mut();
    let hp = h.as_mut_ptr() as *mut c_void;
    assert_eq!(
        api::listen(core::ptr::null_mut(), dev, hp, &mut l),
        ncclResult_t::Success
    );
    let (mut s, mut r): (*mut c_void, *mut c_void) = (core::ptr::null_mut(), core::ptr::null_mut());
    let t0 = Instant::now();
    while s.is_null() || r.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no connection");
        if s.is_null() {
            let rc = api::connect(core::ptr::null_mut(), dev, hp, &mut s, None);
            assert_eq!(rc, ncclResult_t::Success, "connect: {:?}", take_log());
        }
        if r.is_null() {
            assert_eq!(
                api::accept(l, &mut r),
                ncclResult_t::Success,
                "{:?}",
                take_log()
            );
        }
    }
    (s, r, l)
}

fn reg(c: *mut c_void, b: &mut [u8]) -> *mut c_void {
    let mut mh = core::ptr::null_mut();
    let p = b.as_mut_ptr() as *mut c_void;
    let rc = api::reg_mr(c, p, b.len() as u64, 0, None, &mut mh);
    assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
    mh
}

/// Posts a receive of `bufs` (one per receive) with tags `tags`; sends `sends[i]` bytes
/// from `src` to receive `i`; waits for all; returns the sizes the receive reported.
fn exchange(
    s: *mut c_void,
    r: *mut c_void,
    src: &mut [Vec<u8>],
    dst: &mut [Vec<u8>],
    sends: &[usize],
) -> Vec<c_int> {
    let n = dst.len();
    let mut data: Vec<*mut c_void> = dst.iter_mut().map(|b| b.as_mut_ptr() as _).collect();
    let sizes: Vec<usize> = dst.iter().map(|b| b.len()).collect();
    let tags: Vec<c_int> = (0..n as c_int).map(|i| 100 + i).collect();
    let mut rmh: Vec<*mut c_void> = dst.iter_mut().map(|b| reg(r, b)).collect();
    let smh: Vec<*mut c_void> = src.iter_mut().map(|b| reg(s, b)).collect();
    let mut rreq = core::ptr::null_mut();
    let rc = api::irecv(
        r,
        n as c_int,
        data.as_mut_ptr(),
        Sizes::Size(sizes.as_ptr()),
        tags.as_ptr(),
        rmh.as_mut_ptr(),
        core::ptr::null_mut(),
        &mut rreq,
    );
    assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
    assert!(!rreq.is_null());
    let mut sreqs = Vec::new();
    for i in 0..n {
        let mut q: *mut c_void = core::ptr::null_mut();
        let t0 = Instant::now();
        while q.is_null() {
            assert!(t0.elapsed() < Duration::from_secs(30), "isend never posted");
            let p = src[i].as_mut_ptr() as *mut c_void;
            let rc = api::isend(
                s,
                p,
                sends[i] as u64,
                tags[i],
                smh[i],
                core::ptr::null_mut(),
                &mut q,
            );
            assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
        }
        sreqs.push(q);
    }
    let mut got = vec![-1 as c_int; n];
    let t0 = Instant::now();
    let mut rdone = false;
    let mut sdone = vec![false; n];
    while !rdone || sdone.iter().any(|d| !d) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not done: {:?}",
            take_log()
        );
        for (q, d) in sreqs.iter().zip(sdone.iter_mut()).filter(|(_, d)| !**d) {
            let mut x = 0;
            assert_eq!(
                api::test(*q, &mut x, core::ptr::null_mut()),
                ncclResult_t::Success
            );
            *d = x != 0;
        }
        if !rdone {
            let mut x = 0;
            let rc = api::test(rreq, &mut x, got.as_mut_ptr());
            assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
            rdone = x != 0;
        }
    }
    for (i, m) in smh.into_iter().enumerate() {
        assert_eq!(api::dereg_mr(s, m), ncclResult_t::Success, "{i}");
    }
    for m in rmh {
        assert_eq!(api::dereg_mr(r, m), ncclResult_t::Success);
    }
    got
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn a_fused_nic_through_the_api() {
    if util::ran_in_child() {
        return;
    }
    if !init_soft(&[("NCCL_SOCKET_IFNAME", "lo"), ("IBNET_SOFT_DEVICES", "2")]) {
        return;
    }
    let mut n = 0;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    assert_eq!(n, 2, "soft0 and soft1");
    let d = fuse_first_two();
    assert_eq!(d, 2, "the vNIC comes after the physical devices");
    assert_eq!(fuse_first_two(), 2, "the same fusion is the same vNIC");
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    assert_eq!(n, 3);
    let p = api::properties(d).expect("properties");
    let one = api::properties(0).expect("properties");
    assert_eq!(p.speed, 2 * one.speed, "speeds summed");
    // SAFETY: the name is a NUL-terminated string the plugin keeps.
    let name = unsafe { std::ffi::CStr::from_ptr(p.name) };
    assert_eq!(name.to_str().unwrap(), "soft0+soft1");
    assert_eq!(
        (p.vprops.ndevs, p.vprops.devs[..2].to_vec()),
        (2, vec![0, 1])
    );

    let (s, r, l) = pair(d);
    let _ = take_log();
    // Single receives of sizes around the stripe's 128-byte alignment, every byte verified.
    for (k, &len) in [
        0usize,
        1,
        127,
        128,
        129,
        255,
        256,
        4097,
        65536,
        1 << 20,
        (1 << 20) + 3,
    ]
    .iter()
    .enumerate()
    {
        let mut src = vec![pattern(len.max(1), k as u8)];
        let mut dst = vec![vec![0xEEu8; len.max(1) + 64]];
        let got = exchange(s, r, &mut src, &mut dst, &[len]);
        assert_eq!(got, vec![len as c_int], "size of a {len}-byte message");
        assert_eq!(&dst[0][..len], &src[0][..len], "{len} bytes");
        assert!(
            dst[0][len..].iter().all(|&b| b == 0xEE),
            "{len}: no byte past the message"
        );
    }
    let st = api::rail_stats(s).expect("fused send comm");
    assert_eq!(st.rails, 2);
    assert!(
        st.rail_bytes[0] > 0 && st.rail_bytes[1] > 0,
        "traffic on both rails: {st:?}"
    );
    assert_eq!(st.resent, 0);
    assert_eq!(st.live[..2], [true, true]);
    println!("per-rail bytes: {:?}", &st.rail_bytes[..2]);
    // A multi-receive of 8 different sizes reports each exactly.
    let sends = [0usize, 1, 100, 128, 300, 4096, 5000, 70_000];
    let mut src: Vec<Vec<u8>> = sends
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n.max(1), 40 + i as u8))
        .collect();
    let mut dst: Vec<Vec<u8>> = sends.iter().map(|_| vec![0u8; 80_000]).collect();
    let got = exchange(s, r, &mut src, &mut dst, &sends);
    let want: Vec<c_int> = sends.iter().map(|&n| n as c_int).collect();
    assert_eq!(got, want, "each receive's own size");
    for (i, &n) in sends.iter().enumerate() {
        assert_eq!(&dst[i][..n], &src[i][..n], "receive {i}");
    }
    // A plain device next to the vNIC keeps working.
    assert!(api::rail_stats(s).is_some());
    let no_warn = take_log()
        .into_iter()
        .filter(|(l, _)| *l == ibnet_nccl::log::Level::Warn);
    assert_eq!(no_warn.count(), 0, "no WARN on a healthy fused comm");
    close(s, r, l);
    let (h2s, h2r, h2l) = {
        let (mut h, l) = listen();
        let (s, r, _) = establish(&mut h, l, Duration::from_secs(20));
        (s, r, l)
    };
    assert!(api::rail_stats(h2s).is_none(), "device 0 is plain");
    transfer(h2s, h2r, 100_000, 3);
    close(h2s, h2r, h2l);
    a_failed_fused_comm_refuses_new_work(d);
}

/// A fused receive comm whose peer is gone (its send comm closed): once `test` failed, every
/// later data call fails at once with the same result, logged at INFO (issue 30).
fn a_failed_fused_comm_refuses_new_work(d: c_int) {
    let (s, r, l) = pair(d);
    let mut b = vec![0u8; 4096];
    let mh = reg(r, &mut b);
    let req = post_recv(r, &mut b, mh, 1);
    assert_eq!(api::close_send(s), ncclResult_t::Success);
    let t0 = Instant::now();
    let mut done: c_int = 0;
    let first = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the receive never failed"
        );
        let rc = api::test(req, &mut done, core::ptr::null_mut());
        if rc != ncclResult_t::Success {
            break rc;
        }
    };
    let log = take_log();
    println!("a fused receive whose sender closed: {first:?}, {log:?}");
    assert_eq!(first, ncclResult_t::RemoteError, "{log:?}");
    let (rc, req2) = irecv_once(r, &mut b, mh, 1);
    assert_eq!(rc, first, "irecv on a failed fused comm: {:?}", take_log());
    assert!(req2.is_null());
    assert_eq!(api::test(req, &mut done, core::ptr::null_mut()), first);
    let warns = take_log()
        .into_iter()
        .filter(|(l, _)| *l == ibnet_nccl::log::Level::Warn)
        .count();
    assert_eq!(warns, 0, "the refusals are INFO lines");
    assert_eq!(api::dereg_mr(r, mh), ncclResult_t::Success);
    assert_eq!(api::close_recv(r), ncclResult_t::Success);
    assert_eq!(api::close_listen(l), ncclResult_t::Success);
}

#[test]
fn sizes_of_fused_comms() {
    if util::ran_in_child() {
        return;
    }
    println!(
        "FusedSend<soft> {} B, FusedRecv<soft> {} B, SendComm<soft> {} B",
        size_of::<ibnet_core::fused::FusedSend<ibnet_soft::SoftProvider>>(),
        size_of::<ibnet_core::fused::FusedRecv<ibnet_soft::SoftProvider>>(),
        size_of::<ibnet_core::comm::SendComm<ibnet_soft::SoftProvider>>()
    );
}
