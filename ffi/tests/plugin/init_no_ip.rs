//! Init without a usable IP interface fails, as the seed's does (NCCL then falls back to
//! another transport), instead of reporting devices whose `listen` would fail. A process of its
//! own: it sets the process environment before the plugin reads it.

use crate::util;

use std::ffi::c_void;

use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::abi::exports::ncclNetPlugin_v11 as NET;

#[test]
fn init_fails_without_an_ip_interface_and_reports_no_device() {
    if util::ran_in_child() {
        return;
    }
    std::env::set_var("NCCL_SOCKET_IFNAME", "=ibnet-no-such-interface");
    std::env::set_var("IBNET_PROVIDER", "soft");
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: the v11 table's init with a valid ctx out-pointer, no config, no logger.
    let rc =
        unsafe { (NET.init.expect("in the table"))(&mut ctx, 0, std::ptr::null_mut(), None, None) };
    assert_eq!(
        rc,
        ncclResult_t::InternalError,
        "init must fail, as the seed's"
    );
    assert!(ctx.is_null(), "no context on failure");
    let mut n = -1;
    // SAFETY: valid out-pointer.
    assert_eq!(
        unsafe { (NET.devices.expect("in the table"))(&mut n) },
        ncclResult_t::Success
    );
    assert_eq!(n, 0, "no device after a failed init");
    // NCCL calls finalize even after a failed init: NULL-safe.
    // SAFETY: NULL ctx.
    assert_eq!(
        unsafe { (NET.finalize.expect("in the table"))(ctx) },
        ncclResult_t::Success
    );
    // With an interface, init succeeds again in the same process (nothing was left held).
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    // SAFETY: as above.
    let rc =
        unsafe { (NET.init.expect("in the table"))(&mut ctx, 0, std::ptr::null_mut(), None, None) };
    assert_eq!(rc, ncclResult_t::Success);
    assert!(!ctx.is_null());
    // SAFETY: the ctx init returned.
    assert_eq!(
        unsafe { (NET.finalize.expect("in the table"))(ctx) },
        ncclResult_t::Success
    );
}
