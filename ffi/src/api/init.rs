//! `init` / `finalize` (with v11's per-communicator contexts), `devices`, `getProperties`,
//! `makeVDevice`, `setNetAttr`.
#![allow(unsafe_code)]
// NCCL's pointers and the ctx boxes; every block has a SAFETY comment.
// The C entry points' bodies: every pointer comes from NCCL and is NULL-checked before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::sync::Mutex;

use ibnet_core::Error;

use super::common::{device, missing, out_ptr, plugin};
use super::entry::entry;
use crate::dev::Props;
use crate::plugin as state;
use crate::vdev::Made;
use ibnet_core::policy::merge::Refused;
use ibnet_nccl::types::{ncclDebugLogger_t, ncclNetAttr_t, ncclResult_t, VDevProps};

/// Per-`init` context (v11): the communicator's traffic class.
#[repr(C)]
pub struct NetCtx {
    tag: u64,
    /// `ncclNetCommConfig_t::trafficClass` (-1: undefined).
    pub traffic_class: i32,
}

const CTX_TAG: u64 = 0x4942_4e45_5443_5458; // "IBNETCTX"

/// Contexts returned by `init` and not yet finalized (control path only). A pointer not in
/// this list (NULL, stale, already finalized) is never dereferenced.
static LIVE_CTX: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// `init`: installs the logger, takes a plugin reference, and (v11) returns a context.
pub fn init(
    ctx: Option<*mut *mut c_void>,
    traffic_class: i32,
    logger: ncclDebugLogger_t,
    prof: ibnet_nccl::types::ncclProfilerCallback_t,
) -> ncclResult_t {
    ibnet_nccl::log::set_logger(logger);
    crate::profiler::set(prof);
    entry("init", || {
        let out = match ctx {
            Some(c) => Some(out_ptr(c, "ctx")?),
            None => None,
        };
        let p = state::acquire();
        if p.bind.is_none() {
            state::release();
            // ncclInternalError, as the seed's "No IP interface found".
            return Err(Error::BadState {
                op: "init",
                state: "no IP interface found (see NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY)",
            });
        }
        ibnet_nccl::info!(
            ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
            "ibnet {} initialised: {} device(s), provider {:?}",
            env!("CARGO_PKG_VERSION"),
            p.devs.len(),
            p.params.provider
        );
        if let Some(out) = out {
            let c = Box::into_raw(Box::new(NetCtx {
                tag: CTX_TAG,
                traffic_class,
            })) as *mut c_void;
            // Registered so that `finalize(ctx)` releases this init's plugin reference and
            // `connect`/`listen` find the communicator's traffic class.
            LIVE_CTX
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(c as usize);
            *out = c;
        }
        Ok(())
    })
}

/// `finalize(ctx)`: NULL-safe and idempotent per context.
pub fn finalize(ctx: *mut c_void) -> ncclResult_t {
    entry("finalize", || {
        let mut live = LIVE_CTX.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pos) = live.iter().position(|&c| c == ctx as usize) else {
            return Ok(());
        };
        live.swap_remove(pos);
        drop(live);
        // SAFETY: the pointer was live in LIVE_CTX, so it is a NetCtx box we allocated; it was
        // removed from the list above, so it is freed exactly once.
        drop(unsafe { Box::from_raw(ctx as *mut NetCtx) });
        state::release();
        Ok(())
    })
}

/// The traffic class of a live v11 context (-1 for NULL or anything not live).
pub(crate) fn ctx_tc(ctx: *mut c_void) -> i32 {
    if ctx.is_null() {
        return -1;
    }
    // Held while reading: `finalize` frees a ctx only after removing it under this lock.
    let live = LIVE_CTX.lock().unwrap_or_else(|e| e.into_inner());
    if !live.contains(&(ctx as usize)) {
        return -1;
    }
    let c = ctx as *const NetCtx;
    // SAFETY: a live ctx (checked above, lock still held, so not freed meanwhile) is a NetCtx
    // we allocated.
    let (tag, tc) = unsafe { ((*c).tag, (*c).traffic_class) };
    drop(live);
    if tag == CTX_TAG {
        tc
    } else {
        -1
    }
}

/// `devices`.
pub fn devices(ndev: *mut c_int) -> ncclResult_t {
    entry("devices", || {
        // SAFETY: valid or NULL (rejected).
        let n = unsafe { ndev.as_mut() }.ok_or(missing("ndev"))?;
        // The physical devices, then the vNICs makeVDevice merged (crate::vdev).
        *n = state::current().map_or(0, |p| (p.devs.len() + crate::vdev::count()) as c_int);
        Ok(())
    })
}

/// `getProperties`, version-agnostic; each shim copies into its struct.
pub fn properties(dev: c_int) -> Result<Props, Error> {
    let p = plugin()?;
    if let Some(v) = crate::vdev::resolve(p.devs.len(), dev).filter(|v| v.ndevs() > 1) {
        return crate::vdev::props(&p, &v);
    }
    let d = device(&p, dev)?;
    Ok(p.props(&d))
}

/// `makeVDevice`: the device number of the virtual NIC fusing `props.devs` ([`crate::vdev`]);
/// one device is that device. `N` is the table's limit (4 for v9–v11, 8 for v12): more is
/// `ncclInvalidArgument` naming it. A fusion refused by `NCCL_IB_MERGE_NICS=0` is
/// `ncclInvalidUsage` with an INFO line (as NCCL 2.28), every other failure one WARN.
pub fn make_vdevice<const N: usize>(d: *mut c_int, props: *const VDevProps<N>) -> ncclResult_t {
    let mut quiet = None;
    let r = entry("makeVDevice", || {
        // SAFETY: valid or NULL (rejected).
        let d = unsafe { d.as_mut() }.ok_or(missing("d"))?;
        // SAFETY: valid or NULL (rejected).
        let pr = unsafe { props.as_ref() }.ok_or(missing("props"))?;
        let p = plugin()?;
        match crate::vdev::make(&p, pr.ndevs, &pr.devs) {
            Ok(v) => {
                *d = v;
                Ok(())
            }
            Err(Made::Refused(Refused::MergeNicsOff)) => {
                ibnet_nccl::info!(
                    ibnet_nccl::log::NET,
                    "skipping makeVDevice of {} devices: NCCL_IB_MERGE_NICS=0",
                    pr.ndevs
                );
                quiet = Some(ncclResult_t::InvalidUsage);
                Ok(())
            }
            // One WARN that names both devices, in place of `entry`'s (which could not name them):
            // the same ncclInvalidUsage as the error would map to.
            Err(Made::Refused(Refused::LinkLayers(a, b))) => {
                let name = |d: u16| {
                    p.devs
                        .get(usize::from(d))
                        .map_or("?".into(), |d| d.name().to_string_lossy().into_owned())
                };
                let (an, bn) = (name(a), name(b));
                ibnet_nccl::warn!(
                    "makeVDevice: cannot merge [{a}]{an} and [{b}]{bn}: different link layers; \
                     select NICs of one link type with NCCL_IB_HCA"
                );
                quiet = Some(ncclResult_t::InvalidUsage);
                Ok(())
            }
            Err(Made::Refused(r)) => Err(r.to_error()),
            Err(Made::Error(e)) => Err(e),
        }
    });
    quiet.unwrap_or(r)
}

/// `setNetAttr`: accepted and ignored (as NCCL's IB plugin).
pub fn set_net_attr(_ctx: *mut c_void, _attr: *mut ncclNetAttr_t) -> ncclResult_t {
    ncclResult_t::Success
}

#[cfg(test)]
mod tests {
    use super::*;

    /// v11: every `init` context is live until its `finalize`, which releases the plugin
    /// reference it took; the last one tears the plugin down; finalize is idempotent.
    #[test]
    fn finalize_releases_what_init_took() {
        let mut a: *mut c_void = core::ptr::null_mut();
        let mut b: *mut c_void = core::ptr::null_mut();
        assert_eq!(init(Some(&mut a), 106, None, None), ncclResult_t::Success);
        assert_eq!(init(Some(&mut b), -1, None, None), ncclResult_t::Success);
        assert!(!a.is_null() && !b.is_null());
        assert_eq!(ctx_tc(a), 106);
        assert_eq!(ctx_tc(b), -1);
        assert_eq!(finalize(a), ncclResult_t::Success);
        assert_eq!(ctx_tc(a), -1, "finalized ctx is no longer live");
        assert!(state::current().is_some(), "b still holds the plugin");
        assert_eq!(finalize(b), ncclResult_t::Success);
        assert!(
            state::current().is_none(),
            "last finalize releases the plugin"
        );
        assert_eq!(finalize(b), ncclResult_t::Success, "idempotent");
        assert_eq!(
            finalize(core::ptr::null_mut()),
            ncclResult_t::Success,
            "NULL-safe"
        );
    }
}
