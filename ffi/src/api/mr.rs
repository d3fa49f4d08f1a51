//! `regMr` / `regMrDmaBuf` / `deregMr` through the comm's NIC ([`crate::nic::Nic`]: one
//! rail registers in its device's cache, several in the NIC's own over the rails'), and what
//! the data path reads of a registration (`mhandle`s are [`crate::handles`] tokens).
#![allow(unsafe_code)]
// sysconf; every block has a SAFETY comment.
// The C entry points' bodies: every pointer comes from NCCL and is NULL-checked before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};

use ibnet_core::provider::RegKind;
use ibnet_core::Error;
const _: () = assert!(
    crate::dev::MR_CACHE_CAPACITY == 16384 && ibnet_core::mr_cache::PROBE == 16,
    "update the probe-window message in reg_mr"
);

use super::comm::{comm_ref, CommRef};
use super::common::{missing, out_ptr};
use super::entry::entry_on;
use crate::handles::{mh_decode, mh_encode};
use crate::nic::{MrInfo, Nic};
use ibnet_nccl::types::ncclResult_t;

/// The registration of `mhandle` among the NIC's (lock-free, no allocation): its keys on
/// every rail and its range.
#[inline]
pub(crate) fn mr_get(nic: &Nic, m: *mut c_void) -> Result<MrInfo, Error> {
    let h = mh_decode(m as usize, nic.index)?;
    nic.keys(h).ok_or(Error::BadState {
        op: "memory handle",
        state: "not a live ibnet registration of this device (stale or deregistered)",
    })
}

/// A buffer must lie inside the registration NCCL passed with it.
pub(crate) fn covers(m: &MrInfo, addr: u64, size: u64) -> Result<(), Error> {
    if size == 0 {
        return Ok(());
    }
    if addr < m.base || addr.saturating_add(size) > m.base + m.len {
        return Err(Error::OutOfRange {
            what: "buffer outside its registration",
            value: addr as i64,
            min: m.base as i64,
            max: (m.base + m.len) as i64,
        });
    }
    Ok(())
}

/// The NIC of a comm: a shared field only (the proxy service thread calls `regMr`/`deregMr`
/// while the progress thread runs the comm's data path).
fn comm_nic(c: *mut c_void) -> Result<&'static Nic, Error> {
    Ok(match comm_ref(c, "comm", "regMr/deregMr")? {
        CommRef::Send(s) => &s.nic,
        CommRef::Recv(r) => &r.nic,
    })
}

/// `regMr` / `regMrDmaBuf` (`dmabuf` = Some((offset, fd))): through the device's registration
/// cache, so registering a range again (any comm of the device) is a lock-free hit.
pub fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: u64,
    ty: c_int,
    dmabuf: Option<(u64, c_int)>,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    entry_on("regMr", comm, || {
        let out = out_ptr(mhandle, "mhandle")?;
        *out = core::ptr::null_mut();
        let nic = comm_nic(comm)?;
        if data.is_null() && size > 0 {
            return Err(missing("data"));
        }
        let _ = ty;
        let kind = match dmabuf {
            Some((offset, fd)) => RegKind::DmaBuf { fd, offset },
            None => RegKind::Plain,
        };
        // The cache page-aligns the range as NCCL's IB plugin does; an empty registration
        // covers one page. Several rails: one registration per rail, behind one entry of the
        // NIC's own cache (see `crate::nic`).
        let h = nic
            .reg(data as u64, size.max(1), page_size(), kind)
            .map_err(name_full)?;
        *out = mh_encode(h, nic.index) as *mut c_void;
        Ok(())
    })
}

/// Says what is full when a registration cache refuses one more registration.
fn name_full(e: Error) -> Error {
    match e {
        // The cache's own Full names its slot count; what is full is one range's window.
        Error::Full {
            what: "MR cache", ..
        } => Error::Full {
            what: "MR cache probe window of this range (16 of the device cache's 16384 \
                   slots; too many live registrations hash near it)",
            cap: ibnet_core::mr_cache::PROBE,
        },
        // One record per mhandle: NCCL holds this many without deregistering them.
        Error::Full {
            what: "MR registrations",
            cap,
        } => Error::Full {
            what: "live registrations (mhandles not yet deregistered) of this device",
            cap,
        },
        e => e,
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// `deregMr`: ends the registration `mhandle` names (each `regMr` has its own) and drops its
/// reference on the cache entry; the entry's last reference deregisters. A handle deregistered
/// already (a second `deregMr`) or never registered is an error, whatever other registrations
/// share its entry. A NULL `mhandle` succeeds and does nothing, as in NCCL's own plugin
/// (NCCL deregisters a buffer it never registered so).
pub fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    if mhandle.is_null() {
        return ncclResult_t::Success;
    }
    entry_on("deregMr", comm, || {
        let nic = comm_nic(comm)?;
        let h = mh_decode(mhandle as usize, nic.index)?;
        let res = nic.dereg(h);
        res.map_err(|e| match e {
            Error::BadState {
                op: "MR cache release",
                state: "stale or unknown handle",
            } => Error::BadState {
                op: "memory handle",
                state: "not a live ibnet registration of this device (deregistered already, or \
                        never registered)",
            },
            e => e,
        })
    })
}
