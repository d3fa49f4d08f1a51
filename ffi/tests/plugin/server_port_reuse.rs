//! `NCCL_IB_SOCK_SERVER_PORT_REUSE=1` (as the seed, RCCL): the listen comms of one thread share
//! one port; each connection reaches the listen comm whose handle it used (routed by its
//! nonce), whatever the order of connects and accepts; junk on the shared port is refused as
//! on a private one; the port closes with the last listen comm. Over the soft provider.

use crate::util;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use ibnet_nccl::types::ncclResult_t;
use util::*;

#[test]
fn listen_comms_of_a_thread_share_one_port_and_get_their_own_connections() {
    if util::ran_in_child() {
        return;
    }
    if !init_soft(&[
        ("NCCL_IB_SOCK_SERVER_PORT_REUSE", "1"),
        ("IBNET_HANDSHAKE_TIMEOUT", "5"),
    ]) {
        return;
    }
    let (mut h1, l1) = listen();
    let (mut h2, l2) = listen();
    let (mut h3, l3) = listen();
    let a = addr(&h1);
    assert_eq!(a, addr(&h2), "one shared port");
    assert_eq!(a, addr(&h3), "one shared port");
    assert!(nonce(&h1) != nonce(&h2) && nonce(&h2) != nonce(&h3));

    // Junk first: a connection that sends garbage is refused by whoever takes it.
    let mut junk = TcpStream::connect(a).unwrap();
    junk.write_all(&[0xAB; 16]).unwrap();

    // A connect to l3 gets its Hello out before anyone accepts; accepting on l1 must not take
    // that connection (nor produce a comm from it or from the junk).
    let mut s3: *mut core::ffi::c_void = core::ptr::null_mut();
    for _ in 0..20 {
        let (rc, c) = connect_once(&mut h3);
        assert_eq!(rc, ncclResult_t::Success);
        assert!(c.is_null(), "no comm before the acceptor answers");
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..20 {
        let (rc, c) = accept_once(l1);
        assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
        assert!(c.is_null(), "l1 took a connection made with l3's handle");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut r3: *mut core::ffi::c_void = core::ptr::null_mut();
    let t0 = std::time::Instant::now();
    while s3.is_null() || r3.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(10), "l3 never connected");
        if r3.is_null() {
            r3 = accept_once(l3).1;
        }
        if s3.is_null() {
            s3 = connect_once(&mut h3).1;
        }
    }
    let (s1, r1, _) = establish(&mut h1, l1, Duration::from_secs(10));
    transfer(s3, r3, 4096, 3);
    transfer(s1, r1, 1 << 16, 1);
    close(s1, r1, l1);

    // l1 is closed; the port stays open for l2.
    let (s2, r2, _) = establish(&mut h2, l2, Duration::from_secs(10));
    transfer(s2, r2, 100, 2);
    close(s2, r2, l2);
    close(s3, r3, l3);
    drop(junk);
    let warns: Vec<_> = take_log();
    assert!(
        warns
            .iter()
            .any(|(_, m)| m.contains("accept") || m.contains("Hello")),
        "the junk connection was refused with a WARN: {warns:?}"
    );

    // The last listen comm closed the shared port; a new listen opens a new one.
    let (h4, l4) = listen();
    assert!(TcpStream::connect(a).is_err() || addr(&h4) == a);
    assert_eq!(nccl_net_ibnet::api::close_listen(l4), ncclResult_t::Success);
}
