//! The fixed request pool of a comm, and `wr_id` packing.
//!
//! Each comm owns [`MAX_REQUESTS`] request slots (NCCL 2.28: 32 outstanding operations × up to
//! 8 receives each). A free list of slot indices makes `alloc` and `free` O(1). A [`ReqId`]
//! carries the slot index and a generation, so a stale handle (a request already completed and
//! freed, then reused) is detected instead of aliasing the new request.
//!
//! A send's completion must retire every request of a multi-receive at once, so a `wr_id` packs
//! up to 8 slot indices, 8 bits each (lane `i` in bits `8i..8i+8`). That is why the pool holds at
//! most 256 slots.

use crate::error::{Error, ReqType, Result};
use crate::fifo::{MAX_RECVS, MAX_REQUESTS};

const _: () = assert!(MAX_REQUESTS <= 256, "a wr_id lane is 8 bits");
const _: () = assert!(MAX_RECVS * 8 <= 64, "a wr_id holds at most 8 lanes");

/// A handle to a live request: slot index + generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqId {
    idx: u8,
    gen: u16,
}

impl ReqId {
    /// The slot index (what goes into a `wr_id` lane).
    #[inline]
    pub fn index(self) -> u8 {
        self.idx
    }
    /// Packs the handle into a `u32` (for C request tokens).
    #[inline]
    pub fn to_bits(self) -> u32 {
        ((self.gen as u32) << 8) | self.idx as u32
    }
    /// Unpacks [`ReqId::to_bits`].
    #[inline]
    pub fn from_bits(b: u32) -> Self {
        Self {
            idx: b as u8,
            gen: (b >> 8) as u16,
        }
    }
}

/// The send half of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendState {
    /// Local address of the data.
    pub addr: u64,
    /// Bytes to send.
    pub size: u64,
    /// lkey of the data's registration.
    pub lkey: u32,
}

/// One request slot.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// What kind of operation, or `None` when the slot is free.
    pub kind: Option<ReqType>,
    /// Completions still expected before the request is done.
    pub events: u32,
    /// Receives in the multi-receive this request belongs to (1..=8).
    pub nreqs: u8,
    /// Received sizes (receives), per buffer.
    pub sizes: [u64; MAX_RECVS],
    /// Send parameters (sends).
    pub send: SendState,
    /// The FIFO slot a receive was posted in (where its sizes row is).
    pub fifo_slot: u16,
    /// A multi-receive's immediates OR-ed: bit `i` says send `i` carried data.
    pub imm_mask: u32,
    /// A send's profiler parent (the `phandle` NCCL passed; 0: none). Receives start their
    /// events in `irecv`, with the parents at hand; the events' handles are the sink's.
    pub parent: usize,
    gen: u16,
}

impl Request {
    const FREE: Self = Self {
        kind: None,
        events: 0,
        nreqs: 0,
        sizes: [0; MAX_RECVS],
        send: SendState {
            addr: 0,
            size: 0,
            lkey: 0,
        },
        fifo_slot: 0,
        imm_mask: 0,
        parent: 0,
        gen: 0,
    };
}

/// A fixed pool of [`MAX_REQUESTS`] requests.
#[derive(Debug, Clone)]
pub struct RequestPool {
    reqs: [Request; MAX_REQUESTS],
    free: heapless::Vec<u8, MAX_REQUESTS>,
}

impl Default for RequestPool {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestPool {
    /// A pool with every slot free.
    pub fn new() -> Self {
        let mut free = heapless::Vec::new();
        // Pop order hands out low indices first (purely cosmetic, helps debugging).
        for i in (0..MAX_REQUESTS).rev() {
            let _ = free.push(i as u8);
        }
        Self {
            reqs: [Request::FREE; MAX_REQUESTS],
            free,
        }
    }

    /// Takes a free slot for `kind` with `events` expected completions.
    pub fn alloc(&mut self, kind: ReqType, events: u32, nreqs: u8) -> Result<ReqId> {
        let idx = self.free.pop().ok_or(Error::Full {
            what: "request pool",
            cap: MAX_REQUESTS,
        })?;
        let r = &mut self.reqs[idx as usize];
        let gen = r.gen.wrapping_add(1);
        *r = Request {
            kind: Some(kind),
            events,
            nreqs,
            gen,
            ..Request::FREE
        };
        Ok(ReqId { idx, gen })
    }

    /// Returns a live request's slot to the pool.
    pub fn free(&mut self, id: ReqId) -> Result<()> {
        self.get(id)?;
        let r = &mut self.reqs[id.idx as usize];
        r.kind = None;
        // Cannot fail: a live slot is not in the free list, and the list holds every slot.
        let _ = self.free.push(id.idx);
        Ok(())
    }

    /// The live request `id` names.
    pub fn get(&mut self, id: ReqId) -> Result<&mut Request> {
        let r = &mut self.reqs[id.idx as usize];
        if r.kind.is_none() || r.gen != id.gen {
            return Err(Error::StaleRequest { idx: id.idx as u16 });
        }
        Ok(r)
    }

    /// The live request in slot `idx` (for completions, which carry indices only).
    pub fn by_index(&mut self, idx: u8) -> Option<&mut Request> {
        let r = &mut self.reqs[idx as usize];
        r.kind.map(|_| r)
    }

    /// The slot indices of every live request (for closing: stopping their profiler events).
    pub fn live(&self) -> impl Iterator<Item = u8> + '_ {
        self.reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.kind.is_some())
            .map(|(i, _)| i as u8)
    }

    /// Frees every request in use (their handles go stale): a comm whose QPs were reset
    /// gives up what it had outstanding (`Provider::reset_qp`).
    pub fn free_all(&mut self) {
        for (i, r) in self.reqs.iter_mut().enumerate() {
            if r.kind.take().is_some() {
                // Cannot fail: a slot in use is not in the free list, which has room for all.
                let _ = self.free.push(i as u8);
            }
        }
    }

    /// Requests in use.
    pub fn in_use(&self) -> usize {
        MAX_REQUESTS - self.free.len()
    }
}

/// Packs slot indices into a `wr_id`, lane `i` = `ids[i]`.
#[inline]
pub fn pack_wr_id(ids: &[u8]) -> u64 {
    ids.iter()
        .take(8)
        .enumerate()
        .fold(0u64, |w, (i, &id)| w | (id as u64) << (8 * i))
}

/// Lane `lane` of a `wr_id`.
#[inline]
pub fn wr_id_lane(wr_id: u64, lane: usize) -> u8 {
    (wr_id >> (8 * lane)) as u8
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_is_an_error_and_free_recycles() {
        let mut p = RequestPool::new();
        let ids: Vec<_> = (0..MAX_REQUESTS)
            .map(|_| p.alloc(ReqType::Recv, 1, 1).unwrap())
            .collect();
        assert_eq!(p.in_use(), MAX_REQUESTS);
        assert_eq!(
            p.alloc(ReqType::Send, 1, 1),
            Err(Error::Full {
                what: "request pool",
                cap: MAX_REQUESTS
            })
        );
        p.free(ids[17]).unwrap();
        let again = p.alloc(ReqType::Send, 1, 1).unwrap();
        assert_eq!(again.index(), ids[17].index());
        // The old handle is stale now.
        assert_eq!(p.get(ids[17]).unwrap_err(), Error::StaleRequest { idx: 17 });
        assert_eq!(p.free(ids[17]), Err(Error::StaleRequest { idx: 17 }));
        assert!(p.get(again).is_ok());
    }

    #[test]
    fn wr_id_round_trips_eight_lanes() {
        let ids = [0u8, 255, 3, 128, 7, 9, 1, 200];
        let w = pack_wr_id(&ids);
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(wr_id_lane(w, i), id);
        }
        assert_eq!(
            ReqId::from_bits(ReqId { idx: 5, gen: 300 }.to_bits()),
            ReqId { idx: 5, gen: 300 }
        );
    }
}
