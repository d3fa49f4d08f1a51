//! Profiler hooks: the proxy op and step events of NCCL's profiler plugin, no-op by default.
//!
//! The engine calls these from the progress functions, on the proxy thread, with the index of
//! the sub-operation and step numbers relative to the sub's `base`. Every method has an empty
//! default body, so [`NoProfiler`] costs nothing after inlining.

use super::Dir;

/// A proxy-op state change (NCCL's `ncclProfilerProxyOp*` states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpEvent {
    /// Send: credits posted to the GPU up to `step`.
    SendPosted,
    /// Send: data for `step` ready in the buffer (waiting on nothing but the network).
    SendRemFifoWait,
    /// Send: `isend` posted up to `step`.
    SendTransmitted,
    /// Send: the network completed up to `step`.
    SendDone,
    /// Recv: `irecv` posted up to `step`.
    RecvPosted,
    /// Recv: the network delivered up to `step`.
    RecvReceived,
    /// Recv: data (flushed) handed to the GPU up to `step`.
    RecvTransmitted,
    /// Recv: the GPU consumed up to `step`.
    RecvDone,
}

/// A proxy-step state change (NCCL's `ncclProfilerProxyStep*` states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEvent {
    /// Send: waiting for the GPU to fill the slot.
    SendGpuWait,
    /// Send: waiting for the network to complete.
    SendWait,
    /// Recv: waiting for the network to deliver.
    RecvWait,
    /// Recv: waiting for the flush.
    RecvFlushWait,
    /// Recv: waiting for the GPU to consume.
    RecvGpuWait,
}

/// Receives proxy events. All methods default to doing nothing.
pub trait Profiler {
    /// Whether the hooks want each step's events: `false` (only [`NoProfiler`]) lets the
    /// engine move a counter over a run of steps at once where nothing but these events
    /// happens per step. A profiler that overrides a hook keeps the default `true`.
    const PER_STEP: bool = true;

    /// Sub-operation `sub` of a `dir` operation starts (`nsteps` steps, `nbytes` bytes).
    fn op_start(&mut self, dir: Dir, sub: usize, nsteps: u64, nbytes: usize) {
        let _ = (dir, sub, nsteps, nbytes);
    }
    /// Sub-operation `sub` reached `state` at `step`, having moved `bytes` so far.
    fn op_state(&mut self, sub: usize, state: OpEvent, step: u64, bytes: u64) {
        let _ = (sub, state, step, bytes);
    }
    /// Steps `[from, to)` of sub `sub` start.
    fn step_start(&mut self, sub: usize, from: u64, to: u64) {
        let _ = (sub, from, to);
    }
    /// Steps `[from, to)` of sub `sub` enter `state`.
    fn step_state(&mut self, sub: usize, from: u64, to: u64, state: StepEvent) {
        let _ = (sub, from, to, state);
    }
    /// Steps `[from, to)` of sub `sub` are finished.
    fn step_stop(&mut self, sub: usize, from: u64, to: u64) {
        let _ = (sub, from, to);
    }
    /// Sub-operation `sub` is finished.
    fn op_stop(&mut self, sub: usize) {
        let _ = sub;
    }
}

/// The default profiler: ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProfiler;

impl Profiler for NoProfiler {
    const PER_STEP: bool = false;
}
