//! `NCCL_IB_WARN_RAIL_LOCAL=1` over two soft devices, as NCCL 2.28 behaves: the accepting side
//! logs one INFO when the connecting peer's physical device numbers are not its own (device 0
//! accepting from device 1), nothing when they are (0 from 0, or the fused NIC of 0 and 1 from
//! the same), and the connecting side never logs it.

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};
use nccl_net_ibnet::api;
use util::*;

/// Listens on `ldev`, connects from `cdev`; returns the rail-local lines logged by accept and
/// by connect, and closes the comms.
fn lines(ldev: c_int, cdev: c_int) -> (Vec<String>, Vec<String>) {
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let hp = h.as_mut_ptr() as *mut c_void;
    let mut l = core::ptr::null_mut();
    let rc = api::listen(core::ptr::null_mut(), ldev, hp, &mut l);
    assert_eq!(rc, ncclResult_t::Success);
    let (mut s, mut r): (*mut c_void, *mut c_void) = (core::ptr::null_mut(), core::ptr::null_mut());
    let (mut on_accept, mut on_connect) = (Vec::new(), Vec::new());
    let rail_local = |out: &mut Vec<String>| {
        take_log()
            .into_iter()
            .filter(|(_, m)| m.contains("(NCCL_IB_WARN_RAIL_LOCAL=1;"))
            .for_each(|(lv, m)| {
                assert_eq!(lv, Level::Info, "{m}");
                out.push(m);
            })
    };
    let t0 = Instant::now();
    while s.is_null() || r.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no connection");
        if s.is_null() {
            let rc = api::connect(core::ptr::null_mut(), cdev, hp, &mut s, None);
            assert_eq!(rc, ncclResult_t::Success, "connect: {:?}", take_log());
            rail_local(&mut on_connect);
        }
        if r.is_null() {
            assert_eq!(api::accept(l, &mut r), ncclResult_t::Success);
            rail_local(&mut on_accept);
        }
    }
    close(s, r, l);
    (on_accept, on_connect)
}

#[test]
fn the_accepting_side_reports_a_peer_on_other_devices() {
    if util::ran_in_child() {
        return;
    }
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "2"),
        ("NCCL_IB_WARN_RAIL_LOCAL", "1"),
    ];
    if !init_soft(&env) {
        return;
    }
    take_log();
    let (acc, con) = lines(0, 1);
    assert_eq!(acc.len(), 1, "{acc:?}");
    assert!(
        acc[0].contains("physical devices [1] are not this side's [0]"),
        "{acc:?}"
    );
    assert!(con.is_empty(), "{con:?}");

    let (acc, con) = lines(0, 0);
    assert!(acc.is_empty() && con.is_empty(), "{acc:?} {con:?}");

    let d = util::fuse_first_two();
    let (acc, con) = lines(d, d);
    assert!(acc.is_empty() && con.is_empty(), "{acc:?} {con:?}");
}
