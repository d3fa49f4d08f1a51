//! Bootstrap errors name the peer by socket address (issue 13): a timed-out connect, a peer
//! that closes the bootstrap socket, a refused connect, and a bogus soft peer address (no
//! cross-memory-attach hint). Over the soft provider, through `api`; texts read from the log.

use crate::util;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ibnet_core::provider::{Gid, LinkLayer, Mtu};
use ibnet_core::wire::{ConnectHandle, Hello, QpInfo, RemoteBuf, QP_INFO_MAX_LEN};
use ibnet_nccl::types::ncclResult_t;
use util::*;

/// Calls connect with `h` until it fails; returns the WARN lines logged.
fn connect_until_error(h: &mut Handle, limit: Duration) -> Vec<String> {
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < limit, "connect neither failed nor succeeded");
        let (rc, c) = connect_once(h);
        assert!(c.is_null());
        if rc != ncclResult_t::Success {
            return take_log().into_iter().map(|(_, l)| l).collect();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A copy of the listen handle `h` pointing at `to`.
fn handle_to(h: &Handle, to: SocketAddr) -> Handle {
    let mut c = ConnectHandle::decode(&h[..]).unwrap();
    c.addr = to;
    let mut out = [0u8; 128];
    c.encode(&mut out).unwrap();
    out
}

fn has(log: &[String], what: &str) -> bool {
    log.iter().any(|l| l.contains(what))
}

/// A live receiver that never posts: no error, but after IBNET_STALL_WARN (1 s here) one WARN
/// naming the peer's address and GID, the tag and what is awaited.
fn a_stalled_peer_is_named_once() {
    let (mut h, l) = listen();
    let to = addr(&h);
    let (s, r, _) = establish(&mut h, l, Duration::from_secs(20));
    let _ = take_log();
    let mut b = vec![0u8; 64];
    let mut mh = core::ptr::null_mut();
    let p = b.as_mut_ptr() as *mut core::ffi::c_void;
    assert_eq!(
        nccl_net_ibnet::api::reg_mr(s, p, 64, 0, None, &mut mh),
        ncclResult_t::Success
    );
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(2500) {
        let mut req = core::ptr::null_mut();
        let rc = nccl_net_ibnet::api::isend(s, p, 64, 0x2a, mh, core::ptr::null_mut(), &mut req);
        assert_eq!(rc, ncclResult_t::Success, "a stall is no error");
        assert!(req.is_null());
        std::thread::sleep(Duration::from_micros(50));
    }
    let log: Vec<String> = take_log().into_iter().map(|(_, l)| l).collect();
    let stalls: Vec<_> = log
        .iter()
        .filter(|l| l.contains("IBNET_STALL_WARN"))
        .collect();
    assert_eq!(stalls.len(), 1, "{log:?}");
    let w = stalls[0];
    assert!(
        w.contains(&format!("peer {to}")) || w.contains("peer 127.0.0.1:"),
        "{w}"
    );
    assert!(
        w.contains("gid ") && w.contains("tag 0x2a") && w.contains("clear-to-send"),
        "{w}"
    );
    assert_eq!(nccl_net_ibnet::api::dereg_mr(s, mh), ncclResult_t::Success);
    close(s, r, l);
}

#[test]
fn bootstrap_errors_name_the_peer() {
    if util::ran_in_child() {
        return;
    }
    if !init_soft(&[
        ("IBNET_HANDSHAKE_TIMEOUT", "1"),
        ("IBNET_STALL_WARN", "1"),
        ("NCCL_SOCKET_IFNAME", "lo"),
    ]) {
        return;
    }
    a_stalled_peer_is_named_once();
    let (h, l) = listen();
    let to = addr(&h);

    // A listener that never accepts: the connector waits for its QP info, then times out.
    let mut c = h;
    let log = connect_until_error(&mut c, Duration::from_secs(20));
    let want = format!("timed out waiting for {to} in state RecvInfo");
    assert!(has(&log, &want), "{log:?}");
    assert!(!has(&log, "corrupt"), "{log:?}");

    // A peer that accepts and closes the bootstrap socket at once.
    let closer = TcpListener::bind("127.0.0.1:0").unwrap();
    let caddr = closer.local_addr().unwrap();
    let t = std::thread::spawn(move || drop(closer.accept()));
    let mut c = handle_to(&h, caddr);
    let log = connect_until_error(&mut c, Duration::from_secs(20));
    t.join().unwrap();
    assert!(
        has(
            &log,
            &format!("peer {caddr} closed the bootstrap connection")
        ),
        "{log:?}"
    );
    assert!(!has(&log, "gid ::"), "{log:?}");

    // A refused connect names the address.
    let gone = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut c = handle_to(&h, gone);
    let log = connect_until_error(&mut c, Duration::from_secs(20));
    assert!(has(&log, &format!("connect with {gone} failed")), "{log:?}");
    assert!(has(&log, "errno 111"), "{log:?}");

    // A handshake whose soft peer address names no live process: refused as such, without
    // the cross-memory-attach (ptrace) hint; accept keeps going. (A fresh listener: the first
    // one still has the timed-out connect queued.)
    assert_eq!(nccl_net_ibnet::api::close_listen(l), ncclResult_t::Success);
    let (h, l) = listen();
    let mut s = TcpStream::connect(addr(&h)).unwrap();
    s.write_all(&Hello { nonce: nonce(&h) }.encode()).unwrap();
    let mut qpn = heapless::Vec::new();
    qpn.push(17).unwrap();
    let bogus = ibnet_soft::SoftAddr {
        host: 0,
        pid: 0x3fff_fff0,
        fd: 3,
        nonce: 1,
        magic_addr: 0x1000,
    };
    let info = QpInfo {
        port: 1,
        link_layer: LinkLayer::Ethernet,
        mtu: Mtu::M4096,
        lid: 0,
        gid: Gid([0; 16]),
        sl: 0,
        tc: 0,
        qpn,
        fifo: Some(RemoteBuf {
            addr: 0x1000,
            rkey: 5,
        }),
        addr: bogus.encode(),
        ece: heapless::Vec::new(),
    };
    let mut b = [0u8; QP_INFO_MAX_LEN];
    let n = info.encode(&mut b).unwrap();
    s.write_all(&b[..n]).unwrap();
    // Wire v4: the rail list follows the rails' infos.
    let n = ibnet_core::wire::RailList::single(0)
        .encode(&mut b)
        .unwrap();
    s.write_all(&b[..n]).unwrap();
    let t0 = Instant::now();
    let log = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "bogus handshake not dropped"
        );
        let (rc, r) = accept_once(l);
        assert_eq!(rc, ncclResult_t::Success);
        assert!(r.is_null());
        let log: Vec<String> = take_log().into_iter().map(|(_, l)| l).collect();
        if has(&log, "accept: dropped") {
            break log;
        }
    };
    assert!(
        has(&log, "soft peer address names no live process"),
        "{log:?}"
    );
    assert!(!has(&log, "ptrace"), "{log:?}");
    assert_eq!(nccl_net_ibnet::api::close_listen(l), ncclResult_t::Success);
}
