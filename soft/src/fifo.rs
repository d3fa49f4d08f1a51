//! FIFO rings for the core's comms (`Provider::alloc_fifo`): in the shared segment when a slot
//! is free, so that peers write clear-to-send elements with plain stores through their mapping
//! instead of `process_vm_writev` (see `segment`'s "FIFO rings in shared memory"); on the heap
//! otherwise.

use std::sync::{Arc, Mutex};

use ibnet_core::fifo::FifoRing;

use crate::idx::IdxAlloc;
use crate::segment::{self, Segment};

/// A FIFO ring of the soft provider.
pub struct SoftFifo(Place);

enum Place {
    /// Slot `idx` of the provider's segment, given back (zeroed) on drop.
    Shared {
        seg: Arc<Segment>,
        slots: Arc<Mutex<IdxAlloc>>,
        idx: u32,
    },
    /// All segment slots were taken.
    Heap(Box<FifoRing>),
}

impl SoftFifo {
    /// A zeroed ring: a segment slot if one is free (its pages read as zeros: never touched,
    /// or punched at its last release), else the heap.
    pub(crate) fn alloc(seg: &Arc<Segment>, slots: &Arc<Mutex<IdxAlloc>>) -> Self {
        let idx = slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc("soft FIFO slots");
        match idx {
            Ok(idx) => Self(Place::Shared {
                seg: seg.clone(),
                slots: slots.clone(),
                idx,
            }),
            Err(_) => Self(Place::Heap(segment::zeroed_fifo())),
        }
    }

    /// Whether the ring lives in the shared segment (peers write it without a syscall).
    pub fn is_shared(&self) -> bool {
        matches!(self.0, Place::Shared { .. })
    }
}

impl std::ops::Deref for SoftFifo {
    type Target = FifoRing;
    fn deref(&self) -> &FifoRing {
        match &self.0 {
            Place::Shared { seg, idx, .. } => seg.fifo(*idx as usize),
            Place::Heap(b) => b,
        }
    }
}

impl Drop for SoftFifo {
    fn drop(&mut self) {
        if let Place::Shared { seg, slots, idx } = &self.0 {
            // A slot that cannot be zeroed is never reused (its next user would read stale
            // elements as posted).
            if seg.clear_fifo(*idx as usize).is_ok() {
                slots.lock().unwrap_or_else(|e| e.into_inner()).free(*idx);
            }
        }
    }
}
