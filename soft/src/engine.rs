//! The copy engine: worker threads that move the chunks of large WRs, like a NIC's DMA
//! engines.
//!
//! A large WR is handed over as `k ≤ workers` *tokens* `(job, seq)` (a [`Job`] is a QP)
//! through a bounded, allocation-free MPMC channel; each token claims chunks of the WR until
//! none is left (see `qp.rs`; the posting thread claims chunks too, so a WR never waits for a
//! worker to wake). An idle worker polls the channel for `spin` ([`Config::spin_us`](crate::Config))
//! before it parks in it: under steady traffic the next token finds it awake. [`Engine::shutdown`]
//! sends one `Stop` per worker behind all queued tokens and joins every thread; tokens still
//! queued afterwards are run by the caller, so no WR is ever lost. No worker holds the provider,
//! so dropping the last provider handle can join them.
//!
//! ## Doorbell cost
//! [`Engine::submit`] is this provider's doorbell (what an MMIO write to the NIC is for verbs),
//! and it is on the `isend` path of WRs larger than `direct_max` (512 KiB by default; smaller
//! ones are copied by the posting thread and never come here, except the WRs of a stream of
//! at least `stream_min`: see `qp.rs`, "Streams"). `try_send` itself is lock-free (a CAS on
//! the ring). When a worker is *parked* (idle longer than its spin), waking it takes the
//! channel's waker mutex (uncontended in practice: only a worker registering or leaving
//! contends) and one `futex` wake syscall, ~1-2 µs. The poster never waits for a worker: for
//! an idle QP it copies chunks itself and hands out a token (at most one per worker) only
//! while at least two chunks are unclaimed, so it pays at most one wake before its first
//! chunk and each further one overlaps its own copies; in a stream it returns at once. The spin is bounded (50 µs by default with 8 cores or more, none below):
//! it keeps workers awake between the WRs of a stream (then a token costs no syscall), and
//! gives the cores back to the GPU proxy threads and NCCL's progress threads when traffic
//! pauses.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use ibnet_core::Error;

/// Queued tokens at most; beyond that the posting thread copies itself.
const QUEUE: usize = 1 << 14;

/// What a token names: work the engine runs without knowing what it is (a QP's WR, in
/// `qp.rs`).
pub trait Job: Send + Sync + 'static {
    /// Runs this job's share of work item `seq` (a token may run more than once per item: each
    /// run claims what is left).
    fn run_token(&self, seq: u64);
}

enum Msg<J> {
    Token(Arc<J>, u64),
    Stop,
}

/// A worker's next message: polled for `spin`, then waited for (parked). `None`: the engine
/// is gone.
fn next<J>(rx: &Receiver<Msg<J>>, spin: Duration) -> Option<Msg<J>> {
    if !spin.is_zero() {
        let t = Instant::now();
        let mut polls = 0u32;
        loop {
            match rx.try_recv() {
                Ok(m) => return Some(m),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {}
            }
            std::hint::spin_loop();
            polls += 1;
            // The clock only every 64 polls (a vDSO call, ~20 ns).
            if polls % 64 == 0 && t.elapsed() >= spin {
                break;
            }
        }
    }
    rx.recv().ok()
}

/// The worker pool.
pub struct Engine<J: Job> {
    tx: Sender<Msg<J>>,
    rx: Receiver<Msg<J>>,
    n: usize,
    stopped: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<J: Job> Engine<J> {
    /// Starts `n` workers that poll for `spin` before parking when idle.
    pub fn start(n: usize, spin: Duration) -> Result<Self, Error> {
        let (tx, rx) = bounded(QUEUE);
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx: Receiver<Msg<J>> = rx.clone();
            let t = std::thread::Builder::new()
                .name(format!("ibnet-soft-cp{i}"))
                .spawn(move || {
                    while let Some(Msg::Token(job, seq)) = next(&rx, spin) {
                        job.run_token(seq);
                    }
                })
                .map_err(|e| Error::Provider {
                    call: "spawn copy-engine thread",
                    errno: e.raw_os_error().unwrap_or(0),
                });
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    for _ in &threads {
                        let _ = tx.send(Msg::Stop);
                    }
                    threads.into_iter().for_each(|t| drop(t.join()));
                    return Err(e);
                }
            }
        }
        Ok(Self {
            tx,
            rx,
            n,
            stopped: AtomicBool::new(false),
            threads: Mutex::new(threads),
        })
    }

    /// Number of workers (0 after shutdown).
    #[inline]
    pub fn workers(&self) -> usize {
        // Relaxed: a hint; `submit` refuses after shutdown anyway.
        if self.stopped.load(Ordering::Relaxed) {
            0
        } else {
            self.n
        }
    }

    /// Queues a token; `false` when the queue is full or the engine stopped (the caller runs
    /// the token itself). Never blocks; waking a parked worker costs a mutex and a `futex`
    /// wake (see "Doorbell cost" in the module doc).
    #[inline]
    pub fn submit(&self, job: Arc<J>, seq: u64) -> bool {
        // Acquire: pairs with `shutdown`'s Release.
        if self.stopped.load(Ordering::Acquire) {
            return false;
        }
        match self.tx.try_send(Msg::Token(job, seq)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Stops and joins every worker; runs tokens still queued (idempotent).
    pub fn shutdown(&self) {
        // AcqRel: Release pairs with `submit`'s Acquire; Acquire with an earlier shutdown's
        // Release (idempotence: the second caller sees the first one's work done or doing).
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for _ in &threads {
            let _ = self.tx.send(Msg::Stop);
        }
        for t in threads {
            let _ = t.join();
        }
        while let Ok(j) = self.rx.try_recv() {
            if let Msg::Token(job, seq) = j {
                job.run_token(seq);
            }
        }
    }
}
