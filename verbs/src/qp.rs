//! Connecting a QP as NCCL 2.28 does: `ibv_modify_qp` with its retry on ETIMEDOUT, the RTR
//! address vector (RoCE: GRH with the traffic class; InfiniBand: LID within a subnet, FLID and
//! a GRH across subnets), and ECE through the optional `ibv_query_ece`/`ibv_set_ece`.
//!
//! ```text
//!  modify(attr):  attempt 1 ──ok──▶ done
//!                     │ errno
//!                     ▼  retry? (ETIMEDOUT, or any with NCCL_IB_MQP_RETRY_ALL)
//!                 attempt n+1 after n × NCCL_IB_MQP_RETRY_SLEEP_MSEC, up to 1 + NCCL_IB_MQP_RETRY_CNT
//! ```
//! The retry sleeps on the connect path only (NCCL's proxy thread sleeps there too). A
//! failback's reset (`reset_qp`, which a data call such as `test` runs) makes one attempt per
//! transition ([`Retry::Never`]): a failure is returned at once, and the failback protocol
//! tries again after its own start delay, so no data call ever sleeps here. Every retry is one
//! INFO line; the final failure is the comm's error.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use ibnet_core::provider::Ece;
use ibnet_core::{Error, Result};

use super::loader::{errno_or, Verbs};
use super::sys::*;

/// What a port's QPs do on connect, from NCCL's variables (and one test fault).
#[derive(Debug, Default)]
pub struct QpOpts {
    /// `NCCL_IB_MQP_RETRY_ALL`.
    pub retry_all: bool,
    /// `NCCL_IB_MQP_RETRY_CNT`: retries after the first attempt.
    pub retry_cnt: u32,
    /// `NCCL_IB_MQP_RETRY_SLEEP_MSEC`.
    pub retry_sleep_ms: u32,
    /// `NCCL_IB_ECE_ENABLE`.
    pub ece: bool,
    /// `IBNET_FAULT_MQP_ETIMEDOUT`: `ibv_modify_qp` calls left that fail with ETIMEDOUT
    /// without reaching the driver (tests only; shared by the ports of the process).
    pub fault_timeouts: AtomicU32,
}

impl QpOpts {
    /// Takes one injected ETIMEDOUT, if any are left.
    fn take_fault(&self) -> bool {
        // Relaxed: a counter of injected faults; nothing else is ordered by it.
        self.fault_timeouts
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Whether attempt `attempt` (1-based) that failed with `errno` is tried again, and after how
/// many milliseconds: `None` gives up. NCCL 2.28: ETIMEDOUT only (any error with `retry_all`),
/// at most `1 + retry_cnt` attempts, the n-th retry after `n × sleep_ms`.
pub fn retry_after(o: &QpOpts, attempt: u32, errno: i32) -> Option<u64> {
    let retryable = errno != 0 && (o.retry_all || errno == libc::ETIMEDOUT);
    (retryable && attempt <= o.retry_cnt).then(|| u64::from(o.retry_sleep_ms) * u64::from(attempt))
}

/// Whether `modify` (this module's QP state transition) retries a failed transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// NCCL 2.28's sleeping retry ([`retry_after`]): connection setup.
    Nccl,
    /// One attempt, never a sleep: a failback's reset, run inside a data call (the failback
    /// protocol retries the whole reset later, at its own pace).
    Never,
}

/// `ibv_modify_qp`, retried as `retry` says. `dev` and `what` name the call in logs and
/// errors. `qp` must be a live QP (the callers own it through a `VQp`).
#[allow(clippy::too_many_arguments)] // the QP, its transition and how to name and retry it
pub(crate) fn modify(
    v: &Verbs,
    o: &QpOpts,
    dev: &str,
    qp: *mut ibv_qp,
    attr: &mut ibv_qp_attr,
    mask: i32,
    what: &'static str,
    retry: Retry,
) -> Result<()> {
    let mut attempt = 1u32;
    loop {
        let rc = if o.take_fault() {
            libc::ETIMEDOUT
        } else {
            // SAFETY: `qp` is live (owned by the caller's VQp); `attr` is initialised.
            unsafe { (v.modify_qp)(qp, attr, mask) }
        };
        if rc == 0 {
            return Ok(());
        }
        let e = errno_or(rc);
        let again = match retry {
            Retry::Nccl => retry_after(o, attempt, e),
            Retry::Never => None,
        };
        let Some(ms) = again else {
            return Err(Error::Provider {
                call: what,
                errno: e,
            });
        };
        ibnet_nccl::info!(
            ibnet_nccl::log::NET,
            "{dev}: {what} failed with errno {e} ({}), retrying {attempt}/{} after {ms} ms",
            std::io::Error::from_raw_os_error(e),
            o.retry_cnt
        );
        std::thread::sleep(std::time::Duration::from_millis(ms));
        attempt += 1;
    }
}

/// The FLID of an InfiniBand GID (bytes 4..6 of the subnet prefix, big-endian).
pub fn flid(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[4], gid[5]])
}

/// The local subnet part of an InfiniBand GID's prefix (its low 16 bits).
pub fn subnet(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[6], gid[7]])
}

/// How an InfiniBand RTR addresses the peer: `(dlid, global)`. Same subnet: its LID, no GRH.
/// Different subnets: its FLID (its LID, with a WARN, when the FLID is 0) and a GRH, as NCCL
/// 2.28 routes across subnets.
pub fn ib_route(local: &[u8; 16], remote: &[u8; 16], remote_lid: u16) -> (u16, bool) {
    if subnet(local) == subnet(remote) {
        return (remote_lid, false);
    }
    match flid(remote) {
        0 => {
            ibnet_nccl::warn!(
                "remote FLID is 0 though the endpoints are on different subnets \
                 ({:#x} vs {:#x}); using its LID {remote_lid}",
                subnet(local),
                subnet(remote)
            );
            (remote_lid, true)
        }
        f => (f, true),
    }
}

/// Logs once per process that ECE is unavailable, and why (not an error: NCCL goes on too).
fn note_no_ece(dev: &str, why: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        ibnet_nccl::info!(
            ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
            "{dev}: ECE not available ({why}); connecting without it"
        )
    });
}

/// `ibv_query_ece`: `Ok(None)` when the library lacks it or the device answers EOPNOTSUPP /
/// ENOTSUP (logged once); another error fails the connect, as in NCCL 2.28.
pub(crate) fn query_ece(v: &Verbs, dev: &str, qp: *mut ibv_qp) -> Result<Option<Ece>> {
    let Some(f) = v.query_ece else {
        note_no_ece(dev, "libibverbs < IBVERBS_1.10");
        return Ok(None);
    };
    let mut e = ibv_ece::default();
    // SAFETY: `qp` is live; `e` is writable.
    let rc = unsafe { f(qp, &mut e) };
    match rc {
        0 => Ok(Some(Ece {
            vendor_id: e.vendor_id,
            options: e.options,
            comp_mask: e.comp_mask,
        })),
        _ if unsupported(errno_or(rc)) => {
            note_no_ece(dev, "ibv_query_ece: EOPNOTSUPP");
            Ok(None)
        }
        _ => Err(Error::Provider {
            call: "ibv_query_ece",
            errno: errno_or(rc),
        }),
    }
}

/// `ibv_set_ece` before RTR: `Ok(false)` when unsupported (logged once).
pub(crate) fn set_ece(v: &Verbs, dev: &str, qp: *mut ibv_qp, ece: &Ece) -> Result<bool> {
    let Some(f) = v.set_ece else {
        note_no_ece(dev, "libibverbs < IBVERBS_1.10");
        return Ok(false);
    };
    let mut e = ibv_ece {
        vendor_id: ece.vendor_id,
        options: ece.options,
        comp_mask: ece.comp_mask,
    };
    // SAFETY: `qp` is live; `e` is initialised and only read by the call.
    let rc = unsafe { f(qp, &mut e) };
    match rc {
        0 => {
            ibnet_nccl::info!(
                ibnet_nccl::log::NET,
                "{dev}: qpn {:#x} set_ece vendor_id {:#x} options {:#x}",
                // SAFETY: `qp` is live; `qp_num` is in the stable prefix.
                unsafe { (*qp).qp_num },
                e.vendor_id,
                e.options
            );
            Ok(true)
        }
        _ if unsupported(errno_or(rc)) => {
            note_no_ece(dev, "ibv_set_ece: EOPNOTSUPP");
            Ok(false)
        }
        _ => Err(Error::Provider {
            call: "ibv_set_ece",
            errno: errno_or(rc),
        }),
    }
}

fn unsupported(e: i32) -> bool {
    e == libc::EOPNOTSUPP || e == libc::ENOTSUP || e == libc::ENOSYS
}

/// Reads the connected QP's attributes back (`ibv_query_qp`) and logs them at INFO: what the
/// device applied, not what was asked (the rxe suite checks the traffic class here).
pub(crate) fn log_connected(v: &Verbs, dev: &str, qp: *mut ibv_qp) {
    let mut attr = ibv_qp_attr::default();
    // SAFETY: all-zero is a valid ibv_qp_init_attr (NULL pointers, zero counts).
    let mut init: ibv_qp_init_attr = unsafe { core::mem::zeroed() };
    // SAFETY: `qp` is live; both structs are writable.
    let rc = unsafe { (v.query_qp)(qp, &mut attr, IBV_QP_STATE | IBV_QP_AV, &mut init) };
    // SAFETY: `qp` is live; `qp_num` is in the stable prefix.
    let qpn = unsafe { (*qp).qp_num };
    if rc != 0 {
        ibnet_nccl::info!(
            ibnet_nccl::log::NET,
            "{dev}: qpn {qpn:#x} connected (ibv_query_qp: errno {})",
            errno_or(rc)
        );
        return;
    }
    let ah = attr.ah_attr;
    ibnet_nccl::info!(
        ibnet_nccl::log::NET,
        "{dev}: qpn {qpn:#x} -> qpn {:#x} state {} dlid {} sl {} global {} traffic_class {} sgid_index {}",
        attr.dest_qp_num,
        attr.qp_state,
        ah.dlid,
        ah.sl,
        ah.is_global,
        ah.grh.traffic_class,
        ah.grh.sgid_index
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(all: bool, cnt: u32, ms: u32) -> QpOpts {
        QpOpts {
            retry_all: all,
            retry_cnt: cnt,
            retry_sleep_ms: ms,
            ..QpOpts::default()
        }
    }

    #[test]
    fn retry_follows_nccl_2_28() {
        let o = opts(false, 34, 100);
        assert_eq!(retry_after(&o, 1, libc::ETIMEDOUT), Some(100));
        assert_eq!(retry_after(&o, 2, libc::ETIMEDOUT), Some(200));
        assert_eq!(retry_after(&o, 34, libc::ETIMEDOUT), Some(3400));
        assert_eq!(
            retry_after(&o, 35, libc::ETIMEDOUT),
            None,
            "35 attempts in all"
        );
        assert_eq!(
            retry_after(&o, 1, libc::EINVAL),
            None,
            "only ETIMEDOUT by default"
        );
        let o = opts(true, 2, 1);
        assert_eq!(retry_after(&o, 1, libc::EINVAL), Some(1));
        assert_eq!(retry_after(&o, 3, libc::EINVAL), None);
        assert_eq!(retry_after(&opts(true, 0, 1), 1, libc::ETIMEDOUT), None);
    }

    #[test]
    fn the_fault_knob_counts_down() {
        let o = QpOpts {
            fault_timeouts: AtomicU32::new(2),
            ..QpOpts::default()
        };
        assert!(o.take_fault() && o.take_fault() && !o.take_fault() && !o.take_fault());
    }

    #[test]
    fn flid_routing() {
        let gid = |subnet: u16, flid: u16| {
            let mut g = [0u8; 16];
            g[0] = 0xfe;
            g[1] = 0x80;
            g[4..6].copy_from_slice(&flid.to_be_bytes());
            g[6..8].copy_from_slice(&subnet.to_be_bytes());
            g[15] = 1;
            g
        };
        assert_eq!(flid(&gid(7, 0x1234)), 0x1234);
        assert_eq!(subnet(&gid(7, 0x1234)), 7);
        // Same subnet: LID, no GRH.
        assert_eq!(ib_route(&gid(7, 1), &gid(7, 0x55), 9), (9, false));
        // Different subnets: FLID and GRH; a zero FLID falls back to the LID.
        assert_eq!(ib_route(&gid(7, 1), &gid(8, 0x55), 9), (0x55, true));
        assert_eq!(ib_route(&gid(7, 1), &gid(8, 0), 9), (9, true));
    }
}
