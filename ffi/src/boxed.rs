//! Large values built in place on the heap: fused comms and registration caches.
//!
//! A fused comm is about 200 KB (four rails) and a registration cache 1 MiB or more, too large
//! to pass through the stack of a thread NCCL, RCCL or a user made with a small stack, least
//! of all in a debug build, which copies a returned value several times (and reserves a frame
//! for every value a function could build, taken branch or not). So each is allocated
//! uninitialised and the core writes it there in place (`FusedSend::init`, `FusedRecv::init`,
//! `MrCache::init_in_place`); only one rail's comm at a time is ever on the stack, as when a
//! plain comm is made.

use core::mem::MaybeUninit;

use ibnet_core::comm::CommConfig;
use ibnet_core::fused::{FusedRecv, FusedSend};
use ibnet_core::mr_cache::MrCache;
use ibnet_core::provider::Provider;
use ibnet_core::wire::QpInfo;
use ibnet_core::Result;

/// A fused send comm over the rail devices `devs`, made on the heap.
#[allow(unsafe_code)]
pub fn send<P: Provider + Clone>(devs: &[P], cfg: CommConfig) -> Result<Box<FusedSend<P>>> {
    let mut b: Box<MaybeUninit<FusedSend<P>>> = Box::new_uninit();
    FusedSend::init(&mut b, devs, cfg)?;
    // SAFETY: `init` returned `Ok`, which it does only once every field of `*b` is written.
    Ok(unsafe { b.assume_init() })
}

/// A fused receive comm over `devs`, connected to the sender's rails `remote`, made on the
/// heap.
#[allow(unsafe_code)]
pub fn recv<P: Provider + Clone>(
    devs: &[P],
    cfg: CommConfig,
    remote: &[QpInfo],
) -> Result<Box<FusedRecv<P>>> {
    let mut b: Box<MaybeUninit<FusedRecv<P>>> = Box::new_uninit();
    FusedRecv::init(&mut b, devs, cfg, remote)?;
    // SAFETY: `init` returned `Ok`, which it does only once every field of `*b` is written.
    Ok(unsafe { b.assume_init() })
}

/// An empty registration cache, built in place on the heap (a caller wanting it shared makes
/// an `Arc` of it: `Arc::from` moves it from heap to heap, a byte copy, never through the
/// stack).
#[allow(unsafe_code)]
pub fn mr_cache<M: Copy, const N: usize>() -> Box<MrCache<M, N>> {
    let mut b: Box<MaybeUninit<MrCache<M, N>>> = Box::new_uninit();
    // SAFETY: `b` is a fresh allocation, valid and aligned for one cache; `init_in_place`
    // initialises all of it, so `assume_init` holds.
    unsafe {
        MrCache::init_in_place(b.as_mut_ptr());
        b.assume_init()
    }
}
