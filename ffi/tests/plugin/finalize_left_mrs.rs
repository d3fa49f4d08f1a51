//! Registrations NCCL leaves at `finalize` (it may finalize without deregistering everything)
//! are deregistered and freed then, alone in its process: plugin lives that each close their
//! comms with two registrations still made leave no soft registration behind, and each
//! `finalize` says how many it found, in one INFO.

use crate::util;

use core::ffi::c_void;
use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;

const PAGE: usize = 4096;

/// Makes this process a soft-provider plugin process logging to `util::note`, and returns a
/// buffer of five pages; `None` in the parent of the test's child, or where soft is unavailable.
fn soft_plugin_process() -> Option<Vec<u8>> {
    if util::ran_in_child() {
        return None;
    }
    std::env::set_var("IBNET_PROVIDER", "soft");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    if let Err(u) = ibnet_soft::probe_with(false) {
        eprintln!("SKIP: soft provider unavailable ({u:?})");
        return None;
    }
    ibnet_nccl::log::set_sink(util::note);
    Some(vec![0u8; 5 * PAGE])
}

/// Registers one page of `buf` on each comm, the pages apart: two registrations, two memory
/// regions, never deregistered.
fn reg_a_page_each(s: *mut c_void, r: *mut c_void, buf: &mut [u8]) {
    let base = (buf.as_mut_ptr() as usize).next_multiple_of(PAGE);
    for (c, at) in [(s, base), (r, base + 2 * PAGE)] {
        let mut mh = core::ptr::null_mut();
        let rc = api::reg_mr(c, at as *mut c_void, PAGE as u64, 0, None, &mut mh);
        assert_eq!(rc, ncclResult_t::Success, "{:?}", util::take_log());
    }
}

#[test]
fn finalize_deregisters_the_registrations_nccl_left() {
    let Some(mut buf) = soft_plugin_process() else {
        return;
    };
    for life in 0..5 {
        let mut ctx: *mut c_void = core::ptr::null_mut();
        let rc = api::init(Some(&mut ctx), -1, None, None);
        assert_eq!(rc, ncclResult_t::Success);
        let (mut h, l) = util::listen();
        let (s, r, _) = util::establish(&mut h, l, std::time::Duration::from_secs(20));
        // The comms' own rings are registrations too (gone with the comms).
        let rings = ibnet_soft::live_registrations();
        reg_a_page_each(s, r, &mut buf);
        assert_eq!(ibnet_soft::live_registrations(), rings + 2, "life {life}");
        // NCCL's error paths close comms without `deregMr`.
        util::close(s, r, l);
        util::take_log();
        assert_eq!(api::finalize(ctx), ncclResult_t::Success);
        assert_eq!(
            ibnet_soft::live_registrations(),
            0,
            "life {life}: registrations left behind by finalize"
        );
        let lines: Vec<_> = util::take_log()
            .into_iter()
            .filter(|(_, l)| l.contains("did not deregister"))
            .collect();
        assert_eq!(lines.len(), 1, "life {life}: {lines:?}");
        assert_eq!(lines[0].0, Level::Info);
        assert!(
            lines[0].1.contains(
                "finalize: 2 registration(s) NCCL did not deregister (2 memory region(s))"
            ),
            "{}",
            lines[0].1
        );
    }
}

/// A comm still open at `finalize` keeps its device's registrations (later calls on it fail,
/// but NCCL may still close it); they are deregistered when it closes, one INFO saying how
/// many. Before, they leaked with their soft segment.
#[test]
fn a_comm_closed_after_finalize_deregisters_what_nccl_left() {
    let Some(mut buf) = soft_plugin_process() else {
        return;
    };
    let mut ctx: *mut c_void = core::ptr::null_mut();
    assert_eq!(
        api::init(Some(&mut ctx), -1, None, None),
        ncclResult_t::Success
    );
    let (mut h, l) = util::listen();
    let (s, r, _) = util::establish(&mut h, l, std::time::Duration::from_secs(20));
    reg_a_page_each(s, r, &mut buf);
    // The listen comm holds the plugin itself: closed first, so that `finalize` drops the
    // plugin while the two comms (which hold only their device) stay open.
    assert_eq!(api::close_listen(l), ncclResult_t::Success);
    let held = ibnet_soft::live_registrations();
    util::take_log();
    assert_eq!(api::finalize(ctx), ncclResult_t::Success);
    assert_eq!(
        ibnet_soft::live_registrations(),
        held,
        "finalize left the open comms' registrations alone"
    );
    let kept = util::take_log()
        .into_iter()
        .filter(|(_, l)| l.contains("2 registration(s) of comms still open are left to them"))
        .count();
    assert_eq!(kept, 1, "one INFO at finalize");
    assert_eq!(api::close_send(s), ncclResult_t::Success);
    assert_eq!(api::close_recv(r), ncclResult_t::Success);
    assert_eq!(
        ibnet_soft::live_registrations(),
        0,
        "registrations left behind by the comms closed after finalize"
    );
    let lines: Vec<_> = util::take_log()
        .into_iter()
        .filter(|(_, l)| l.contains("a comm closed after finalize"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, Level::Info);
    assert!(
        lines[0]
            .1
            .contains("2 registration(s) NCCL did not deregister (2 memory region(s))"),
        "{}",
        lines[0].1
    );
}
