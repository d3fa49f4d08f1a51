//! The tokens NCCL holds for our comms, requests and registrations: never pointers, but
//! indices into a fixed-capacity table of comm slots, each with a generation, and (for
//! `mhandle`s) into the registration records of the device's registration cache.
//!
//! ```text
//!  comm token     [63..48] COMM_MARK  [47..16] slot generation (32 bits)  [15..0] slot index
//!  request token  [63..56] REQ_MARK   [55..40] slot index  [39..24] generation (low 16 bits)
//!                 [23..0]  the core's ReqId (request slot index + its own generation)
//!  mhandle        [63..54] MH_MARK  [53..46] device index  [45..14] record generation
//!                 [13..0]  registration record (one per regMr, also where several share a
//!                          cache entry)
//!
//!  SLOTS[i] = { state: generation << 8 | life, ptr: the comm's box }
//! ```
//!
//! Each slot's low state byte is its comm's lifecycle, [`Life`]:
//! ```text
//!  Free ──insert──▶ Live(kind) ──poison (a panic was caught in a call on it)──▶ Poisoned(kind)
//!   ▲                   │                                                            │
//!   └──── remove (close; the generation moves on) ◀──────────────────────────────────┘
//! ```
//! A poisoned comm's state may be half-updated: every call but close fails with `Poisoned`.
//!
//! A lookup decodes the token, loads the slot's state once (Acquire) and compares it with the
//! token's generation and the kind the call expects; only a match reads the box pointer. So a
//! token whose comm was closed (the generation moved on when its slot was freed), a token of
//! another kind, or any other value NCCL might pass is rejected without dereferencing anything.
//! A request token also names its comm's slot and generation, so a request of a closed comm is
//! rejected even after the slot was reused; the request itself is checked by the core
//! (`ReqId`'s generation). Lookups are lock-free and allocate nothing (hot path); allocating
//! and freeing slots (connect, accept, listen, close: control path) take one mutex.
//!
//! What the table cannot make safe: closing a comm while another thread is inside a call on
//! the same comm. NCCL never does that (close comes after the last test of the comm), and it
//! is outside the plugin contract, as for every NCCL net plugin.

use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ibnet_core::mr_cache::MrHandle;
use ibnet_core::request::ReqId;
use ibnet_core::Error;

const _: () = assert!(usize::BITS == 64, "tokens are 64-bit values");

/// Slots in the table: the most comms (listen + send + receive) open at once per process.
pub const CAPACITY: usize = 1 << 16;

use crate::slot::Slot;
pub use crate::slot::{Kind, Life};

/// A comm found by a lookup: its box, kind and lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The comm's box.
    pub ptr: *mut (),
    /// Its kind.
    pub kind: Kind,
    /// Live or poisoned.
    pub life: Life,
}

const COMM_MARK: u64 = 0x1bcc;
const COMM_MARK_SHIFT: u32 = 48;
const REQ_MARK: u64 = 0x5e;
const REQ_MARK_SHIFT: u32 = 56;
const _: () = assert!(CAPACITY == 1 << 16, "a token's index field is 16 bits");

static SLOTS: [Slot; CAPACITY] = [const { Slot::new() }; CAPACITY];

/// Where the next free-slot search starts (control path, under the mutex).
static ALLOC: Mutex<usize> = Mutex::new(0);

/// Slots in use (changed under `ALLOC`).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// How many comms (listen, send, receive) are open.
pub fn live() -> usize {
    // Relaxed: a count for `plugin::idle`, which needs no ordering with the slots (see there).
    LIVE.load(Ordering::Relaxed)
}

fn comm_token(idx: usize, gen: u32) -> usize {
    ((COMM_MARK << COMM_MARK_SHIFT) | ((gen as u64) << 16) | idx as u64) as usize
}

/// Puts `ptr` (a leaked box of `kind`) into a free slot and returns its comm token.
pub fn insert(kind: Kind, ptr: *mut ()) -> Result<usize, Error> {
    let mut next = ALLOC.lock().unwrap_or_else(|e| e.into_inner());
    for k in 0..CAPACITY {
        let idx = (*next + k) % CAPACITY;
        // A slot becomes or stops being Free only under ALLOC, which we hold.
        let Some(gen) = SLOTS[idx].publish(kind, ptr) else {
            continue;
        };
        *next = idx + 1;
        // Relaxed: changed under ALLOC only.
        LIVE.fetch_add(1, Ordering::Relaxed);
        return Ok(comm_token(idx, gen));
    }
    Err(Error::Full {
        what: "ibnet comm table (open comms per process)",
        cap: CAPACITY,
    })
}

fn bad(op: &'static str) -> Error {
    Error::BadState {
        op,
        state: "not a live ibnet comm of this kind (closed, foreign or corrupt)",
    }
}

fn decode_comm(token: usize) -> Option<(usize, u32)> {
    let v = token as u64;
    (v >> COMM_MARK_SHIFT == COMM_MARK).then_some(((v & 0xffff) as usize, (v >> 16) as u32))
}

/// The comm behind a comm token of one of `kinds`, live or poisoned. Lock-free; never
/// dereferences anything for a stale or foreign token.
#[inline]
pub fn lookup(token: usize, kinds: &[Kind], op: &'static str) -> Result<Found, Error> {
    let (idx, gen) = decode_comm(token).ok_or_else(|| bad(op))?;
    let (ptr, kind, life) = SLOTS[idx].lookup(gen, u32::MAX).ok_or_else(|| bad(op))?;
    if !kinds.contains(&kind) {
        return Err(bad(op));
    }
    Ok(Found { ptr, kind, life })
}

/// A request token for request `id` of the comm with token `comm`.
pub fn request_token(comm: usize, id: ReqId) -> usize {
    let (idx, gen) = decode_comm(comm).unwrap_or((0, 0));
    ((REQ_MARK << REQ_MARK_SHIFT)
        | ((idx as u64) << 40)
        | (((gen & 0xffff) as u64) << 24)
        | (id.to_bits() as u64 & 0xff_ffff)) as usize
}

/// The comm (send or receive) and the request id behind a request token. Lock-free; never
/// dereferences anything for a stale or foreign token.
#[inline]
pub fn lookup_request(token: usize) -> Result<(Found, ReqId), Error> {
    let op = "request";
    let v = token as u64;
    if v >> REQ_MARK_SHIFT != REQ_MARK {
        return Err(Error::BadState {
            op,
            state: "not an ibnet request",
        });
    }
    let (idx, gen16) = decode_request(v);
    match SLOTS[idx].lookup(gen16, 0xffff) {
        Some((ptr, kind @ (Kind::Send | Kind::Recv), life)) => {
            let found = Found { ptr, kind, life };
            Ok((found, ReqId::from_bits((v & 0xff_ffff) as u32)))
        }
        _ => Err(Error::BadState {
            op,
            state: "request of a comm that is closed (stale) or not ours",
        }),
    }
}

fn decode_request(v: u64) -> (usize, u32) {
    (((v >> 40) & 0xffff) as usize, ((v >> 24) & 0xffff) as u32)
}

/// Marks the comm a comm or request token names as poisoned (after a caught panic), if it is
/// live. Lock-free: the slot's state moves `Live(kind)` → `Poisoned(kind)` only if it still
/// holds the token's generation.
pub fn poison(token: usize) {
    let v = token as u64;
    let (idx, gen, gen_mask) = match decode_comm(token) {
        Some((idx, gen)) => (idx, gen, u32::MAX),
        None if v >> REQ_MARK_SHIFT == REQ_MARK => {
            let (idx, gen16) = decode_request(v);
            (idx, gen16, 0xffff)
        }
        None => return,
    };
    SLOTS[idx].poison(gen, gen_mask);
}

/// Frees the slot of a comm token of `kind`, returning its box for the caller to drop. The
/// generation moves on, so the token (and its requests' tokens) are stale from now on.
pub fn remove(token: usize, kind: Kind, op: &'static str) -> Result<*mut (), Error> {
    let _g = ALLOC.lock().unwrap_or_else(|e| e.into_inner());
    let p = lookup(token, &[kind], op)?.ptr;
    let (idx, gen) = decode_comm(token).ok_or(bad(op))?;
    SLOTS[idx].free(gen);
    // Relaxed: changed under ALLOC only.
    LIVE.fetch_sub(1, Ordering::Relaxed);
    Ok(p)
}

/// `mhandle`s are not pointers: they encode the device cache's [`MrHandle`] (the index of the
/// registration's own record, below 2^14, and the record's generation) and the plugin device
/// index (8 bits) under a marker (see the module doc), so a registration hit allocates
/// nothing. A value without the marker, of another device (NCCL passed a handle registered on
/// another device's comm), or whose registration was deregistered (stale; the cache's lookup
/// through the record, also while other registrations keep the entry) is rejected.
const MH_MARK: u64 = 0x1b3;
const MH_MARK_SHIFT: u32 = 54;
const MH_IDX_BITS: u32 = 14;
const MH_DEV_SHIFT: u32 = 46;
const _: () = assert!(MH_MARK < 1 << (64 - MH_MARK_SHIFT));
const _: () = assert!(crate::dev::MR_CACHE_CAPACITY <= 1 << MH_IDX_BITS);
const _: () = assert!(MH_IDX_BITS + 32 <= MH_DEV_SHIFT && MH_DEV_SHIFT + 8 <= MH_MARK_SHIFT);

/// The `mhandle` of registration `h` of device `dev_index`.
pub fn mh_encode(h: MrHandle, dev_index: u8) -> usize {
    let b = h.to_bits();
    let (gen, idx) = (b >> 32, b & 0xffff_ffff);
    ((MH_MARK << MH_MARK_SHIFT) | ((dev_index as u64) << MH_DEV_SHIFT) | (gen << MH_IDX_BITS) | idx)
        as usize
}

/// The registration an `mhandle` names, if it is one of device `dev_index`.
pub fn mh_decode(m: usize, dev_index: u8) -> Result<MrHandle, Error> {
    let v = m as u64;
    if m == 0 {
        return Err(Error::Missing { what: "mhandle" });
    }
    if v >> MH_MARK_SHIFT != MH_MARK {
        return Err(Error::BadState {
            op: "memory handle",
            state: "not an ibnet registration",
        });
    }
    if (v >> MH_DEV_SHIFT) & 0xff != dev_index as u64 {
        return Err(Error::BadState {
            op: "memory handle",
            state: "registered on another device than this comm's",
        });
    }
    let idx = v & ((1 << MH_IDX_BITS) - 1);
    let gen = (v >> MH_IDX_BITS) & 0xffff_ffff;
    Ok(MrHandle::from_bits((gen << 32) | idx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_foreign_and_wrong_kind_tokens_are_rejected() {
        let mut x = 5u32;
        let p = &mut x as *mut u32 as *mut ();
        let t = insert(Kind::Send, p).unwrap();
        let live = Found {
            ptr: p,
            kind: Kind::Send,
            life: Life::Live(Kind::Send),
        };
        assert_eq!(lookup(t, &[Kind::Send], "t").unwrap(), live);
        assert!(matches!(
            lookup(t, &[Kind::Recv], "t"),
            Err(Error::BadState { .. })
        ));
        let id = ReqId::from_bits(0x12_3456);
        let r = request_token(t, id);
        assert_eq!(lookup_request(r).unwrap(), (live, id));
        assert!(lookup_request(t).is_err(), "a comm token is not a request");
        assert!(
            lookup(r, &[Kind::Send], "t").is_err(),
            "a request is not a comm"
        );
        for foreign in [0usize, 1, 0x1000, &x as *const u32 as usize, usize::MAX] {
            assert!(lookup(foreign, &[Kind::Send, Kind::Recv], "t").is_err());
            assert!(lookup_request(foreign).is_err());
        }
        // Poisoned through a request token: lookups still find it (close works), `check`
        // refuses it.
        poison(r);
        let found = lookup(t, &[Kind::Send], "t").unwrap();
        assert_eq!(found.life, Life::Poisoned(Kind::Send));
        assert!(matches!(
            found.life.check("isend"),
            Err(Error::Poisoned {
                op: "isend",
                cause: ibnet_core::ErrorKind::Internal
            })
        ));
        assert_eq!(
            lookup_request(r).unwrap().0.life,
            Life::Poisoned(Kind::Send)
        );
        assert_eq!(remove(t, Kind::Send, "t").unwrap(), p);
        poison(t); // stale: nothing happens
        assert!(lookup(t, &[Kind::Send], "t").is_err(), "stale comm");
        assert!(lookup_request(r).is_err(), "stale request");
        assert!(remove(t, Kind::Send, "t").is_err(), "closed twice");
        // The slot is reused with a new generation: the old tokens stay stale.
        let mut y = 6u32;
        let q = &mut y as *mut u32 as *mut ();
        let idx = decode_comm(t).unwrap().0;
        let u = {
            // Start the search at the freed slot so that it is reused now.
            *ALLOC.lock().unwrap() = idx;
            insert(Kind::Recv, q).unwrap()
        };
        assert_eq!(decode_comm(u).unwrap().0, idx, "slot reused");
        assert_ne!(u, t);
        assert!(lookup(t, &[Kind::Send, Kind::Recv], "t").is_err());
        assert!(lookup_request(r).is_err());
        assert_eq!(
            lookup(u, &[Kind::Recv], "t").unwrap().life,
            Life::Live(Kind::Recv),
            "the stale poison did not reach the reused slot"
        );
        remove(u, Kind::Recv, "t").unwrap();
    }

    /// An mhandle carries its device: one from device 0 used on device 1's comm is an error.
    #[test]
    fn mhandles_are_tied_to_their_device() {
        let h = MrHandle::from_bits((5u64 << 32) | 17);
        let m0 = mh_encode(h, 0);
        let m1 = mh_encode(h, 1);
        assert_ne!(m0, m1);
        assert_eq!(mh_decode(m0, 0).unwrap(), h);
        assert_eq!(mh_decode(m1, 1).unwrap(), h);
        assert!(matches!(
            mh_decode(m0, 1),
            Err(Error::BadState {
                state: "registered on another device than this comm's",
                ..
            })
        ));
        assert!(mh_decode(mh_encode(h, 255), 255).is_ok());
        assert!(mh_decode(0x1234, 0).is_err(), "no marker");
    }
}
