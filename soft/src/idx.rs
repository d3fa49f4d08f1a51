//! Slot-index allocation for the provider's tables (QPs, MRs, FIFO slots).

use std::collections::VecDeque;

use ibnet_core::{Error, Result};

/// Free-list of slot indices (1-based; FIFO reuse keeps stale handles far from new ones).
pub(crate) struct IdxAlloc {
    free: VecDeque<u32>,
    next: u32,
    cap: u32,
    /// Generation per slot, bumped by the owner when a slot is reused.
    pub(crate) gens: Vec<u8>,
}

impl IdxAlloc {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            free: VecDeque::new(),
            next: 1,
            cap: cap as u32,
            gens: vec![0; cap],
        }
    }
    pub(crate) fn alloc(&mut self, what: &'static str) -> Result<u32> {
        if let Some(i) = self.free.pop_front() {
            return Ok(i);
        }
        if self.next >= self.cap {
            return Err(Error::Full {
                what,
                cap: self.cap as usize - 1,
            });
        }
        self.next += 1;
        Ok(self.next - 1)
    }
    pub(crate) fn free(&mut self, i: u32) {
        self.free.push_back(i);
    }
}
