//! A device's registration cache ([`DevCache`]), whose last holder deregisters what is left
//! in it.
//!
//! The plugin holds one per device, and every comm and listener on the device holds it too
//! (an `Arc`). `finalize` deregisters what NCCL left in the caches only the plugin holds
//! (`plugin.rs`, one INFO). A comm still open at `finalize` keeps its device's cache, so the
//! registrations in it are deregistered here, when that comm closes and drops the last
//! reference; before, they leaked with their provider (a verbs PD, a soft segment's memfd).

use core::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::dev::{AnyMr, MrCacheT};
use ibnet_nccl::info;

/// A device's registration cache; dropping the last reference deregisters what it holds.
// `repr(transparent)`: `new` takes the cache `boxed::mr_cache` built in place as a `MrCacheT`
// (1 MiB, never on the stack), which this layout makes a `DevCache`.
#[repr(transparent)]
pub struct DevCache(MrCacheT);

impl DevCache {
    /// An empty cache, built in place on the heap ([`crate::boxed::mr_cache`]).
    #[allow(unsafe_code)]
    pub fn new() -> Arc<Self> {
        let cache: *mut MrCacheT = Box::into_raw(crate::boxed::mr_cache());
        // SAFETY: `cache` is a live, owned `MrCacheT` from `Box::into_raw`; `DevCache` is
        // `repr(transparent)` over that one field, so the allocation is valid, aligned and of
        // the right layout for a `DevCache`, and `Box::from_raw` takes the ownership back.
        // `Arc::from` moves it from heap to heap (a byte copy, never through the stack).
        Arc::from(unsafe { Box::from_raw(cache.cast::<Self>()) })
    }

    /// Deregisters and frees every registration the cache holds (it is the caller's alone):
    /// (registrations, memory regions, deregistrations that failed).
    pub fn deregister_all(&mut self) -> (usize, usize, usize) {
        let mut failed = 0;
        let (regs, mrs) = self.0.drain_all(|v| {
            // SAFETY: `raw` is the Box<AnyMr> leaked by a registration closure (`nic.rs`);
            // the drain hands each live entry over once, and the cache is ours alone (no
            // release can reclaim it too).
            #[allow(unsafe_code)]
            let mr = unsafe { Box::from_raw(v.raw as *mut AnyMr) };
            if mr.dereg().is_err() {
                failed += 1;
            }
        });
        (regs, mrs, failed)
    }
}

impl Deref for DevCache {
    type Target = MrCacheT;
    fn deref(&self) -> &MrCacheT {
        &self.0
    }
}

impl DerefMut for DevCache {
    fn deref_mut(&mut self) -> &mut MrCacheT {
        &mut self.0
    }
}

impl Drop for DevCache {
    /// The last reference: a comm that outlived `finalize` closed. Its registrations are
    /// deregistered, one INFO when there were any.
    fn drop(&mut self) {
        let (regs, mrs, failed) = self.deregister_all();
        if regs > 0 {
            info!(
                ibnet_nccl::log::NET,
                "a comm closed after finalize: {regs} registration(s) NCCL did not deregister \
                 ({mrs} memory region(s)); deregistered them{}",
                if failed > 0 {
                    format!(" ({failed} of them failed to deregister)")
                } else {
                    String::new()
                }
            );
        }
    }
}
