//! The tokens NCCL holds for our comms and requests: never pointers, but indices into a
//! fixed-capacity table of comm slots, each with a generation.
//!
//! ```text
//!  comm token     [63..48] COMM_MARK  [47..16] slot generation (32 bits)  [15..0] slot index
//!  request token  [63..56] REQ_MARK   [55..40] slot index  [39..24] generation (low 16 bits)
//!                 [23..0]  the core's ReqId (request slot index + its own generation)
//!
//!  SLOTS[i] = { state: generation << 8 | kind (0 = free), ptr: the comm's box }
//! ```
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

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

use ibnet_core::request::ReqId;
use ibnet_core::Error;

const _: () = assert!(usize::BITS == 64, "tokens are 64-bit values");

/// Slots in the table: the most comms (listen + send + receive) open at once per process.
pub const CAPACITY: usize = 1 << 16;

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

impl Kind {
    fn from_raw(k: u64) -> Option<Self> {
        match k {
            1 => Some(Self::Listen),
            2 => Some(Self::Send),
            3 => Some(Self::Recv),
            _ => None,
        }
    }
}

const COMM_MARK: u64 = 0x1bcc;
const COMM_MARK_SHIFT: u32 = 48;
const REQ_MARK: u64 = 0x5e;
const REQ_MARK_SHIFT: u32 = 56;
const KIND_BITS: u32 = 8;
const KIND_MASK: u64 = (1 << KIND_BITS) - 1;
const _: () = assert!(CAPACITY == 1 << 16, "a token's index field is 16 bits");

struct Slot {
    /// `generation << 8 | kind`; kind 0 is a free slot.
    state: AtomicU64,
    /// The comm's box while the slot is in use.
    ptr: AtomicPtr<()>,
}

static SLOTS: [Slot; CAPACITY] = [const {
    Slot {
        state: AtomicU64::new(0),
        ptr: AtomicPtr::new(core::ptr::null_mut()),
    }
}; CAPACITY];

/// Where the next free-slot search starts (control path, under the mutex).
static ALLOC: Mutex<usize> = Mutex::new(0);

fn gen_of(state: u64) -> u32 {
    (state >> KIND_BITS) as u32
}

fn comm_token(idx: usize, gen: u32) -> usize {
    ((COMM_MARK << COMM_MARK_SHIFT) | ((gen as u64) << 16) | idx as u64) as usize
}

/// Puts `ptr` (a leaked box of `kind`) into a free slot and returns its comm token.
pub fn insert(kind: Kind, ptr: *mut ()) -> Result<usize, Error> {
    let mut next = ALLOC.lock().unwrap_or_else(|e| e.into_inner());
    for k in 0..CAPACITY {
        let idx = (*next + k) % CAPACITY;
        let s = &SLOTS[idx];
        // Relaxed: slots change state only under ALLOC, which we hold.
        let st = s.state.load(Ordering::Relaxed);
        if st & KIND_MASK != 0 {
            continue;
        }
        // Relaxed: published by the Release store of `state` just below.
        s.ptr.store(ptr, Ordering::Relaxed);
        // Release pairs with the Acquire load in `lookup`: a matching state implies `ptr`.
        s.state
            .store((st & !KIND_MASK) | kind as u64, Ordering::Release);
        *next = idx + 1;
        return Ok(comm_token(idx, gen_of(st)));
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

/// The box behind a comm token of one of `kinds`, and its kind. Lock-free; never dereferences
/// anything for a stale or foreign token.
pub fn lookup(token: usize, kinds: &[Kind], op: &'static str) -> Result<(*mut (), Kind), Error> {
    let (idx, gen) = decode_comm(token).ok_or(bad(op))?;
    let s = &SLOTS[idx];
    // Acquire pairs with the Release store in `insert` (makes `ptr` visible).
    let st = s.state.load(Ordering::Acquire);
    let kind = Kind::from_raw(st & KIND_MASK).ok_or(bad(op))?;
    if gen_of(st) != gen || !kinds.contains(&kind) {
        return Err(bad(op));
    }
    // Relaxed: ordered after the Acquire load above.
    Ok((s.ptr.load(Ordering::Relaxed), kind))
}

/// A request token for request `id` of the comm with token `comm`.
pub fn request_token(comm: usize, id: ReqId) -> usize {
    let (idx, gen) = decode_comm(comm).unwrap_or((0, 0));
    ((REQ_MARK << REQ_MARK_SHIFT)
        | ((idx as u64) << 40)
        | (((gen & 0xffff) as u64) << 24)
        | (id.to_bits() as u64 & 0xff_ffff)) as usize
}

/// The comm box, its kind and the request id behind a request token. Lock-free; never
/// dereferences anything for a stale or foreign token.
pub fn lookup_request(token: usize) -> Result<(*mut (), Kind, ReqId), Error> {
    let op = "request";
    let v = token as u64;
    if v >> REQ_MARK_SHIFT != REQ_MARK {
        return Err(Error::BadState {
            op,
            state: "not an ibnet request",
        });
    }
    let idx = ((v >> 40) & 0xffff) as usize;
    let gen16 = ((v >> 24) & 0xffff) as u32;
    let s = &SLOTS[idx];
    // Acquire pairs with the Release store in `insert` (makes `ptr` visible).
    let st = s.state.load(Ordering::Acquire);
    let kind = Kind::from_raw(st & KIND_MASK);
    match kind {
        Some(k @ (Kind::Send | Kind::Recv)) if gen_of(st) & 0xffff == gen16 => {
            // Relaxed: ordered after the Acquire load above.
            let p = s.ptr.load(Ordering::Relaxed);
            Ok((p, k, ReqId::from_bits((v & 0xff_ffff) as u32)))
        }
        _ => Err(Error::BadState {
            op,
            state: "request of a comm that is closed (stale) or not ours",
        }),
    }
}

/// The comm slot a comm or request token names, if it is live (for poisoning after a panic).
pub fn lookup_any(token: usize) -> Option<(*mut (), Kind)> {
    lookup(token, &[Kind::Listen, Kind::Send, Kind::Recv], "comm")
        .ok()
        .or_else(|| lookup_request(token).ok().map(|(p, k, _)| (p, k)))
}

/// Frees the slot of a comm token of `kind`, returning its box for the caller to drop. The
/// generation moves on, so the token (and its requests' tokens) are stale from now on.
pub fn remove(token: usize, kind: Kind, op: &'static str) -> Result<*mut (), Error> {
    let _g = ALLOC.lock().unwrap_or_else(|e| e.into_inner());
    let (p, _) = lookup(token, &[kind], op)?;
    let (idx, gen) = decode_comm(token).ok_or(bad(op))?;
    let s = &SLOTS[idx];
    // Relaxed: the box is handed back to the caller (this thread); no reader may use it after
    // close (plugin contract), and a later lookup fails on the state below.
    s.ptr.store(core::ptr::null_mut(), Ordering::Relaxed);
    // Release pairs with the Acquire loads in `lookup*`: they see the new generation.
    s.state
        .store((gen.wrapping_add(1) as u64) << KIND_BITS, Ordering::Release);
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_foreign_and_wrong_kind_tokens_are_rejected() {
        let mut x = 5u32;
        let p = &mut x as *mut u32 as *mut ();
        let t = insert(Kind::Send, p).unwrap();
        assert_eq!(lookup(t, &[Kind::Send], "t").unwrap(), (p, Kind::Send));
        assert!(matches!(
            lookup(t, &[Kind::Recv], "t"),
            Err(Error::BadState { .. })
        ));
        let id = ReqId::from_bits(0x12_3456);
        let r = request_token(t, id);
        assert_eq!(lookup_request(r).unwrap(), (p, Kind::Send, id));
        assert!(lookup_request(t).is_err(), "a comm token is not a request");
        assert!(
            lookup(r, &[Kind::Send], "t").is_err(),
            "a request is not a comm"
        );
        for foreign in [0usize, 1, 0x1000, &x as *const u32 as usize, usize::MAX] {
            assert!(lookup(foreign, &[Kind::Send, Kind::Recv], "t").is_err());
            assert!(lookup_request(foreign).is_err());
        }
        assert_eq!(remove(t, Kind::Send, "t").unwrap(), p);
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
        remove(u, Kind::Recv, "t").unwrap();
    }
}
