//! loom model of the FIFO publication protocol (`ibnet_core::fifo`): the receiver (writer)
//! fills a slot and stores `idx` last with Release; the sender (reader) polls `idx` with
//! Acquire and must then see every field of every element of the slot. A 2-slot ring wraps on
//! the third post; the writer reuses a slot only after the reader consumed it, as the real
//! protocol does (a slot is reposted only after the request that used it completed). Each
//! slot carries a live-rail mask (a fused receiver's; it changes from lap to lap, as when a
//! rail fails), which the reader must see whole with the slot. A second model gates the
//! reader's polls on the `is_posted` hint, as the proxy engine's send pass does.
#![cfg(loom)]

use ibnet_core::fifo::{FifoRing, PostedRecv, MAX_RECVS};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

fn elem(seq: u64, r: usize) -> PostedRecv {
    PostedRecv {
        addr: 0x1000 * (seq + 1) + r as u64,
        size: 64 * (seq + 1),
        rkey: 7 + seq as u32,
        tag: r as u32,
    }
}

/// Width of the multi-receive posted at `seq` (1 or 2: a multi-receive crossing the wrap).
fn width(seq: u64) -> usize {
    1 + (seq % 2) as usize
}

/// The live-rail mask posted with `seq` (0b11, then a rail gone: 0b01, ...).
fn rails(seq: u64) -> u32 {
    0b11 >> seq.min(1)
}

#[test]
fn reader_sees_whole_slots_across_wrap_around() {
    wrap_around(false);
}

/// The same, with the reader polling only once `is_posted` (the sender's hint, a Relaxed load
/// of the first element's `idx`, `SendComm::peer_posted`) says the slot is begun: the hint
/// never keeps the reader from a slot the writer posted, and the slot it then reads is whole.
#[test]
fn reader_gated_by_the_is_posted_hint_sees_every_slot_whole() {
    wrap_around(true);
}

fn wrap_around(hint: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let ring = Arc::new(FifoRing::<2>::new());
        let consumed = Arc::new(AtomicU64::new(0));
        const POSTS: u64 = 3;

        let (wr, wc) = (ring.clone(), consumed.clone());
        let writer = thread::spawn(move || {
            for seq in 0..POSTS {
                // Reuse a slot only after the reader consumed its previous lap.
                // Acquire: pairs with the reader's Release store of `consumed`.
                while seq >= wc.load(Ordering::Acquire) + 2 {
                    thread::yield_now();
                }
                let elems: Vec<PostedRecv> = (0..width(seq)).map(|r| elem(seq, r)).collect();
                wr.publish_rails(seq, &elems, rails(seq));
            }
        });

        let mut out = [PostedRecv::default(); MAX_RECVS];
        for seq in 0..POSTS {
            let (n, mask) = loop {
                if hint && !ring.is_posted(seq) {
                    thread::yield_now();
                    continue;
                }
                match ring.poll_rails(seq, &mut out) {
                    Ok(Some(x)) => break x,
                    Ok(None) => thread::yield_now(),
                    Err(f) => panic!("fault {f:?} at seq {seq}"),
                }
            };
            assert_eq!(n, width(seq));
            assert_eq!(mask, rails(seq), "seq {seq}");
            for (r, got) in out[..n].iter().enumerate() {
                assert_eq!(*got, elem(seq, r), "seq {seq} elem {r}");
            }
            // Release: publishes that slot `seq % 2` may be reused (pairs with the writer's Acquire).
            consumed.store(seq + 1, Ordering::Release);
        }
        writer.join().unwrap();
    });
}

#[test]
fn a_stale_lap_is_never_mistaken_for_the_current_one() {
    loom::model(|| {
        let ring = Arc::new(FifoRing::<2>::new());
        let w = ring.clone();
        let writer = thread::spawn(move || {
            w.publish(0, &[elem(0, 0)]);
        });
        let mut out = [PostedRecv::default(); MAX_RECVS];
        // Sequence 2 shares slot 0 with sequence 0 but must not match it.
        assert_eq!(ring.poll(2, &mut out), Ok(None));
        writer.join().unwrap();
        assert_eq!(ring.poll(2, &mut out), Ok(None));
        assert_eq!(ring.poll(0, &mut out), Ok(Some(1)));
        assert_eq!(out[0], elem(0, 0));
    });
}
