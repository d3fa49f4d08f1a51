//! NCCL's `NCCL_IB_RESILIENCY_PORT_FAILOVER*` on fused comms over loopback rails
//! (`ibnet_core::fused::Resilience`): failover off fails the comm as a plain comm would; a
//! failure no other rail can mend (an access error) fails it even with failover on, as NCCL
//! treats only flush and retry-exceeded as recoverable; the probe delay holds lost parts back
//! until the caller's clock passes it; the attempt limit fails a message whose carrier failed
//! too often. Bytes verified wherever a message completes.

use ibnet_core::comm::{CommConfig, Done};
use ibnet_core::error::{Error, ErrorKind};
use ibnet_core::fused::{stripe, FusedBuf, FusedRecv, FusedSend, Resilience, MAX_DEVS_PER_NIC};
use ibnet_core::lifecycle::Lifecycle;
use ibnet_core::provider::{MrKeys, WcStatus};
use ibnet_core::request::ReqId;
use ibnet_testkit::{fill_pattern, AlignedBuf, Fault, Loopback};

struct Pair {
    rails: Vec<Loopback>,
    s: Box<FusedSend<Loopback>>,
    r: Box<FusedRecv<Loopback>>,
}

fn pair(n: usize, res: Resilience) -> Pair {
    let rails: Vec<Loopback> = (0..n).map(|_| Loopback::new()).collect();
    let (mut s, mut r) =
        ibnet_testkit::fused_pair(&rails, CommConfig::default()).expect("fused pair");
    s.set_resilience(res);
    r.set_resilience(res);
    Pair { rails, s, r }
}

fn reg(rails: &[Loopback], b: &AlignedBuf) -> [MrKeys; MAX_DEVS_PER_NIC] {
    let mut k = [MrKeys::default(); MAX_DEVS_PER_NIC];
    for (i, d) in rails.iter().enumerate() {
        k[i] = d.register(b.addr(), b.len() as u64).expect("register").0;
    }
    k
}

/// A message of `size` bytes posted at both ends, `arm` run between the receive and the
/// send: (send request or its error, receive request, send buffer, receive buffer).
#[allow(clippy::type_complexity)]
fn start(
    p: &mut Pair,
    size: usize,
    arm: impl FnOnce(&[Loopback]),
) -> (ibnet_core::Result<ReqId>, ReqId, AlignedBuf, AlignedBuf) {
    let mut sb = AlignedBuf::new(size);
    fill_pattern(sb.as_mut_slice(), size as u64);
    let rb = AlignedBuf::new(size);
    let (sk, rk) = (reg(&p.rails, &sb), reg(&p.rails, &rb));
    let buf = FusedBuf {
        addr: rb.addr(),
        size: size as u64,
        tag: 5,
        mrs: rk,
    };
    let rid = p.r.irecv(&[buf]).expect("irecv").expect("posted");
    arm(&p.rails);
    let n = p.rails.len();
    let sid =
        p.s.isend(sb.addr(), size as u64, 5, &sk[..n])
            .map(|s| s.expect("receive posted"));
    (sid, rid, sb, rb)
}

/// Tests `id` until done or failed (a bound on a hang, not a timing).
fn finish(mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> ibnet_core::Result<Done> {
    for _ in 0..10_000 {
        if let Some(d) = f()? {
            return Ok(d);
        }
    }
    panic!("request neither completed nor failed");
}

fn fail_next(rail: &Loopback, after: u64, status: WcStatus) {
    rail.inject(Fault::FailWr { after, status });
}

#[test]
fn failover_off_fails_the_comm_on_a_rail_failure() {
    let mut p = pair(
        2,
        Resilience {
            failover: false,
            ..Resilience::default()
        },
    );
    let (sid, _rid, _sb, _rb) = start(&mut p, 1 << 20, |r| {
        fail_next(&r[1], 0, WcStatus::RetryExceeded)
    });
    let e = sid.and_then(|id| finish(|| p.s.test(id)).map(|_| id));
    match e {
        Err(Error::Completion {
            status: WcStatus::RetryExceeded,
            ..
        }) => {}
        r => panic!("failover off: expected the rail's error, got {r:?}"),
    }
    assert!(
        p.s.take_events().is_empty(),
        "no rail event: the comm failed"
    );
    let again = p.s.isend(0, 0, 5, &[MrKeys::default(); 2]);
    assert!(
        matches!(
            again,
            Err(Error::Poisoned {
                cause: ErrorKind::Remote,
                ..
            })
        ),
        "{again:?}"
    );
}

#[test]
fn an_access_error_is_not_failed_over() {
    let mut p = pair(2, Resilience::default());
    let (sid, _rid, _sb, _rb) = start(&mut p, 1 << 20, |r| {
        fail_next(&r[1], 0, WcStatus::RemoteAccessError)
    });
    let e = sid.and_then(|id| finish(|| p.s.test(id)).map(|_| id));
    assert!(
        matches!(
            e,
            Err(Error::Completion {
                status: WcStatus::RemoteAccessError,
                ..
            })
        ),
        "a remote access error fails the comm (NCCL: only flush and retry-exceeded recover): \
         {e:?}"
    );
    assert_eq!(p.s.resent_bytes(), 0, "nothing written again");
}

#[test]
fn lost_parts_wait_for_the_probe_delay() {
    let mut p = pair(
        2,
        Resilience {
            probe_delay_ms: 50,
            ..Resilience::default()
        },
    );
    p.s.tick(1000);
    let size = (1 << 20) + 3;
    let (sid, rid, sb, rb) = start(&mut p, size, |r| {
        fail_next(&r[1], 0, WcStatus::RetryExceeded)
    });
    let sid = sid.expect("isend");
    for now in [1000, 1010, 1049] {
        p.s.tick(now);
        for _ in 0..100 {
            assert_eq!(p.s.test(sid).expect("test"), None, "at {now} ms");
        }
        assert_eq!(p.s.resent_bytes(), 0, "nothing written again at {now} ms");
    }
    p.s.tick(1050);
    let sd = finish(|| p.s.test(sid)).expect("send");
    assert_eq!(sd.sizes[0], size as u64);
    assert_eq!(p.s.resent_bytes(), stripe(size as u64, 2)[1].len);
    let rd = finish(|| p.r.test(rid)).expect("receive");
    assert_eq!(rd.sizes[0], size as u64);
    assert_eq!(rb.as_slice(), sb.as_slice(), "every byte");
}

/// Three rails: rail 2's part fails, and its carrier (rail 0, the first live rail) fails
/// too: one failed attempt. A limit of 0 fails the comm; a limit of 1 lets rail 1 carry it.
#[test]
fn the_attempt_limit_fails_a_message_whose_carrier_failed_too_often() {
    for (limit, survives) in [(Some(0), false), (Some(1), true), (None, true)] {
        let mut p = pair(
            3,
            Resilience {
                max_attempts: limit,
                ..Resilience::default()
            },
        );
        let size = 3 << 20;
        // Rail 0: its own part goes (WR 0), the moved part of rail 2 (WR 1) fails.
        let (sid, rid, sb, rb) = start(&mut p, size, |r| {
            fail_next(&r[0], 1, WcStatus::RetryExceeded);
            fail_next(&r[2], 0, WcStatus::RetryExceeded);
        });
        let r = sid.and_then(|id| finish(|| p.s.test(id)));
        if !survives {
            assert!(
                matches!(
                    r,
                    Err(Error::Completion {
                        status: WcStatus::RetryExceeded,
                        ..
                    })
                ),
                "limit {limit:?}: {r:?}"
            );
            continue;
        }
        assert_eq!(r.expect("send").sizes[0], size as u64, "limit {limit:?}");
        let rd = finish(|| p.r.test(rid)).expect("receive");
        assert_eq!(rd.sizes[0], size as u64);
        assert_eq!(rb.as_slice(), sb.as_slice(), "every byte, limit {limit:?}");
        assert!(p.s.rail_live(1) && !p.s.rail_live(0) && !p.s.rail_live(2));
    }
}

/// The variables, as `Params` reads them: unset is ibnet's default (failover on, which
/// NCCL's is not), set is NCCL's meaning; malformed values are refused naming the variable.
#[test]
fn the_variables_map_to_resilience() {
    use ibnet_core::params::Params;
    let p = Params::default();
    assert_eq!(Resilience::from_params(&p), Resilience::default());
    assert!(Resilience::from_params(&p).failover, "ibnet's default: on");
    assert!(!p.ib_resiliency_port_recovery, "NCCL's default: off");
    let mut p = Params::default();
    for (n, v) in [
        ("NCCL_IB_RESILIENCY_PORT_FAILOVER", "0"),
        ("NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS", "1"),
        ("NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY", "0x0a"),
        ("NCCL_IB_RESILIENCY_PORT_RECOVERY", "1"),
        ("NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY", "20"),
        ("NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX", "3"),
        ("NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT", "100"),
    ] {
        assert!(ibnet_core::config::find(n).is_some(), "{n} is declared");
        assert_eq!(p.set(n, v), Ok(true), "{n}={v}");
    }
    assert_eq!(
        Resilience::from_params(&p),
        Resilience {
            failover: false,
            max_attempts: Some(1),
            probe_delay_ms: 10,
            recovery: true,
            start_delay_ms: 20,
            attempts_max: 3,
            ack_timeout_ms: 100,
        }
    );
    assert!(p.ib_resiliency_port_recovery);
    assert_eq!(p.ib_resiliency_port_recovery_start_delay, 20);
    assert_eq!(p.ib_resiliency_port_recovery_attempts_max, 3);
    assert_eq!(p.ib_resiliency_port_recovery_ack_timeout, 100);
    // NCCL's alive-message knobs have no counterpart (ibnet probes with one RDMA READ): they
    // are declared as refused, so ffi WARNs once per variable set and the plugin ignores them.
    for n in [
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_INTERVAL",
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE",
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_SEQUENCE_SIZE",
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT",
    ] {
        let var = ibnet_core::config::find(n).expect("declared");
        assert!(
            matches!(var.refusal("5"), Ok(Some(_))),
            "{n}=5 is refused by name"
        );
        assert_eq!(p.set(n, "5"), Ok(false), "{n} is not the plugin's");
    }
    for (n, v) in [
        ("NCCL_IB_RESILIENCY_PORT_FAILOVER", "on"),
        ("NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS", "-1"),
        ("NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY", "10ms"),
        (
            "NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT",
            "99999999999",
        ),
    ] {
        match Params::default().set(n, v) {
            Err(Error::Param { name, .. }) => assert_eq!(name, n),
            r => panic!("{n}={v}: {r:?}"),
        }
    }
}

/// Failback over loopback rails: rail 1 fails (retry exceeded) and fails over; past the start
/// delay both sides bring it back (READY, reset, probe, JOIN); messages posted before the
/// return (their masks name rail 1 or not) and after it all arrive whole, later messages
/// are striped over rail 1 again, and each side reports the return once. Both ends' lifecycle
/// follows: ready, rail-degraded while rail 1 is out, ready again once it returned.
#[test]
fn a_failed_rail_returns_once_both_sides_brought_it_back() {
    let mut p = pair(
        2,
        Resilience {
            recovery: true,
            start_delay_ms: 10,
            ..Resilience::default()
        },
    );
    let clock = |p: &mut Pair, t: u64| {
        p.s.tick(t);
        p.r.tick(t);
    };
    clock(&mut p, 100);
    let both = |p: &Pair| (p.s.lifecycle(), p.r.lifecycle());
    assert_eq!(both(&p), (Lifecycle::Ready, Lifecycle::Ready));
    let size = (1 << 20) + 5;
    let (sid, rid, sb, rb) = start(&mut p, size, |r| {
        fail_next(&r[1], 0, WcStatus::RetryExceeded)
    });
    assert_eq!(
        finish(|| p.s.test(sid.unwrap())).unwrap().sizes[0],
        size as u64
    );
    assert_eq!(finish(|| p.r.test(rid)).unwrap().sizes[0], size as u64);
    assert_eq!(rb.as_slice(), sb.as_slice());
    assert!(!p.s.rail_live(1) && !p.r.rail_live(1));
    assert_eq!(both(&p), (Lifecycle::RailDegraded, Lifecycle::RailDegraded));
    // Before the start delay nothing comes back.
    let whole = |p: &mut Pair, n: usize| {
        let (sid, rid, sb, rb) = start(p, n, |_| {});
        let sd = finish(|| p.s.test(sid.unwrap())).unwrap();
        let rd = finish(|| p.r.test(rid)).unwrap();
        assert_eq!((sd.sizes[0], rd.sizes[0]), (n as u64, n as u64));
        assert_eq!(rb.as_slice(), sb.as_slice(), "{n} B");
    };
    clock(&mut p, 105);
    whole(&mut p, 70_000);
    assert!(
        !p.s.rail_live(1) && !p.r.rail_live(1),
        "start delay not over"
    );
    assert_eq!(both(&p), (Lifecycle::RailDegraded, Lifecycle::RailDegraded));
    // Past it: a receive posted now finds the sender READY, resets, probes and joins.
    let before = p.s.rail_bytes(1);
    for (t, n) in [1, 300, 70_000, 1 << 20].into_iter().enumerate() {
        // A millisecond per message: the receiver reads READY again a millisecond on.
        clock(&mut p, 111 + t as u64);
        whole(&mut p, n);
    }
    assert!(
        p.s.rail_live(1) && p.r.rail_live(1),
        "both ends use rail 1 again"
    );
    assert!(p.s.rail_bytes(1) > before, "rail 1 carries its share again");
    assert_eq!(
        both(&p),
        (Lifecycle::Ready, Lifecycle::Ready),
        "every rail back"
    );
    assert_eq!(
        p.s.take_returned().as_slice(),
        &[1],
        "the sender's one report"
    );
    assert_eq!(
        p.r.take_returned().as_slice(),
        &[1],
        "the receiver's one report"
    );
    // It can fail again, and fails over again.
    let (sid, rid, sb, rb) = start(&mut p, size, |r| {
        fail_next(&r[1], 0, WcStatus::RetryExceeded)
    });
    assert_eq!(
        finish(|| p.s.test(sid.unwrap())).unwrap().sizes[0],
        size as u64
    );
    assert_eq!(finish(|| p.r.test(rid)).unwrap().sizes[0], size as u64);
    assert_eq!(rb.as_slice(), sb.as_slice());
    assert!(!p.s.rail_live(1));
    assert_eq!(p.s.lifecycle(), Lifecycle::RailDegraded);
    assert_eq!(p.s.requests_in_use(), 0);
    assert_eq!(p.r.requests_in_use(), 0);
}

/// Without `recovery` (NCCL's default) a failed rail stays out however long it waits.
#[test]
fn without_recovery_a_failed_rail_stays_out() {
    let mut p = pair(2, Resilience::default());
    let (sid, rid, _sb, _rb) = start(&mut p, 1 << 20, |r| {
        fail_next(&r[1], 0, WcStatus::RetryExceeded)
    });
    finish(|| p.s.test(sid.unwrap())).unwrap();
    finish(|| p.r.test(rid)).unwrap();
    p.s.tick(1_000_000);
    p.r.tick(1_000_000);
    let (sid, rid, _sb, _rb) = start(&mut p, 1 << 20, |_| {});
    finish(|| p.s.test(sid.unwrap())).unwrap();
    finish(|| p.r.test(rid)).unwrap();
    assert!(!p.s.rail_live(1) && !p.r.rail_live(1));
    assert!(p.s.take_returned().is_empty());
}
