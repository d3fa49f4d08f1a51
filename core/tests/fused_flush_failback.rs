//! A fused receive comm's flush QP (GPU-direct's loopback RDMA READ) after failback: a flush
//! that failed on rail 1 takes the rail out (NCCL counts a flush error as recoverable); once the
//! rail is back, the next flush must use it without failing again. Before the fix, failback
//! reset the rail's data QPs but not its flush QP, which stayed in the error state, so the first
//! flush after failback took the rail out again.

use ibnet_core::comm::{CommConfig, Done};
use ibnet_core::fused::{FusedBuf, FusedRecv, FusedSend, Resilience, MAX_DEVS_PER_NIC};
use ibnet_core::lifecycle::Lifecycle;
use ibnet_core::provider::{MrKeys, WcStatus};
use ibnet_testkit::{fill_pattern, AlignedBuf, Fault, Loopback};

struct Pair {
    rails: Vec<Loopback>,
    s: Box<FusedSend<Loopback>>,
    r: Box<FusedRecv<Loopback>>,
}

fn reg(rails: &[Loopback], b: &AlignedBuf) -> [MrKeys; MAX_DEVS_PER_NIC] {
    let mut k = [MrKeys::default(); MAX_DEVS_PER_NIC];
    for (i, d) in rails.iter().enumerate() {
        k[i] = d.register(b.addr(), b.len() as u64).expect("register").0;
    }
    k
}

/// Tests until done or failed (a bound on a hang, not a timing).
fn finish(mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> ibnet_core::Result<Done> {
    for _ in 0..10_000 {
        if let Some(d) = f()? {
            return Ok(d);
        }
    }
    panic!("request neither completed nor failed");
}

/// One message of `n` bytes, bytes verified, then (with `flush`) a flush of its buffer; `arm`
/// runs between the message and the flush. Returns the flush's outcome (`None`: nothing to
/// flush, or no flush asked).
fn message_then_flush(
    p: &mut Pair,
    n: usize,
    flush: bool,
    arm: impl FnOnce(&[Loopback]),
) -> Option<ibnet_core::Result<Done>> {
    let mut sb = AlignedBuf::new(n);
    fill_pattern(sb.as_mut_slice(), n as u64);
    let rb = AlignedBuf::new(n);
    let (sk, rk) = (reg(&p.rails, &sb), reg(&p.rails, &rb));
    let buf = FusedBuf {
        addr: rb.addr(),
        size: n as u64,
        tag: 9,
        mrs: rk,
    };
    let rid = p.r.irecv(&[buf]).expect("irecv").expect("posted");
    let rails = p.rails.len();
    let sid =
        p.s.isend(sb.addr(), n as u64, 9, &sk[..rails])
            .expect("isend")
            .expect("receive posted");
    finish(|| p.s.test(sid)).expect("send done");
    assert_eq!(
        finish(|| p.r.test(rid)).expect("recv done").sizes[0],
        n as u64
    );
    assert_eq!(rb.as_slice(), sb.as_slice(), "{n} B");
    if !flush {
        return None;
    }
    arm(&p.rails);
    let fid = p.r.iflush(&[buf]).expect("iflush")?;
    Some(finish(|| p.r.test(fid)))
}

#[test]
fn a_flush_after_failback_uses_the_returned_rail() {
    let rails: Vec<Loopback> = (0..2).map(|_| Loopback::new()).collect();
    let cfg = CommConfig {
        gdr_flush: true,
        ..CommConfig::default()
    };
    let (mut s, mut r) = ibnet_testkit::fused_pair(&rails, cfg).expect("fused pair");
    let res = Resilience {
        recovery: true,
        start_delay_ms: 10,
        ..Resilience::default()
    };
    s.set_resilience(res);
    r.set_resilience(res);
    let mut p = Pair { rails, s, r };
    let clock = |p: &mut Pair, t: u64| {
        p.s.tick(t);
        p.r.tick(t);
    };
    clock(&mut p, 100);
    // Rail 1's flush READ fails: the flush still completes (rail 0's), rail 1 goes out.
    let flushed = message_then_flush(&mut p, 1 << 16, true, |r| {
        r[1].inject(Fault::FailWr {
            after: 0,
            status: WcStatus::RetryExceeded,
        })
    });
    assert!(
        flushed.expect("something to flush").is_ok(),
        "rail 0's flush"
    );
    assert!(!p.r.rail_live(1), "the flush's failure took rail 1 out");
    // Past the start delay (counted from when each end learnt of the failure), messages (no
    // flushes) bring rail 1 back at both ends.
    for t in 0..8u64 {
        clock(&mut p, 120 + 20 * t);
        message_then_flush(&mut p, 70_000, false, |_| {});
    }
    assert!(p.s.rail_live(1) && p.r.rail_live(1), "rail 1 is back");
    assert_eq!(p.r.lifecycle(), Lifecycle::Ready);
    // The flushes after failback use rail 1 and keep it.
    for t in 0..3u64 {
        clock(&mut p, 300 + t);
        let d = message_then_flush(&mut p, 1 << 16, true, |_| {}).expect("something to flush");
        assert!(d.is_ok(), "flush {t} after failback: {d:?}");
        assert!(
            p.r.rail_live(1),
            "flush {t} after failback took rail 1 out again"
        );
    }
    assert_eq!(p.r.lifecycle(), Lifecycle::Ready);
}
