//! `IBNET_SOFT_FAULTS` over the core's comms: each injected fault surfaces as the right error,
//! on the right comm (sender or receiver), or — for delay and reorder — as no error with every
//! byte right. Faults are armed per provider through `Config::faults` (what the variable sets);
//! the kill test re-executes this binary as the peer (`fault_helper_entry`).

mod common;

use std::io::BufReader;
use std::time::Instant;

use common::{
    fill_pattern, parse_qp_info, qp_info_line, read_line_with, recv_from_helper, reg, write_line,
    Region, DEADLINE,
};
use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm};
use ibnet_core::error::{Error, ReqType};
use ibnet_core::provider::{Access, Provider, RegKind, WcStatus};
use ibnet_core::request::ReqId;
use ibnet_soft::faults::Faults;
use ibnet_soft::{Config, SoftProvider};

type S = SendComm<SoftProvider>;
type R = RecvComm<SoftProvider>;

fn provider(faults: &str) -> SoftProvider {
    SoftProvider::open_with(Config {
        workers: 2,
        faults: Faults::parse(faults).unwrap(),
        ..Config::default()
    })
    .unwrap()
}

/// One message of `len` bytes (tag `tag`) from `s` to `r`: both requests driven until each
/// completes or fails; returns both outcomes (the receiver's buffer is checked on success).
fn one_message(
    ps: &SoftProvider,
    pr: &SoftProvider,
    s: &mut S,
    r: &mut R,
    len: usize,
    tag: u32,
) -> (ibnet_core::Result<Done>, ibnet_core::Result<Done>) {
    let mut src = Region::new(len.max(1));
    fill_pattern(src.bytes_mut(), tag as u64);
    let dst = Region::new(len.max(1));
    let ((_ms, sk), (_md, rk)) = (reg(ps, &src), reg(pr, &dst));
    let rid = r.irecv(&[RecvBuf {
        addr: dst.addr(),
        size: len as u64,
        tag,
        mr: rk,
    }]);
    let rid: ReqId = match rid {
        Ok(Some(id)) => id,
        Ok(None) => panic!("irecv: not yet"),
        Err(e) => return (Err(e), Err(e)),
    };
    let t = Instant::now();
    let mut sid = None;
    let (mut so, mut ro) = (None, None);
    while so.is_none() || ro.is_none() {
        assert!(
            t.elapsed() < DEADLINE,
            "message never settled: {so:?} {ro:?}"
        );
        if so.is_none() {
            match sid {
                None => match s.isend(src.addr(), len as u64, tag, sk) {
                    Ok(Some(id)) => sid = Some(id),
                    Ok(None) => {}
                    Err(e) => so = Some(Err(e)),
                },
                Some(id) => match s.test(id) {
                    Ok(Some(d)) => so = Some(Ok(d)),
                    Ok(None) => {}
                    Err(e) => so = Some(Err(e)),
                },
            }
        }
        if ro.is_none() {
            match r.test(rid) {
                Ok(Some(d)) => ro = Some(Ok(d)),
                Ok(None) => {}
                Err(e) => ro = Some(Err(e)),
            }
        }
        std::thread::yield_now();
    }
    let ro = ro.unwrap();
    if ro.is_ok() {
        assert!(
            dst.bytes()[..len] == src.bytes()[..len],
            "{len} bytes differ"
        );
    }
    (so.unwrap(), ro)
}

fn comms(ps: &SoftProvider, pr: &SoftProvider, cfg: CommConfig) -> (S, R) {
    let mut s = S::new(ps.clone(), cfg).unwrap();
    let r = R::new(pr.clone(), cfg, &s.local_info()).unwrap();
    s.connect(&r.local_info()).unwrap();
    (s, r)
}

fn completion(e: &ibnet_core::Result<Done>) -> Option<(WcStatus, ReqType)> {
    match e {
        Err(Error::Completion { status, req, .. }) => Some((*status, *req)),
        _ => None,
    }
}

/// One message of `len` bytes over a fresh pair of comms, the sender's provider armed with
/// `send_faults` and the receiver's with `recv_faults`: the send must fail with a remote
/// access error and the receive be flushed (a responder error puts the receiver's QP in error
/// too).
fn send_fails_and_receive_is_flushed(send_faults: &str, recv_faults: &str, len: usize, tag: u32) {
    let (ps, pr) = (provider(send_faults), provider(recv_faults));
    let (mut s, mut r) = comms(&ps, &pr, CommConfig::default());
    let (so, ro) = one_message(&ps, &pr, &mut s, &mut r, len, tag);
    assert_eq!(
        completion(&so),
        Some((WcStatus::RemoteAccessError, ReqType::Send)),
        "{so:?}"
    );
    assert_eq!(
        completion(&ro),
        Some((WcStatus::WrFlushError, ReqType::Recv)),
        "{ro:?}"
    );
}

#[test]
fn wr_fail_fails_the_senders_comm_with_the_chosen_status_and_flushes_the_receiver() {
    send_fails_and_receive_is_flushed("seed=7,wr_fail=1:RemoteAccessError", "", 4096, 1);
}

/// The same for an 8-byte message (its payload would travel inline in the ring entry): the
/// injected failure applies before, and nothing is delivered.
#[test]
fn wr_fail_applies_to_an_inline_message() {
    send_fails_and_receive_is_flushed("seed=7,wr_fail=1:RemoteAccessError", "", 8, 1);
}

#[test]
fn wr_fail_with_a_local_status_fails_the_sender_only() {
    let (ps, pr) = (provider("wr_fail=1:LocalProtectionError"), provider(""));
    let (mut s, mut r) = comms(&ps, &pr, CommConfig::default());
    let src = Region::new(64);
    let dst = Region::new(64);
    let ((_ms, sk), (_md, rk)) = (reg(&ps, &src), reg(&pr, &dst));
    r.irecv(&[RecvBuf {
        addr: dst.addr(),
        size: 64,
        tag: 3,
        mr: rk,
    }])
    .unwrap()
    .unwrap();
    let t = Instant::now();
    let id = loop {
        if let Some(id) = s.isend(src.addr(), 64, 3, sk).unwrap() {
            break id;
        }
        assert!(t.elapsed() < DEADLINE, "no clear-to-send");
    };
    let e = loop {
        match s.test(id) {
            Ok(None) => assert!(t.elapsed() < DEADLINE, "send never failed"),
            Ok(Some(d)) => break Ok(d),
            Err(e) => break Err(e),
        }
    };
    assert_eq!(
        completion(&e),
        Some((WcStatus::LocalProtectionError, ReqType::Send)),
        "{e:?}"
    );
}

#[test]
fn fifo_corrupt_fails_the_peers_write_and_flushes_our_receive() {
    // The receiver's provider corrupts the clear-to-send it writes (the sender's incoming
    // FIFO element): the sender writes with a stale rkey.
    send_fails_and_receive_is_flushed("", "seed=3,fifo_corrupt=1", 8192, 5);
}

#[test]
fn reg_fail_fails_the_comm_whose_registration_it_hits() {
    let p = provider("reg_fail=1");
    let injected = |r: Result<(), Error>| matches!(r, Err(Error::Provider { errno, call }) if errno == libc::ENOMEM && call.contains("reg_fail"));
    let s = S::new(p.clone(), CommConfig::default()).map(drop);
    assert!(injected(s), "send comm: {s:?}");
    let ok = S::new(provider(""), CommConfig::default()).unwrap();
    let r = R::new(p.clone(), CommConfig::default(), &ok.local_info()).map(drop);
    assert!(injected(r), "recv comm: {r:?}");
    // Every third registration fails, the others succeed.
    let p = provider("reg_fail=3");
    let buf = Region::new(4096);
    let res: Vec<bool> = (0..6)
        .map(|_| {
            p.reg_mr(buf.addr(), 4096, Access::ALL, RegKind::Plain)
                .is_ok()
        })
        .collect();
    assert_eq!(res, [true, true, false, true, true, false]);
}

#[test]
fn cq_delay_and_reorder_lose_nothing_and_corrupt_nothing() {
    let f = "seed=11,cq_delay_us=50,reorder=1";
    let (ps, pr) = (provider(f), provider(f));
    let cfg = CommConfig {
        nqps: 4,
        split_data: true,
        ..CommConfig::default()
    };
    let (mut s, mut r) = comms(&ps, &pr, cfg);
    for i in 0..200u32 {
        let len = [0usize, 1, 100, 4096, 70_000, 300_000][i as usize % 6];
        let (so, ro) = one_message(&ps, &pr, &mut s, &mut r, len, i);
        so.unwrap_or_else(|e| panic!("message {i}: send: {e}"));
        ro.unwrap_or_else(|e| panic!("message {i}: recv: {e}"));
    }
}

/// The peer: a send comm with the faults of `IBNET_SOFT_ARG` that sends small messages until
/// its fault kills it.
#[test]
#[ignore = "helper role: spawned by the two-process tests with IBNET_SOFT_ROLE"]
fn fault_helper_entry() {
    let Ok(role) = std::env::var("IBNET_SOFT_ROLE") else {
        return;
    };
    assert_eq!(role, "sender");
    let p = provider(&std::env::var("IBNET_SOFT_ARG").unwrap());
    let mut out = std::io::stdout();
    let mut inp = BufReader::new(std::io::stdin());
    let mut s = S::new(p.clone(), CommConfig::default()).unwrap();
    write_line(&mut out, &qp_info_line(&s.local_info()));
    let ri = read_line_with(&mut inp, parse_qp_info);
    s.connect(&ri).unwrap();
    let src = Region::new(64);
    let (_m, k) = reg(&p, &src);
    for i in 0.. {
        let id = loop {
            if let Some(id) = s.isend(src.addr(), 64, i, k).unwrap() {
                break id;
            }
        };
        loop {
            match s.test(id) {
                Ok(Some(_)) => break,
                Ok(None) => {}
                Err(e) => {
                    // Report, then live on until the parent closes our input (so that our
                    // exit is never what the parent's comm reports).
                    write_line(&mut out, &format!("SENDERR {e:?}"));
                    let mut l = String::new();
                    while std::io::BufRead::read_line(&mut inp, &mut l).unwrap_or(0) > 0 {
                        l.clear();
                    }
                    return;
                }
            }
        }
    }
}

/// `fifo_corrupt` across processes: our clear-to-send goes into the peer's FIFO ring, which lives
/// in the peer's shared segment and is written with word stores through our mapping of it (no
/// syscall); the injected corruption still reaches it: the peer's write fails with a remote
/// access error and our receive is flushed.
#[test]
fn fifo_corrupt_reaches_a_peer_fifo_in_shared_memory() {
    let p = provider("seed=3,fifo_corrupt=1");
    let (mut peer, mut r) = recv_from_helper(&p, "fault_helper_entry", "sender", "");
    let dst = Region::new(64);
    let (_m, k) = reg(&p, &dst);
    let buf = RecvBuf {
        addr: dst.addr(),
        size: 64,
        tag: 0,
        mr: k,
    };
    let id = r.irecv(&[buf]).unwrap().expect("irecv: not yet");
    let t = Instant::now();
    let e = loop {
        assert!(t.elapsed() < DEADLINE, "the receive never settled");
        match r.test(id) {
            Ok(Some(d)) => panic!("the receive succeeded: {d:?}"),
            Ok(None) => std::thread::yield_now(),
            Err(e) => break Err(e),
        }
    };
    assert_eq!(
        completion(&e),
        Some((WcStatus::WrFlushError, ReqType::Recv)),
        "{e:?}"
    );
    let sent = read_line_with(&mut peer.cout, |l| {
        l.strip_prefix("SENDERR ").map(String::from)
    });
    assert!(
        sent.contains("RemoteAccessError") && sent.contains("Send"),
        "the peer's send: {sent}"
    );
}

#[test]
fn kill_after_wrs_kills_the_peer_and_our_receive_fails() {
    let p = provider("");
    let (mut peer, mut r) =
        recv_from_helper(&p, "fault_helper_entry", "sender", "kill_after_wrs=20");
    let dst = Region::new(64);
    let (_m, k) = reg(&p, &dst);
    let t = Instant::now();
    let mut i = 0;
    let e = 'outer: loop {
        let buf = RecvBuf {
            addr: dst.addr(),
            size: 64,
            tag: i,
            mr: k,
        };
        let id = match r.irecv(&[buf]) {
            Ok(Some(id)) => id,
            Ok(None) => panic!("irecv: not yet"),
            Err(e) => break 'outer e,
        };
        i += 1;
        loop {
            assert!(t.elapsed() < DEADLINE, "the peer's death was never seen");
            match r.test(id) {
                Ok(Some(_)) => break,
                Ok(None) => std::thread::yield_now(),
                Err(e) => break 'outer e,
            }
        }
    };
    eprintln!("the survivor's receive comm reports: {e}");
    let status = peer.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the peer killed itself"
    );
    assert!(
        matches!(
            e,
            Error::Completion {
                status: WcStatus::RetryExceeded,
                req: ReqType::Recv,
                ..
            } | Error::PeerGone { .. }
                | Error::Poisoned { .. }
        ),
        "{e}"
    );
}
