//! Accept survives anything (issue 13): junk, truncated, idle and replayed connections on a
//! listen comm's port are dropped with a WARN naming their address, `accept` never fails, and
//! the legitimate peer still connects and its bytes verify. But a connection that presented
//! the listen comm's nonce is the peer NCCL waits for: when it dies mid-handshake and no other
//! connection carrying the nonce is in progress, `accept` fails at once naming it (issue 30).
//! Over the soft provider, through `api` (the bodies of the exported C entry points).

use crate::util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use util::*;

/// IBNET_HANDSHAKE_TIMEOUT for this test (seconds): idle connections time out after it.
const TIMEOUT_S: u64 = 5;

/// The legitimate peer, with `junk` connections made first (held open until it is done).
fn legit_after(
    what: &str,
    junk: impl FnOnce(SocketAddr, u64, &mut dyn FnMut()) -> Vec<TcpStream>,
) -> Duration {
    let (mut h, l) = listen();
    // NCCL keeps calling accept meanwhile: it never fails and yields no comm.
    let mut poll = || {
        let (rc, c) = accept_once(l);
        assert_eq!(
            rc,
            ncclResult_t::Success,
            "accept failed on junk: {:?}",
            take_log()
        );
        assert!(c.is_null(), "junk produced a comm");
    };
    let held = junk(addr(&h), nonce(&h), &mut poll);
    // Let the junk arrive first (queued ahead of the legitimate peer).
    std::thread::sleep(Duration::from_millis(50));
    let (s, r, took) = establish(&mut h, l, Duration::from_secs(TIMEOUT_S));
    transfer(s, r, 1 << 16, what.len() as u8);
    close(s, r, l);
    drop(held);
    eprintln!("{what}: legitimate peer connected in {took:?}");
    took
}

fn junk_conns(
    to: SocketAddr,
    n: usize,
    poll: &mut dyn FnMut(),
    mut payload: impl FnMut(usize) -> Vec<u8>,
) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            poll();
            let mut c = TcpStream::connect(to).unwrap();
            let p = payload(i);
            if !p.is_empty() {
                let _ = c.write_all(&p);
            }
            c
        })
        .collect()
}

fn warned_drop(log: &[(ibnet_nccl::log::Level, String)]) -> bool {
    log.iter()
        .any(|(_, l)| l.contains("accept: dropped the connection from 127.0.0.1:"))
}

fn init() -> bool {
    let t = TIMEOUT_S.to_string();
    init_soft(&[
        ("IBNET_HANDSHAKE_TIMEOUT", &t),
        ("NCCL_SOCKET_IFNAME", "lo"),
    ])
}

#[test]
fn accept_survives_hostile_connections() {
    if util::ran_in_child() {
        return;
    }
    if !init() {
        return;
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut worst = Duration::ZERO;

    // 100 random payloads (1..600 bytes), some closed right away.
    worst = worst.max(legit_after("random payloads", |a, _, p| {
        let mut v = junk_conns(a, 100, p, |i| rng.bytes(1 + (i * 37) % 600));
        v.truncate(50);
        v
    }));
    assert!(warned_drop(&take_log()));

    // A valid Hello (the right nonce) followed by garbage instead of the QP info.
    let mut g = Rng(7);
    worst = worst.max(legit_after("valid prefix then garbage", |a, n, p| {
        junk_conns(a, 43, p, |i| {
            let mut p = ibnet_core::wire::Hello { nonce: n }.encode().to_vec();
            p.extend(g.bytes(1 + i * 5));
            p
        })
    }));
    assert!(warned_drop(&take_log()));

    // A flood of 200 random-byte connections.
    let mut f = Rng(99);
    worst = worst.max(legit_after("flood of 200", |a, _, p| {
        junk_conns(a, 200, p, |_| f.bytes(64))
    }));
    let log = take_log();
    assert!(warned_drop(&log));
    // Rate-limited: far fewer lines than drops.
    let lines = log
        .iter()
        .filter(|(_, l)| l.contains("accept: dropped"))
        .count();
    assert!(lines < 20, "{lines} drop lines for 200 drops");

    // An HTTP request.
    worst = worst.max(legit_after("GET / HTTP/1.0", |a, _, p| {
        junk_conns(a, 1, p, |_| b"GET / HTTP/1.0\r\n\r\n".to_vec())
    }));
    assert!(warned_drop(&take_log()));

    // 200 idle connections queued ahead: each costs its own timeout, not the peer's time.
    let idle = legit_after("200 idle connections", |a, _, p| {
        junk_conns(a, 200, p, |_| Vec::new())
    });
    worst = worst.max(idle);
    assert!(idle < Duration::from_secs(TIMEOUT_S), "{idle:?}");
    eprintln!("worst legitimate connect time under junk: {worst:?}");
    a_replayed_connect_gets_no_second_comm();
}

/// A second connect with the same handle (the nonce already spent) is refused.
fn a_replayed_connect_gets_no_second_comm() {
    let (mut h, l) = listen();
    let mut replay = h;
    let (s, r, _) = establish(&mut h, l, Duration::from_secs(TIMEOUT_S));
    // The same handle again: a second connection carrying the spent nonce.
    let t0 = std::time::Instant::now();
    let connect_err = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(2 * TIMEOUT_S),
            "replay neither refused nor timed out"
        );
        let (rc, c) = connect_once(&mut replay);
        assert!(c.is_null(), "the replayed connect got a send comm");
        if rc != ncclResult_t::Success {
            break rc;
        }
        let (rc, c2) = accept_once(l);
        assert_eq!(
            rc,
            ncclResult_t::Success,
            "accept must not fail on a replay"
        );
        assert!(c2.is_null(), "a replayed connect got a second recvComm");
    };
    assert_ne!(connect_err, ncclResult_t::Success);
    let log = take_log();
    assert!(
        log.iter().any(|(_, l)| l.contains("replay refused")),
        "{log:?}"
    );
    // The first pair still works.
    transfer(s, r, 4096, 3);
    close(s, r, l);
}

/// A real connector's first flight to the listener of `h` (Hello · QpInfo · RailList, made by
/// `connect` against a stand-in listener with `h`'s nonce), its message lengths, and what to
/// drop once done (the stand-in's socket and the parked connect's handle).
struct Flight {
    bytes: Vec<u8>,
    /// Lengths of the Hello and the QpInfo (the rest is the rail list).
    hello: usize,
    info: usize,
    standin: TcpStream,
    handle: Handle,
}

fn capture_flight(h: &Handle) -> Flight {
    use ibnet_core::wire::{ConnectHandle, QpInfo, HELLO_LEN, QP_INFO_HEADER_LEN};
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut handle = *h;
    let mut ch = ConnectHandle::decode(&h[..]).unwrap();
    ch.addr = fake.local_addr().unwrap();
    ch.encode(&mut handle[..]).unwrap();
    let mut step = || {
        let (rc, s) = connect_once(&mut handle);
        assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
        assert!(s.is_null());
    };
    step();
    let (standin, _) = fake.accept().unwrap();
    standin.set_nonblocking(true).unwrap();
    // Reads exactly `b.len()` bytes, calling connect meanwhile (NCCL keeps calling it).
    let mut read = |b: &mut [u8]| {
        let (mut got, t0) = (0, Instant::now());
        while got < b.len() {
            assert!(t0.elapsed() < Duration::from_secs(TIMEOUT_S), "no flight");
            step();
            match (&standin).read(&mut b[got..]) {
                Ok(0) => panic!("the connector closed"),
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    };
    let mut bytes = vec![0u8; HELLO_LEN + QP_INFO_HEADER_LEN];
    read(&mut bytes);
    let info = QpInfo::frame_len(&bytes[HELLO_LEN..]).unwrap();
    let rails = ibnet_core::wire::RailList::encoded_len(1);
    bytes.resize(HELLO_LEN + info + rails, 0);
    read(&mut bytes[HELLO_LEN + QP_INFO_HEADER_LEN..]);
    Flight {
        bytes,
        hello: HELLO_LEN,
        info,
        standin,
        handle,
    }
}

impl Flight {
    /// Ends the captured connect: its stand-in listener closes, so its next call fails.
    fn finish(mut self) {
        drop(self.standin);
        let t0 = Instant::now();
        while connect_once(&mut self.handle).0 == ncclResult_t::Success {
            assert!(
                t0.elapsed() < Duration::from_secs(TIMEOUT_S),
                "stand-in connect"
            );
        }
    }
}

/// How a hand-written connector ends.
#[derive(Clone, Copy, Debug)]
enum Death {
    /// Sends this many bytes of the first flight, then closes (FIN).
    After(usize),
    /// Sends them, then resets the connection (RST).
    ResetAfter(usize),
    /// Sends the whole flight, reads the acceptor's whole answer, sends `n` bytes of Ready
    /// (fewer than it has), then closes.
    Answered(usize),
}

/// Closes `s` with a reset (SO_LINGER 0) instead of a FIN.
fn reset(s: TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger struct of the size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            core::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    drop(s);
}

/// Drives a hand-written connector to the listener `l` (handle `h`) until `death`; returns its
/// address. `accept` is called between its steps, as NCCL keeps calling it.
fn connector_dies(h: &Handle, l: *mut core::ffi::c_void, f: &Flight, death: Death) -> SocketAddr {
    let poll = || {
        let (rc, c) = accept_once(l);
        assert_eq!(rc, ncclResult_t::Success, "{death:?}: {:?}", take_log());
        assert!(c.is_null());
    };
    let mut s = TcpStream::connect(addr(h)).unwrap();
    let me = s.local_addr().unwrap();
    let (n, read_answer) = match death {
        Death::After(n) | Death::ResetAfter(n) => (n, false),
        Death::Answered(_) => (f.bytes.len(), true),
    };
    s.write_all(&f.bytes[..n]).unwrap();
    poll();
    if read_answer {
        // The acceptor's answer: its QpInfo and rail list (as long as ours: same device).
        let mut answer = vec![0u8; f.bytes.len() - f.hello];
        s.set_nonblocking(true).unwrap();
        let (mut got, t0) = (0, Instant::now());
        while got < answer.len() {
            assert!(t0.elapsed() < Duration::from_secs(TIMEOUT_S), "no answer");
            poll();
            match s.read(&mut answer[got..]) {
                Ok(0) => panic!("{death:?}: the acceptor closed: {:?}", take_log()),
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        if let Death::Answered(k) = death {
            let ready = ibnet_core::wire::READY_LEN;
            assert!(k < ready);
            s.set_nonblocking(false).unwrap();
            s.write_all(&[0u8; 8][..k]).unwrap();
            poll();
        }
    }
    match death {
        Death::ResetAfter(_) => reset(s),
        _ => drop(s),
    }
    me
}

/// Calls `accept` until it fails or `limit` passes; the failure and its time.
fn accept_until_error(
    l: *mut core::ffi::c_void,
    limit: Duration,
) -> Option<(ncclResult_t, Duration)> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        let (rc, c) = accept_once(l);
        assert!(c.is_null(), "a dead connector produced a comm");
        if rc != ncclResult_t::Success {
            return Some((rc, t0.elapsed()));
        }
    }
    None
}

/// The connecting side dies in every state after its Hello (closed or reset): `accept` fails
/// within 1 s with one WARN naming it; dying before the Hello is complete (no nonce seen) is
/// junk and never fails `accept`, and the listener still connects the real peer afterwards.
#[test]
fn a_connector_dying_mid_handshake_fails_accept() {
    if util::ran_in_child() {
        return;
    }
    if !init() {
        return;
    }
    let probe = {
        let (h, l) = listen();
        let f = capture_flight(&h);
        let v = (f.hello, f.info, f.bytes.len());
        f.finish();
        assert_eq!(api::close_listen(l), ncclResult_t::Success);
        v
    };
    let (hello, info, all) = probe;
    let fatal = [
        ("RecvInfo (the Hello only)", Death::After(hello)),
        ("RecvInfo (part of the QpInfo)", Death::After(hello + 10)),
        ("RecvRails (Hello and QpInfo)", Death::After(hello + info)),
        ("RecvRails (part of the rail list)", Death::After(all - 1)),
        ("RecvReady (the whole flight)", Death::After(all)),
        ("RecvReady (answer read)", Death::Answered(0)),
        ("RecvReady (part of Ready)", Death::Answered(3)),
        ("RecvInfo, reset", Death::ResetAfter(hello)),
        ("RecvReady, reset", Death::ResetAfter(all)),
    ];
    for (state, death) in fatal {
        take_log();
        let (h, l) = listen();
        let f = capture_flight(&h);
        let me = connector_dies(&h, l, &f, death);
        let failed = accept_until_error(l, Duration::from_secs(1));
        let log = take_log();
        let Some((rc, took)) = failed else {
            panic!("{state}: accept still waiting 1 s after the connector died: {log:?}");
        };
        eprintln!("connector died in {state}: accept failed ({rc:?}) after {took:?}");
        assert_eq!(rc, ncclResult_t::RemoteError, "{state}: {log:?}");
        let warns: Vec<_> = log
            .iter()
            .filter(|(lv, _)| *lv == ibnet_nccl::log::Level::Warn)
            .map(|(_, m)| m)
            .collect();
        assert_eq!(warns.len(), 1, "{state}: one WARN: {warns:?}");
        assert!(warns[0].contains(&me.to_string()), "{state}: {warns:?}");
        let name = state.split([' ', ',']).next().unwrap();
        assert!(warns[0].contains(&format!("in state {name}")), "{warns:?}");
        assert!(warns[0].contains("accept: "), "{state}: {warns:?}");
        f.finish();
        assert_eq!(api::close_listen(l), ncclResult_t::Success);
    }
    // Before its Hello is whole, a connection is junk: dropped, never an accept failure.
    let (mut h, l) = listen();
    let f = capture_flight(&h);
    for death in [
        Death::After(0),
        Death::After(hello - 1),
        Death::ResetAfter(5),
    ] {
        connector_dies(&h, l, &f, death);
        assert!(
            accept_until_error(l, Duration::from_millis(300)).is_none(),
            "{death:?}: junk failed accept: {:?}",
            take_log()
        );
    }
    f.finish();
    let (s, r, _) = establish(&mut h, l, Duration::from_secs(TIMEOUT_S));
    transfer(s, r, 4096, 9);
    close(s, r, l);
    take_log();
}

/// A replayed copy of the peer's Hello that dies while the real peer is mid-handshake does not
/// fail `accept`: the real peer connects and its bytes verify.
#[test]
fn a_dying_replay_does_not_cost_the_real_peer() {
    if util::ran_in_child() {
        return;
    }
    if !init() {
        return;
    }
    let (mut h, l) = listen();
    // The real peer's first flight is in: the acceptor answered and waits for its Ready.
    for _ in 0..3 {
        let (rc, s) = connect_once(&mut h);
        assert_eq!(rc, ncclResult_t::Success);
        assert!(s.is_null());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (rc, r) = accept_once(l);
    assert_eq!(rc, ncclResult_t::Success);
    assert!(r.is_null());
    // A replay of its Hello, which dies (EOF, then a reset) while the real one is in progress.
    let hello = ibnet_core::wire::Hello { nonce: nonce(&h) }.encode();
    for rst in [false, true] {
        let mut c = TcpStream::connect(addr(&h)).unwrap();
        c.write_all(&hello).unwrap();
        if rst {
            reset(c);
        } else {
            drop(c);
        }
        assert!(
            accept_until_error(l, Duration::from_millis(300)).is_none(),
            "a dying replay failed accept: {:?}",
            take_log()
        );
        let log = take_log();
        assert!(
            log.iter()
                .any(|(_, m)| m.contains("is in progress: waiting for it")),
            "the replay's death was not seen: {log:?}"
        );
    }
    let (s, r, _) = establish(&mut h, l, Duration::from_secs(TIMEOUT_S));
    transfer(s, r, 1 << 16, 5);
    close(s, r, l);
    take_log();
    a_death_waits_for_the_other_nonce_holder();
}

/// Two connections present the nonce; the second dies while the first is in progress (no
/// failure yet), then the first dies too: `accept` fails, its WARN naming the first death.
fn a_death_waits_for_the_other_nonce_holder() {
    let (h, l) = listen();
    let hello = ibnet_core::wire::Hello { nonce: nonce(&h) }.encode();
    let mut first = TcpStream::connect(addr(&h)).unwrap();
    first.write_all(&hello).unwrap();
    let mut second = TcpStream::connect(addr(&h)).unwrap();
    second.write_all(&hello).unwrap();
    let dead = second.local_addr().unwrap();
    assert_eq!(accept_once(l).0, ncclResult_t::Success);
    drop(second);
    assert!(
        accept_until_error(l, Duration::from_millis(300)).is_none(),
        "failed while another nonce holder is in progress: {:?}",
        take_log()
    );
    take_log();
    drop(first);
    let Some((rc, _)) = accept_until_error(l, Duration::from_secs(1)) else {
        panic!(
            "accept still waiting with no nonce holder left: {:?}",
            take_log()
        );
    };
    assert_eq!(rc, ncclResult_t::RemoteError);
    let log = take_log();
    let warns: Vec<_> = log
        .iter()
        .filter(|(lv, _)| *lv == ibnet_nccl::log::Level::Warn)
        .collect();
    assert_eq!(warns.len(), 1, "{log:?}");
    assert!(warns[0].1.contains(&dead.to_string()), "{warns:?}");
    // Later calls are refused the same way.
    assert_eq!(accept_once(l).0, rc);
    assert_eq!(api::close_listen(l), ncclResult_t::Success);
    take_log();
}
