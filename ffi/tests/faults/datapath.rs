//! NCCL's data-path semantics (issue 28, point 3), through `api` over soft devices:
//!
//! - a send larger than the posted receive is truncated to the receive's size, as NCCL 2.30's
//!   `p2p.cc` does: the bytes up to the posted size arrive, nothing past the posted buffer is
//!   written (guard bytes), both ends report the truncated size, and the comm logs one WARN
//!   naming both sizes and the peer, however many sends it truncates (plain and fused comms);
//! - `deregMr(comm, NULL)` succeeds without a WARN;
//! - a device-fatal async event fails `isend` (also one waiting for clear-to-send), `irecv`,
//!   `test` and `iflush` with `ncclSystemError` (NCCL's `ncclIbStatsCheckFatalCount`), the
//!   first failure one WARN naming the device and the peer. The soft provider's
//!   `raise_device_fatal` stands in for `IBV_EVENT_DEVICE_FATAL`.

use crate::util;

use core::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api::{self, Sizes};
use util::*;

/// The soft device the fatal-event test kills (the others stay healthy).
const DOOMED: c_int = 2;

/// The plugin over three soft devices; false without the soft provider.
fn setup() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| init_soft(&[("NCCL_SOCKET_IFNAME", "lo"), ("IBNET_SOFT_DEVICES", "3")]))
}

/// The WARN lines logged since the last call.
fn warns() -> Vec<String> {
    take_log()
        .into_iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, t)| t)
        .collect()
}

const GUARD: u8 = 0xee;
const TIMEOUT: Duration = Duration::from_secs(30);

/// Posts one receive of the first `len` bytes of `buf` (registered as `mh`) with `tag`.
fn post_part(
    r: *mut c_void,
    buf: &mut [u8],
    len: usize,
    mh: *mut c_void,
    tag: c_int,
) -> *mut c_void {
    let mut req: *mut c_void = core::ptr::null_mut();
    let mut data = [buf.as_mut_ptr() as *mut c_void];
    let sizes = [len];
    let tags = [tag];
    let mut mhs = [mh];
    let rc = api::irecv(
        r,
        1,
        data.as_mut_ptr(),
        Sizes::Size(sizes.as_ptr()),
        tags.as_ptr(),
        mhs.as_mut_ptr(),
        core::ptr::null_mut(),
        &mut req,
    );
    assert_eq!(rc, ncclResult_t::Success, "irecv: {:?}", take_log());
    assert!(!req.is_null());
    req
}

/// Calls `test` on `req` until done; the size it reports.
fn done_size(req: *mut c_void) -> Result<c_int, ncclResult_t> {
    let t0 = Instant::now();
    let (mut done, mut size): (c_int, c_int) = (0, -1);
    while done == 0 {
        assert!(t0.elapsed() < TIMEOUT, "request not done after {TIMEOUT:?}");
        match api::test(req, &mut done, &mut size) {
            ncclResult_t::Success => {}
            e => return Err(e),
        }
    }
    Ok(size)
}

/// Retries `isend` of `src` with `tag` until it returns a request (every call must succeed).
fn send(s: *mut c_void, src: &mut [u8], mh: *mut c_void, tag: c_int) -> *mut c_void {
    let mut req: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while req.is_null() {
        assert!(t0.elapsed() < TIMEOUT, "isend never posted");
        let p = src.as_mut_ptr() as *mut c_void;
        let rc = api::isend(
            s,
            p,
            src.len() as u64,
            tag,
            mh,
            core::ptr::null_mut(),
            &mut req,
        );
        assert_eq!(rc, ncclResult_t::Success, "isend: {:?}", take_log());
    }
    req
}

/// Two oversize sends on the pair (`recv` bytes posted, `send` bytes sent): both truncated,
/// bytes verified up to the posted size, guards intact, sizes reported at both ends; one WARN
/// for the comm, naming both sizes and the peer.
fn oversize_sends_are_truncated(s: *mut c_void, r: *mut c_void, recv: usize, send_len: usize) {
    const PAD: usize = 4096;
    let mut src: Vec<u8> = (0..send_len)
        .map(|i| (i as u8).wrapping_mul(37) ^ (i >> 9) as u8 ^ 0x3c)
        .collect();
    let ms = reg(s, &mut src);
    for round in 0..2 {
        // The receive buffer is the first `recv` bytes of a larger registered allocation:
        // a write past the posted size would land in the guard and be seen.
        let mut dst = vec![GUARD; recv + PAD];
        let mr = reg(r, &mut dst);
        let _ = take_log();
        let rreq = post_part(r, &mut dst, recv, mr, 7);
        let sreq = send(s, &mut src, ms, 7);
        let ssize = done_size(sreq).expect("send completes");
        let rsize = done_size(rreq).expect("receive completes");
        assert_eq!(
            rsize as usize, recv,
            "the receiver reports the truncated size"
        );
        assert_eq!(
            ssize as usize, recv,
            "the sender reports the truncated size"
        );
        assert!(dst[..recv] == src[..recv], "bytes up to the posted size");
        let bad = dst[recv..].iter().position(|&b| b != GUARD);
        assert_eq!(bad, None, "a byte past the posted buffer was written");
        let w = warns();
        if round == 0 {
            assert_eq!(w.len(), 1, "one WARN for the first truncation: {w:?}");
            let (a, b) = (send_len.to_string(), recv.to_string());
            assert!(w[0].contains(&a) && w[0].contains(&b), "both sizes: {w:?}");
            assert!(w[0].contains("127.0.0.1"), "the peer: {w:?}");
        } else {
            assert!(w.is_empty(), "one WARN per comm, not per send: {w:?}");
        }
        assert_eq!(api::dereg_mr(r, mr), ncclResult_t::Success);
    }
    // The comm is healthy: an exact-size message still goes through, verified.
    transfer(s, r, 10_000, 5);
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::Success);
    assert!(warns().is_empty());
}

#[test]
fn oversize_send_is_truncated_on_a_plain_comm() {
    if util::ran_in_child() {
        return;
    }
    if !setup() {
        return;
    }
    let (mut h, l) = listen();
    let (s, r, _) = establish(&mut h, l, TIMEOUT);
    oversize_sends_are_truncated(s, r, 3000, 7001);
    close(s, r, l);
}

#[test]
fn oversize_send_is_truncated_on_a_fused_comm() {
    if util::ran_in_child() {
        return;
    }
    if !setup() {
        return;
    }
    let d = util::fuse_first_two();
    let (mut h, l) = listen_on(d);
    let (s, r, _) = establish_on(d, &mut h, l, TIMEOUT);
    assert!(api::rail_stats(s).is_some(), "a fused comm");
    // Both rails carry a part of the truncated message (and one of 1000 fits rail 0 alone).
    oversize_sends_are_truncated(s, r, 100_003, 300_000);
    oversize_sends_are_truncated_again(s, r);
    close(s, r, l);
}

/// A fused comm's one WARN is spent: a truncation that fits one rail is silent, and right.
fn oversize_sends_are_truncated_again(s: *mut c_void, r: *mut c_void) {
    let mut src: Vec<u8> = (0..5000).map(|i| (i as u8) ^ 0x77).collect();
    let ms = reg(s, &mut src);
    let mut dst = vec![GUARD; 1000 + 4096];
    let mr = reg(r, &mut dst);
    let rreq = post_part(r, &mut dst, 1000, mr, 7);
    let sreq = send(s, &mut src, ms, 7);
    assert_eq!(done_size(sreq), Ok(1000));
    assert_eq!(done_size(rreq), Ok(1000));
    assert!(dst[..1000] == src[..1000]);
    assert!(dst[1000..].iter().all(|&b| b == GUARD));
    assert!(warns().is_empty());
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(r, mr), ncclResult_t::Success);
}

#[test]
fn dereg_mr_of_null_succeeds() {
    if util::ran_in_child() {
        return;
    }
    if !setup() {
        return;
    }
    let (mut h, l) = listen();
    let (s, r, _) = establish(&mut h, l, TIMEOUT);
    let _ = take_log();
    assert_eq!(
        api::dereg_mr(s, core::ptr::null_mut()),
        ncclResult_t::Success
    );
    assert_eq!(
        api::dereg_mr(r, core::ptr::null_mut()),
        ncclResult_t::Success
    );
    let w = warns();
    assert!(w.is_empty(), "no WARN for deregMr(NULL): {w:?}");
    transfer(s, r, 4096, 1);
    close(s, r, l);
}

/// Raises a device-fatal event on soft device `dev` (the soft provider's stand-in for
/// `IBV_EVENT_DEVICE_FATAL`).
fn kill_device(dev: c_int) {
    let p = nccl_net_ibnet::plugin::current().expect("plugin initialised");
    match &p.devs[dev as usize] {
        nccl_net_ibnet::dev::Dev::Soft(s, _) => s.raise_device_fatal(),
        _ => panic!("device {dev} is not a soft device"),
    }
}

/// An `isend` waiting for clear-to-send sees a device that died meanwhile: it fails with
/// `ncclSystemError` (what NCCL's `ncclIbStatsCheckFatalCount` returns) and one WARN naming
/// the device and the peer; the receiver's `test`, `irecv` and `iflush` fail too. Comms on
/// other devices are untouched.
#[test]
fn fatal_device_event_fails_every_data_call() {
    if util::ran_in_child() {
        return;
    }
    if !setup() {
        return;
    }
    let (mut h, l) = listen_on(DOOMED);
    let (s, r, _) = establish_on(DOOMED, &mut h, l, TIMEOUT);
    transfer(s, r, 4096, 3);
    let mut src = vec![1u8; 4096];
    let mut dst = vec![0u8; 4096];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let _ = take_log();
    let isend = |req: &mut *mut c_void, src: &mut [u8]| {
        let p = src.as_mut_ptr() as *mut c_void;
        api::isend(s, p, 4096, 7, ms, core::ptr::null_mut(), req)
    };
    // The receiver posts nothing for tag 7: the send waits for its clear-to-send.
    let mut sreq: *mut c_void = core::ptr::null_mut();
    assert_eq!(isend(&mut sreq, &mut src), ncclResult_t::Success);
    assert!(sreq.is_null(), "no clear-to-send yet");
    let rreq = post_part(r, &mut dst, 4096, mr, 9);
    assert_eq!(isend(&mut sreq, &mut src), ncclResult_t::Success);
    assert!(sreq.is_null(), "tag 9 is not tag 7");
    assert!(warns().is_empty());

    kill_device(DOOMED);
    assert_eq!(isend(&mut sreq, &mut src), ncclResult_t::SystemError);
    assert!(sreq.is_null());
    let w = warns();
    assert_eq!(w.len(), 1, "one WARN: {w:?}");
    assert!(
        w[0].contains("isend") && w[0].contains("soft2"),
        "the device: {w:?}"
    );
    assert!(w[0].contains("127.0.0.1"), "the peer: {w:?}");
    // Refused again, reported as the first failure (an INFO line, not another WARN).
    assert_eq!(isend(&mut sreq, &mut src), ncclResult_t::SystemError);
    assert!(warns().is_empty());

    // The receiver: the pending receive's test, a new irecv and an iflush.
    let (mut done, mut size): (c_int, c_int) = (0, 0);
    assert_eq!(
        api::test(rreq, &mut done, &mut size),
        ncclResult_t::SystemError
    );
    assert_eq!(done, 0);
    let w = warns();
    assert_eq!(w.len(), 1, "one WARN: {w:?}");
    assert!(w[0].contains("test") && w[0].contains("soft2"), "{w:?}");
    let (rc, req) = irecv_once(r, &mut dst, mr, 7);
    assert_eq!(
        (rc, req),
        (ncclResult_t::SystemError, core::ptr::null_mut())
    );
    let mut data = [dst.as_mut_ptr() as *mut c_void];
    let sizes = [4096 as c_int];
    let mut mhs = [mr];
    let mut freq: *mut c_void = core::ptr::null_mut();
    let rc = api::iflush(
        r,
        1,
        data.as_mut_ptr(),
        sizes.as_ptr(),
        mhs.as_mut_ptr(),
        &mut freq,
    );
    assert_eq!(rc, ncclResult_t::SystemError);
    assert!(
        warns().is_empty(),
        "refusals after the first failure are INFO"
    );

    // Another device's comms still move verified bytes.
    let (mut h0, l0) = listen();
    let (s0, r0, _) = establish(&mut h0, l0, TIMEOUT);
    transfer(s0, r0, 65536, 9);
    close(s0, r0, l0);
    let _ = (api::dereg_mr(s, ms), api::dereg_mr(r, mr));
    let _ = (api::close_send(s), api::close_recv(r), api::close_listen(l));
    let _ = take_log();
}
