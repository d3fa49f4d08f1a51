//! One comm slot of `ibnet-ffi`'s token table (`ibnet_ffi::handles`): the lock-free half of the
//! table, on its own so that the loom model (`tests/loom/tests/loom_handles.rs`) runs this very
//! code.
//!
//! A slot's state word is `generation << 8 | life` ([`Life`]; 0 is a free slot of generation
//! 0); its pointer is the comm's box while the slot is in use:
//! ```text
//!  publish (under the table's mutex):  ptr = box (Relaxed); state = gen|Live(kind) (Release)
//!  lookup (any thread, lock-free):     state (Acquire) matches the token's gen → ptr (Relaxed)
//!  poison (any thread, lock-free):     CAS gen|Live(kind) → gen|Poisoned(kind) (Release)
//!  free (under the table's mutex):     ptr = null (Relaxed); state = (gen + 1)|Free (Release)
//! ```
//! A lookup that sees a token's generation live sees the pointer that publish stored before
//! it (Release/Acquire on `state`); once free ran, the generation moved on and every lookup
//! or poison with the old token fails.
//! Atomics come from `ibnet_core::sync` (loom's under `--cfg loom`).

use ibnet_core::sync::{AtomicU64, AtomicUsize, Ordering};
use ibnet_core::Error;

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A listen comm.
    Listen = 1,
    /// A send comm.
    Send = 2,
    /// A receive comm.
    Recv = 3,
}

/// A slot's lifecycle (see the module doc): the low byte of its state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// No comm.
    Free,
    /// A comm of this kind, usable.
    Live(Kind),
    /// A comm of this kind on which a panic was caught: only close works.
    Poisoned(Kind),
}

impl Life {
    #[inline]
    fn from_state(st: u64) -> Self {
        let kind = match st & 0x3 {
            1 => Kind::Listen,
            2 => Kind::Send,
            3 => Kind::Recv,
            _ => return Life::Free,
        };
        match st & POISONED {
            0 => Life::Live(kind),
            _ => Life::Poisoned(kind),
        }
    }

    fn bits(self) -> u64 {
        match self {
            Life::Free => 0,
            Life::Live(k) => k as u64,
            Life::Poisoned(k) => k as u64 | POISONED,
        }
    }

    #[inline]
    fn kind(self) -> Option<Kind> {
        match self {
            Life::Free => None,
            Life::Live(k) | Life::Poisoned(k) => Some(k),
        }
    }

    /// `Ok` for a live comm; `Poisoned { op }` for a poisoned one (poisoned by a caught panic:
    /// reported as an internal error, as the panic was).
    #[inline]
    pub fn check(self, op: &'static str) -> Result<(), Error> {
        match self {
            Life::Poisoned(_) => Err(Error::Poisoned {
                op,
                cause: ibnet_core::ErrorKind::Internal,
            }),
            _ => Ok(()),
        }
    }
}

const POISONED: u64 = 0x80;
const LIFE_BITS: u32 = 8;
const LIFE_MASK: u64 = (1 << LIFE_BITS) - 1;

/// One comm slot (see the module doc).
pub struct Slot {
    /// `generation << 8 | life` ([`Life`]; 0 is a free slot).
    state: AtomicU64,
    /// The comm's box (as an address) while the slot is in use.
    ptr: AtomicUsize,
}

#[inline]
fn gen_of(state: u64) -> u32 {
    (state >> LIFE_BITS) as u32
}

impl Default for Slot {
    fn default() -> Self {
        Self::new()
    }
}

impl Slot {
    /// A free slot of generation 0.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            ptr: AtomicUsize::new(0),
        }
    }
    /// A free slot of generation 0.
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            ptr: AtomicUsize::new(0),
        }
    }

    /// Puts `ptr` (a comm of `kind`) into this slot if it is free; its generation, or `None`
    /// if the slot is in use. Callers serialise publish and free (the table's mutex).
    pub fn publish(&self, kind: Kind, ptr: *mut ()) -> Option<u32> {
        // Relaxed: a slot becomes or stops being Free only in publish/free, which the caller
        // serialises (`poison` changes Live slots only).
        let st = self.state.load(Ordering::Relaxed);
        if Life::from_state(st) != Life::Free {
            return None;
        }
        // Relaxed: published by the Release store of `state` just below.
        self.ptr.store(ptr as usize, Ordering::Relaxed);
        // Release pairs with the Acquire load in `lookup`: a matching state implies `ptr`.
        self.state.store(
            (st & !LIFE_MASK) | Life::Live(kind).bits(),
            Ordering::Release,
        );
        Some(gen_of(st))
    }

    /// The comm in this slot if its generation, masked with `gen_mask`, is `gen` (live or
    /// poisoned): its box, kind and lifecycle.
    #[inline]
    pub fn lookup(&self, gen: u32, gen_mask: u32) -> Option<(*mut (), Kind, Life)> {
        // Acquire pairs with the Release stores in `publish` (makes `ptr` visible) and
        // `poison`.
        let st = self.state.load(Ordering::Acquire);
        let life = Life::from_state(st);
        let kind = life.kind()?;
        if gen_of(st) & gen_mask != gen {
            return None;
        }
        // Relaxed: ordered after the Acquire load above.
        Some((self.ptr.load(Ordering::Relaxed) as *mut (), kind, life))
    }

    /// Moves `Live(kind)` → `Poisoned(kind)` if the slot still holds generation `gen`
    /// (masked with `gen_mask`); anything else is left alone.
    pub fn poison(&self, gen: u32, gen_mask: u32) {
        // Relaxed: the compare-exchange below validates what this read saw.
        let mut st = self.state.load(Ordering::Relaxed);
        loop {
            let Life::Live(kind) = Life::from_state(st) else {
                return;
            };
            if gen_of(st) & gen_mask != gen {
                return;
            }
            let new = (st & !LIFE_MASK) | Life::Poisoned(kind).bits();
            // Release pairs with the Acquire loads in `lookup`: they see the comm poisoned.
            // Relaxed on failure: the loop re-checks the state it read.
            match self
                .state
                .compare_exchange(st, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(cur) => st = cur,
            }
        }
    }

    /// Frees the slot holding generation `gen` (the caller checked it with `lookup`, and
    /// serialises publish and free): the generation moves on.
    pub fn free(&self, gen: u32) {
        // Relaxed: the box is handed back to the caller; no reader may use it after close
        // (plugin contract), and a later lookup fails on the state below.
        self.ptr.store(0, Ordering::Relaxed);
        // Release pairs with the Acquire loads in `lookup`: they see the new generation.
        // A concurrent `poison` CAS of the old state fails against this store and gives up.
        self.state
            .store((gen.wrapping_add(1) as u64) << LIFE_BITS, Ordering::Release);
    }
}
