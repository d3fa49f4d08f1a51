//! The sizes FIFO (a multi-receive reports each send's bytes; a peer's impossible size is an
//! error) and the plugin-level profiler events (one stop per start, descriptors as NCCL 2.28
//! fills them), over the loopback provider.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

use ibnet_core::comm::{
    CommConfig, Done, QpEvent, QpEvents, QpOp, RecvBuf, RecvComm, SendComm, Sink,
};
use ibnet_core::error::{Error, ErrorKind};
use ibnet_core::fifo::{FifoRing, MAX_RECVS, MAX_REQUESTS};
use ibnet_core::provider::MrKeys;
use ibnet_core::request::ReqId;
use ibnet_testkit::{connect_pair, fill_pattern, AlignedBuf, Loopback};

fn reg(dev: &Loopback, b: &AlignedBuf) -> MrKeys {
    dev.register(b.addr(), b.len() as u64).expect("register").0
}

fn wait(mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> ibnet_core::Result<Done> {
    for _ in 0..100_000 {
        if let Some(d) = f()? {
            return Ok(d);
        }
    }
    panic!("request never completed");
}

fn until_some(mut f: impl FnMut() -> ibnet_core::Result<Option<ReqId>>) -> ReqId {
    for _ in 0..1000 {
        if let Some(id) = f().expect("post") {
            return id;
        }
    }
    panic!("never accepted");
}

/// A multi-receive of `sends.len()` buffers of `posted` bytes each, and its sends; `tamper`
/// runs on the receiver's sizes FIFO row after the data landed and before `test`.
fn multi(
    cfg: CommConfig,
    sends: &[usize],
    posted: usize,
    parents: &[usize],
    sink: Option<Sink>,
    tamper: impl FnOnce(&[AtomicU32]),
) -> (
    ibnet_core::Result<Done>,
    SendComm<Loopback>,
    RecvComm<Loopback>,
) {
    let dev = Loopback::new();
    let (mut s, mut r) = connect_pair(&dev, cfg).expect("connect");
    s.set_events(sink);
    r.set_events(sink);
    let n = sends.len();
    let mut srcs: Vec<AlignedBuf> = sends.iter().map(|&z| AlignedBuf::new(z.max(1))).collect();
    let dsts: Vec<AlignedBuf> = (0..n).map(|_| AlignedBuf::new(posted.max(1))).collect();
    let bufs: Vec<RecvBuf> = dsts
        .iter()
        .enumerate()
        .map(|(i, d)| RecvBuf {
            addr: d.addr(),
            size: posted as u64,
            tag: i as u32,
            mr: reg(&dev, d),
        })
        .collect();
    let rid = r.irecv_under(&bufs, parents).unwrap().unwrap();
    let mut sids = Vec::new();
    for (i, src) in srcs.iter_mut().enumerate() {
        fill_pattern(src.as_mut_slice(), 40 + i as u64);
        let k = reg(&dev, src);
        let parent = parents.get(i).copied().unwrap_or(0);
        sids.push(until_some(|| {
            s.isend_under(src.addr(), sends[i] as u64, i as u32, k, parent)
        }));
    }
    for sid in sids {
        assert_eq!(wait(|| s.test(sid)).unwrap().n, 1);
    }
    // The receiver's sizes FIFO is what its answer advertised; slot 0 holds this receive.
    let base = r.local_info().fifo.expect("sizes FIFO").addr;
    // SAFETY: `base` is the receiver's live sizes FIFO (`MAX_REQUESTS` rows of `MAX_RECVS`
    // 32-bit atomics, 4-byte aligned), which outlives this borrow; only atomics touch it.
    let row = unsafe { std::slice::from_raw_parts(base as *const AtomicU32, MAX_RECVS) };
    tamper(row);
    let d = wait(|| r.test(rid));
    if d.is_ok() {
        for (i, z) in sends.iter().enumerate() {
            assert_eq!(&dsts[i].as_slice()[..*z], &srcs[i].as_slice()[..*z]);
        }
    }
    (d, s, r)
}

#[test]
fn multi_receive_reports_each_sends_bytes_with_and_without_split() {
    let sends = [0usize, 1, 130, 4096, 7, 0, 65_536, 300];
    for cfg in [
        CommConfig::default(),
        CommConfig {
            nqps: 3,
            split_data: true,
            ..CommConfig::default()
        },
    ] {
        let (d, _, _) = multi(cfg, &sends, 1 << 17, &[], None, |_| {});
        let d = d.unwrap();
        assert_eq!(d.n, 8);
        let want: Vec<u64> = sends.iter().map(|&z| z as u64).collect();
        assert_eq!(&d.sizes[..], &want[..], "{cfg:?}");
    }
    assert_eq!(
        FifoRing::<MAX_REQUESTS>::SIZES_BYTES,
        MAX_REQUESTS * MAX_RECVS * 4
    );
}

#[test]
fn a_size_beyond_the_posted_buffer_is_an_error_naming_the_receive() {
    let (d, _, mut r) = multi(CommConfig::default(), &[10, 20], 64, &[], None, |row| {
        // Relaxed: `r.test` reads the row later on this thread (program order), after the
        // sends completed, so no peer write can overwrite it.
        row[1].store(65, Ordering::Relaxed);
    });
    let e = d.unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadSize {
                index: 1,
                size: 65,
                posted: 64,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.kind(), ErrorKind::Remote);
    // The comm is poisoned: later calls fail fast.
    assert!(matches!(r.irecv(&[]), Err(Error::Poisoned { .. })));
}

#[test]
fn a_size_disagreeing_with_the_immediate_is_an_error() {
    // Send 0 was empty (bit 0 clear), yet its row says 5 bytes.
    let (d, _, _) = multi(CommConfig::default(), &[0, 20], 64, &[], None, |row| {
        // Relaxed: as in the test above.
        row[0].store(5, Ordering::Relaxed);
    });
    assert!(
        matches!(
            d,
            Err(Error::BadSize {
                index: 0,
                size: 5,
                ..
            })
        ),
        "{d:?}"
    );
}

/// A counting sink: every start gets a fresh handle, kept open under (ctx, request, QP) until
/// a stop names it.
struct Counting {
    next: AtomicUsize,
    starts: Mutex<Vec<(usize, QpEvent, usize)>>,
    open: Mutex<Vec<(usize, u8, u8, usize)>>,
    stops: Mutex<Vec<usize>>,
}

impl QpEvents for Counting {
    fn start(&self, ctx: usize, req: u8, qp: u8, parent: usize, ev: &QpEvent) {
        // Relaxed: a counter; the Mutexes order the records.
        let h = 0x1000 + self.next.fetch_add(1, Ordering::Relaxed);
        self.starts.lock().unwrap().push((parent, *ev, h));
        self.open.lock().unwrap().push((ctx, req, qp, h));
    }
    fn stop(&self, ctx: usize, req: u8, qp: Option<u8>) {
        let mut open = self.open.lock().unwrap();
        let hit =
            |o: &(usize, u8, u8, usize)| o.0 == ctx && o.1 == req && qp.is_none_or(|q| q == o.2);
        self.stops
            .lock()
            .unwrap()
            .extend(open.iter().filter(|o| hit(o)).map(|o| o.3));
        open.retain(|o| !hit(o));
    }
}

fn counting() -> &'static Counting {
    Box::leak(Box::new(Counting {
        next: AtomicUsize::new(0),
        starts: Mutex::new(Vec::new()),
        open: Mutex::new(Vec::new()),
        stops: Mutex::new(Vec::new()),
    }))
}

#[test]
fn profiler_events_start_per_buffer_and_qp_and_stop_once_each() {
    let c = counting();
    let sink = Sink {
        events: c,
        ctx: 0x5151,
        device: 3,
    };
    let cfg = CommConfig {
        nqps: 2,
        split_data: true,
        ..CommConfig::default()
    };
    let sends = [256usize, 0, 1000];
    // Parent 0 (send/buffer 1) starts nothing, as NCCL's callback needs a parent.
    let parents = [0x51, 0, 0x53];
    let (d, _, _) = multi(cfg, &sends, 4096, &parents, Some(sink), |_| {});
    assert_eq!(&d.unwrap().sizes[..3], &[256, 0, 1000]);
    let starts = c.starts.lock().unwrap().clone();
    let stops = c.stops.lock().unwrap().clone();
    // Receives: 2 buffers with a parent × 2 QPs; sends: 2 sends with a parent × 2 QPs.
    let recv: Vec<_> = starts.iter().filter(|s| s.1.op == QpOp::Recv).collect();
    let send: Vec<_> = starts.iter().filter(|s| s.1.op != QpOp::Recv).collect();
    assert_eq!((recv.len(), send.len()), (4, 4), "{starts:#?}");
    assert!(starts.iter().all(|s| s.0 == 0x51 || s.0 == 0x53));
    assert!(starts.iter().all(|s| s.1.device == 3));
    // Each QP carried half of each send (128-byte chunks): 128 + 128 and 512 + 488 bytes.
    let mut lens: Vec<(usize, u64)> = send.iter().map(|s| (s.0, s.1.length)).collect();
    lens.sort();
    assert_eq!(lens, [(0x51, 128), (0x51, 128), (0x53, 488), (0x53, 512)]);
    // Two different QPs per request.
    assert_ne!(recv[0].1.qpn, recv[2].1.qpn);
    // Every started event stopped exactly once.
    let mut started: Vec<usize> = starts.iter().map(|s| s.2).collect();
    let mut stopped = stops.clone();
    started.sort();
    stopped.sort();
    assert_eq!(started, stopped);
}

#[test]
fn without_a_sink_no_event_is_started() {
    let c = counting();
    let (d, _, _) = multi(CommConfig::default(), &[5, 6], 64, &[1, 2], None, |_| {});
    assert_eq!(&d.unwrap().sizes[..2], &[5, 6]);
    assert!(c.starts.lock().unwrap().is_empty());
}
