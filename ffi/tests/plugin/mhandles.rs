//! `mhandle`s are per registration (issue 30, point 3): two registrations that share one cache
//! entry (a range inside a registered one) have two handles. A second `deregMr` of a handle,
//! and `isend` / `irecv` / `iflush` with a deregistered handle, are refused with
//! `ncclInternalError` (NCCL's own plugin answers an unknown `mhandle` so) and one WARN each,
//! even while the shared entry lives on; the containing registration keeps working, its bytes
//! verified. On a plain comm and on a fused NIC of two soft devices, through `api`.

use crate::util;

use core::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use util::*;

/// The plugin over two soft devices; false without the soft provider.
fn setup() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| init_soft(&[("NCCL_SOCKET_IFNAME", "lo"), ("IBNET_SOFT_DEVICES", "2")]))
}

/// The WARN lines logged since the last call.
fn warns() -> Vec<String> {
    take_log()
        .into_iter()
        .filter(|(l, _)| *l == Level::Warn)
        .map(|(_, t)| t)
        .collect()
}

/// Asserts that exactly one WARN was logged since the last look, naming `call`.
fn one_warn(call: &str) {
    let w = warns();
    assert_eq!(w.len(), 1, "one WARN for {call}: {w:?}");
    assert!(w[0].contains(call), "{w:?}");
}

fn isend(s: *mut c_void, buf: &mut [u8], mh: *mut c_void, req: &mut *mut c_void) -> ncclResult_t {
    let (p, n) = (buf.as_mut_ptr() as *mut c_void, buf.len() as u64);
    api::isend(s, p, n, 7, mh, core::ptr::null_mut(), req)
}

fn irecv(r: *mut c_void, buf: &mut [u8], mh: *mut c_void, req: &mut *mut c_void) -> ncclResult_t {
    let rc;
    (rc, *req) = irecv_once(r, buf, mh, 7);
    rc
}

fn iflush(r: *mut c_void, buf: &mut [u8], mh: *mut c_void, req: &mut *mut c_void) -> ncclResult_t {
    let mut data = [buf.as_mut_ptr() as *mut c_void];
    let sizes = [buf.len() as c_int];
    let mut mhs = [mh];
    api::iflush(
        r,
        1,
        data.as_mut_ptr(),
        sizes.as_ptr(),
        mhs.as_mut_ptr(),
        req,
    )
}

/// What every pair goes through: a contained registration's second `deregMr` and its use on
/// the data path are refused while the container (same entry) still moves verified bytes.
fn stale_handles_are_refused(s: *mut c_void, r: *mut c_void) {
    const LEN: usize = 1 << 16;
    let mut src: Vec<u8> = (0..LEN)
        .map(|i| (i as u8).wrapping_mul(29) ^ 0x5a)
        .collect();
    let mut dst = vec![0u8; LEN];
    let ms = reg(s, &mut src);
    let mr = reg(r, &mut dst);
    // Ranges inside those registrations: served by the same cache entries.
    let ss = reg(s, &mut src[4096..4096 + 64]);
    let rs = reg(r, &mut dst[..64]);
    let _ = warns();
    assert_eq!(api::dereg_mr(s, ss), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(r, rs), ncclResult_t::Success);
    assert!(warns().is_empty());

    // A second deregMr of the same handle: refused; the container's reference is untouched.
    assert_eq!(api::dereg_mr(s, ss), ncclResult_t::InternalError);
    one_warn("deregMr");
    assert_eq!(api::dereg_mr(r, rs), ncclResult_t::InternalError);
    one_warn("deregMr");

    // The receive the valid message is for, posted first: a stale isend must not fill it.
    let rreq = post_recv(r, &mut dst, mr, 7);
    let mut req: *mut c_void = core::ptr::null_mut();
    assert_eq!(
        isend(s, &mut src[4096..4096 + 64], ss, &mut req),
        ncclResult_t::InternalError
    );
    assert!(req.is_null());
    one_warn("isend");
    assert_eq!(
        irecv(r, &mut dst[..64], rs, &mut req),
        ncclResult_t::InternalError
    );
    assert!(req.is_null());
    one_warn("irecv");
    assert_eq!(
        iflush(r, &mut dst[..64], rs, &mut req),
        ncclResult_t::InternalError
    );
    assert!(req.is_null());
    one_warn("iflush");

    // The containing registrations still work: the receive gets the valid message, verified.
    let t0 = Instant::now();
    let mut sreq: *mut c_void = core::ptr::null_mut();
    while sreq.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30), "isend never posted");
        assert_eq!(isend(s, &mut src, ms, &mut sreq), ncclResult_t::Success);
    }
    wait(sreq, Duration::from_secs(30)).expect("send");
    wait(rreq, Duration::from_secs(30)).expect("receive");
    assert_eq!(dst, src, "the valid message, every byte");
    assert!(warns().is_empty());

    // Fully released registrations: a third deregMr, and a later one of the containers, are
    // refused too.
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(r, mr), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(s, ss), ncclResult_t::InternalError);
    one_warn("deregMr");
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::InternalError);
    one_warn("deregMr");
    assert_eq!(
        isend(s, &mut src, ms, &mut req),
        ncclResult_t::InternalError
    );
    one_warn("isend");
    assert_ne!(ss, ms, "a contained registration has its own handle");
    assert_ne!(rs, mr, "a contained registration has its own handle");
}

#[test]
fn stale_mhandles_are_refused_on_a_plain_comm() {
    if util::ran_in_child() {
        return;
    }
    if !setup() {
        return;
    }
    let (mut h, l) = listen();
    let (s, r, _) = establish(&mut h, l, Duration::from_secs(30));
    stale_handles_are_refused(s, r);
    close(s, r, l);
}

#[test]
fn stale_mhandles_are_refused_on_a_fused_nic() {
    if util::ran_in_child() {
        return;
    }
    if !setup() {
        return;
    }
    let d = util::fuse_first_two();
    let (mut h, l) = listen_on(d);
    let (s, r, _) = establish_on(d, &mut h, l, Duration::from_secs(30));
    assert!(api::rail_stats(s).is_some(), "a fused comm");
    stale_handles_are_refused(s, r);
    close(s, r, l);
}

/// A device holds `MR_CACHE_CAPACITY` registrations at once (one record each, however many
/// share a range): one more `regMr` is refused with one WARN saying what is full, and after
/// one `deregMr` the next succeeds.
#[test]
fn registrations_past_the_record_table_are_an_error() {
    if util::ran_in_child() {
        return;
    }
    if !setup() {
        return;
    }
    let (mut h, l) = listen();
    let (s, r, _) = establish(&mut h, l, Duration::from_secs(30));
    let mut buf = vec![0u8; 4096];
    let cap = nccl_net_ibnet::dev::MR_CACHE_CAPACITY;
    let mhs: Vec<_> = (0..cap).map(|_| reg(s, &mut buf)).collect();
    let _ = warns();
    let mut mh = core::ptr::null_mut();
    let p = buf.as_mut_ptr() as *mut c_void;
    assert_eq!(
        api::reg_mr(s, p, 4096, 0, None, &mut mh),
        ncclResult_t::InternalError
    );
    assert!(mh.is_null());
    one_warn("live registrations (mhandles not yet deregistered) of this device");
    assert_eq!(api::dereg_mr(s, mhs[7]), ncclResult_t::Success);
    assert_eq!(
        api::reg_mr(s, p, 4096, 0, None, &mut mh),
        ncclResult_t::Success
    );
    assert_eq!(api::dereg_mr(s, mh), ncclResult_t::Success);
    for (i, &m) in mhs.iter().enumerate() {
        if i != 7 {
            assert_eq!(api::dereg_mr(s, m), ncclResult_t::Success);
        }
    }
    assert!(warns().is_empty());
    close(s, r, l);
}
