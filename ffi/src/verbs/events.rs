//! Async events of a verbs context: which ones fail what.
//!
//! ```text
//!  IBV_EVENT_DEVICE_FATAL                      → every comm on the context fails
//!  IBV_EVENT_QP_FATAL / QP_REQ_ERR / QP_ACCESS_ERR (element = ibv_qp*)
//!        → the QP's CQ (registered at create_qp) → that comm's flag → its polls fail
//!  IBV_EVENT_CQ_ERR (element = ibv_cq*)        → that CQ's comm fails
//!  anything else                               → one WARN (COMM_EST: nothing)
//! ```
//! With `NCCL_IB_RETURN_ASYNC_EVENTS=0` fatal events are only logged (NCCL's behaviour).
//!
//! The CQ and QP registries are touched on the control path (create/destroy) and by the
//! async thread only, under a mutex; the data path reads its CQ's flag (an atomic) without
//! any lookup. That shared state and its orderings are [`super::event_flags`] (loom-checked).

use super::sys::*;

pub use super::event_flags::{CommFlag, Events, Failure, Handled, Scope};

/// Classifies an event type.
pub fn classify(event_type: i32) -> Scope {
    match event_type {
        IBV_EVENT_DEVICE_FATAL => Scope::Device,
        IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => Scope::Qp,
        IBV_EVENT_CQ_ERR => Scope::Cq,
        IBV_EVENT_COMM_EST => Scope::Quiet,
        _ => Scope::Info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn classification() {
        assert_eq!(classify(IBV_EVENT_DEVICE_FATAL), Scope::Device);
        for e in [
            IBV_EVENT_QP_FATAL,
            IBV_EVENT_QP_REQ_ERR,
            IBV_EVENT_QP_ACCESS_ERR,
        ] {
            assert_eq!(classify(e), Scope::Qp);
        }
        assert_eq!(classify(IBV_EVENT_CQ_ERR), Scope::Cq);
        assert_eq!(classify(IBV_EVENT_COMM_EST), Scope::Quiet);
        assert_eq!(classify(IBV_EVENT_GID_CHANGE), Scope::Info);
    }

    /// A QP error fails only the comm owning the QP (through its CQ); a CQ error only its
    /// comm; only DEVICE_FATAL is device-wide.
    #[test]
    fn qp_and_cq_errors_fail_only_their_comm() {
        let ev = Events::default();
        let (cq_a, cq_b, qp_a, qp_b) = (0x1000, 0x2000, 0x1100, 0x2100);
        let fa = ev.add_cq(cq_a);
        let fb = ev.add_cq(cq_b);
        ev.add_qp(qp_a, cq_a);
        ev.add_qp(qp_b, cq_b);
        assert_eq!(
            ev.handle(classify(IBV_EVENT_QP_FATAL), qp_a),
            Handled::FailedComm
        );
        // Acquire (both): as `check`, pairing with the Release flag store in `handle` (made on
        // this thread here, so program order alone would do).
        assert!(fa.load(Ordering::Acquire) != 0 && fb.load(Ordering::Acquire) == 0);
        assert_eq!(ev.fatal_events(), 0);
        assert_eq!(
            ev.handle(classify(IBV_EVENT_CQ_ERR), cq_b),
            Handled::FailedComm
        );
        // Acquire: as above.
        assert!(fb.load(Ordering::Acquire) != 0);
        assert_eq!(
            ev.handle(classify(IBV_EVENT_QP_REQ_ERR), 0x9999),
            Handled::Unknown
        );
        ev.remove_qp(qp_a);
        assert_eq!(
            ev.handle(classify(IBV_EVENT_QP_FATAL), qp_a),
            Handled::Unknown
        );
        ev.remove_cq(cq_a);
        assert_eq!(
            ev.handle(classify(IBV_EVENT_CQ_ERR), cq_a),
            Handled::Unknown
        );
        assert_eq!(
            ev.handle(classify(IBV_EVENT_COMM_EST), qp_b),
            Handled::Quiet
        );
        assert_eq!(
            ev.handle(classify(IBV_EVENT_GID_CHANGE), 0),
            Handled::Logged
        );
        assert_eq!(ev.fatal_events(), 0);
        assert_eq!(
            ev.handle(classify(IBV_EVENT_DEVICE_FATAL), 0),
            Handled::FailedDevice
        );
        assert_eq!(ev.fatal_events(), 1);
    }

    /// A QP's reset (`clear_qp`) takes off that QP's error only, counted once however many
    /// events it had; a CQ error and a device-fatal event stay.
    #[test]
    fn a_reset_clears_its_qps_error_only() {
        let ev = Events::default();
        let (cq, qa, qb) = (0x1000, 0x1100, 0x1200);
        let f = ev.add_cq(cq);
        ev.add_qp(qa, cq);
        ev.add_qp(qb, cq);
        assert!(!ev.clear_qp(qa), "nothing to clear");
        for ty in [IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR] {
            assert_eq!(ev.handle(classify(ty), qa), Handled::FailedComm);
        }
        assert_eq!(
            ev.handle(classify(IBV_EVENT_QP_FATAL), qb),
            Handled::FailedComm
        );
        assert!(ev.clear_qp(qa));
        assert_eq!(
            ev.check(&f),
            Err(Failure::Comm),
            "B's error went with A's reset"
        );
        assert!(!ev.clear_qp(qa), "A counted twice");
        assert!(ev.clear_qp(qb));
        assert_eq!(ev.check(&f), Ok(()));
        assert!(!ev.clear_qp(0x9999));

        assert_eq!(
            ev.handle(classify(IBV_EVENT_CQ_ERR), cq),
            Handled::FailedComm
        );
        ev.handle(classify(IBV_EVENT_QP_FATAL), qa);
        assert!(ev.clear_qp(qa));
        assert_eq!(
            ev.check(&f),
            Err(Failure::Comm),
            "a QP reset cleared the CQ error"
        );

        let g = ev.add_cq(0x2000);
        ev.add_qp(0x2100, 0x2000);
        ev.handle(classify(IBV_EVENT_QP_FATAL), 0x2100);
        ev.handle(classify(IBV_EVENT_DEVICE_FATAL), 0);
        assert!(ev.clear_qp(0x2100));
        assert_eq!(ev.check(&g), Err(Failure::Device));
    }

    #[test]
    fn return_async_events_0_only_warns() {
        let ev = Events::default();
        ev.set_return_events(false);
        let f = ev.add_cq(0x10);
        ev.add_qp(0x20, 0x10);
        assert_eq!(
            ev.handle(classify(IBV_EVENT_QP_FATAL), 0x20),
            Handled::WarnOnly
        );
        assert_eq!(
            ev.handle(classify(IBV_EVENT_DEVICE_FATAL), 0),
            Handled::WarnOnly
        );
        // Acquire: as `check`, pairing with `handle`'s Release flag store (which must not
        // happen here); one thread, so program order alone would do.
        assert_eq!(f.load(Ordering::Acquire), 0);
        assert_eq!(ev.fatal_events(), 0);
    }
}
