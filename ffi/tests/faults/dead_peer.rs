//! A peer process killed in each state makes the survivor's next call fail (issue 13): during
//! the handshake, mid-transfer, while the survivor waits for clear-to-send, and while it has
//! receives posted. Two processes over the soft provider, through `api` (the bodies of the
//! exported C entry points); the peer is this test binary re-run in a child role.
//!
//! Also (issue 30): a comm that failed refuses new work with the first error's kind, and 100
//! cycles of a peer dying (either side, connected or mid-handshake, registrations left or not)
//! leave the process's file descriptors as they were.
//!
//! `IBNET_DEADPEER_TRIALS` (default 3) trials per state, each timed from the kill to the
//! error; the worst and the median per state are printed at the end.
//! `IBNET_DEADPEER_PROVIDER=verbs` runs the same trials over the verbs provider (the rxe VM:
//! `scripts/rxe/deadpeer-trials.sh`), with the environment's `NCCL_SOCKET_IFNAME`; the WARN
//! must then name `IBNET_DEADPEER_PEER_IP`. The assertion is only a generous bound (30 s): the
//! goal (≤ 2 s) is reported, not asserted.

use crate::util;

use core::ffi::{c_int, c_void};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use util::*;

const ROLE: &str = "IBNET_DEADPEER_ROLE";
const PEER_HANDLE: &str = "IBNET_DEADPEER_HANDLE";
const BOUND: Duration = Duration::from_secs(30);
const BIG: usize = 64 << 20;

fn hex(h: &Handle) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Handle {
    let mut h = [0u8; 128];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    h
}

/// Initialises the plugin over the provider under test (see the module doc); false (after a
/// SKIP line) where soft is unavailable.
fn init() -> bool {
    if std::env::var("IBNET_DEADPEER_PROVIDER").as_deref() != Ok("verbs") {
        return init_soft(&[("NCCL_SOCKET_IFNAME", "lo")]);
    }
    std::env::set_var("IBNET_PROVIDER", "verbs");
    ibnet_nccl::log::set_sink(note);
    assert_eq!(api::init(None, -1, None, None), ncclResult_t::Success);
    let mut n = 0;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    assert!(n >= 1, "verbs provider: no device");
    true
}

/// The peer's side (run in the child process): sets up its state, prints READY, then sleeps
/// until it is killed.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert!(init());
    let say = |s: &str| println!("{s}");
    let mut keep: Vec<Vec<u8>> = Vec::new();
    match role.as_str() {
        // Listens, never accepts: the survivor's connect is mid-handshake.
        "handshake" => {
            let (h, _l) = listen();
            say(&format!("HANDLE {}", hex(&h)));
        }
        // A receiver: posts one big receive ("big") or nothing ("idle").
        "recv-big" | "recv-idle" => {
            let (h, l) = listen();
            say(&format!("HANDLE {}", hex(&h)));
            let mut r: *mut c_void = core::ptr::null_mut();
            while r.is_null() {
                let (rc, c) = accept_once(l);
                assert_eq!(rc, ncclResult_t::Success);
                r = c;
            }
            if role == "recv-big" {
                let mut b = vec![0u8; BIG];
                let mh = reg(r, &mut b);
                post_recv(r, &mut b, mh, 1);
                keep.push(b);
            }
        }
        // A connector that sends its first flight and dies before the handshake is done.
        "connect-half" => {
            let mut h = unhex(&std::env::var(PEER_HANDLE).unwrap());
            for _ in 0..5 {
                let (rc, c) = connect_once(&mut h);
                assert_eq!(rc, ncclResult_t::Success);
                assert!(c.is_null());
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // A sender that never sends: the survivor has a receive posted.
        "send-idle" => {
            let mut h = unhex(&std::env::var(PEER_HANDLE).unwrap());
            let mut s: *mut c_void = core::ptr::null_mut();
            while s.is_null() {
                let (rc, c) = connect_once(&mut h);
                assert_eq!(rc, ncclResult_t::Success);
                s = c;
            }
        }
        r => panic!("unknown role {r}"),
    }
    say("READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The child in `role`; returns it and its handle (if it printed one), and a reader for its
/// READY line.
fn spawn(role: &str, env: Option<&Handle>) -> (Child, Option<Handle>, impl FnOnce()) {
    let child = test_path(module_path!(), "child");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", child.as_str(), "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdout(Stdio::piped());
    if let Some(h) = env {
        cmd.env(PEER_HANDLE, hex(h));
    }
    let mut c = cmd.spawn().unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let mut handle = None;
    if env.is_none() {
        for l in lines.by_ref() {
            let l = l.unwrap();
            // libtest may print "test child ... " ahead of the first line.
            if let Some(i) = l.find("HANDLE ") {
                handle = Some(unhex(&l[i + 7..]));
                break;
            }
        }
    }
    let ready = move || {
        for l in lines.by_ref() {
            if l.unwrap().ends_with("READY") {
                return;
            }
        }
        panic!("child exited before READY");
    };
    (c, handle, ready)
}

/// Calls `step` until it returns an error; the time from `t0`.
fn until_error(t0: Instant, mut step: impl FnMut() -> ncclResult_t) -> Duration {
    loop {
        let rc = step();
        if rc != ncclResult_t::Success {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < BOUND,
            "no error {BOUND:?} after the peer died"
        );
    }
}

fn kill(c: &mut Child) -> Instant {
    c.kill().unwrap();
    let t0 = Instant::now();
    c.wait().unwrap();
    t0
}

/// The survivor connects to a child that never answers; the child dies mid-handshake.
fn handshake() -> Duration {
    let (mut c, h, ready) = spawn("handshake", None);
    let mut h = h.unwrap();
    ready();
    for _ in 0..50 {
        let (rc, s) = connect_once(&mut h);
        assert_eq!(rc, ncclResult_t::Success);
        assert!(s.is_null());
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = kill(&mut c);
    until_error(t0, || connect_once(&mut h).0)
}

/// Connects to a receiver child; returns the child and the send comm.
fn connect_to(role: &str) -> (Child, *mut c_void) {
    let (c, h, ready) = spawn(role, None);
    let mut h = h.unwrap();
    let mut s: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while s.is_null() {
        assert!(t0.elapsed() < BOUND);
        let (rc, x) = connect_once(&mut h);
        assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
        s = x;
    }
    ready();
    (c, s)
}

/// Sends `BIG` bytes; the receiver dies while the send is in progress (or just done, then the
/// next isend waits for clear-to-send).
fn mid_transfer(src: &mut [u8]) -> Duration {
    let (mut c, s) = connect_to("recv-big");
    let mh = reg(s, src);
    let mut req: *mut c_void = core::ptr::null_mut();
    while req.is_null() {
        let rc = api::isend(
            s,
            src.as_mut_ptr() as *mut c_void,
            BIG as u64,
            1,
            mh,
            core::ptr::null_mut(),
            &mut req,
        );
        assert_eq!(rc, ncclResult_t::Success);
    }
    let t0 = kill(&mut c);
    let mut done: c_int = 0;
    let mut next = core::ptr::null_mut();
    let took = until_error(t0, || {
        if done == 0 {
            return api::test(req, &mut done, core::ptr::null_mut());
        }
        api::isend(
            s,
            src.as_mut_ptr() as *mut c_void,
            8,
            1,
            mh,
            core::ptr::null_mut(),
            &mut next,
        )
    });
    let _ = api::dereg_mr(s, mh);
    assert_eq!(api::close_send(s), ncclResult_t::Success);
    took
}

/// The receiver never posts; the survivor's isend waits for clear-to-send.
fn waiting_for_cts() -> Duration {
    let (mut c, s) = connect_to("recv-idle");
    let mut b = vec![1u8; 4096];
    let mh = reg(s, &mut b);
    let mut req: *mut c_void = core::ptr::null_mut();
    for _ in 0..100 {
        let rc = api::isend(
            s,
            b.as_mut_ptr() as *mut c_void,
            4096,
            1,
            mh,
            core::ptr::null_mut(),
            &mut req,
        );
        assert_eq!(rc, ncclResult_t::Success);
        assert!(req.is_null());
    }
    let t0 = kill(&mut c);
    let took = until_error(t0, || {
        api::isend(
            s,
            b.as_mut_ptr() as *mut c_void,
            4096,
            1,
            mh,
            core::ptr::null_mut(),
            &mut req,
        )
    });
    let _ = api::dereg_mr(s, mh);
    assert_eq!(api::close_send(s), ncclResult_t::Success);
    took
}

/// The survivor has a receive posted; its sender dies without sending.
fn idle_with_receive_posted() -> Duration {
    let (h, l) = listen();
    let (mut c, _, ready) = spawn("send-idle", Some(&h));
    let mut r: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while r.is_null() {
        assert!(t0.elapsed() < BOUND);
        let (rc, x) = accept_once(l);
        assert_eq!(rc, ncclResult_t::Success);
        r = x;
    }
    ready();
    let mut b = vec![0u8; 4096];
    let mh = reg(r, &mut b);
    let req = post_recv(r, &mut b, mh, 1);
    let t0 = kill(&mut c);
    let mut done: c_int = 0;
    let took = until_error(t0, || api::test(req, &mut done, core::ptr::null_mut()));
    assert_eq!(done, 0);
    let _ = api::dereg_mr(r, mh);
    assert_eq!(api::close_recv(r), ncclResult_t::Success);
    assert_eq!(api::close_listen(l), ncclResult_t::Success);
    took
}

#[test]
fn survivor_errors_when_the_peer_dies() {
    if util::ran_in_child() {
        return;
    }
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    if !init() {
        return;
    }
    let peer_ip = std::env::var("IBNET_DEADPEER_PEER_IP").unwrap_or("127.0.0.1".into());
    let trials: usize = std::env::var("IBNET_DEADPEER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut src = vec![0x5au8; BIG];
    type Case<'a> = (&'a str, Box<dyn FnMut() -> Duration + 'a>);
    let cases: Vec<Case> = vec![
        ("handshake", Box::new(handshake)),
        ("mid-transfer", Box::new(|| mid_transfer(&mut src))),
        ("waiting for clear-to-send", Box::new(waiting_for_cts)),
        (
            "idle with a receive posted",
            Box::new(idle_with_receive_posted),
        ),
    ];
    for (name, mut f) in cases {
        let mut took: Vec<Duration> = (0..trials).map(|_| f()).collect();
        took.sort_unstable();
        let worst = took.last().copied().unwrap_or_default();
        let median = took.get(took.len() / 2).copied().unwrap_or_default();
        let slow = took.iter().filter(|t| **t > Duration::from_secs(2)).count();
        eprintln!(
            "dead peer, {name}: {trials} trials, worst detection {worst:?}, median {median:?}, {slow} over 2 s"
        );
        let log = take_log();
        assert!(
            log.iter().any(|(_, l)| l.contains(&format!("{peer_ip}:"))),
            "{name}: no WARN naming the peer: {log:?}"
        );
    }
}

/// Accepts the connection of a child in `role` (given our handle); the child, the receive comm
/// and the listener.
fn accept_from(role: &str) -> (Child, *mut c_void, *mut c_void) {
    let (h, l) = listen();
    let (c, _, ready) = spawn(role, Some(&h));
    let mut r: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while r.is_null() {
        assert!(t0.elapsed() < BOUND);
        let (rc, x) = accept_once(l);
        assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
        r = x;
    }
    ready();
    (c, r, l)
}

fn warns(log: &[(ibnet_nccl::log::Level, String)]) -> Vec<&String> {
    log.iter()
        .filter(|(l, _)| *l == ibnet_nccl::log::Level::Warn)
        .map(|(_, m)| m)
        .collect()
}

/// Once a call failed with "peer … is gone", every later data call on that comm (irecv, iflush,
/// test of a new or old request; isend) fails at once with the same result, without another
/// WARN.
#[test]
fn a_failed_comm_refuses_new_work() {
    if util::ran_in_child() {
        return;
    }
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    if !init() {
        return;
    }
    // The receiving side.
    let (mut c, r, l) = accept_from("send-idle");
    let mut b = vec![0u8; 4096];
    let mh = reg(r, &mut b);
    let req = post_recv(r, &mut b, mh, 1);
    let t0 = kill(&mut c);
    let mut done: c_int = 0;
    let mut first = ncclResult_t::Success;
    until_error(t0, || {
        first = api::test(req, &mut done, core::ptr::null_mut());
        first
    });
    assert_eq!(first, ncclResult_t::RemoteError);
    let log = take_log();
    assert!(warns(&log).iter().any(|w| w.contains("is gone")), "{log:?}");
    let (rc, req2) = irecv_once(r, &mut b, mh, 1);
    assert_eq!(rc, first, "irecv on a failed comm: {:?}", take_log());
    assert!(req2.is_null());
    let mut freq: *mut c_void = core::ptr::null_mut();
    let mut data = [b.as_mut_ptr() as *mut c_void];
    let sizes = [4096 as c_int];
    let mut mhs = [mh];
    let rc = api::iflush(
        r,
        1,
        data.as_mut_ptr(),
        sizes.as_ptr(),
        mhs.as_mut_ptr(),
        &mut freq,
    );
    assert_eq!(rc, first, "iflush on a failed comm");
    assert_eq!(api::test(req, &mut done, core::ptr::null_mut()), first);
    let log = take_log();
    assert!(
        warns(&log).is_empty(),
        "later refusals are not WARNs: {log:?}"
    );
    assert_eq!(api::dereg_mr(r, mh), ncclResult_t::Success);
    assert_eq!(api::close_recv(r), ncclResult_t::Success);
    assert_eq!(api::close_listen(l), ncclResult_t::Success);

    // The sending side.
    let (mut c, s) = connect_to("recv-idle");
    let mh = reg(s, &mut b);
    let mut sreq: *mut c_void = core::ptr::null_mut();
    let mut isend = |sreq: &mut *mut c_void| {
        api::isend(
            s,
            b.as_mut_ptr() as *mut c_void,
            4096,
            1,
            mh,
            core::ptr::null_mut(),
            sreq,
        )
    };
    assert_eq!(isend(&mut sreq), ncclResult_t::Success);
    let t0 = kill(&mut c);
    let mut first = ncclResult_t::Success;
    until_error(t0, || {
        first = isend(&mut sreq);
        first
    });
    assert_eq!(first, ncclResult_t::RemoteError);
    take_log();
    for _ in 0..3 {
        assert_eq!(isend(&mut sreq), first, "isend on a failed comm");
        assert!(sreq.is_null());
    }
    let log = take_log();
    assert!(
        warns(&log).is_empty(),
        "later refusals are not WARNs: {log:?}"
    );
    let _ = api::dereg_mr(s, mh);
    assert_eq!(api::close_send(s), ncclResult_t::Success);
}

/// The open fds, with what each names (for the failure message).
fn fds() -> Vec<(String, String)> {
    let mut v: Vec<_> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let to = std::fs::read_link(e.path()).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                to.display().to_string(),
            ))
        })
        .collect();
    v.sort();
    v
}

/// One cycle of a peer dying: `kind` picks the side and the state (see the match); `left`
/// keeps the cycle's registrations (never deregistered, as after a failed run).
fn die_cycle(kind: usize, left: &mut Vec<Vec<u8>>) {
    let mut b = vec![0u8; 4096];
    let keep = kind.is_multiple_of(2);
    match kind {
        // The connecting side dies after the handshake: the survivor's receive fails.
        0 | 1 => {
            let (mut c, r, l) = accept_from("send-idle");
            let mh = reg(r, &mut b);
            let req = post_recv(r, &mut b, mh, 1);
            let t0 = kill(&mut c);
            let mut done: c_int = 0;
            until_error(t0, || api::test(req, &mut done, core::ptr::null_mut()));
            if !keep {
                assert_eq!(api::dereg_mr(r, mh), ncclResult_t::Success);
            }
            assert_eq!(api::close_recv(r), ncclResult_t::Success);
            assert_eq!(api::close_listen(l), ncclResult_t::Success);
        }
        // The accepting side dies after the handshake: the survivor's send fails.
        2 | 3 => {
            let (mut c, s) = connect_to("recv-idle");
            let mh = reg(s, &mut b);
            let mut req: *mut c_void = core::ptr::null_mut();
            let t0 = kill(&mut c);
            until_error(t0, || {
                api::isend(
                    s,
                    b.as_mut_ptr() as *mut c_void,
                    4096,
                    1,
                    mh,
                    core::ptr::null_mut(),
                    &mut req,
                )
            });
            if !keep {
                assert_eq!(api::dereg_mr(s, mh), ncclResult_t::Success);
            }
            assert_eq!(api::close_send(s), ncclResult_t::Success);
        }
        // The connecting side dies mid-handshake: accept fails.
        4 => {
            let (h, l) = listen();
            let (mut c, _, ready) = spawn("connect-half", Some(&h));
            ready();
            let t0 = kill(&mut c);
            until_error(t0, || accept_once(l).0);
            assert_eq!(api::close_listen(l), ncclResult_t::Success);
        }
        // The accepting side dies mid-handshake: connect fails.
        _ => {
            handshake();
        }
    }
    if keep {
        left.push(b);
    }
}

/// 100 cycles of a peer dying (six kinds in turn, half of the connected ones leaving their
/// registration) end with as many open fds as they started with.
#[test]
fn dead_peers_leave_no_fds() {
    if util::ran_in_child() {
        return;
    }
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    if !init() {
        return;
    }
    let mut left = Vec::new();
    // Warm up: one cycle of each kind (the plugin, its threads and first sockets exist).
    for k in 0..6 {
        die_cycle(k, &mut left);
    }
    let start = fds();
    for i in 0..100 {
        die_cycle(i % 6, &mut left);
    }
    take_log();
    // The soft provider's monitor thread lets go of a dead peer's pidfd on its next round
    // (every 50 ms): give it a few.
    let t0 = Instant::now();
    let mut end = fds();
    while end != start && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
        end = fds();
    }
    eprintln!(
        "dead peers: {} fds before 100 cycles, {} after",
        start.len(),
        end.len()
    );
    assert_eq!(end, start, "fds leaked over 100 dead-peer cycles");
}
