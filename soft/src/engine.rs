//! The copy engine: worker threads that move the chunks of large WRs, like a NIC's DMA
//! engines.
//!
//! A large WR is handed over as `k ≤ workers` *tokens* `(job, seq)` (a [`Job`] is a QP)
//! through a bounded, allocation-free MPMC channel (or, for awake workers, a second one:
//! "Offers" below); each token claims chunks of the WR until
//! none is left (see `qp.rs`; the posting thread claims chunks too, so a WR never waits for a
//! worker to wake). An idle worker polls the channel for `spin` ([`Config::spin_us`](crate::Config))
//! before it parks in it: under steady traffic the next token finds it awake. [`Engine::shutdown`]
//! sends one `Stop` per worker behind all queued tokens and joins every thread; tokens still
//! queued afterwards are run by the caller, so no WR is ever lost. No worker holds the provider,
//! so dropping the last provider handle can join them.
//!
//! ## Doorbell cost
//! [`Engine::submit`] is this provider's doorbell (what an MMIO write to the NIC is for verbs),
//! and it is on the `isend` path of WRs larger than `direct_max` (64 KiB by default; smaller
//! ones are copied by the posting thread and never come here, except the WRs of a stream of
//! at least `stream_min`: see `qp.rs`, "Streams"). `try_send` itself is lock-free (a CAS on
//! the ring). When a worker is *parked* (idle longer than its spin), waking it takes the
//! channel's waker mutex (uncontended in practice: only a worker registering or leaving
//! contends) and one `futex` wake syscall, ~1-2 µs. The poster never waits for a worker: for
//! an idle QP it first *offers* tokens to the workers that are awake and idle (spinning), then
//! copies its own first chunk, and only after it hands a token through the waking channel
//! while at least two chunks are unclaimed (at most one token per worker in all): no syscall
//! comes before its first chunk, and each wake overlaps its own copies; in a stream it
//! returns at once. The spin is bounded (50 µs by default with 8 cores or more, none below):
//! it keeps workers awake between the WRs of a stream (then a token costs no syscall), and
//! gives the cores back to the GPU proxy threads and NCCL's progress threads when traffic
//! pauses.
//!
//! ## Offers (tokens for awake workers, no wake)
//! A send on the channel wakes a parked worker whenever one is parked, even when a spinning
//! one would take the token first. So tokens for awake workers travel through a second
//! channel, `offers`, that no worker ever blocks on (a send there never wakes anyone), and
//! [`Engine::offer`] sends at most as many as `spinning` says are awake and idle. `spinning`
//! is a hint (Relaxed): a worker counted there may park before it polls the offer, and then
//! the offered token waits until some worker next polls `offers` (after its next token, or
//! when woken). Nothing relies on an offer being taken: the poster copies every chunk nobody
//! claimed, and past its budget it hands out a waking token ([`Engine::submit`]). A token
//! run late claims what is left of its WR, usually nothing (a claim checks the WR's tag).
//! No new synchronization: nothing is published through `spinning` (tokens synchronize
//! through the channels, as before), so no loom model covers it; the unit tests below show an
//! offer made to a parked worker run at the next wake or at shutdown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
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

/// A worker's receiving ends: `rx` (waking tokens, `Stop`), `offers` (never blocked on), and
/// the count of spinning workers it keeps up to date.
struct Inbox<J> {
    rx: Receiver<Msg<J>>,
    offers: Receiver<Msg<J>>,
    spinning: Arc<AtomicUsize>,
}

impl<J> Inbox<J> {
    /// One poll of both channels, offers first.
    fn poll(&self) -> Option<Msg<J>> {
        self.offers.try_recv().or_else(|_| self.rx.try_recv()).ok()
    }

    /// The next message: polled for `spin` (counted in `spinning` meanwhile), then waited
    /// for (parked). `None`: the engine is gone.
    fn next(&self, spin: Duration) -> Option<Msg<J>> {
        if !spin.is_zero() {
            // Relaxed (both): `spinning` is a hint for `Engine::offer`; it publishes nothing
            // (tokens travel through the channels, which synchronize themselves).
            self.spinning.fetch_add(1, Ordering::Relaxed);
            let m = self.spin(spin);
            self.spinning.fetch_sub(1, Ordering::Relaxed);
            if m.is_some() {
                return m;
            }
        }
        // An offer made while this worker still counted as spinning.
        if let Ok(m) = self.offers.try_recv() {
            return Some(m);
        }
        self.rx.recv().ok()
    }

    fn spin(&self, spin: Duration) -> Option<Msg<J>> {
        let t = Instant::now();
        let mut polls = 0u32;
        loop {
            if let Some(m) = self.poll() {
                return Some(m);
            }
            std::hint::spin_loop();
            polls += 1;
            // The clock only every 64 polls (a vDSO call, ~20 ns).
            if polls % 64 == 0 && t.elapsed() >= spin {
                return None;
            }
        }
    }
}

/// The worker pool.
pub struct Engine<J: Job> {
    tx: Sender<Msg<J>>,
    rx: Receiver<Msg<J>>,
    /// Tokens for awake workers ("Offers" in the module doc).
    offer_tx: Sender<Msg<J>>,
    offer_rx: Receiver<Msg<J>>,
    /// Workers spinning (awake and idle): a hint.
    spinning: Arc<AtomicUsize>,
    n: usize,
    stopped: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<J: Job> Engine<J> {
    /// Starts `n` workers that poll for `spin` before parking when idle.
    pub fn start(n: usize, spin: Duration) -> Result<Self, Error> {
        let (tx, rx) = bounded::<Msg<J>>(QUEUE);
        let (offer_tx, offer_rx) = bounded::<Msg<J>>(QUEUE);
        let spinning = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let inbox = Inbox {
                rx: rx.clone(),
                offers: offer_rx.clone(),
                spinning: spinning.clone(),
            };
            let t = std::thread::Builder::new()
                .name(format!("ibnet-soft-cp{i}"))
                .spawn(move || {
                    while let Some(Msg::Token(job, seq)) = inbox.next(spin) {
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
            offer_tx,
            offer_rx,
            spinning,
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

    /// Offers up to `want` tokens `(job, seq)` to workers that are awake and idle (at most as
    /// many as are spinning now), without waking a parked one; returns how many were offered.
    /// An offer is a hint: the caller must not rely on it being taken ("Offers" in the module
    /// doc).
    #[inline]
    pub fn offer(&self, job: &Arc<J>, seq: u64, want: u64) -> u64 {
        // Relaxed: a hint (see `Inbox::next`); Acquire on `stopped` pairs with `shutdown`'s
        // Release, as in `submit`.
        let awake = self.spinning.load(Ordering::Relaxed) as u64;
        if awake == 0 || self.stopped.load(Ordering::Acquire) {
            return 0;
        }
        let mut sent = 0;
        while sent < want.min(awake) && self.offer_tx.try_send(Msg::Token(job.clone(), seq)).is_ok()
        {
            sent += 1;
        }
        sent
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
        while let Ok(j) = self.rx.try_recv().or_else(|_| self.offer_rx.try_recv()) {
            if let Msg::Token(job, seq) = j {
                job.run_token(seq);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Counts its runs, and the sum of the `seq`s it ran.
    #[derive(Default)]
    struct Count(AtomicU64, AtomicU64);

    impl Job for Count {
        fn run_token(&self, seq: u64) {
            self.1.fetch_add(seq, Ordering::SeqCst);
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(60), "never: {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn offers_go_to_spinning_workers_only_and_every_one_runs() {
        // Spinning long enough that both workers stay awake through the test.
        let e = Engine::<Count>::start(2, Duration::from_secs(600)).unwrap();
        let job = Arc::new(Count::default());
        wait_for("both workers spinning", || {
            e.spinning.load(Ordering::Relaxed) == 2
        });
        // At most as many as are awake: 2 of the 5 wanted.
        assert_eq!(e.offer(&job, 7, 5), 2);
        wait_for("both offers run", || job.0.load(Ordering::SeqCst) == 2);
        assert_eq!(job.1.load(Ordering::SeqCst), 14);
        assert!(e.submit(job.clone(), 1));
        wait_for("the waking token run", || job.0.load(Ordering::SeqCst) == 3);
        e.shutdown();
        assert_eq!(e.offer(&job, 7, 5), 0, "no offer after shutdown");
    }

    #[test]
    fn no_offer_without_spin_and_waking_tokens_still_run() {
        let e = Engine::<Count>::start(2, Duration::ZERO).unwrap();
        let job = Arc::new(Count::default());
        // Workers that never spin are never counted awake: nothing is offered.
        assert_eq!(e.offer(&job, 3, 2), 0);
        assert!(e.submit(job.clone(), 3));
        wait_for("the waking token run", || job.0.load(Ordering::SeqCst) == 1);
        e.shutdown();
        assert_eq!(job.1.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn an_offer_no_worker_took_runs_at_the_next_wake_or_at_shutdown() {
        let e = Engine::<Count>::start(1, Duration::ZERO).unwrap();
        let job = Arc::new(Count::default());
        // A stale hint: an offer lands while the only worker is parked (as when it parks
        // between `offer`'s read of `spinning` and its send).
        assert!(e.offer_tx.try_send(Msg::Token(job.clone(), 5)).is_ok());
        assert!(e.submit(job.clone(), 1));
        // The woken worker polls offers too: both run.
        wait_for("both tokens run", || job.0.load(Ordering::SeqCst) == 2);
        assert!(e.offer_tx.try_send(Msg::Token(job.clone(), 10)).is_ok());
        e.shutdown(); // runs what is still queued
        assert_eq!(job.0.load(Ordering::SeqCst), 3);
        assert_eq!(job.1.load(Ordering::SeqCst), 16);
    }
}
