//! The profiler of the C API: `ibnet_proxy_event_t` and `ibnet_proxy_profiler_t`, and how the
//! engine's op and step events reach a C callback. [`super::entry`] holds one per proxy; [`super::entry_xproc`]
//! installs it (`ibnet_proxy_set_profiler`).

use core::ffi::{c_int, c_void};

use crate::{Dir, OpEvent, Profiler, StepEvent};

/// `ibnet_proxy_event_t`: one profiler event. `kind`: 0 op start, 1 op state, 2 op stop,
/// 3 step start, 4 step state, 5 step stop. `state`: an `IBNET_PROF_OP_*` (op state) or
/// `IBNET_PROF_STEP_*` (step state), else -1. `dir` (op start only, else -1). Steps are
/// relative to the sub's first step; an op state's step is in `from` and `to`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct CEvent {
    pub kind: c_int,
    pub dir: c_int,
    pub state: c_int,
    pub sub: u32,
    pub from: u64,
    pub to: u64,
    pub bytes: u64,
    pub nsteps: u64,
}

/// `ibnet_proxy_profiler_t`: called on the proxy thread, during progress.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CProfiler {
    /// Passed back to `event`.
    pub ctx: *mut c_void,
    /// Receives every event.
    pub event: Option<unsafe extern "C" fn(ctx: *mut c_void, ev: *const CEvent)>,
}

impl CProfiler {
    fn emit(&mut self, e: CEvent) {
        if let Some(f) = self.event {
            // SAFETY: the caller's callback, given a valid event for the call's duration.
            unsafe { f(self.ctx, &e) };
        }
    }
}

fn ev(kind: c_int, sub: usize) -> CEvent {
    CEvent {
        kind,
        dir: -1,
        state: -1,
        sub: sub as u32,
        ..CEvent::default()
    }
}

impl Profiler for CProfiler {
    fn op_start(&mut self, dir: Dir, sub: usize, nsteps: u64, nbytes: usize) {
        self.emit(CEvent {
            dir: (dir == Dir::Recv) as c_int,
            nsteps,
            bytes: nbytes as u64,
            ..ev(0, sub)
        });
    }
    fn op_state(&mut self, sub: usize, state: OpEvent, step: u64, bytes: u64) {
        self.emit(CEvent {
            state: state as c_int,
            from: step,
            to: step,
            bytes,
            ..ev(1, sub)
        });
    }
    fn op_stop(&mut self, sub: usize) {
        self.emit(ev(2, sub));
    }
    fn step_start(&mut self, sub: usize, from: u64, to: u64) {
        self.emit(CEvent {
            from,
            to,
            ..ev(3, sub)
        });
    }
    fn step_state(&mut self, sub: usize, from: u64, to: u64, state: StepEvent) {
        self.emit(CEvent {
            from,
            to,
            state: state as c_int,
            ..ev(4, sub)
        });
    }
    fn step_stop(&mut self, sub: usize, from: u64, to: u64) {
        self.emit(CEvent {
            from,
            to,
            ..ev(5, sub)
        });
    }
}
