//! Fused comms over two to four loopback "devices" (one loopback fabric per rail): messages
//! striped across the rails with every byte verified, traffic on every rail, multi-receives,
//! and rail failover: a rail whose writes fail (retry exceeded) hands its parts to a healthy
//! rail, the receiver completes from the notice, and no byte is lost or counted twice. Once
//! both sides know a rail is dead, later messages are striped over the live rails only: no byte
//! of theirs is written again and no notice is written for them (counted per rail in WRs).
//!
//! The loopback double executes a write when it is posted and `isend` tests the new message's
//! parts at once, so a failing write is seen in its own message's `isend`: the parts in flight
//! at a failure are that message's (or, for a multi-receive, whose rail posts all of a group's
//! parts together, the group's).

use ibnet_core::comm::{CommConfig, Done};
use ibnet_core::comm::{RecvBuf, RecvComm};
use ibnet_core::error::{Error, ErrorKind};
use ibnet_core::fused::{stripe, FusedBuf, FusedRecv, FusedSend, MAX_DEVS_PER_NIC};
use ibnet_core::provider::{MrKeys, WcStatus};
use ibnet_core::request::ReqId;
use ibnet_core::wire::RemoteBuf;
use ibnet_testkit::{fill_pattern, AlignedBuf, Fault, Loopback};

struct Pair {
    rails: Vec<Loopback>,
    s: Box<FusedSend<Loopback>>,
    r: Box<FusedRecv<Loopback>>,
}

fn pair(n: usize) -> Pair {
    pair_with(n, CommConfig::default())
}

fn pair_with(n: usize, cfg: CommConfig) -> Pair {
    let rails: Vec<Loopback> = (0..n).map(|_| Loopback::new()).collect();
    let (s, r) = ibnet_testkit::fused_pair(&rails, cfg).expect("fused pair");
    Pair { rails, s, r }
}

/// The buffer's keys on every rail.
fn reg(rails: &[Loopback], b: &AlignedBuf) -> [MrKeys; MAX_DEVS_PER_NIC] {
    let mut k = [MrKeys::default(); MAX_DEVS_PER_NIC];
    for (i, d) in rails.iter().enumerate() {
        k[i] = d.register(b.addr(), b.len() as u64).expect("register").0;
    }
    k
}

fn wait(mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> Done {
    for _ in 0..10_000 {
        if let Some(d) = f().expect("test") {
            return d;
        }
    }
    panic!("request never completed");
}

fn post_recv(p: &mut Pair, rb: &AlignedBuf, rk: [MrKeys; MAX_DEVS_PER_NIC], tag: u32) -> ReqId {
    let buf = FusedBuf {
        addr: rb.addr(),
        size: rb.len() as u64,
        tag,
        mrs: rk,
    };
    p.r.irecv(&[buf]).expect("irecv").expect("posted")
}

fn send(
    p: &mut Pair,
    sb: &AlignedBuf,
    size: usize,
    sk: [MrKeys; MAX_DEVS_PER_NIC],
    tag: u32,
) -> ReqId {
    let n = p.rails.len();
    p.s.isend(sb.addr(), size as u64, tag, &sk[..n])
        .expect("isend")
        .expect("receive posted")
}

/// One message of `size` bytes (pattern `seed`) through `p`, bytes and sizes checked.
fn one(p: &mut Pair, size: usize, seed: u64) {
    let mut sb = AlignedBuf::new(size.max(1));
    fill_pattern(sb.as_mut_slice(), seed);
    let rb = AlignedBuf::new(size.max(1) + 4096);
    let (sk, rk) = (reg(&p.rails, &sb), reg(&p.rails, &rb));
    let rid = post_recv(p, &rb, rk, 7);
    let sid = send(p, &sb, size, sk, 7);
    let sd = wait(|| p.s.test(sid));
    let rd = wait(|| p.r.test(rid));
    assert_eq!(sd.sizes[0], size as u64);
    assert_eq!((rd.n, rd.sizes[0]), (1, size as u64), "{size} B");
    assert_eq!(&rb.as_slice()[..size], &sb.as_slice()[..size], "{size} B");
    assert!(
        rb.as_slice()[size..].iter().all(|&b| b == 0),
        "nothing past the send"
    );
}

/// [`one`], returning the send WRs each rail posted for it (both sides: a receiver's
/// clear-to-send, a sender's part; a moved part or a notice would add one).
fn one_counted(p: &mut Pair, size: usize, seed: u64) -> Vec<u64> {
    let before: Vec<u64> = p.rails.iter().map(Loopback::wrs_posted).collect();
    one(p, size, seed);
    p.rails
        .iter()
        .zip(before)
        .map(|(d, b)| d.wrs_posted() - b)
        .collect()
}

#[test]
fn messages_are_striped_over_every_rail_byte_for_byte() {
    for n in 1..=MAX_DEVS_PER_NIC {
        let mut p = pair(n);
        for (i, size) in [0usize, 1, 127, 129, 1000, 4096, 65_537, (1 << 20) + 3]
            .into_iter()
            .enumerate()
        {
            let before: Vec<u64> = p.rails.iter().map(Loopback::wrs_posted).collect();
            one(&mut p, size, i as u64 + 1);
            for (r, d) in p.rails.iter().enumerate() {
                // Each rail posts its clear-to-send and its part's write-with-immediate.
                assert!(
                    d.wrs_posted() >= before[r] + 2,
                    "rail {r} of {n} idle at {size} B"
                );
            }
        }
        assert_eq!(p.s.requests_in_use(), 0);
        assert_eq!(p.r.requests_in_use(), 0);
        p.s.close().unwrap();
        p.r.close().unwrap();
    }
}

#[test]
fn a_multi_receive_reports_each_sends_bytes_across_rails() {
    let mut p = pair(2);
    let sizes = [0usize, 100, 5000, 300];
    let mut sbs = Vec::new();
    let mut rbs = Vec::new();
    let mut bufs = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        let mut sb = AlignedBuf::new(s.max(1));
        fill_pattern(sb.as_mut_slice(), 50 + i as u64);
        let rb = AlignedBuf::new(8192);
        bufs.push(FusedBuf {
            addr: rb.addr(),
            size: 8192,
            tag: 10 + i as u32,
            mrs: reg(&p.rails, &rb),
        });
        sbs.push(sb);
        rbs.push(rb);
    }
    let rid = p.r.irecv(&bufs).unwrap().unwrap();
    // Sends in reverse tag order: each matches its own receive on both rails.
    let mut sids = Vec::new();
    for i in (0..sizes.len()).rev() {
        let sk = reg(&p.rails, &sbs[i]);
        sids.push(send(&mut p, &sbs[i], sizes[i], sk, 10 + i as u32));
    }
    for id in sids {
        wait(|| p.s.test(id));
    }
    let d = wait(|| p.r.test(rid));
    assert_eq!(d.n, 4);
    for (i, &s) in sizes.iter().enumerate() {
        // The sum of the rails' parts, each from its rail's sizes FIFO row.
        assert_eq!(d.sizes[i], s as u64, "receive {i}");
        assert_eq!(
            &rbs[i].as_slice()[..s],
            &sbs[i].as_slice()[..s],
            "receive {i}"
        );
    }
}

#[test]
fn a_failed_rail_hands_its_parts_to_a_healthy_one_and_no_byte_is_lost() {
    let mut p = pair(2);
    let size = (1 << 20) + 77;
    let mut sb = AlignedBuf::new(size);
    fill_pattern(sb.as_mut_slice(), 9);
    let rb = AlignedBuf::new(size);
    let (sk, rk) = (reg(&p.rails, &sb), reg(&p.rails, &rb));
    let rid = post_recv(&mut p, &rb, rk, 1);
    // The next WR on rail 1 is the sender's part: it fails as when the link went down.
    p.rails[1].inject(Fault::FailWr {
        after: 0,
        status: WcStatus::RetryExceeded,
    });
    let sid = send(&mut p, &sb, size, sk, 1);
    let sd = wait(|| p.s.test(sid));
    assert_eq!(sd.sizes[0], size as u64);
    let ev = p.s.take_events();
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].rail, ev[0].to), (1, Some(0)));
    assert!(matches!(
        ev[0].error,
        Error::Completion {
            status: WcStatus::RetryExceeded,
            ..
        }
    ));
    let moved = stripe(size as u64, 2)[1].len;
    assert_eq!(
        p.s.resent_bytes(),
        moved,
        "exactly rail 1's part went again"
    );
    assert!(!p.s.rail_live(1) && p.s.rail_live(0));

    let rd = wait(|| p.r.test(rid));
    assert_eq!(rd.sizes[0], size as u64, "counted once");
    assert_eq!(rb.as_slice(), sb.as_slice(), "every byte");
    let ev = p.r.take_events();
    assert_eq!((ev.len(), ev[0].rail, ev[0].to), (1, 1, Some(0)));
    // The receiver learned it from the sender's notice: the event says so, readably (the
    // plugin's WARN quotes it), and is the peer's doing (reported as remote).
    assert!(
        matches!(ev[0].error, Error::RailDroppedByPeer { .. }),
        "{:?}",
        ev[0].error
    );
    assert_eq!(
        ev[0].error.to_string(),
        "the sender moved this rail's traffic to another rail"
    );
    assert_eq!(ev[0].error.kind(), ErrorKind::Remote);
    assert!(!p.r.rail_live(1));

    // Later messages go over rail 0 alone: nothing of theirs is written again, no notice.
    for (i, size) in [0usize, 1, 300, 70_000].into_iter().enumerate() {
        assert_eq!(one_counted(&mut p, size, 100 + i as u64), [2, 0]);
    }
    assert_eq!(p.s.resent_bytes(), moved, "later messages: 0 bytes re-sent");
    assert_eq!(p.s.requests_in_use(), 0);
    assert_eq!(p.r.requests_in_use(), 0);
}

/// With two QPs per rail, the writes of a failover (a moved part, notices: no immediate, no
/// receive consumed) leave the data QPs' turn alone: each later send still goes on the QP the
/// receiver posted its receive on, so every later message keeps its exact size and bytes
/// (three such writes, an odd number, used to shift the sender's round robin by one).
#[test]
fn failover_writes_leave_the_data_qps_turn_alone() {
    let cfg = CommConfig {
        nqps: 2,
        ..CommConfig::default()
    };
    let mut p = pair_with(2, cfg);
    let size = 100_000;
    let mut sbs: Vec<AlignedBuf> = (0..2).map(|_| AlignedBuf::new(size)).collect();
    let rbs: Vec<AlignedBuf> = (0..2).map(|_| AlignedBuf::new(size)).collect();
    let mut rids = Vec::new();
    for (i, rb) in rbs.iter().enumerate() {
        fill_pattern(sbs[i].as_mut_slice(), 500 + i as u64);
        let rk = reg(&p.rails, rb);
        rids.push(post_recv(&mut p, rb, rk, 2));
    }
    // The first message's part on rail 1 fails: moved and told (two writes on rail 0); the
    // second, posted over both rails, is striped over rail 0 and its empty rail-1 part told
    // (a third).
    p.rails[1].inject(Fault::FailWr {
        after: 0,
        status: WcStatus::RetryExceeded,
    });
    for sb in &sbs {
        let sk = reg(&p.rails, sb);
        let id = send(&mut p, sb, size, sk, 2);
        assert_eq!(wait(|| p.s.test(id)).sizes[0], size as u64);
    }
    for (i, id) in rids.into_iter().enumerate() {
        assert_eq!(wait(|| p.r.test(id)).sizes[0], size as u64, "message {i}");
        assert_eq!(rbs[i].as_slice(), sbs[i].as_slice(), "message {i}");
    }
    for (i, size) in [5000usize, 1, 70_000, 300].into_iter().enumerate() {
        one(&mut p, size, 600 + i as u64);
    }
}

#[test]
fn failover_with_many_messages_in_flight_keeps_every_message_whole() {
    let mut p = pair(3);
    let size = 200_000;
    let k = 8;
    let mut sbs: Vec<AlignedBuf> = (0..k).map(|_| AlignedBuf::new(size)).collect();
    let rbs: Vec<AlignedBuf> = (0..k).map(|_| AlignedBuf::new(size)).collect();
    let mut rids = Vec::new();
    for (i, rb) in rbs.iter().enumerate() {
        fill_pattern(sbs[i].as_mut_slice(), 1000 + i as u64);
        let rk = reg(&p.rails, rb);
        rids.push(post_recv(&mut p, rb, rk, 3));
    }
    // Rail 2 fails on its third data write from now (the first two messages' parts land).
    p.rails[2].inject(Fault::FailWr {
        after: 2,
        status: WcStatus::RetryExceeded,
    });
    let mut sids = Vec::new();
    for sb in &sbs {
        let sk = reg(&p.rails, sb);
        sids.push(send(&mut p, sb, size, sk, 3));
    }
    for id in sids {
        assert_eq!(wait(|| p.s.test(id)).sizes[0], size as u64);
    }
    for (i, id) in rids.into_iter().enumerate() {
        assert_eq!(wait(|| p.r.test(id)).sizes[0], size as u64, "message {i}");
        assert_eq!(rbs[i].as_slice(), sbs[i].as_slice(), "message {i}");
    }
    let part = stripe(size as u64, 3)[2].len;
    // Messages 0 and 1 were acknowledged on rail 2; message 2's part was in flight when it
    // failed and went again. Messages 3..8, whose receives were posted over all three rails,
    // were striped over rails 0 and 1 (rail 2's part empty, told by a notice): nothing of
    // theirs went twice.
    assert_eq!(p.s.resent_bytes(), part);
    assert_eq!(p.s.rail_bytes(2), 3 * part, "rail 2 carried messages 0..3");
    assert_eq!(p.s.take_events().len(), 1);
    assert!(!p.r.rail_live(2), "the notices told the receiver");
    assert_eq!(one_counted(&mut p, size, 2000), [2, 2, 0]);
    assert_eq!(p.s.resent_bytes(), part);
}

#[test]
fn a_rail_only_the_receiver_sees_fail_is_dropped_by_the_sender_too() {
    let mut p = pair(2);
    let size = 300_000;
    let mut sb = AlignedBuf::new(size);
    fill_pattern(sb.as_mut_slice(), 77);
    let rb = AlignedBuf::new(size);
    let (sk, rk) = (reg(&p.rails, &sb), reg(&p.rails, &rb));
    // The receiver's clear-to-send on rail 1 fails: the sender never sees that rail's receive.
    p.rails[1].inject(Fault::FailWr {
        after: 0,
        status: WcStatus::RetryExceeded,
    });
    let rid = post_recv(&mut p, &rb, rk, 4);
    let mut sid = None;
    for _ in 0..100 {
        sid =
            p.s.isend(sb.addr(), size as u64, 4, &sk[..2])
                .expect("isend");
        if sid.is_some() {
            break;
        }
        // The receiver's progress (NCCL's proxy drives both) finds the failure and says so.
        assert!(p.r.test(rid).expect("recv test").is_none());
    }
    let sid = sid.expect("the sender stopped waiting for rail 1");
    assert_eq!(wait(|| p.s.test(sid)).sizes[0], size as u64);
    assert_eq!(wait(|| p.r.test(rid)).sizes[0], size as u64);
    assert_eq!(rb.as_slice(), sb.as_slice());
    let (se, re) = (p.s.take_events(), p.r.take_events());
    assert_eq!((se.len(), se[0].rail, se[0].to), (1, 1, Some(0)));
    assert_eq!((re.len(), re[0].rail, re[0].to), (1, 1, Some(0)));
    // Nothing was in flight on rail 1: the sender never posted there.
    assert_eq!(p.s.resent_bytes(), 0);
    assert_eq!(one_counted(&mut p, 5000, 78), [2, 0]);
    assert_eq!(p.s.resent_bytes(), 0);
}

#[test]
fn no_healthy_rail_left_is_the_comms_error() {
    let mut p = pair(2);
    let size = 10_000;
    let mut sb = AlignedBuf::new(size);
    fill_pattern(sb.as_mut_slice(), 3);
    let rb = AlignedBuf::new(size);
    let (sk, rk) = (reg(&p.rails, &sb), reg(&p.rails, &rb));
    let _rid = post_recv(&mut p, &rb, rk, 1);
    for d in &p.rails {
        d.inject(Fault::FailWr {
            after: 0,
            status: WcStatus::RetryExceeded,
        });
    }
    // The error surfaces in isend itself (its first step moves the parts) or in test.
    let mut err = None;
    match p.s.isend(sb.addr(), size as u64, 1, &sk[..2]) {
        Err(e) => err = Some(e),
        Ok(sid) => {
            let sid = sid.expect("receive posted");
            for _ in 0..100 {
                match p.s.test(sid) {
                    Ok(Some(_)) => panic!("completed without a rail"),
                    Ok(None) => {}
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
        }
    }
    let e = err.expect("an error");
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
    assert!(matches!(
        p.s.isend(sb.addr(), 1, 1, &sk[..2]),
        Err(Error::Poisoned { .. })
    ));
    let ev = p.s.take_events();
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[1].to, None);
}

/// A fused comm is written in place on the heap (`FusedSend::init`, `FusedRecv::init`), never
/// whole on the stack: a four-rail pair (about 190 KB + 160 KB) is built in a debug build on a
/// 1 MiB stack, half a test thread's (returning the comms by value overflowed 2 MiB; building
/// one plain send/receive pair takes about 600 KB of a debug build's stack, and the fused pair
/// about as much, since it makes its rails' comms one at a time).
#[test]
fn a_fused_comm_is_built_on_a_small_stack() {
    assert!(core::mem::size_of::<FusedSend<Loopback>>() > 128 << 10);
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            let p = pair(4);
            assert_eq!(p.s.rails(), 4);
            assert!(p.r.local_info(3).is_some());
        })
        .expect("spawn")
        .join()
        .expect("built on a small stack");
}

/// A fused comm whose set-up fails part way (rail 1's peer info is unusable, after rail 0's
/// comm was made) is an error, and everything made so far is released.
#[test]
fn a_fused_comm_that_fails_part_way_releases_what_it_made() {
    let rails: Vec<Loopback> = (0..2).map(|_| Loopback::new()).collect();
    let cfg = CommConfig::default();
    let s = ibnet_testkit::fused_send(&rails, cfg).expect("fused send");
    let mut infos: Vec<_> = (0..2).map(|i| s.local_info(i).unwrap()).collect();
    infos[1].fifo = None;
    let before: Vec<_> = rails
        .iter()
        .map(|d| (d.live_qps(), d.live_cqs(), d.live_mrs()))
        .collect();
    let e = ibnet_testkit::fused_recv(&rails, cfg, &infos)
        .err()
        .expect("refused");
    assert!(matches!(e, Error::Wire { .. }), "{e:?}");
    let after: Vec<_> = rails
        .iter()
        .map(|d| (d.live_qps(), d.live_cqs(), d.live_mrs()))
        .collect();
    assert_eq!(before, after);
    drop(s);
    for d in &rails {
        assert_eq!((d.live_qps(), d.live_cqs(), d.live_mrs()), (0, 0, 0));
    }
}

/// The eight different sizes of the failover multi-receives: empty, inside rail 0's stripe,
/// and spread over every rail.
const GROUP: [usize; 8] = [0, 1, 100, 129, 4096, 5000, 70_001, 300_000];

/// A multi-receive of [`GROUP`]'s sizes (pattern from `seed`), posted by the receiver.
struct Group {
    sbs: Vec<AlignedBuf>,
    rbs: Vec<AlignedBuf>,
    rid: ReqId,
}

fn post_group(p: &mut Pair, seed: u64) -> Group {
    let (mut sbs, mut rbs, mut bufs) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &s) in GROUP.iter().enumerate() {
        let mut sb = AlignedBuf::new(s.max(1));
        fill_pattern(sb.as_mut_slice(), seed + i as u64);
        let rb = AlignedBuf::new(s + 4096);
        bufs.push(FusedBuf {
            addr: rb.addr(),
            size: rb.len() as u64,
            tag: 20 + i as u32,
            mrs: reg(&p.rails, &rb),
        });
        sbs.push(sb);
        rbs.push(rb);
    }
    let rid = p.r.irecv(&bufs).expect("irecv").expect("posted");
    Group { sbs, rbs, rid }
}

/// Sends every receive of `g` (reverse order), then checks both ends: each send's size, each
/// receive's exact size, every byte, nothing past the send.
fn finish_group(p: &mut Pair, g: Group) {
    let n = p.rails.len();
    let mut sids = Vec::new();
    for i in (0..GROUP.len()).rev() {
        let sk = reg(&p.rails, &g.sbs[i]);
        let mut sid = None;
        for _ in 0..100 {
            sid =
                p.s.isend(g.sbs[i].addr(), GROUP[i] as u64, 20 + i as u32, &sk[..n])
                    .expect("isend");
            if sid.is_some() {
                break;
            }
            // The receiver's progress (NCCL's proxy drives both) reports its failures.
            assert!(p.r.test(g.rid).expect("recv test").is_none());
        }
        sids.push((i, sid.expect("receive posted")));
    }
    for (i, id) in sids {
        assert_eq!(wait(|| p.s.test(id)).sizes[0], GROUP[i] as u64, "send {i}");
    }
    let d = wait(|| p.r.test(g.rid));
    assert_eq!(d.n as usize, GROUP.len());
    for (i, &s) in GROUP.iter().enumerate() {
        assert_eq!(d.sizes[i], s as u64, "receive {i}: counted once, exact");
        assert_eq!(
            &g.rbs[i].as_slice()[..s],
            &g.sbs[i].as_slice()[..s],
            "receive {i}"
        );
        assert!(
            g.rbs[i].as_slice()[s..].iter().all(|&b| b == 0),
            "receive {i}: nothing past the send"
        );
    }
}

/// Bytes of rail `r`'s parts of [`GROUP`] over `n` rails.
fn group_part(n: usize, r: usize) -> u64 {
    GROUP.iter().map(|&s| stripe(s as u64, n)[r].len).sum()
}

#[test]
fn a_multi_receive_survives_a_rail_failing_under_its_sends() {
    for (n, rail, after) in [(2usize, 1usize, 0u64), (2, 1, 3), (3, 0, 2), (4, 2, 1)] {
        let mut p = pair(n);
        let g = post_group(&mut p, 500);
        // A data write of the group on `rail` fails (the sender's: the clear-to-sends are out).
        p.rails[rail].inject(Fault::FailWr {
            after,
            status: WcStatus::RetryExceeded,
        });
        finish_group(&mut p, g);
        // Every part of the group on the failed rail went again (a rail's parts of a
        // multi-receive complete together, so none was acknowledged), and nothing else.
        assert_eq!(p.s.resent_bytes(), group_part(n, rail), "{n} rails");
        let ev = p.s.take_events();
        assert_eq!((ev.len(), ev[0].rail), (1, rail as u8), "{n} rails");
        assert!(!p.s.rail_live(rail) && !p.r.rail_live(rail));
        let to = p.r.take_events()[0].to;
        assert!(to.is_some() && to != Some(rail as u8));

        // The next multi-receive is striped over the live rails alone: nothing goes twice.
        let g = post_group(&mut p, 900);
        finish_group(&mut p, g);
        assert_eq!(p.s.resent_bytes(), group_part(n, rail), "{n} rails");
        let w = one_counted(&mut p, 70_000, 901);
        assert_eq!(w[rail], 0, "{n} rails: the dead rail is idle");
        assert_eq!(p.s.resent_bytes(), group_part(n, rail), "{n} rails");
        assert_eq!(p.s.requests_in_use(), 0);
        assert_eq!(p.r.requests_in_use(), 0);
    }
}

#[test]
fn a_multi_receive_survives_a_rail_only_the_receiver_sees_fail() {
    let mut p = pair(2);
    // The receiver's clear-to-send on rail 1 fails: the sender never sees the group there.
    p.rails[1].inject(Fault::FailWr {
        after: 0,
        status: WcStatus::RetryExceeded,
    });
    let g = post_group(&mut p, 700);
    finish_group(&mut p, g);
    // The sender never posted on rail 1: the group went over rail 0 alone (rail 1's parts
    // empty, told by the group's notice), nothing twice.
    assert_eq!(p.s.resent_bytes(), 0);
    let (se, re) = (p.s.take_events(), p.r.take_events());
    assert_eq!((se.len(), se[0].rail, se[0].to), (1, 1, Some(0)));
    assert_eq!((re.len(), re[0].rail, re[0].to), (1, 1, Some(0)));
    let g = post_group(&mut p, 800);
    finish_group(&mut p, g);
    assert_eq!(p.s.resent_bytes(), 0);
    assert_eq!(p.s.requests_in_use(), 0);
    assert_eq!(p.r.requests_in_use(), 0);
}

#[test]
fn a_multi_receive_survives_its_carrier_failing_too() {
    // Rail 2 fails on its first data write; rail 0, which carries rail 2's parts and the
    // group's notice, fails `after` writes later (its own parts, a moved part or the notice):
    // rail 1 takes whatever was not acknowledged, and the notice is written again.
    let mut both = 0;
    for after in 0..16 {
        let mut p = pair(3);
        let g = post_group(&mut p, 40 + after);
        p.rails[2].inject(Fault::FailWr {
            after: 0,
            status: WcStatus::RetryExceeded,
        });
        p.rails[0].inject(Fault::FailWr {
            after,
            status: WcStatus::RetryExceeded,
        });
        finish_group(&mut p, g);
        assert!(p.s.resent_bytes() >= group_part(3, 2), "after {after}");
        // Past rail 0's last write of the group, its fault fires in the next group (on the
        // sender's or the receiver's side of rail 0).
        let ev = p.s.take_events();
        both += usize::from(ev.len() == 2);
        let g = post_group(&mut p, 90 + after);
        finish_group(&mut p, g);
        assert_eq!(ev.len() + p.s.take_events().len(), 2, "after {after}");
        assert!(p.s.rail_live(1) && !p.s.rail_live(0) && !p.s.rail_live(2));
        assert_eq!(p.s.requests_in_use(), 0);
        assert_eq!(p.r.requests_in_use(), 0);
    }
    assert!(
        both >= 8,
        "rail 0 failed during the group in {both} runs only"
    );
}

/// Sends `size` bytes to the receive `rid` posted for `rb`, driving the receiver while the
/// sender waits for a clear-to-send (NCCL's proxy drives both; the receiver's progress
/// reports a rail only it saw fail), then checks both ends and every byte.
fn send_driven(p: &mut Pair, rid: ReqId, rb: &AlignedBuf, size: usize, seed: u64) {
    let n = p.rails.len();
    let mut sb = AlignedBuf::new(size.max(1));
    fill_pattern(sb.as_mut_slice(), seed);
    let sk = reg(&p.rails, &sb);
    let mut sid = None;
    for _ in 0..100 {
        sid =
            p.s.isend(sb.addr(), size as u64, 9, &sk[..n])
                .expect("isend");
        if sid.is_some() {
            break;
        }
        assert!(p.r.test(rid).expect("recv test").is_none());
    }
    let sid = sid.expect("the sender stopped waiting for the dead rail");
    assert_eq!(wait(|| p.s.test(sid)).sizes[0], size as u64);
    assert_eq!(wait(|| p.r.test(rid)).sizes[0], size as u64, "exact size");
    assert_eq!(&rb.as_slice()[..size], &sb.as_slice()[..size], "every byte");
}

/// For two to four rails, each rail failing, seen by the sender (its part's write fails) or
/// only by the receiver (its clear-to-send's write fails): the bytes written again are exactly
/// the part in flight at the failure (none when only the receiver saw it: the sender never
/// posted there), and every later message costs the dead rail nothing: each live rail posts
/// its clear-to-send and its part, the dead rail nothing, no notice, no byte twice.
#[test]
fn after_a_failure_later_messages_cost_the_dead_rail_nothing() {
    for n in 2..=MAX_DEVS_PER_NIC {
        for dead in 0..n {
            for receiver_only in [false, true] {
                let at = format!("{n} rails, rail {dead} dead, receiver only: {receiver_only}");
                let mut p = pair(n);
                let size = 100_000;
                let rb = AlignedBuf::new(size);
                let rk = reg(&p.rails, &rb);
                let fault = Fault::FailWr {
                    after: 0,
                    status: WcStatus::RetryExceeded,
                };
                if receiver_only {
                    p.rails[dead].inject(fault);
                }
                let rid = post_recv(&mut p, &rb, rk, 9);
                if !receiver_only {
                    p.rails[dead].inject(fault);
                }
                send_driven(&mut p, rid, &rb, size, 40 + dead as u64);
                let in_flight = if receiver_only {
                    0
                } else {
                    stripe(size as u64, n)[dead].len
                };
                assert_eq!(p.s.resent_bytes(), in_flight, "{at}");
                assert!(!p.s.rail_live(dead) && !p.r.rail_live(dead), "{at}");
                let carried = p.s.rail_bytes(dead);
                for (i, size) in [0usize, 1, 129, 5000, 300_001].into_iter().enumerate() {
                    let w = one_counted(&mut p, size, 60 + i as u64);
                    let want: Vec<u64> = (0..n).map(|r| if r == dead { 0 } else { 2 }).collect();
                    assert_eq!(w, want, "{at}: {size} B, WRs per rail");
                }
                assert_eq!(p.s.resent_bytes(), in_flight, "{at}: later messages");
                assert_eq!(p.s.rail_bytes(dead), carried, "{at}: dead rail idle");
                assert_eq!(p.s.take_events().len(), 1, "{at}");
                assert_eq!(p.r.take_events().len(), 1, "{at}");
                assert_eq!(p.s.requests_in_use(), 0, "{at}");
                assert_eq!(p.r.requests_in_use(), 0, "{at}");
            }
        }
    }
}

/// A multi-receive posted over every rail before the receiver heard of a failure the sender
/// saw: its sends are striped over the live rails (the dead rail's parts empty, told by the
/// group's notice naming each send's stripe), each receive's size exact, nothing written twice
/// but the group in flight at the failure.
#[test]
fn a_multi_receive_posted_before_the_receiver_knew_keeps_exact_sizes() {
    for n in 2..=MAX_DEVS_PER_NIC {
        let dead = n - 1;
        let mut p = pair(n);
        let g1 = post_group(&mut p, 300);
        let g2 = post_group(&mut p, 400);
        p.rails[dead].inject(Fault::FailWr {
            after: 0,
            status: WcStatus::RetryExceeded,
        });
        finish_group(&mut p, g1);
        assert_eq!(p.s.resent_bytes(), group_part(n, dead), "{n} rails");
        // g1's notice told the receiver, but g2 was posted over every rail before it.
        assert!(!p.r.rail_live(dead), "{n} rails");
        let before = p.rails[0].wrs_posted();
        finish_group(&mut p, g2);
        assert_eq!(p.s.resent_bytes(), group_part(n, dead), "{n} rails: g2");
        // Rail 0 posted g2's parts (one post: each send's write and the sizes write) and its
        // notice (one write): nothing moved.
        assert!(p.rails[0].wrs_posted() - before <= 10, "{n} rails");
        let g3 = post_group(&mut p, 500);
        finish_group(&mut p, g3);
        assert_eq!(p.s.resent_bytes(), group_part(n, dead), "{n} rails: g3");
        assert_eq!(p.s.requests_in_use(), 0);
        assert_eq!(p.r.requests_in_use(), 0);
    }
}

/// A clear-to-send whose live-rail mask is empty, names a rail the comm lacks, leaves out the
/// rail it came on, or differs between rails is refused as a hostile notice is: the comm
/// fails with `BadFifoElem` naming the mask, and stays failed.
#[test]
fn a_clear_to_send_with_a_bad_rail_mask_is_refused() {
    let cases: [(usize, [u8; 3]); 5] = [
        (2, [0, 0, 0]),
        (2, [0b100, 0b100, 0]),
        (2, [0b111, 0b111, 0]),
        (2, [0b10, 0b10, 0]),
        (3, [0b011, 0b111, 0b111]),
    ];
    for (n, masks) in cases {
        let rails: Vec<Loopback> = (0..n).map(|_| Loopback::new()).collect();
        let cfg = CommConfig::default();
        let mut s = ibnet_testkit::fused_send(&rails, cfg).expect("fused send");
        // A hostile receiver: one plain comm per rail, posting whatever mask it likes.
        let mut rs: Vec<RecvComm<Loopback>> = (0..n)
            .map(|i| RecvComm::new(rails[i].clone(), cfg, &s.local_info(i).unwrap()).unwrap())
            .collect();
        for (i, r) in rs.iter().enumerate() {
            s.connect(i, &r.local_info()).expect("connect");
        }
        let ring = vec![RemoteBuf { addr: 64, rkey: 1 }; n];
        s.set_notice_ring(&ring).expect("ring");
        let rb = AlignedBuf::new(4096);
        let mut sb = AlignedBuf::new(4096);
        fill_pattern(sb.as_mut_slice(), 1);
        let (rk, sk) = (reg(&rails, &rb), reg(&rails, &sb));
        for (i, r) in rs.iter_mut().enumerate() {
            let buf = RecvBuf {
                addr: rb.addr(),
                size: 4096,
                tag: 1,
                mr: rk[i],
            };
            r.irecv_rails(&[buf], masks[i])
                .expect("irecv")
                .expect("posted");
        }
        let e = s.isend(sb.addr(), 4096, 1, &sk[..n]).expect_err("refused");
        assert!(
            matches!(e, Error::BadFifoElem { field, .. } if field.contains("live-rail mask")),
            "{masks:?}: {e:?}"
        );
        assert!(matches!(
            s.isend(sb.addr(), 4096, 1, &sk[..n]),
            Err(Error::Poisoned { .. })
        ));
        assert!(
            rb.as_slice().iter().all(|&b| b == 0),
            "{masks:?}: nothing written"
        );
    }
}
