//! FIFO element validation: arbitrary bytes in a ring slot, as a peer's RDMA write could leave
//! them, polled by the sender (`FifoRing::poll`).
//!
//! Input: `seq` (u64), then the slot's raw bytes (see `ibnet_fuzz::seeds_fifo`).
//! Oracle: the sender never accepts an element whose check fails. Every element `poll` hands
//! out must be byte-for-byte what the real writer (`FifoRing::publish`) writes for those values
//! at that sequence number (so its `check`, `idx` and `nreqs` are right), and `poll` never
//! reports a fault for an element that does not verify.
#![no_main]

use ibnet_core::fifo::{PostedRecv, MAX_RECVS};
use ibnet_fuzz::{ring_bytes, Cursor, FuzzRing, FIFO_SLOT_BYTES};
use libfuzzer_sys::fuzz_target;

/// The bytes of an element that the writer defines (addr..check; the reserved word and the
/// padding are not part of the protocol).
fn defined(e: &[u8]) -> ([u8; 28], [u8; 16]) {
    let mut a = [0u8; 28];
    let mut b = [0u8; 16];
    a.copy_from_slice(&e[..28]);
    b.copy_from_slice(&e[32..48]);
    (a, b)
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let seq = c.u64();
    // `idx` is seq + 1 and sequence numbers never wrap (64-bit): the sender never polls
    // u64::MAX (`poll` would overflow computing its idx in a debug build).
    if seq == u64::MAX {
        return;
    }
    let bytes = c.take(FIFO_SLOT_BYTES);
    let mut ring: Box<FuzzRing> = Box::default();
    let off = FuzzRing::slot_offset(FuzzRing::slot_of(seq));
    // SAFETY: the ring is plain memory of atomic integers (any bit pattern is valid), owned
    // here through `&mut` (no other access), and `off + bytes.len()` stays inside it: a slot
    // is FIFO_SLOT_BYTES long. This stands for the NIC's write into registered memory.
    unsafe {
        let base = (&mut *ring as *mut FuzzRing).cast::<u8>();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(off), bytes.len());
    }
    let mut out = [PostedRecv::default(); MAX_RECVS];
    let got = ring.poll(seq, &mut out);
    match got {
        Ok(None) => {}
        Ok(Some(n)) => {
            assert!((1..=MAX_RECVS).contains(&n), "{n} elements");
            // What the real writer puts in this slot for these values.
            let model: Box<FuzzRing> = Box::default();
            let (moff, mlen) = model.publish(seq, &out[..n]);
            assert_eq!((moff, mlen), (off, n * 64));
            let want = &ring_bytes(&model)[off..off + mlen];
            let have = &ring_bytes(&ring)[off..off + mlen];
            for i in 0..n {
                let e = i * 64..(i + 1) * 64;
                assert_eq!(
                    defined(&have[e.clone()]),
                    defined(&want[e]),
                    "element {i} of {n} was accepted but is not what a writer writes"
                );
            }
        }
        Err(f) => {
            // A fault is only reported for an element that verifies. An nreqs outside
            // 1..=MAX_RECVS (element 0's, or another element's that differs from it) is not
            // modelled here: no writer produces one, so `publish` cannot say what its check
            // is. An element r whose nreqs k is in range but differs from element 0's must
            // carry exactly what a writer of a k-element slot writes for its values.
            assert_eq!(f.field, "nreqs");
            let n0 = u32_at(&ring, off + 20);
            let k = usize::try_from(f.value).unwrap_or(0);
            let in_range = |n: usize| (1..=MAX_RECVS).contains(&n);
            if !in_range(n0 as usize) {
                assert_eq!(f.value, u64::from(n0), "element 0's nreqs is the fault");
            } else if in_range(k) {
                let verified = (1..n0 as usize).any(|r| {
                    let e = off + r * 64;
                    let p = read(&ring, e);
                    let model: Box<FuzzRing> = Box::default();
                    model.publish(seq, &vec![p; k]);
                    let have = &ring_bytes(&ring)[e..e + 64];
                    defined(have) == defined(&ring_bytes(&model)[off..off + 64])
                });
                assert!(verified, "fault {f:?} but no element verifies with it");
            }
        }
    }
    // Polling is a pure read: the same answer again.
    let mut again = [PostedRecv::default(); MAX_RECVS];
    assert_eq!(ring.poll(seq, &mut again), got);
    if let Ok(Some(n)) = got {
        assert_eq!(&again[..n], &out[..n]);
    }
});

fn u32_at(r: &FuzzRing, at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&ring_bytes(r)[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(r: &FuzzRing, at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&ring_bytes(r)[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The values of the element at byte `e` (layout: addr, size, rkey, nreqs, tag).
fn read(r: &FuzzRing, e: usize) -> PostedRecv {
    PostedRecv {
        addr: u64_at(r, e),
        size: u64_at(r, e + 8),
        rkey: u32_at(r, e + 16),
        tag: u32_at(r, e + 24),
    }
}
