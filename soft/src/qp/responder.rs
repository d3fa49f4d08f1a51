//! Responder errors, as RC has them: a WR that fails on the *target's* side (a remote access
//! error: deregistered or stale rkey, range or access violation, a fault in the target's memory)
//! moves the target QP to the error state too, so its posted receives complete with
//! `WrFlushError` instead of waiting forever.
//!
//! ```text
//!  initiator (copy failed, remote status)        target (its next poll_cq / combiner pass)
//!  head.state == remote qpn ? (Acquire)
//!  head.error = qpn << 32 | status  (Release) ──▶ head.error (Acquire): tag == own qpn ?
//!                                                 → set_fail(WrFlushError)
//! ```
//! The mark carries the QP number, so a mark meant for a destroyed QP never hits the QP that
//! reuses its slot (the create resets the word, and a late mark names the old number).

use std::sync::atomic::Ordering;

use ibnet_core::provider::WcStatus;

use super::QpShared;

/// Statuses by which the responder (the target) detected the failure.
fn is_responder_error(st: WcStatus) -> bool {
    matches!(
        st,
        WcStatus::RemoteAccessError
            | WcStatus::RemoteOperationError
            | WcStatus::RemoteInvalidRequest
    )
}

impl QpShared {
    /// Initiator: WR status `st` was a responder error: marks the target QP (cold path).
    pub(super) fn mark_responder(&self, st: WcStatus) {
        if !is_responder_error(st) {
            return;
        }
        let Some(r) = self.remote.get() else {
            return;
        };
        let b = r.peer.seg.qp_block(r.block);
        // Acquire: pairs with the target's Release store of its QP number at create.
        if b.state.load(Ordering::Acquire) == r.qpn as u64 {
            // Release: pairs with the Acquire load in `check_responder`.
            b.error
                .store(((r.qpn as u64) << 32) | st as u64, Ordering::Release);
        }
    }

    /// Target: moves this QP to the error state if an initiator marked it (one load of the
    /// QP's own head line, which only changes on failure).
    #[inline]
    pub(super) fn check_responder(&self) {
        // Acquire: pairs with the Release store in `mark_responder`.
        let e = self.own.qp_block(self.idx).error.load(Ordering::Acquire);
        if e != 0 && (e >> 32) as u32 == self.qpn {
            self.set_fail(WcStatus::WrFlushError);
        }
    }
}
