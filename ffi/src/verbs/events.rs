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
//! any lookup.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::sys::*;

/// What an async event concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The whole device (`IBV_EVENT_DEVICE_FATAL`).
    Device,
    /// One QP (its element is the `ibv_qp*`).
    Qp,
    /// One CQ (its element is the `ibv_cq*`).
    Cq,
    /// Informational (no comm fails).
    Info,
    /// Expected during setup, not logged (`IBV_EVENT_COMM_EST`).
    Quiet,
}

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

/// What the async-event thread shares with the device and its comms (the thread holds no
/// `Context`, so the context's drop can stop and join it).
#[derive(Default)]
pub struct Events {
    /// Count of device-fatal events seen so far (every comm on the device fails).
    pub fatal: AtomicU32,
    /// Set by the thread's owner to stop it.
    pub stop: AtomicBool,
    /// `NCCL_IB_RETURN_ASYNC_EVENTS=0`: fatal events are only logged.
    warn_only: AtomicBool,
    /// Live CQs (`ibv_cq*` as usize) and their comm's failure flag.
    cqs: Mutex<Vec<(usize, Arc<AtomicBool>)>>,
    /// Live QPs (`ibv_qp*` as usize) and their CQ.
    qps: Mutex<Vec<(usize, usize)>>,
}

impl Events {
    /// Applies `NCCL_IB_RETURN_ASYNC_EVENTS` (default 1: fatal events fail comms).
    pub fn set_return_events(&self, on: bool) {
        // Relaxed: a configuration flag set at init, before any comm exists.
        self.warn_only.store(!on, Ordering::Relaxed);
    }

    /// Registers a new CQ; the returned flag is set when an event fails it.
    pub fn add_cq(&self, cq: usize) -> Arc<AtomicBool> {
        let f = Arc::new(AtomicBool::new(false));
        self.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((cq, f.clone()));
        f
    }

    /// Forgets a destroyed CQ.
    pub fn remove_cq(&self, cq: usize) {
        let mut v = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|(c, _)| *c != cq);
    }

    /// Registers a new QP and the CQ it completes on.
    pub fn add_qp(&self, qp: usize, cq: usize) {
        let mut v = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        v.push((qp, cq));
    }

    /// Forgets a destroyed QP.
    pub fn remove_qp(&self, qp: usize) {
        let mut v = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|(q, _)| *q != qp);
    }

    /// Handles one event (type and element pointer as usize); returns what it did, for the
    /// log line.
    pub fn handle(&self, event_type: i32, element: usize) -> Handled {
        let scope = classify(event_type);
        // Relaxed: a configuration flag (see `set_return_events`).
        let act = !self.warn_only.load(Ordering::Relaxed);
        match scope {
            Scope::Quiet => Handled::Quiet,
            Scope::Info => Handled::Logged,
            _ if !act => Handled::WarnOnly,
            Scope::Device => {
                // Release pairs with the Acquire load in `VerbsPort::poll_cq`.
                self.fatal.fetch_add(1, Ordering::Release);
                Handled::FailedDevice
            }
            Scope::Qp | Scope::Cq => {
                let cq = if scope == Scope::Qp {
                    let qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
                    match qps.iter().find(|(q, _)| *q == element) {
                        Some(&(_, cq)) => cq,
                        None => return Handled::Unknown,
                    }
                } else {
                    element
                };
                let cqs = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
                match cqs.iter().find(|(c, _)| *c == cq) {
                    Some((_, f)) => {
                        // Release pairs with the Acquire load in `VerbsPort::poll_cq`.
                        f.store(true, Ordering::Release);
                        Handled::FailedComm
                    }
                    None => Handled::Unknown,
                }
            }
        }
    }
}

/// What [`Events::handle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Nothing (expected event).
    Quiet,
    /// Informational event, logged.
    Logged,
    /// Fatal event, only logged (`NCCL_IB_RETURN_ASYNC_EVENTS=0`).
    WarnOnly,
    /// Every comm on the device fails.
    FailedDevice,
    /// The owning comm fails.
    FailedComm,
    /// A QP/CQ event for an object no comm owns (already destroyed).
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(ev.handle(IBV_EVENT_QP_FATAL, qp_a), Handled::FailedComm);
        assert!(fa.load(Ordering::Acquire) && !fb.load(Ordering::Acquire));
        assert_eq!(ev.fatal.load(Ordering::Acquire), 0);
        assert_eq!(ev.handle(IBV_EVENT_CQ_ERR, cq_b), Handled::FailedComm);
        assert!(fb.load(Ordering::Acquire));
        assert_eq!(ev.handle(IBV_EVENT_QP_REQ_ERR, 0x9999), Handled::Unknown);
        ev.remove_qp(qp_a);
        assert_eq!(ev.handle(IBV_EVENT_QP_FATAL, qp_a), Handled::Unknown);
        ev.remove_cq(cq_a);
        assert_eq!(ev.handle(IBV_EVENT_CQ_ERR, cq_a), Handled::Unknown);
        assert_eq!(ev.handle(IBV_EVENT_COMM_EST, qp_b), Handled::Quiet);
        assert_eq!(ev.handle(IBV_EVENT_GID_CHANGE, 0), Handled::Logged);
        assert_eq!(ev.fatal.load(Ordering::Acquire), 0);
        assert_eq!(ev.handle(IBV_EVENT_DEVICE_FATAL, 0), Handled::FailedDevice);
        assert_eq!(ev.fatal.load(Ordering::Acquire), 1);
    }

    #[test]
    fn return_async_events_0_only_warns() {
        let ev = Events::default();
        ev.set_return_events(false);
        let f = ev.add_cq(0x10);
        ev.add_qp(0x20, 0x10);
        assert_eq!(ev.handle(IBV_EVENT_QP_FATAL, 0x20), Handled::WarnOnly);
        assert_eq!(ev.handle(IBV_EVENT_DEVICE_FATAL, 0), Handled::WarnOnly);
        assert!(!f.load(Ordering::Acquire));
        assert_eq!(ev.fatal.load(Ordering::Acquire), 0);
    }
}
