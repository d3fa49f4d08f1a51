//! The copy engine: worker threads that move the chunks of large WRs, like a NIC's DMA
//! engines.
//!
//! A large WR is handed over as `k ≤ workers` *tokens* `(job, seq)` (a [`Job`] is a QP)
//! through a bounded, allocation-free MPMC channel; each token claims chunks of the WR until
//! none is left (see `qp.rs`; the posting thread claims chunks too, so a WR never waits for a
//! worker to wake). An idle worker polls the channel for `spin` ([`Config::spin_us`](crate::Config))
//! before it parks in it: under steady traffic the next token finds it awake.
//!
//! Each worker also has a mailbox ([`Engine::submit_to`]): a token there runs on that worker
//! only (polled before the shared queue). An idle QP's WR hands its helpers' tokens to the
//! same workers every time (`qp.rs`, `idle_helpers`), whose caches then still hold the pages
//! they copied last time; a worker that ran a mailbox token parks at once instead of spinning
//! (the next WR of a latency-bound exchange comes a round trip later, and a spinning worker
//! slows the peer's copies meanwhile). [`Engine::shutdown`]
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
/// Queued tokens at most in one worker's mailbox; beyond that `submit_to` uses the shared
/// queue.
const MAILBOX: usize = 1 << 10;

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

/// A worker's next message, from its own mailbox first, then the shared queue: polled for
/// `spin`, then waited for on both (parked); with whether it came from the mailbox. `None`:
/// the engine is gone.
fn next<J>(
    own: &Receiver<Msg<J>>,
    shared: &Receiver<Msg<J>>,
    spin: Duration,
) -> Option<(Msg<J>, bool)> {
    let poll = || -> Option<Option<(Msg<J>, bool)>> {
        for (rx, mine) in [(own, true), (shared, false)] {
            match rx.try_recv() {
                Ok(m) => return Some(Some((m, mine))),
                Err(TryRecvError::Disconnected) => return Some(None),
                Err(TryRecvError::Empty) => {}
            }
        }
        None
    };
    if !spin.is_zero() {
        let t = Instant::now();
        let mut polls = 0u32;
        loop {
            if let Some(m) = poll() {
                return m;
            }
            std::hint::spin_loop();
            polls += 1;
            // The clock only every 64 polls (a vDSO call, ~20 ns).
            if polls.is_multiple_of(64) && t.elapsed() >= spin {
                break;
            }
        }
    }
    if let Some(m) = poll() {
        return m;
    }
    crossbeam_channel::select! {
        recv(own) -> m => m.ok().map(|m| (m, true)),
        recv(shared) -> m => m.ok().map(|m| (m, false)),
    }
}

/// A worker's mailbox: both ends of its own channel.
type Mailbox<J> = (Sender<Msg<J>>, Receiver<Msg<J>>);

/// The worker pool.
pub struct Engine<J: Job> {
    tx: Sender<Msg<J>>,
    rx: Receiver<Msg<J>>,
    /// One mailbox per worker: tokens for that worker only (`submit_to`).
    mail: Vec<Mailbox<J>>,
    n: usize,
    stopped: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<J: Job> Engine<J> {
    /// Starts `n` workers that poll for `spin` before parking when idle.
    pub fn start(n: usize, spin: Duration) -> Result<Self, Error> {
        let (tx, rx) = bounded(QUEUE);
        let mail: Vec<_> = (0..n).map(|_| bounded(MAILBOX)).collect();
        let mut threads = Vec::with_capacity(n);
        for (i, (_, own)) in mail.iter().enumerate() {
            let rx: Receiver<Msg<J>> = rx.clone();
            let own: Receiver<Msg<J>> = own.clone();
            let t = std::thread::Builder::new()
                .name(format!("ibnet-soft-cp{i}"))
                .spawn(move || {
                    let mut wait = spin;
                    while let Some((Msg::Token(job, seq), mine)) = next(&own, &rx, wait) {
                        job.run_token(seq);
                        // After a helper's token (an idle QP's WR, a latency-bound exchange)
                        // no spin: the next WR of that exchange comes after a round trip, and
                        // a spinning worker meanwhile slows the peer's copies on this host
                        // (1 MiB ping-pong 58-65 µs parking at once, 71-101 spinning 50 µs,
                        // 88-109 spinning 200 µs; one device call). A stream's worker spins.
                        wait = if mine { Duration::ZERO } else { spin };
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
            mail,
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

    /// Queues a token for worker `worker % workers` (its mailbox), or, with that mailbox
    /// full, for any worker (`submit`); `false` as `submit`. The same worker for the same
    /// job keeps the job's pages in that worker's cache (see `qp.rs`, `idle_helpers`).
    #[inline]
    pub fn submit_to(&self, job: Arc<J>, seq: u64, worker: usize) -> bool {
        // Acquire: pairs with `shutdown`'s Release.
        if self.stopped.load(Ordering::Acquire) || self.n == 0 {
            return false;
        }
        match self.mail[worker % self.n].0.try_send(Msg::Token(job, seq)) {
            Ok(()) => true,
            Err(TrySendError::Full(Msg::Token(job, seq))) => self.submit(job, seq),
            Err(_) => false,
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
        for rx in self.mail.iter().map(|(_, rx)| rx).chain([&self.rx]) {
            while let Ok(j) = rx.try_recv() {
                if let Msg::Token(job, seq) = j {
                    job.run_token(seq);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    /// Reports which thread ran each token.
    struct Where(Mutex<mpsc::Sender<(u64, String)>>);

    impl Job for Where {
        fn run_token(&self, seq: u64) {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            let _ = self.0.lock().unwrap().send((seq, name));
        }
    }

    #[test]
    fn a_token_for_a_worker_runs_on_that_worker() {
        let (tx, rx) = mpsc::channel();
        let job = Arc::new(Where(Mutex::new(tx)));
        let e = Engine::start(3, Duration::ZERO).unwrap();
        for seq in 0..30u64 {
            // Worker `seq % 3` by the modulo of the worker index.
            assert!(e.submit_to(job.clone(), seq, seq as usize + 3));
        }
        for _ in 0..30 {
            let (seq, name) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(name, format!("ibnet-soft-cp{}", seq % 3), "token {seq}");
        }
        e.shutdown();
        assert!(!e.submit_to(job, 0, 0), "refused after shutdown");
    }

    /// Counts its tokens; the first one waits until `go` opens.
    struct Gate {
        ran: AtomicUsize,
        go: Mutex<bool>,
        cv: std::sync::Condvar,
    }

    impl Job for Gate {
        fn run_token(&self, _seq: u64) {
            // SeqCst: stronger than needed; a test counter that publishes nothing (picking the
            // first token needs only the RMW's atomicity; `go` is behind the mutex).
            if self.ran.fetch_add(1, Ordering::SeqCst) == 0 {
                let mut g = self.go.lock().unwrap();
                while !*g {
                    g = self.cv.wait(g).unwrap();
                }
            }
        }
    }

    #[test]
    fn every_queued_token_runs_across_shutdown() {
        let job = Arc::new(Gate {
            ran: AtomicUsize::new(0),
            go: Mutex::new(false),
            cv: std::sync::Condvar::new(),
        });
        let e = Arc::new(Engine::start(2, Duration::ZERO).unwrap());
        // The first token holds worker 0; the rest queue in its mailbox and the shared queue.
        assert!(e.submit_to(job.clone(), 0, 0));
        // SeqCst: stronger than needed; only waits for the count, nothing is read through it.
        while job.ran.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        for seq in 1..=8 {
            assert!(e.submit_to(job.clone(), seq, 0));
        }
        for seq in 9..=12 {
            assert!(e.submit(job.clone(), seq));
        }
        let stopper = {
            let e = e.clone();
            std::thread::spawn(move || e.shutdown())
        };
        *job.go.lock().unwrap() = true;
        job.cv.notify_all();
        stopper.join().unwrap();
        // SeqCst: stronger than needed; `shutdown` joined the workers (and ran the rest itself),
        // and `stopper.join` orders all of that before this load.
        assert_eq!(job.ran.load(Ordering::SeqCst), 13, "no token lost");
    }
}
