//! The provider's memory budget for QPs (`IBNET_SOFT_MEM`): what a QP may cost at most, the
//! budget's default, and the live QPs' share of it; and the cap on CQs (one per comm,
//! [`MAX_CQS`]), so that the comm past the plugin's `maxComms` is refused however `maxComms`
//! is bounded.
//!
//! A QP's queues are committed lazily (`zeroed`) and its inbound ring is a sparse part of the
//! segment, so an idle QP costs about its `QpShared`; but a QP that carries traffic touches
//! its whole send queue, receive queue and inbound ring as its sequence numbers wrap. The
//! budget counts each live QP at that worst case ([`qp_bytes`]), so that however the comms
//! are used the provider never holds more than the budget in QP memory: `create_qp` past it
//! fails with [`Error::Full`] (what the plugin's `maxComms` is derived from, so the plugin
//! refuses a comm before the OOM killer would). The bounce slots (`BOUNCE_SLOTS` ×
//! `bounce_max` for each of the first `BOUNCE_QPS` QP slots) are a fixed cost of the provider
//! and come off the budget first ([`Budget::new`]).
//!
//! Default: an eighth of the host's memory (`MemTotal`, or the cgroup v2 `memory.max` of the
//! process where lower), per soft device: as if each of 8 ranks of a node had one device and
//! used every ring of every comm it may open.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use ibnet_core::{Error, Result};

use crate::segment::{BOUNCE_QPS, BOUNCE_SLOTS, RING};

/// CQs one provider holds at once: one per comm (the core makes one per comm and rail), so
/// the plugin's `maxComms` cap of 2 × 1024 comms: the comm past it is refused even where
/// memory would allow it ([`Budget::take_cq`]).
pub const MAX_CQS: u32 = 2 * 1024;

/// The default budget's share of the host's memory (1/8).
pub const HOST_SHARE: u64 = 8;

/// Bytes a QP of `max_send_wr` / `max_recv_wr` entries costs at most: its send queue and
/// receive queue (whole pages, as mapped), its inbound ring in the segment and its shared
/// state.
pub fn qp_bytes(max_send_wr: u32, max_recv_wr: u32) -> u64 {
    let page = |b: usize| b.next_multiple_of(4096) as u64;
    let sq =
        page(max_send_wr.max(1).next_power_of_two() as usize * size_of::<crate::sq::SqEntry>());
    let rq = page(max_recv_wr.max(1).next_power_of_two() as usize * size_of::<u64>());
    let ring = (RING * size_of::<crate::ring::RingEntry>()) as u64;
    sq + rq + ring + QP_STATE_BYTES
}

/// A QP's shared state (`QpShared` behind its `Arc`, checked in `qp.rs`) and the CQ's and the
/// allocator's bookkeeping of it.
pub const QP_STATE_BYTES: u64 = 2048;

/// The fixed cost of the bounce slots at `bounce_max` bytes per slot.
pub fn bounce_bytes(bounce_max: u64) -> u64 {
    (BOUNCE_QPS * BOUNCE_SLOTS) as u64 * bounce_max.next_multiple_of(4096)
}

/// The default budget: [`host_memory`] / [`HOST_SHARE`].
pub fn default_budget() -> u64 {
    host_memory() / HOST_SHARE
}

/// The memory this process may use: `MemTotal`, or its cgroup v2 `memory.max` where lower
/// (16 GiB when neither can be read).
pub fn host_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| meminfo_total(&s))
        .unwrap_or(16 << 30);
    total.min(cgroup_max().unwrap_or(u64::MAX))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn meminfo_total(s: &str) -> Option<u64> {
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The cgroup v2 `memory.max` of this process's cgroup (None: no limit, or not cgroup v2).
fn cgroup_max() -> Option<u64> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let v = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim())).ok()?;
    v.trim().parse().ok()
}

/// A provider's budget and what its live QPs hold of it.
#[derive(Debug)]
pub struct Budget {
    /// Bytes QPs may hold (the configured budget less the bounce slots' fixed cost).
    cap: u64,
    /// The configured budget (`IBNET_SOFT_MEM`), for messages.
    configured: u64,
    held: AtomicU64,
    /// Live CQs (at most [`MAX_CQS`]).
    cqs: AtomicU32,
}

impl Budget {
    /// A budget of `mem` bytes, of which the bounce slots at `bounce_max` take their share.
    pub fn new(mem: u64, bounce_max: u64) -> Self {
        Self {
            cap: mem.saturating_sub(bounce_bytes(bounce_max)),
            configured: mem,
            held: AtomicU64::new(0),
            cqs: AtomicU32::new(0),
        }
    }

    /// Bytes QPs may hold.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The configured budget.
    pub fn configured(&self) -> u64 {
        self.configured
    }

    /// Takes `bytes` for a new QP, or fails with [`Error::Full`] naming the budget.
    pub fn take(self: &Arc<Self>, bytes: u64) -> Result<Held> {
        // Relaxed: a counter; no data is published through it.
        let prev = self.held.fetch_add(bytes, Ordering::Relaxed);
        if prev.saturating_add(bytes) > self.cap {
            self.held.fetch_sub(bytes, Ordering::Relaxed); // Relaxed: as above
            return Err(Error::Full {
                what: "soft provider QP memory budget (IBNET_SOFT_MEM; bytes, less the bounce \
                       slots; maxComms is derived from it)",
                cap: self.configured as usize,
            });
        }
        Ok(Held {
            pool: self.clone(),
            bytes,
        })
    }

    /// Takes one of the [`MAX_CQS`] CQ slots (a comm), or fails with [`Error::Full`].
    pub fn take_cq(self: &Arc<Self>) -> Result<CqSlot> {
        // Relaxed: a counter; no data is published through it.
        if self.cqs.fetch_add(1, Ordering::Relaxed) >= MAX_CQS {
            self.cqs.fetch_sub(1, Ordering::Relaxed); // Relaxed: as above
            return Err(Error::Full {
                what: "soft device comms (one CQ each; the cap of maxComms)",
                cap: MAX_CQS as usize,
            });
        }
        Ok(CqSlot { pool: self.clone() })
    }

    /// Bytes live QPs hold now.
    pub fn held(&self) -> u64 {
        // Relaxed: a counter, read for reports.
        self.held.load(Ordering::Relaxed)
    }
}

/// A QP's share of the budget, given back when the QP's memory is freed (drop).
#[derive(Debug)]
pub struct Held {
    pool: Arc<Budget>,
    bytes: u64,
}

/// A CQ's slot, given back when the CQ is dropped.
#[derive(Debug)]
pub struct CqSlot {
    pool: Arc<Budget>,
}

impl Drop for CqSlot {
    fn drop(&mut self) {
        // Relaxed: a counter (see `take_cq`).
        self.pool.cqs.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Relaxed: a counter (see `take`).
        self.pool.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_past_its_cap_and_takes_back_what_is_dropped() {
        let b = Arc::new(Budget::new(10_000, 0));
        let one = b.take(6_000).unwrap();
        assert!(matches!(
            b.take(6_000),
            Err(Error::Full { cap: 10_000, .. })
        ));
        assert_eq!(b.held(), 6_000);
        drop(one);
        assert_eq!(b.held(), 0);
        let _two = b.take(10_000).unwrap();
    }

    #[test]
    fn cqs_past_the_cap_are_refused_until_one_is_dropped() {
        let b = Arc::new(Budget::new(1 << 30, 0));
        let mut all: Vec<_> = (0..MAX_CQS).map(|_| b.take_cq().unwrap()).collect();
        assert!(matches!(b.take_cq(), Err(Error::Full { cap, .. }) if cap == MAX_CQS as usize));
        all.pop();
        all.push(b.take_cq().unwrap());
    }

    #[test]
    fn bounce_slots_come_off_the_budget() {
        let b = Budget::new(1 << 30, 4096);
        assert_eq!(b.cap(), (1 << 30) - 2048 * 32 * 4096);
        assert_eq!(Budget::new(1 << 20, 4096).cap(), 0);
    }

    #[test]
    fn meminfo_total_is_read_in_bytes() {
        let s = "MemTotal:       24683236 kB\nMemFree:  1 kB\n";
        assert_eq!(meminfo_total(s), Some(24683236 * 1024));
        assert_eq!(meminfo_total("nothing"), None);
        assert!(host_memory() > 0);
    }

    #[test]
    fn a_qp_costs_its_queues_ring_and_state() {
        let b = qp_bytes(512, 256);
        // 512 send entries of 128 B, 256 receive ids, the 16 KiB ring.
        assert!(b >= 64 * 1024 + 2048 + 16 * 1024, "{b}");
        assert!(b < 90 * 1024, "{b}");
    }
}
