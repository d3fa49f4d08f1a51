//! Tokens across the API: stale and foreign ones are errors, a caught panic poisons its comm.

use core::ffi::c_void;

use ibnet_core::comm::CommConfig;
use ibnet_core::mr_cache::MrHandle;
use ibnet_core::params::Params;
use ibnet_core::provider::LinkLayer;
use ibnet_core::Error;

use super::comm::{publish, send_comm};
use super::mr::mr_get;
use super::*;
use crate::dev::{AnySend, Dev};
use crate::handles;
use ibnet_nccl::types::ncclResult_t;

/// The NIC of one rail over `d`, device number 0.
fn one_rail_nic(d: Dev) -> std::sync::Arc<crate::nic::Nic> {
    let caches = [crate::dev_cache::DevCache::new()];
    let nics = crate::nic::Nics::default();
    let v = ibnet_core::rails::VNic::single(0);
    nics.resolve((&[d], &caches), 0, v).unwrap()
}

/// A soft send comm published as a token (no peer needed), or None where the host refuses
/// cross-memory attach (the soft provider cannot open).
fn soft_send() -> Option<(ibnet_soft::SoftProvider, *mut c_void)> {
    ibnet_soft::probe_with(false).ok()?;
    let sp = ibnet_soft::SoftProvider::open_with(ibnet_soft::Config::default()).ok()?;
    let d = Dev::Soft(sp.clone(), 0);
    let cfg = CommConfig::from_params(&Params::default(), LinkLayer::Ethernet, None, false);
    let s = AnySend::new(core::slice::from_ref(&d), cfg).unwrap();
    let at = one_rail_nic(d);
    let tok = publish(handles::Kind::Send, &at, s, None, AnySend::close).unwrap();
    Some((sp, tok))
}

#[test]
fn stale_and_foreign_tokens_are_errors_not_dereferenced() {
    let mut done = 0;
    let mut buf = [0u8; 64];
    let mut req: *mut c_void = core::ptr::null_mut();
    let garbage = buf.as_mut_ptr() as *mut c_void;
    // Values that were never ours: rejected without reading them.
    assert_eq!(close_send(garbage), ncclResult_t::InternalError);
    assert_eq!(close_recv(0x10 as *mut c_void), ncclResult_t::InternalError);
    assert_eq!(
        test(garbage, &mut done, core::ptr::null_mut()),
        ncclResult_t::InternalError
    );
    let Some((sp, tok)) = soft_send() else {
        eprintln!("SKIP: soft provider unavailable (cross-memory attach refused)");
        return;
    };
    let mut mh: *mut c_void = core::ptr::null_mut();
    let data = buf.as_mut_ptr() as *mut c_void;
    assert_eq!(
        reg_mr(tok, data, 64, 0, None, &mut mh),
        ncclResult_t::Success
    );
    // A request token of this comm (never issued): the core rejects the request id.
    let rq = handles::request_token(tok as usize, ibnet_core::request::ReqId::from_bits(7))
        as *mut c_void;
    assert_ne!(
        test(rq, &mut done, core::ptr::null_mut()),
        ncclResult_t::Success
    );
    assert_eq!(dereg_mr(tok, mh), ncclResult_t::Success);
    assert_eq!(close_send(tok), ncclResult_t::Success);
    // Stale: the comm and its requests are gone; nothing is dereferenced.
    assert_eq!(close_send(tok), ncclResult_t::InternalError);
    assert_eq!(
        isend(tok, data, 8, 0, mh, core::ptr::null_mut(), &mut req),
        ncclResult_t::InternalError
    );
    assert_eq!(
        test(rq, &mut done, core::ptr::null_mut()),
        ncclResult_t::InternalError
    );
    assert_eq!(done, 0);
    sp.shutdown();
}

/// An mhandle of device 0 is no registration of device 1's cache.
#[test]
fn mhandles_of_another_device_are_not_looked_up() {
    let h = MrHandle::from_bits((5u64 << 32) | 17);
    let m0 = handles::mh_encode(h, 0) as *mut c_void;
    let Some(sp) = ibnet_soft::probe_with(false)
        .ok()
        .and_then(|_| ibnet_soft::SoftProvider::open_with(ibnet_soft::Config::default()).ok())
    else {
        eprintln!("SKIP: soft provider unavailable (cross-memory attach refused)");
        return;
    };
    let caches = [crate::dev_cache::DevCache::new()];
    let nics = crate::nic::Nics::default();
    let d = Dev::Soft(sp.clone(), 0);
    let nic1 = nics
        .resolve(
            (&[d.clone(), d], &caches),
            1,
            ibnet_core::rails::VNic::single(0),
        )
        .unwrap();
    assert!(mr_get(&nic1, m0).is_err());
    sp.shutdown();
}

#[test]
fn a_caught_panic_poisons_its_comm() {
    let Some((sp, tok)) = soft_send() else {
        eprintln!("SKIP: soft provider unavailable (cross-memory attach refused)");
        return;
    };
    let r = entry_on("isend", tok, || panic!("injected"));
    assert_eq!(r, ncclResult_t::InternalError);
    assert!(matches!(
        send_comm(tok, "isend"),
        Err(Error::Poisoned {
            op: "isend",
            cause: ibnet_core::ErrorKind::Internal
        })
    ));
    let mut buf = [0u8; 8];
    let mut mh: *mut c_void = core::ptr::null_mut();
    let data = buf.as_mut_ptr() as *mut c_void;
    // Refused as the first failure (the panic) was reported.
    assert_eq!(
        reg_mr(tok, data, 8, 0, None, &mut mh),
        ncclResult_t::InternalError,
        "poisoned comm refuses work"
    );
    let mut req: *mut c_void = core::ptr::null_mut();
    assert_eq!(
        isend(tok, data, 8, 0, mh, core::ptr::null_mut(), &mut req),
        ncclResult_t::InternalError
    );
    assert!(req.is_null());
    assert_eq!(close_send(tok), ncclResult_t::Success, "close still works");
    sp.shutdown();
}
