//! Accept survives anything (issue 13): junk, truncated, idle and replayed connections on a
//! listen comm's port are dropped with a WARN naming their address, `accept` never fails, and
//! the legitimate peer still connects and its bytes verify. Over the soft provider, through
//! `api` (the bodies of the exported C entry points).

mod util;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use nccl_net_ibnet::nccl::types::ncclResult_t;
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

fn warned_drop(log: &[(nccl_net_ibnet::log::Level, String)]) -> bool {
    log.iter()
        .any(|(_, l)| l.contains("accept: dropped the connection from 127.0.0.1:"))
}

#[test]
fn accept_survives_hostile_connections() {
    let t = TIMEOUT_S.to_string();
    if !init_soft(&[
        ("IBNET_HANDSHAKE_TIMEOUT", &t),
        ("NCCL_SOCKET_IFNAME", "lo"),
    ]) {
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
