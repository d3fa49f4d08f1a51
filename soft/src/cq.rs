//! Completion queues.
//!
//! A CQ stores no completions: it *harvests* them from its QPs on `poll_cq` (each QP's retired
//! send entries and delivered receives), so completions of one QP come out in order and nothing
//! can overflow. The CQ depth is enforced at post time instead: every signaled send WR and
//! every receive reserves a slot (`reserve`), which `poll_cq` gives back; a post that would
//! exceed the depth fails with `Error::Full { what: "soft completion queue" }` and posts
//! nothing. (A verbs CQ would overrun and raise an async error; refusing the post is the
//! deterministic equivalent.) Error completions of unsignaled WRs take no slot.
//!
//! The CQ's QP list changes only on `create_qp`/`destroy_qp` (control path, under a mutex);
//! `poll_cq` keeps its own copy and refreshes it when the list's version moves, so the hot path
//! takes no lock. The loom model (`tests/loom_seg.rs`) runs the reservation under every
//! interleaving (the atomics come from `ibnet_core::sync`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::inject::Inject;

use ibnet_core::provider::Completion;
use ibnet_core::sync::{AtomicU32, AtomicU64, Ordering};
use ibnet_core::{Error, Result};

/// What a CQ harvests completions from (a QP, in `qp.rs`).
pub trait Harvest: Send + Sync {
    /// Moves up to `out.len()` completions, in order, into `out`; returns how many.
    fn poll_into(&self, out: &mut [Completion]) -> usize;
}

/// A harvested source as the CQ holds it.
type Source = Arc<dyn Harvest>;

/// The part of a CQ its QPs share.
pub struct CqShared {
    depth: u32,
    reserved: AtomicU32,
    list: Mutex<Vec<Source>>,
    ver: AtomicU64,
}

impl CqShared {
    /// A CQ of `depth` slots with no QP.
    pub fn new(depth: u32) -> Self {
        Self {
            depth,
            reserved: AtomicU32::new(0),
            list: Mutex::new(Vec::new()),
            ver: AtomicU64::new(0),
        }
    }

    /// Reserves `n` completion slots.
    pub fn reserve(&self, n: u32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        // Relaxed: a counter; no data is published through it.
        let prev = self.reserved.fetch_add(n, Ordering::Relaxed);
        if prev.saturating_add(n) > self.depth {
            self.reserved.fetch_sub(n, Ordering::Relaxed); // Relaxed: as above
            return Err(Error::Full {
                what: "soft completion queue",
                cap: self.depth as usize,
            });
        }
        Ok(())
    }

    /// Gives `n` slots back.
    pub fn release(&self, n: u32) {
        if n != 0 {
            // Relaxed: a counter. Saturating: never wraps, even if accounting were off.
            let _ = self
                .reserved
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(n))
                });
        }
    }

    /// Adds a QP (create_qp).
    pub fn attach(&self, qp: Source) {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).push(qp);
        // Release: pairs with the Acquire in `SoftCq::poll`: the list change is visible.
        self.ver.fetch_add(1, Ordering::Release);
    }

    /// Removes a QP (destroy_qp).
    pub fn detach<Q: Harvest>(&self, qp: &Arc<Q>) {
        // Compares data pointers only (a vtable pointer may differ between codegen units).
        let gone = Arc::as_ptr(qp).cast::<()>();
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|q| Arc::as_ptr(q).cast::<()>() != gone);
        // Release: as in `attach`.
        self.ver.fetch_add(1, Ordering::Release);
    }

    fn attached(&self) -> usize {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A completion queue of the soft provider.
pub struct SoftCq {
    pub(crate) sh: Arc<CqShared>,
    qps: Vec<Source>,
    ver: u64,
    rr: usize,
    /// Armed `IBNET_SOFT_FAULTS` (delay, reorder), and when the next batch may go out.
    /// Boxed: one pointer in the (common) case of no fault.
    faults: Option<Box<(Arc<Inject>, Option<Instant>)>>,
    /// This CQ's slot of the provider's CQ cap (None: made outside a provider, in tests).
    pub(crate) _slot: Option<crate::budget::CqSlot>,
}

impl SoftCq {
    pub(crate) fn new(depth: u32, inject: Option<Arc<Inject>>) -> Self {
        Self {
            sh: Arc::new(CqShared::new(depth)),
            qps: Vec::new(),
            ver: u64::MAX,
            rr: 0,
            faults: inject
                .filter(|f| f.spec.cq_delay_us != 0 || f.spec.reorder)
                .map(|f| Box::new((f, None))),
            _slot: None,
        }
    }

    /// The depth it was created with.
    pub fn depth(&self) -> u32 {
        self.sh.depth
    }

    /// Harvests up to `out.len()` completions, round-robin over the CQ's QPs.
    pub(crate) fn poll(&mut self, out: &mut [Completion]) -> usize {
        // Acquire: pairs with the Release in attach/detach.
        let v = self.sh.ver.load(Ordering::Acquire);
        if v != self.ver {
            // Control-path event (a QP was created or destroyed): refresh our copy.
            self.qps
                .clone_from(&self.sh.list.lock().unwrap_or_else(|e| e.into_inner()));
            self.ver = v;
        }
        let nq = self.qps.len();
        if nq == 0 {
            return 0;
        }
        if self.faults.is_some() {
            return self.poll_faulty(out);
        }
        if let [q] = &self.qps[..] {
            return q.poll_into(out); // one QP (a comm's CQ): no rotation
        }
        // No division on the hot path (`rr` is past the end only after the list shrank: start at 0).
        let start = if self.rr < nq { self.rr } else { 0 };
        let mut n = 0;
        let mut i = start;
        loop {
            n += self.qps[i].poll_into(&mut out[n..]);
            i = if i + 1 == nq { 0 } else { i + 1 };
            if n == out.len() || i == start {
                break;
            }
        }
        self.rr = if start + 1 == nq { 0 } else { start + 1 };
        n
    }

    /// `poll` with `cq_delay_us` / `reorder` armed (see [`crate::faults`]).
    #[cold]
    fn poll_faulty(&mut self, out: &mut [Completion]) -> usize {
        let Some(b) = &mut self.faults else {
            return 0;
        };
        let (f, hold) = &mut **b;
        if hold.is_some_and(|t| Instant::now() < t) {
            return 0;
        }
        let nq = self.qps.len();
        let mut n = 0;
        if f.spec.reorder {
            // Rounds over the QPs in a random order, one completion of each per round.
            loop {
                let before = n;
                let (start, step) = (f.rand() as usize % nq, 1 + f.rand() as usize % nq);
                for i in 0..nq {
                    if n == out.len() {
                        break;
                    }
                    // A step coprime to nq visits every QP; otherwise some twice (harmless).
                    let q = &self.qps[(start + i * step) % nq];
                    n += q.poll_into(&mut out[n..n + 1]);
                }
                if n == before || n == out.len() {
                    break;
                }
            }
        } else {
            for q in &self.qps {
                n += q.poll_into(&mut out[n..]);
                if n == out.len() {
                    break;
                }
            }
        }
        if n > 0 && f.spec.cq_delay_us != 0 {
            *hold = Some(Instant::now() + Duration::from_micros(f.spec.cq_delay_us));
        }
        n
    }

    pub(crate) fn has_qps(&self) -> bool {
        self.sh.attached() != 0
    }
}
