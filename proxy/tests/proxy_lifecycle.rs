//! The proxy engine's lifecycle and error paths: connection maps, shared comm and pool
//! reference counts, errors by variant for bad input (stale ids, wrong direction, a hostile
//! size from the GPU, capacity limits), profiler events, and zero allocations during progress.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ibnet_core::Error;
use ibnet_proxy::map::Side;
use ibnet_proxy::{
    Bank, DeviceRecv, DeviceSend, Dir, OpEvent, Profiler, Protocol, ProxyOp, SetupReq, SubArgs,
    MAX_SUBS, MODE_NORMAL, MODE_OFFSET, STEPS,
};
use ibnet_testkit::proxy::{self, connect_pairs, new_px, Px, Scenario};

struct Counting;
thread_local!(static COUNT: Cell<Option<usize>> = const { Cell::new(None) });

// SAFETY: forwards to the system allocator; counts calls made on a thread that asked for it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get().map(|n| n + 1)));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn big_stack(f: impl FnOnce() + Send) {
    std::thread::scope(|t| {
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn_scoped(t, f)
            .unwrap()
            .join()
            .unwrap()
    })
}

/// Drives one SIMPLE op pair with an inline "GPU" on this thread (no allocation anywhere).
fn inline_op(px: &mut Px, s: ibnet_proxy::ConnId, r: ibnet_proxy::ConnId, k0: u64) -> u64 {
    let sv = px.device_view(s).unwrap();
    let rv = px.device_view(r).unwrap();
    // SAFETY: both connections stay connected during this function.
    let gs = unsafe { DeviceSend::from_view(&sv) }.unwrap();
    // SAFETY: as above.
    let gr = unsafe { DeviceRecv::from_view(&rv) }.unwrap();
    let n = 20;
    let mut so = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1).unwrap();
    let mut ro = ProxyOp::new(Dir::Recv, Protocol::Simple, 1, 1).unwrap();
    so.push(SubArgs::new(s, n, 1 << 20)).unwrap();
    ro.push(SubArgs::new(r, n, 1 << 20)).unwrap();
    let (mut ks, mut kr) = (k0, k0);
    let (mut sd, mut rd) = (false, false);
    while !(sd && rd) {
        while ks < k0 + n && gs.has_credit(ks) {
            gs.publish(ks, 1000);
            gs.advance(ks + 1);
            ks += 1;
        }
        sd = sd || px.progress(&mut so).unwrap().done;
        rd = rd || px.progress(&mut ro).unwrap().done;
        while gr.arrived(kr) {
            kr += 1;
            gr.consume(kr);
        }
    }
    assert_eq!((so.bytes(0), ro.bytes(0)), (20 * 1000, 20 * 1000));
    kr
}

#[test]
fn progress_allocates_nothing() {
    big_stack(|| {
        let sc = Scenario::simple();
        let mut px = new_px(&sc, false);
        let (s, r) = connect_pairs(&mut px, &sc).unwrap();
        let mut k = inline_op(&mut px, s[0], r[0], 0); // warm up
        COUNT.with(|c| c.set(Some(0)));
        for _ in 0..50 {
            k = inline_op(&mut px, s[0], r[0], k);
        }
        let n = COUNT.with(|c| c.replace(None));
        assert_eq!(n, Some(0), "allocations during 1,000 steps of progress");
    });
}

#[test]
fn connect_map_describes_dedicated_and_shared_connections() {
    big_stack(|| {
        let sc = Scenario::simple();
        let mut px = new_px(&sc, false);
        let (s, r) = connect_pairs(&mut px, &sc).unwrap();
        let m = px.map(s[0]).unwrap();
        assert_eq!(m.shared, 0);
        for p in Protocol::ALL {
            let b = m.buffs[p.index()];
            assert!(
                !b.is_null() && b.bank() == Bank::Host,
                "{p:?} buffer in the host bank"
            );
        }
        assert!(m.pointer(m.send_mem, Side::Cpu).is_some());
        let v = px.device_view(r[0]).unwrap();
        // SAFETY: host memory, connection alive.
        let (_, _, mem) = unsafe { ibnet_proxy::device::words(&v) }.unwrap();
        assert!(mem
            .conn_fifo
            .iter()
            .all(|f| f.size().is_none() && f.mode() == MODE_NORMAL));

        let sh = Scenario {
            shared: true,
            use_gdr: true,
            nsubs: 3,
            ..Scenario::simple()
        };
        let mut px2 = new_px(&sh, false);
        let (s2, r2) = connect_pairs(&mut px2, &sh).unwrap();
        let m2 = px2.map(s2[1]).unwrap();
        assert_eq!(m2.shared, 1);
        let simple = m2.buffs[Protocol::Simple.index()];
        assert_eq!((simple.bank(), simple.offset()), (Bank::SharedDevice, 0));
        assert!(
            m2.buffs[Protocol::Ll.index()].is_null(),
            "no LL buffer unless asked for"
        );
        // One pool per direction, one shared comm per direction, referenced by 3 connections.
        assert_eq!(px2.live(), (6, 2, 2));
        assert_eq!(px2.net().live_comms(), (1, 1));
        let v2 = px2.device_view(r2[2]).unwrap();
        // SAFETY: as above.
        let (_, _, mem2) = unsafe { ibnet_proxy::device::words(&v2) }.unwrap();
        assert!(mem2.conn_fifo.iter().all(|f| f.mode() == MODE_OFFSET));
        // Freeing releases exactly what each took: the comm closes with its last user.
        px2.free(s2[0]).unwrap();
        px2.free(r2[0]).unwrap();
        assert_eq!(px2.net().live_comms(), (1, 1));
        px2.free(s2[1]).unwrap();
        px2.free(r2[1]).unwrap();
        px2.free(s2[2]).unwrap();
        px2.free(r2[2]).unwrap();
        assert_eq!(px2.live(), (0, 0, 0));
        assert_eq!(px2.net().live_comms(), (0, 0));
        assert_eq!(px2.mem().live(), 0);
        // A freed id is stale.
        assert_eq!(
            px2.free(s2[0]),
            Err(Error::Missing {
                what: "proxy connection"
            })
        );
        assert!(matches!(px2.device_view(r2[0]), Err(Error::Missing { .. })));
        for (a, b) in s.into_iter().zip(r) {
            px.free(a).unwrap();
            px.free(b).unwrap();
        }
    });
}

#[test]
fn free_before_connect_closes_the_listener() {
    big_stack(|| {
        let sc = Scenario::simple();
        let mut px = new_px(&sc, false);
        let (r, h) = px.setup(Dir::Recv, SetupReq::default()).unwrap();
        assert!(h.is_some());
        assert_eq!(px.net().live_listens_and_mrs(), (1, 0));
        px.free(r).unwrap();
        assert_eq!(px.net().live_listens_and_mrs(), (0, 0));
        assert_eq!(px.live(), (0, 0, 0));
    });
}

#[test]
fn bad_input_is_an_error_by_variant() {
    big_stack(|| {
        let sc = Scenario::simple();
        let mut px = new_px(&sc, false);
        let (s, r) = connect_pairs(&mut px, &sc).unwrap();
        // Wrong direction.
        let mut op = ProxyOp::new(Dir::Recv, Protocol::Simple, 1, 1).unwrap();
        op.push(SubArgs::new(s[0], 1, 10)).unwrap();
        assert!(matches!(px.progress(&mut op), Err(Error::BadState { .. })));
        // Out-of-range op parameters.
        assert!(matches!(
            ProxyOp::<proxy::Net>::new(Dir::Send, Protocol::Simple, 0, 1),
            Err(Error::OutOfRange {
                what: "slice_steps",
                ..
            })
        ));
        let mut op = ProxyOp::<proxy::Net>::new(Dir::Send, Protocol::Simple, 2, 2).unwrap();
        assert!(matches!(
            op.push(SubArgs::new(s[0], 3, 10)),
            Err(Error::OutOfRange { .. })
        ));
        for _ in 0..MAX_SUBS {
            op.push(SubArgs::new(s[0], 2, 10)).unwrap();
        }
        assert_eq!(
            op.push(SubArgs::new(s[0], 2, 10)),
            Err(Error::Full {
                what: "proxy op subs",
                cap: MAX_SUBS
            })
        );
        // An op without subs is done at once (it used to divide by zero).
        for dir in [Dir::Send, Dir::Recv] {
            let mut op = ProxyOp::new(dir, Protocol::Simple, 1, 1).unwrap();
            assert!(px.progress(&mut op).unwrap().done);
        }
        // Registered mode needs a shared-buffer connection.
        let mut op = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1).unwrap();
        op.push(SubArgs::registered(s[0], 0x1000, 64)).unwrap();
        assert!(matches!(px.progress(&mut op), Err(Error::BadState { .. })));
        // A hostile size from the GPU is refused, not sent (checked when the step could be
        // sent: the receiver has posted).
        let mut ro = ProxyOp::new(Dir::Recv, Protocol::Simple, 1, 1).unwrap();
        ro.push(SubArgs::new(r[0], 1, 1 << 20)).unwrap();
        assert!(!px.progress(&mut ro).unwrap().done);
        let v = px.device_view(s[0]).unwrap();
        // SAFETY: connection alive, host memory.
        let g = unsafe { DeviceSend::from_view(&v) }.unwrap();
        let mut op = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1).unwrap();
        op.push(SubArgs::new(s[0], 1, 1 << 20)).unwrap();
        let base = px.progress(&mut op).map(|_| op.base(0)).unwrap();
        g.publish(base, (v.buff_sizes[2] / STEPS + 1) as u64);
        g.advance(base + 1);
        assert!(matches!(
            px.progress(&mut op),
            Err(Error::OutOfRange {
                what: "connFifo size from the GPU",
                ..
            })
        ));
        px.abort(&mut op).unwrap();
        px.abort(&mut ro).unwrap();
        // Setup errors: channel beyond the shared pools.
        let bad = SetupReq {
            shared: true,
            channel: 99,
            ..SetupReq::default()
        };
        assert!(matches!(
            px.setup(Dir::Send, bad),
            Err(Error::OutOfRange { .. })
        ));
        px.free(s[0]).unwrap();
        px.free(r[0]).unwrap();
        assert_eq!(px.live(), (0, 0, 0));
    });
}

#[derive(Default)]
struct Events {
    starts: usize,
    done: [u64; 2],
    stops: usize,
}

impl Profiler for Events {
    fn op_start(&mut self, _: Dir, _: usize, _: u64, _: usize) {
        self.starts += 1;
    }
    fn op_state(&mut self, _: usize, e: OpEvent, step: u64, _: u64) {
        match e {
            OpEvent::SendDone => self.done[0] = step,
            OpEvent::RecvDone => self.done[1] = step,
            _ => {}
        }
    }
    fn op_stop(&mut self, _: usize) {
        self.stops += 1;
    }
}

#[test]
fn profiler_sees_op_and_step_events() {
    let mut ev = Events::default();
    let r = proxy::run_with(
        Scenario {
            ops: 10,
            max_slices: 3,
            ..Scenario::simple()
        },
        &mut ev,
    );
    assert_eq!(r.ops, 10);
    assert_eq!(
        (ev.starts, ev.stops),
        (20, 20),
        "one start and stop per sub of each op"
    );
    assert!(ev.done[0] >= 1 && ev.done[1] >= 1);
}
