//! Reference-counted resources shared between connections: the per-peer shared buffer pools
//! (shared-buffer mode) and the shared net comms (`NCCL_NET_SHARED_COMMS`).
//!
//! **Pools.** In shared-buffer mode (p2p), connections do not get dedicated SIMPLE buffers:
//! every connection of one local rank and direction carves its slots from one pool of
//! `p2p_nchannels × SHARED_STEPS × p2p_chunk_size` bytes, each channel owning
//! [`SHARED_STEPS`] chunks:
//! ```text
//!  pool: | ch0: slot0 .. slot15 | ch1: slot0 .. slot15 | ...      slot = chunk bytes
//!  offset(channel, slot) = chunk × (channel × SHARED_STEPS + slot)
//! ```
//! The pool is allocated by the first connection that needs it (host or device memory, as the
//! connection's GPU-direct choice says) and freed when the last one is freed.
//!
//! **Shared comms.** With shared buffers, a plugin that groups receives (`max_recvs > 1`) and
//! `NCCL_NET_SHARED_COMMS=1`, connections to the same (device, remote rank, channel) reuse one
//! net comm, so their receives can be grouped into one multi-receive. The comm is closed when
//! its last connection is freed.

use super::mem::{MemKind, MemProvider, Region};
use super::net::CommRef;
use super::{Dir, SHARED_STEPS};
use ibnet_core::error::{Error, Result};

/// Pools one proxy holds (local ranks × 2 directions).
pub const MAX_POOLS: usize = 32;
/// Shared comms one proxy holds.
pub const MAX_SHARED_COMMS: usize = 64;

/// Byte offset of `slot` of `channel` in a shared pool.
pub fn shared_offset(chunk: usize, channel: u32, slot: usize) -> Result<u32> {
    let off = (channel as u64 * SHARED_STEPS as u64 + slot as u64) * chunk as u64;
    u32::try_from(off).map_err(|_| Error::OutOfRange {
        what: "shared buffer offset",
        value: off as i64,
        min: 0,
        max: u32::MAX as i64,
    })
}

#[derive(Debug, Default, Clone, Copy)]
struct Pool {
    used: bool,
    local_rank: u32,
    recv: bool,
    refs: u32,
    host: Option<Region>,
    dev: Option<Region>,
}

/// The shared buffer pools.
#[derive(Debug)]
pub struct Pools {
    pools: [Pool; MAX_POOLS],
}

impl Default for Pools {
    fn default() -> Self {
        Self {
            pools: [Pool::default(); MAX_POOLS],
        }
    }
}

impl Pools {
    /// Takes a reference to the pool of (`local_rank`, `dir`) in device (`dev`) or host
    /// memory, allocating it with `size` bytes on first use. Returns the pool index and
    /// region.
    pub fn acquire<M: MemProvider>(
        &mut self,
        mem: &mut M,
        local_rank: u32,
        dir: Dir,
        dev: bool,
        size: usize,
    ) -> Result<(usize, Region)> {
        let recv = dir == Dir::Recv;
        let i = match self
            .pools
            .iter()
            .position(|p| p.used && p.local_rank == local_rank && p.recv == recv)
        {
            Some(i) => i,
            None => {
                let i = self.pools.iter().position(|p| !p.used).ok_or(Error::Full {
                    what: "shared buffer pools",
                    cap: MAX_POOLS,
                })?;
                self.pools[i] = Pool {
                    used: true,
                    local_rank,
                    recv,
                    ..Pool::default()
                };
                i
            }
        };
        let p = &mut self.pools[i];
        let slot = if dev { &mut p.dev } else { &mut p.host };
        let region = match slot {
            Some(r) => *r,
            None => {
                let kind = if dev { MemKind::Device } else { MemKind::Host };
                match mem.alloc(kind, size) {
                    Ok(r) => *slot.insert(r),
                    Err(e) => {
                        if p.refs == 0 {
                            p.used = false;
                        }
                        return Err(e);
                    }
                }
            }
        };
        p.refs += 1;
        Ok((i, region))
    }

    /// Drops a reference to pool `i`; the last one frees its memory.
    pub fn release<M: MemProvider>(&mut self, mem: &mut M, i: usize) -> Result<()> {
        let p = self
            .pools
            .get_mut(i)
            .filter(|p| p.used && p.refs > 0)
            .ok_or(Error::BadState {
                op: "release shared pool",
                state: "not referenced",
            })?;
        p.refs -= 1;
        if p.refs > 0 {
            return Ok(());
        }
        let (h, d) = (p.host.take(), p.dev.take());
        p.used = false;
        let a = h.map_or(Ok(()), |r| mem.free(r));
        let b = d.map_or(Ok(()), |r| mem.free(r));
        a.and(b)
    }

    /// Pools currently allocated (for leak checks).
    pub fn live(&self) -> usize {
        self.pools.iter().filter(|p| p.used).count()
    }
}

#[derive(Debug, Clone, Copy)]
struct Shared<S, R> {
    dev: u32,
    remote: u32,
    channel: u32,
    comm: CommRef<S, R>,
    refs: u32,
}

/// Shared net comms, keyed by (device, remote rank, channel, direction).
#[derive(Debug)]
pub struct SharedComms<S: Copy, R: Copy> {
    e: [Option<Shared<S, R>>; MAX_SHARED_COMMS],
}

impl<S: Copy, R: Copy> Default for SharedComms<S, R> {
    fn default() -> Self {
        Self {
            e: [None; MAX_SHARED_COMMS],
        }
    }
}

impl<S: Copy, R: Copy> SharedComms<S, R> {
    /// The shared comm for the key, with a new reference taken.
    pub fn take_ref(
        &mut self,
        dev: u32,
        remote: u32,
        channel: u32,
        dir: Dir,
    ) -> Option<(usize, CommRef<S, R>)> {
        let i = self.e.iter().position(|e| {
            e.is_some_and(|e| {
                e.dev == dev
                    && e.remote == remote
                    && e.channel == channel
                    && matches!(
                        (e.comm, dir),
                        (CommRef::Send(_), Dir::Send) | (CommRef::Recv(_), Dir::Recv)
                    )
            })
        })?;
        let e = self.e[i].as_mut()?;
        e.refs += 1;
        Some((i, e.comm))
    }

    /// Records a newly connected comm under the key, with one reference.
    pub fn insert(
        &mut self,
        dev: u32,
        remote: u32,
        channel: u32,
        comm: CommRef<S, R>,
    ) -> Result<usize> {
        let i = self.e.iter().position(Option::is_none).ok_or(Error::Full {
            what: "shared net comms",
            cap: MAX_SHARED_COMMS,
        })?;
        self.e[i] = Some(Shared {
            dev,
            remote,
            channel,
            comm,
            refs: 1,
        });
        Ok(i)
    }

    /// Drops a reference; returns the comm to close when it was the last.
    pub fn release(&mut self, i: usize) -> Result<Option<CommRef<S, R>>> {
        let e = self
            .e
            .get_mut(i)
            .and_then(Option::as_mut)
            .ok_or(Error::BadState {
                op: "release shared comm",
                state: "not referenced",
            })?;
        e.refs -= 1;
        if e.refs > 0 {
            return Ok(None);
        }
        let c = e.comm;
        self.e[i] = None;
        Ok(Some(c))
    }

    /// References held on entry `i` (for tests).
    pub fn refs(&self, i: usize) -> u32 {
        self.e.get(i).and_then(|e| e.as_ref()).map_or(0, |e| e.refs)
    }

    /// Shared comms currently open.
    pub fn live(&self) -> usize {
        self.e.iter().filter(|e| e.is_some()).count()
    }
}
