//! The state a verbs device's async-event thread shares with its comms: the lock-free half of
//! `ibnet_ffi::verbs::events`, on its own so that the loom model (`tests/loom/tests/loom_events.rs`)
//! runs this very code.
//!
//! ```text
//!  async thread                                  data path (poll_cq of a comm)
//!   DEVICE_FATAL: fatal += 1 (Release) ─────────▶ check: fatal (Acquire) ≠ 0 → Failure::Device
//!   QP/CQ error:  registries (mutex) → the CQ's
//!                 comm flag = true (Release) ────▶ check: flag (Acquire) → Failure::Comm
//!  control path (create/destroy, under the registries' mutexes): add_cq, add_qp, remove_qp,
//!   remove_cq; Drop of the context: request_stop, then join the thread.
//! ```
//! Neither flag carries data besides itself: the Release/Acquire pairs make whatever the event
//! thread wrote before the failure visible to the poll that reports it (nothing today), at no
//! cost on x86. Flags only ever go from "fine" to "failed"; a poll that starts after the event
//! was handled fails (and a comm, once it fails, stays failed).
//!
//! A QP's registration is removed before `ibv_destroy_qp`, which returns only once every async
//! event libibverbs reported for that QP was acknowledged (and drops unreported ones), and the
//! thread acknowledges an event only after handling it. So an event for a destroyed QP or CQ
//! either reaches the old comm's flag or finds nothing ([`Handled::Unknown`]); it can never fail
//! a new comm whose CQ or QP reuses the old address.
//!
//! Atomics come from `ibnet_core::sync` (loom's under `--cfg loom`), `Arc`/`Mutex` from std (or
//! loom's).

use ibnet_core::sync::{AtomicBool, AtomicU32, Ordering};
#[cfg(loom)]
use loom::sync::{Arc, Mutex};
#[cfg(not(loom))]
use std::sync::{Arc, Mutex};

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

/// Why a poll fails: what [`Events::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A device-fatal event: every comm on the device fails.
    Device,
    /// A QP or CQ error of this comm.
    Comm,
}

/// A comm's failure flag (one per CQ), set by the async thread.
pub type CommFlag = Arc<AtomicBool>;

/// What the async-event thread shares with the device and its comms (the thread holds no
/// `Context`, so the context's drop can stop and join it).
pub struct Events {
    /// Count of device-fatal events seen so far (every comm on the device fails).
    fatal: AtomicU32,
    /// Set by the thread's owner to stop it.
    stop: AtomicBool,
    /// `NCCL_IB_RETURN_ASYNC_EVENTS=0`: fatal events are only logged.
    warn_only: AtomicBool,
    /// Live CQs (`ibv_cq*` as usize) and their comm's failure flag.
    cqs: Mutex<Vec<(usize, CommFlag)>>,
    /// Live QPs (`ibv_qp*` as usize) and their CQ.
    qps: Mutex<Vec<(usize, usize)>>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            fatal: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            warn_only: AtomicBool::new(false),
            cqs: Mutex::new(Vec::new()),
            qps: Mutex::new(Vec::new()),
        }
    }
}

impl Events {
    /// Applies `NCCL_IB_RETURN_ASYNC_EVENTS` (default 1: fatal events fail comms).
    pub fn set_return_events(&self, on: bool) {
        // Relaxed: pairs with the Relaxed load in `handle`; a configuration flag with no data
        // behind it, set once at init, before any comm exists. The async thread already runs
        // then: an event it handles before the store lands gets the default (fail comms).
        self.warn_only.store(!on, Ordering::Relaxed);
    }

    /// Registers a new CQ; the returned flag is set when an event fails it.
    pub fn add_cq(&self, cq: usize) -> CommFlag {
        let f = Arc::new(AtomicBool::new(false));
        self.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((cq, f.clone()));
        f
    }

    /// Forgets a CQ about to be destroyed.
    pub fn remove_cq(&self, cq: usize) {
        let mut v = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|(c, _)| *c != cq);
    }

    /// Registers a new QP and the CQ it completes on.
    pub fn add_qp(&self, qp: usize, cq: usize) {
        let mut v = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        v.push((qp, cq));
    }

    /// Forgets a QP about to be destroyed.
    pub fn remove_qp(&self, qp: usize) {
        let mut v = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|(q, _)| *q != qp);
    }

    /// The comm flag of the CQ an event of `scope` on `element` concerns.
    fn flag_of(&self, scope: Scope, element: usize) -> Option<CommFlag> {
        let cq = if scope == Scope::Qp {
            let qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
            qps.iter().find(|(q, _)| *q == element)?.1
        } else {
            element
        };
        let cqs = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        cqs.iter().find(|(c, _)| *c == cq).map(|(_, f)| f.clone())
    }

    /// Handles one event of `scope` on `element` (an `ibv_qp*`/`ibv_cq*` as usize); returns
    /// what it did, for the log line.
    pub fn handle(&self, scope: Scope, element: usize) -> Handled {
        // Relaxed: a configuration flag (see `set_return_events`).
        let act = !self.warn_only.load(Ordering::Relaxed);
        match scope {
            Scope::Quiet => Handled::Quiet,
            Scope::Info => Handled::Logged,
            _ if !act => Handled::WarnOnly,
            Scope::Device => {
                // Release pairs with the Acquire load in `check`.
                self.fatal.fetch_add(1, Ordering::Release);
                Handled::FailedDevice
            }
            Scope::Qp | Scope::Cq => match self.flag_of(scope, element) {
                Some(f) => {
                    // Release pairs with the Acquire load in `check`.
                    f.store(true, Ordering::Release);
                    Handled::FailedComm
                }
                None => Handled::Unknown,
            },
        }
    }

    /// The data path's check before polling the CQ whose flag is `comm`: a device-fatal
    /// event fails every comm, a QP/CQ error fails its own.
    pub fn check(&self, comm: &AtomicBool) -> Result<(), Failure> {
        // Acquire pairs with the Release increment in `handle` (device-fatal event).
        if self.fatal.load(Ordering::Acquire) != 0 {
            return Err(Failure::Device);
        }
        // Acquire pairs with the Release store in `handle` (QP/CQ error of this comm).
        if comm.load(Ordering::Acquire) {
            return Err(Failure::Comm);
        }
        Ok(())
    }

    /// Device-fatal events seen so far.
    pub fn fatal_events(&self) -> u32 {
        // Relaxed: a count for tests and logs; `check` is the ordered reader.
        self.fatal.load(Ordering::Relaxed)
    }

    /// Asks the async thread to stop (its owner then joins it).
    pub fn request_stop(&self) {
        // Relaxed: pairs with the Relaxed load in `stopping`; the join that follows is the
        // synchronisation point with the thread, and a late observation only delays its exit
        // by one poll period.
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether the thread was asked to stop (checked once per poll period).
    pub fn stopping(&self) -> bool {
        // Relaxed: see `request_stop`.
        self.stop.load(Ordering::Relaxed)
    }
}
