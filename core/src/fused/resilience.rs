//! How a fused comm treats a failed rail: NCCL's `NCCL_IB_RESILIENCY_PORT_FAILOVER*` as
//! [`Resilience`], and which failures a rail may be failed over for ([`recoverable`]).
//!
//! NCCL 2.29+ (`p2p_resiliency.cc`) fails a device's traffic over to the comm's other devices
//! only when `NCCL_IB_RESILIENCY_PORT_FAILOVER=1` (default 0), and only for a completion with
//! `IBV_WC_WR_FLUSH_ERR` or `IBV_WC_RETRY_EXC_ERR`; any other status is fatal. A failed
//! request is probed (an RDMA READ of the receiver's completion record) once
//! `_PROBE_DELAY` ms (default 10) have passed since the failure, and the comm fails once
//! more than `_MAX_ATTEMPTS` (default 1) probes of one request have failed.
//!
//! ibnet, mapped:
//! * `failover`: on unless the variable says 0 (ibnet's default differs from NCCL's: fusion
//!   came with failover in ibnet, and a fused NIC that dies with any one rail is worse than
//!   one plain device). Off, a rail failure fails the comm with its error, as NCCL without
//!   failover and as a plain comm.
//! * recoverable failures ([`recoverable`]): NCCL's two statuses, plus the receiver-not-ready
//!   retry count (`RnrRetryExceeded`, also a path that stopped answering), a local QP
//!   operation error (`LocalQpOpError`: how soft-RoCE reports a send whose own link is down),
//!   a failed provider call on the rail (a failed post: the QP went to error; a fatal async
//!   event such as a port going down) and a rail the peer took out of use. Any other completion status (access,
//!   protection, length errors: a bug or a hostile peer, which would fail on any rail) fails
//!   the comm, as NCCL.
//! * `probe_delay_ms`: ibnet needs no probe (the failed rail's completion queue is drained, so
//!   what it had acknowledged is known); the delay is kept with its meaning of "wait this long
//!   after a failure before the failed parts go again": a lost part is written again on
//!   another rail once `probe_delay_ms` have passed since the failure that lost it (time from
//!   [`crate::fused::FusedSend::tick`], which the caller feeds: the core reads no clock).
//!   Unset, 0: at once (ibnet's behaviour before the variable was honoured).
//! * `max_attempts`: a *failed attempt* is a moved part or notice whose carrier rail failed
//!   too (NCCL's failed probe: the device chosen to recover the request failed). A message with
//!   more than `max_attempts` failed attempts fails the comm. Unset: no limit but the rails
//!   (each failed attempt takes a rail out of use, so at most rails − 2).

use crate::error::Error;
use crate::provider::WcStatus;

/// A fused comm's failover settings (NCCL's `NCCL_IB_RESILIENCY_PORT_FAILOVER*`, resolved
/// with ibnet's defaults; the module doc says how each maps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resilience {
    /// Fail a rail's traffic over to the other rails (default on; off: a rail failure fails
    /// the comm).
    pub failover: bool,
    /// Failed attempts a message may have before the comm fails (`None`: no limit).
    pub max_attempts: Option<u32>,
    /// Milliseconds between a rail's failure and the writing again of the parts it lost.
    pub probe_delay_ms: u64,
    /// Failback of a failed rail (`NCCL_IB_RESILIENCY_PORT_RECOVERY`; protocol in
    /// `crate::fused::heal`'s module doc). Default off, as NCCL.
    pub recovery: bool,
    /// Milliseconds from a rail's going out of use to its first return attempt, and between
    /// attempts (`_RECOVERY_START_DELAY`, default 200).
    pub start_delay_ms: u64,
    /// Return attempts of a rail in a row that may fail before it stays out for good
    /// (`_RECOVERY_ATTEMPTS_MAX`, default 5).
    pub attempts_max: u32,
    /// Milliseconds one attempt waits for the peer (its READY, or the probe's completion)
    /// before it counts as failed (`_RECOVERY_ACK_TIMEOUT`, default 5000).
    pub ack_timeout_ms: u64,
}

impl Default for Resilience {
    /// ibnet's defaults: failover on, no attempt limit, no delay.
    fn default() -> Self {
        Self {
            failover: true,
            max_attempts: None,
            probe_delay_ms: 0,
            recovery: false,
            start_delay_ms: 200,
            attempts_max: 5,
            ack_timeout_ms: 5000,
        }
    }
}

impl Resilience {
    /// The settings `p` gives (`NCCL_IB_RESILIENCY_PORT_*`), with ibnet's defaults for unset
    /// variables (failover on, no attempt limit, no delay).
    pub fn from_params(p: &crate::params::Params) -> Self {
        Self {
            failover: p.ib_resiliency_port_failover.unwrap_or(true),
            max_attempts: p.ib_resiliency_port_failover_max_attempts,
            probe_delay_ms: p.ib_resiliency_port_failover_probe_delay.unwrap_or(0),
            recovery: p.ib_resiliency_port_recovery,
            start_delay_ms: p.ib_resiliency_port_recovery_start_delay,
            attempts_max: p.ib_resiliency_port_recovery_attempts_max,
            ack_timeout_ms: p.ib_resiliency_port_recovery_ack_timeout,
        }
    }

    /// Whether the comm counts time (a probe delay, or failback): its caller then feeds the
    /// clock before each call.
    pub fn wants_clock(&self) -> bool {
        self.probe_delay_ms > 0 || self.recovery
    }

    /// Whether `e`, a rail's own failure, lets the comm go on over its other rails.
    pub fn fails_over(&self, e: &Error) -> bool {
        self.failover && recoverable(e)
    }
}

/// Whether a rail's failure `e` is one the comm may survive on its other rails: the path is
/// gone (retry exceeded, flushed after the QP went to error, a failed provider call, the peer
/// took the rail out of use), not a bug or a hostile peer (see the module doc).
pub fn recoverable(e: &Error) -> bool {
    match e {
        // LocalQpOpError: soft-RoCE (rxe) completes a send with it when the rail's own link is
        // down (no route to build the packet on: `ip link set dummy1 down` in the rxe suite's
        // fused failover cases); a malformed request on a hardware NIC gives it too, and fails
        // again on every rail it moves to, so the comm still fails once no rail is left.
        Error::Completion { status, .. } => matches!(
            status,
            WcStatus::WrFlushError
                | WcStatus::RetryExceeded
                | WcStatus::RnrRetryExceeded
                | WcStatus::LocalQpOpError
        ),
        Error::Provider { .. } | Error::BadState { .. } => true,
        // The peer took the rail out of use: its traffic goes to the live rails.
        Error::RailDroppedByPeer { .. } => true,
        // A rail already failed (its comm poisoned) was classified when it failed.
        Error::Poisoned { .. } => true,
        _ => false,
    }
}
