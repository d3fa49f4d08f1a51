//! The state a verbs device's async-event thread shares with its comms: the lock-free half of
//! `ibnet_verbs::events`, on its own so that the loom model (`tests/loom/tests/loom_events.rs`)
//! runs this very code.
//!
//! ```text
//!  async thread                                  data path (poll_cq of a comm)
//!   DEVICE_FATAL: fatal += 1 (Release) ─────────▶ check: fatal (Acquire) ≠ 0 → Failure::Device
//!   QP error:  registries (mutex): the QP not yet
//!              marked failed → mark it, the CQ's
//!              comm word += 1 (Release) ─────────▶ check: word (Acquire) ≠ 0 → Failure::Comm
//!   CQ error:  the CQ's comm word |= CQ_ERROR (Release) ─┘
//!  comm's thread, `reset_qp` once the QP is in RESET: clear_qp → the QP marked failed →
//!   unmark it, the CQ's comm word -= 1 (Release)
//!  control path (create/destroy, under the registries' mutexes): add_cq, add_qp, remove_qp,
//!   remove_cq; Drop of the context: request_stop, then join the thread.
//! ```
//! Neither word carries data besides itself: the Release/Acquire pairs make whatever was
//! written before the change visible to the poll that reports it (nothing today), at no cost
//! on x86. A poll that starts after an event was handled fails.
//!
//! What a reset clears (the rule): exactly the failure that belongs to the QP it reset. A QP
//! error (`QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`) is the QP's: the reset takes the QP
//! through RESET, which ends that error, so [`Events::clear_qp`] takes the QP's one count off
//! its CQ's word (a QP counts once however many events it had, and a clear of a QP that had
//! none changes nothing, so another QP's error on the same CQ stays). A CQ error (the CQ
//! overran) is the CQ's: no QP reset repairs the CQ, so it stays until the comm is closed. A
//! device-fatal event is the device's and stays for good. An event the thread reports after
//! the clear (a late report of the old error, or a new one) fails the comm again: the
//! failback tries again later, never the other way round. A QP destroyed while marked failed
//! leaves its count (its comm is being closed).
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

/// A comm's failure word (one per CQ): [`CQ_ERROR`] once a CQ error hit the CQ, plus one for
/// each QP completing on it whose error event no reset has cleared yet
/// ([`Events::clear_qp`]). Non-zero: the comm's polls fail.
pub type CommFlag = Arc<AtomicU32>;

/// The bit of a [`CommFlag`] a CQ error sets (sticky: no QP reset repairs the CQ).
pub const CQ_ERROR: u32 = 1 << 31;

/// A live QP: its `ibv_qp*`, the CQ it completes on, and whether an error event of it is
/// counted in that CQ's word.
struct QpEntry {
    qp: usize,
    cq: usize,
    failed: bool,
}

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
    /// Live QPs and their CQ. Lock order: `qps`, then `cqs`.
    qps: Mutex<Vec<QpEntry>>,
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

    /// Registers a new CQ; the returned word is non-zero while an event fails it.
    pub fn add_cq(&self, cq: usize) -> CommFlag {
        let f = Arc::new(AtomicU32::new(0));
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
        v.push(QpEntry {
            qp,
            cq,
            failed: false,
        });
    }

    /// Forgets a QP about to be destroyed (a count it left on its CQ's word stays: its comm
    /// is being closed).
    pub fn remove_qp(&self, qp: usize) {
        let mut v = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|e| e.qp != qp);
    }

    /// The word of CQ `cq`, if registered.
    fn cq_word(&self, cq: usize) -> Option<CommFlag> {
        let cqs = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        cqs.iter().find(|(c, _)| *c == cq).map(|(_, f)| f.clone())
    }

    /// A QP error on `qp`: counted once on its CQ's word.
    fn fail_qp(&self, qp: usize) -> Handled {
        let mut qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        let Some(e) = qps.iter_mut().find(|e| e.qp == qp) else {
            return Handled::Unknown;
        };
        let Some(w) = self.cq_word(e.cq) else {
            return Handled::Unknown;
        };
        if !e.failed {
            e.failed = true;
            // Release pairs with the Acquire load in `check`.
            w.fetch_add(1, Ordering::Release);
        }
        Handled::FailedComm
    }

    /// The QP `qp` was reset (it went through RESET): its error, if one was counted, no
    /// longer fails its comm. Returns whether there was one. A CQ error or a device-fatal
    /// event stays (see the module docs' rule).
    pub fn clear_qp(&self, qp: usize) -> bool {
        let mut qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        let Some(e) = qps.iter_mut().find(|e| e.qp == qp && e.failed) else {
            return false;
        };
        e.failed = false;
        if let Some(w) = self.cq_word(e.cq) {
            // Release pairs with the Acquire load in `check`: a poll that finds the error
            // gone comes after the reset that ended it. The count was added under this
            // mutex, so it is there to take off.
            w.fetch_sub(1, Ordering::Release);
        }
        true
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
            Scope::Qp => self.fail_qp(element),
            Scope::Cq => match self.cq_word(element) {
                Some(w) => {
                    // Release pairs with the Acquire load in `check`.
                    w.fetch_or(CQ_ERROR, Ordering::Release);
                    Handled::FailedComm
                }
                None => Handled::Unknown,
            },
        }
    }

    /// The data path's check before polling the CQ whose word is `comm`: a device-fatal
    /// event fails every comm, a QP/CQ error (not cleared by a reset) fails its own.
    pub fn check(&self, comm: &AtomicU32) -> Result<(), Failure> {
        // Acquire pairs with the Release increment in `handle` (device-fatal event).
        if self.fatal.load(Ordering::Acquire) != 0 {
            return Err(Failure::Device);
        }
        // Acquire pairs with the Release RMWs in `fail_qp`, `handle` (CQ error) and
        // `clear_qp`.
        if comm.load(Ordering::Acquire) != 0 {
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
