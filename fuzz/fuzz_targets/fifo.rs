//! FIFO element validation: arbitrary bytes in a ring slot, as a peer's RDMA write could leave
//! them, polled by the sender (`FifoRing::poll`).
//!
//! Input: `seq` (u64), then the slot's raw bytes (see `ibnet_fuzz::seeds_fifo`).
//! Oracle: the sender never accepts an element whose check fails. Every element `poll_rails`
//! hands out must be byte-for-byte what the real writer (`FifoRing::publish_rails`) writes for
//! those values and the slot's live-rail mask at that sequence number (so its `check`, `idx`,
//! `nreqs` and `rails` are right), and `poll_rails` never reports a fault for an element that
//! does not verify. `poll` answers as `poll_rails` does, less the mask.
#![no_main]

use ibnet_core::fifo::{PostedRecv, MAX_RECVS};
use ibnet_fuzz::{ring_bytes, Cursor, FuzzRing, FIFO_SLOT_BYTES};
use libfuzzer_sys::fuzz_target;

/// The bytes of an element that the writer defines (addr..check, with the live-rail mask at
/// 28..32; the padding is not part of the protocol).
fn defined(e: &[u8]) -> [u8; 48] {
    let mut a = [0u8; 48];
    a.copy_from_slice(&e[..48]);
    a
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
    let got = ring.poll_rails(seq, &mut out);
    match got {
        Ok(None) => {}
        Ok(Some((n, rails))) => {
            assert!((1..=MAX_RECVS).contains(&n), "{n} elements");
            // What the real writer puts in this slot for these values.
            let model: Box<FuzzRing> = Box::default();
            let (moff, mlen) = model.publish_rails(seq, &out[..n], rails);
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
            // carry exactly what a writer of a k-element slot writes for its values; one whose
            // mask differs from element 0's (a "rails" fault), what a writer of an n0-element
            // slot writes for its values and mask.
            let n0 = u32_at(&ring, off + 20);
            let k = usize::try_from(f.value).unwrap_or(0);
            let in_range = |n: usize| (1..=MAX_RECVS).contains(&n);
            let verifies = |width: usize, rails: Option<u32>| {
                (1..n0 as usize).any(|r| {
                    let e = off + r * 64;
                    let (p, mask) = (read(&ring, e), u32_at(&ring, e + 28));
                    if rails.is_some_and(|m| m != mask) {
                        return false;
                    }
                    let model: Box<FuzzRing> = Box::default();
                    model.publish_rails(seq, &vec![p; width], mask);
                    let have = &ring_bytes(&ring)[e..e + 64];
                    defined(have) == defined(&ring_bytes(&model)[off..off + 64])
                })
            };
            match f.field {
                "nreqs" if !in_range(n0 as usize) => {
                    assert_eq!(f.value, u64::from(n0), "element 0's nreqs is the fault");
                }
                "nreqs" if in_range(k) => {
                    assert!(
                        verifies(k, None),
                        "fault {f:?} but no element verifies with it"
                    );
                }
                "nreqs" => {}
                "rails" => {
                    assert!(in_range(n0 as usize), "{f:?} with element 0's nreqs {n0}");
                    let m = u32::try_from(f.value).expect("a 32-bit mask");
                    assert_ne!(m, u32_at(&ring, off + 28), "element 0 agrees with itself");
                    let w = n0 as usize;
                    assert!(
                        verifies(w, Some(m)),
                        "fault {f:?} but no element verifies with it"
                    );
                }
                other => panic!("unexpected fault field {other}"),
            }
        }
    }
    // Polling is a pure read: the same answer again, and `poll` agrees (less the mask).
    let mut again = [PostedRecv::default(); MAX_RECVS];
    assert_eq!(ring.poll_rails(seq, &mut again), got);
    if let Ok(Some((n, _))) = got {
        assert_eq!(&again[..n], &out[..n]);
    }
    assert_eq!(ring.poll(seq, &mut again), got.map(|o| o.map(|(n, _)| n)));
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
