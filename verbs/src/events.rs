//! Async events of a verbs context: which ones fail what.
//!
//! ```text
//!  IBV_EVENT_DEVICE_FATAL                      → every comm on the context fails
//!  IBV_EVENT_QP_FATAL / QP_REQ_ERR / QP_ACCESS_ERR (element = ibv_qp*)
//!        → the QP's CQ (registered at create_qp) → that comm's flag → its polls fail
//!  IBV_EVENT_CQ_ERR (element = ibv_cq*)        → that CQ's comm fails
//!  IBV_EVENT_PORT_ACTIVE (element = port)      → one INFO when the port comes up
//!  IBV_EVENT_PORT_ERR (element = port)         → one WARN when the port goes down
//!  anything else                               → one WARN (COMM_EST: nothing)
//! ```
//! With `NCCL_IB_RETURN_ASYNC_EVENTS=0` fatal events are only logged (NCCL's behaviour).
//! A failback's `reset_qp` clears its QP's error (the rule: [`super::event_flags`]).
//!
//! A port event that repeats the state the port is in already is not logged ([`Ports`]): the
//! kernel may report one change twice (rxe raises PORT_ACTIVE when its netdev goes up and
//! again when the carrier comes on, each a netdev notifier event; PORT_ERR likewise): one link
//! coming back was two "port active" WARNs.
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

/// The ports' states as their async events told them (the async thread's own), so that an
/// event repeating a port's state is not logged again.
#[derive(Debug, Default)]
pub struct Ports(Vec<(u32, bool)>);

impl Ports {
    /// Records that `port` is up (or down); whether that is news: a change, or the port's
    /// first event.
    pub fn note(&mut self, port: u32, up: bool) -> bool {
        match self.0.iter_mut().find(|(p, _)| *p == port) {
            Some((_, s)) if *s == up => false,
            Some((_, s)) => {
                *s = up;
                true
            }
            None => {
                self.0.push((port, up));
                true
            }
        }
    }
}

/// The port number a port event's element carries (`ibv_async_event`'s union: its `int
/// port_num` is the first bytes of the pointer-sized member).
pub fn port_of(element: usize) -> u32 {
    let bits = element as u64;
    if cfg!(target_endian = "little") {
        bits as u32
    } else {
        (bits >> 32) as u32
    }
}

/// The line the async thread logs for an event of type `ty` on `element`, named `what`,
/// which [`Events::handle`] handled as `h` on device `dev` (`None`: nothing to log).
pub fn line(
    dev: &str,
    what: &str,
    (ty, element): (i32, usize),
    h: Handled,
    ports: &mut Ports,
) -> Option<(ibnet_nccl::log::Level, String)> {
    use ibnet_nccl::log::Level::{Info, Warn};
    Some(match h {
        Handled::Quiet => return None,
        Handled::Logged if ty == IBV_EVENT_PORT_ACTIVE || ty == IBV_EVENT_PORT_ERR => {
            let (port, up) = (port_of(element), ty == IBV_EVENT_PORT_ACTIVE);
            if !ports.note(port, up) {
                return None;
            }
            let level = if up { Info } else { Warn };
            (level, format!("{dev}:{port} got async event: {what}"))
        }
        Handled::Logged => (Warn, format!("{dev}: got async event: {what}")),
        Handled::WarnOnly => (
            Warn,
            format!(
                "{dev}: got fatal async event: {what} (NCCL_IB_RETURN_ASYNC_EVENTS=0: not \
                 failing comms)"
            ),
        ),
        Handled::FailedDevice => (
            Warn,
            format!("{dev}: got fatal async event: {what}; every comm on this device will fail"),
        ),
        Handled::FailedComm => (
            Warn,
            format!("{dev}: got async event: {what}; the comm owning it will fail"),
        ),
        Handled::Unknown => (
            Warn,
            format!("{dev}: got async event: {what} for a QP/CQ no comm owns any more"),
        ),
    })
}

/// Logs the line [`line()`] makes of one event (the async thread: not a hot path).
pub fn log(dev: &str, what: &str, event: (i32, usize), h: Handled, ports: &mut Ports) {
    match line(dev, what, event, h, ports) {
        Some((ibnet_nccl::log::Level::Warn, l)) => ibnet_nccl::warn!("{l}"),
        Some((_, l)) => ibnet_nccl::info!(ibnet_nccl::log::NET, "{l}"),
        None => {}
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

    /// A port coming back is one INFO however many PORT_ACTIVE events report it (rxe sends
    /// two); going down is one WARN; each port on its own.
    #[test]
    fn a_port_change_is_logged_once() {
        use ibnet_nccl::log::Level::{Info, Warn};
        let mut ports = Ports::default();
        let mut log = |ty: i32, port: usize| {
            let ev = Events::default();
            let h = ev.handle(classify(ty), port);
            line("rxe0", "what", (ty, port), h, &mut ports).map(|(l, s)| (l as i32, s))
        };
        let up = Some((Info as i32, "rxe0:1 got async event: what".to_string()));
        let down = Some((Warn as i32, "rxe0:1 got async event: what".to_string()));
        assert_eq!(log(IBV_EVENT_PORT_ERR, 1), down);
        assert_eq!(log(IBV_EVENT_PORT_ERR, 1), None);
        assert_eq!(log(IBV_EVENT_PORT_ACTIVE, 1), up);
        assert_eq!(
            log(IBV_EVENT_PORT_ACTIVE, 1),
            None,
            "the second PORT_ACTIVE logged"
        );
        assert_eq!(log(IBV_EVENT_PORT_ACTIVE, 2).unwrap().0, Info as i32);
        assert_eq!(log(IBV_EVENT_PORT_ERR, 1), down);
        assert_eq!(log(IBV_EVENT_COMM_EST, 0), None);
        assert_eq!(log(IBV_EVENT_GID_CHANGE, 0).unwrap().0, Warn as i32);
        // The element's union: the port number is its first four bytes.
        let mut b = [0u8; size_of::<usize>()];
        b[..4].copy_from_slice(&3i32.to_ne_bytes());
        assert_eq!(port_of(usize::from_ne_bytes(b)), 3);
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
