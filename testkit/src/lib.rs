//! # ibnet-testkit
//!
//! Test doubles for `ibnet-core`: [`Loopback`], an in-process [`Provider`] that performs the
//! RDMA operations between QPs of one process, synchronously at post time, with the checks of a
//! real RC QP (lkey/rkey, bounds, access rights, posted receives, error state and flush errors).
//! It lets the whole data path of `ibnet-core` run in unit tests, benches and the
//! allocation-counting test, single-threaded.
//!
//! It is not the software provider (`ibnet-soft`): it has no threads, no cross-process fabric
//! and no asynchrony, which makes failures deterministic and easy to read. It does not allocate
//! on the post/poll path (queues are reserved at creation).
//!
//! [`in_process`] is [`InProcessNet`], the proxy engine's `Net` over ibnet's own comms in one
//! process; [`proxy`] is the proxy engine's scenario harness (a simulated GPU on each side of every
//! connection, every byte verified) and [`scenarios`] the one table of scenarios that each
//! provider's tests run through it ([`proxy_scenario_tests!`](crate::proxy_scenario_tests)).

pub mod in_process;
mod loopback;
pub mod proxy;
pub mod scenarios;

pub use in_process::{InProcessMr, InProcessNet};
pub use loopback::{Fault, LoopCq, LoopMr, LoopQp, Loopback};

use ibnet_core::comm::{CommConfig, RecvComm, SendComm};
use ibnet_core::provider::Provider;
use ibnet_core::Result;

/// A fused send comm over the rails `devs`, built in place on the heap (`FusedSend::init`; a
/// fused comm is too large to pass through a test thread's stack in a debug build).
#[allow(unsafe_code)]
pub fn fused_send<P: Provider + Clone>(
    devs: &[P],
    cfg: CommConfig,
) -> Result<Box<ibnet_core::fused::FusedSend<P>>> {
    let mut b = Box::new_uninit();
    ibnet_core::fused::FusedSend::init(&mut b, devs, cfg)?;
    // SAFETY: `init` returned `Ok`, which it does only once every field of `*b` is written.
    Ok(unsafe { b.assume_init() })
}

/// A fused receive comm over `devs`, connected to the sender's rails `remote`, built in place
/// on the heap (see [`fused_send`]).
#[allow(unsafe_code)]
pub fn fused_recv<P: Provider + Clone>(
    devs: &[P],
    cfg: CommConfig,
    remote: &[ibnet_core::wire::QpInfo],
) -> Result<Box<ibnet_core::fused::FusedRecv<P>>> {
    let mut b = Box::new_uninit();
    ibnet_core::fused::FusedRecv::init(&mut b, devs, cfg, remote)?;
    // SAFETY: `init` returned `Ok`, which it does only once every field of `*b` is written.
    Ok(unsafe { b.assume_init() })
}

/// A connected fused pair: the send comm and the receive comm.
pub type FusedPair<P> = (
    Box<ibnet_core::fused::FusedSend<P>>,
    Box<ibnet_core::fused::FusedRecv<P>>,
);

/// A fused send and receive comm over the same `rails` (one device per rail at both ends),
/// connected to each other: the rails' QPs, the notice ring and the back ring, as the plugin's
/// handshake would.
pub fn fused_pair<P: Provider + Clone>(rails: &[P], cfg: CommConfig) -> Result<FusedPair<P>> {
    let mut s = fused_send(rails, cfg)?;
    let mut infos = Vec::with_capacity(rails.len());
    for i in 0..rails.len() {
        infos.push(s.local_info(i).expect("one rail per device"));
    }
    let mut r = fused_recv(rails, cfg, &infos)?;
    for i in 0..rails.len() {
        s.connect(i, &r.local_info(i).expect("one rail per device"))?;
    }
    s.set_notice_ring(&r.notice_ring())?;
    r.set_back_ring(&s.back_ring())?;
    Ok((s, r))
}

/// Connects a send and a receive comm through `dev`, passing the handshake messages directly
/// (the `wire`/`handshake` layers are tested on their own).
pub fn connect_pair<P: Provider + Clone>(
    dev: &P,
    cfg: CommConfig,
) -> Result<(SendComm<P>, RecvComm<P>)> {
    let mut send = SendComm::new(dev.clone(), cfg)?;
    let recv = RecvComm::new(dev.clone(), cfg, &send.local_info())?;
    send.connect(&recv.local_info())?;
    Ok((send, recv))
}

/// A heap buffer aligned to 4 KiB, for registering as a data buffer.
pub struct AlignedBuf {
    mem: Vec<u128>,
    len: usize,
    off: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes, page aligned.
    pub fn new(len: usize) -> Self {
        let words = len.div_ceil(16) + 4096 / 16;
        let mem = vec![0u128; words];
        let off = (4096 - (mem.as_ptr() as usize % 4096)) % 4096;
        Self { mem, len, off }
    }
    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64 + self.off as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `mem` holds at least `off + len` initialised bytes (zeroed u128s) and lives as
        // long as `self`; u8 has no alignment requirement.
        unsafe {
            std::slice::from_raw_parts((self.mem.as_ptr() as *const u8).add(self.off), self.len)
        }
    }
    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe {
            std::slice::from_raw_parts_mut(
                (self.mem.as_mut_ptr() as *mut u8).add(self.off),
                self.len,
            )
        }
    }
}

/// Fills `buf` with a pattern derived from `seed` (cheap xorshift), for byte-for-byte checks.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}
