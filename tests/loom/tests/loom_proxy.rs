//! loom models of the proxy engine's ring protocol (`ibnet_proxy::shared` / `device`):
//! the GPU and the proxy exchange steps through `head`, `tail` and `connFifo` on a 2-slot ring
//! that wraps on the third step. The data slots are loom `UnsafeCell`s, so a slot read while
//! the other side may still write it is reported as a race.
//!
//! * send ring, dedicated buffers: GPU waits for credit, fills, sets size, moves `tail`; the
//!   proxy sees size + tail, reads, resets size to -1, then moves `head`. After getting credit
//!   for a reused slot the GPU must see the reset (size -1).
//! * send ring, shared buffers: no initial credit (`head = -N`); the proxy writes the slot's
//!   offset, then posts the credit; the GPU must see that offset.
//! * recv ring: the proxy fills, moves `tail`; the GPU reads, moves `head`; the proxy reuses a
//!   slot only after `head` covers it.
#![cfg(loom)]

use ibnet_core::sync::AtomicU64;
use ibnet_proxy::shared::{load_step, store_step};
use ibnet_proxy::{DeviceRecv, DeviceSend, RecvMem};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

const N: usize = 2;
const STEPS: u64 = 3;

struct Ring {
    head: AtomicU64,
    mem: RecvMem<N>,
    data: [UnsafeCell<u64>; N],
}

impl Ring {
    fn new(head: u64) -> Arc<Self> {
        Arc::new(Self {
            head: AtomicU64::new(head),
            mem: RecvMem::new(),
            data: [UnsafeCell::new(0), UnsafeCell::new(0)],
        })
    }
    fn write(&self, k: u64, v: u64) {
        // SAFETY (model): loom checks that no other access to the slot is concurrent.
        self.data[RecvMem::<N>::slot(k)].with_mut(|p| unsafe { *p = v });
    }
    fn read(&self, k: u64) -> u64 {
        // SAFETY (model): as in `write`.
        self.data[RecvMem::<N>::slot(k)].with(|p| unsafe { *p })
    }
}

fn payload(k: u64) -> u64 {
    0x1000 + 7 * k
}

/// The GPU of a send ring with dedicated buffers: waits for credit, checks that the proxy
/// reset the slot's size (-1) before handing the credit back, fills the slot, sets its size
/// and moves `tail`, for `STEPS` steps.
fn dedicated_send_gpu(ring: &Arc<Ring>) -> thread::JoinHandle<()> {
    let r = ring.clone();
    thread::spawn(move || {
        let d = DeviceSend::<N>::new(&r.head, &r.mem);
        for k in 0..STEPS {
            while !d.has_credit(k) {
                thread::yield_now();
            }
            assert!(!d.pending(k), "step {k}: size not reset before head moved");
            r.write(k, payload(k));
            d.publish(k, 64 + k);
            d.advance(k + 1);
        }
    })
}

#[test]
fn send_ring_dedicated_resets_size_before_head() {
    loom::model(|| {
        let ring = Ring::new(0);
        let gpu = dedicated_send_gpu(&ring);
        for k in 0..STEPS {
            let size = loop {
                match ring.mem.ready(k, k, true) {
                    Some(s) => break s,
                    None => thread::yield_now(),
                }
            };
            assert_eq!(size, 64 + k);
            assert_eq!(ring.read(k), payload(k));
            ring.mem.retire(k, Some((&ring.head, k + 1)));
        }
        gpu.join().unwrap();
        assert_eq!(load_step(&ring.head), STEPS);
    });
}

/// The same ring with the proxy retiring a run of steps at once, as the engine's plain send
/// pass does (`send_solo::complete`): every slot of the run reset (Relaxed), then one `head`
/// store (Release) for the run. The GPU must still see each reused slot reset.
#[test]
fn send_ring_dedicated_retires_a_run_with_one_head() {
    loom::model(|| {
        let ring = Ring::new(0);
        let gpu = dedicated_send_gpu(&ring);
        let mut k = 0;
        while k < STEPS {
            // The run: every step ready now, at least one (wait for it).
            let mut end = k;
            while end < STEPS && end < k + N as u64 {
                match ring.mem.ready(end, end, true) {
                    Some(size) => {
                        assert_eq!(size, 64 + end);
                        assert_eq!(ring.read(end), payload(end));
                        end += 1;
                    }
                    None if end == k => thread::yield_now(),
                    None => break,
                }
            }
            for s in k..end {
                ring.mem.retire(s, None);
            }
            store_step(&ring.head, end);
            k = end;
        }
        gpu.join().unwrap();
        assert_eq!(load_step(&ring.head), STEPS);
    });
}

#[test]
fn send_ring_shared_credits_publish_offsets() {
    loom::model(|| {
        // Shared-buffer mode: no credit until the proxy posts one (head = -N).
        let ring = Ring::new(0u64.wrapping_sub(N as u64));
        let r = ring.clone();
        let gpu = thread::spawn(move || {
            let d = DeviceSend::<N>::new(&r.head, &r.mem);
            for k in 0..STEPS {
                while !d.has_credit(k) {
                    thread::yield_now();
                }
                assert_eq!(
                    d.offset(k),
                    100 + k as u32,
                    "offset published with the credit"
                );
                r.write(k, payload(k));
                d.publish(k, 1);
                d.advance(k + 1);
            }
        });
        // Proxy: post up to N credits ahead, send, retire.
        let (mut posted, mut done) = (0u64, 0u64);
        while done < STEPS {
            if posted < STEPS && posted < done + N as u64 {
                let slot = RecvMem::<N>::slot(posted);
                ring.mem.conn_fifo[slot].set_offset(100 + posted as u32);
                posted += 1;
                store_step(&ring.head, posted.wrapping_sub(N as u64));
                continue;
            }
            if ring.mem.ready(done, done, true).is_some() {
                assert_eq!(ring.read(done), payload(done));
                // Shared mode retires without moving head: credits come from posting.
                ring.mem.retire(done, None);
                done += 1;
            } else {
                thread::yield_now();
            }
        }
        gpu.join().unwrap();
    });
}

#[test]
fn recv_ring_reuses_slots_only_after_head() {
    loom::model(|| {
        let ring = Ring::new(0);
        let r = ring.clone();
        let gpu = thread::spawn(move || {
            let d = DeviceRecv::<N>::new(&r.head, &r.mem.tail, &r.mem);
            for k in 0..STEPS {
                while !d.arrived(k) {
                    thread::yield_now();
                }
                assert_eq!(d.offset(k), 200 + k as u32);
                assert_eq!(r.read(k), payload(k));
                d.consume(k + 1);
            }
        });
        for k in 0..STEPS {
            // The "network" may fill slot k only once the GPU consumed step k - N.
            while k >= N as u64 && load_step(&ring.head) + (N as u64) <= k {
                thread::yield_now();
            }
            ring.mem.conn_fifo[RecvMem::<N>::slot(k)].set_offset(200 + k as u32);
            ring.write(k, payload(k));
            store_step(&ring.mem.tail, k + 1);
        }
        gpu.join().unwrap();
        assert_eq!(load_step(&ring.head), STEPS);
    });
}
