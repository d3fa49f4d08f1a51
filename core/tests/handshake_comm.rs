//! A connection set up the way the plugin does it: the core's handshake machines exchange
//! encoded messages over two in-memory byte pipes (moved a few bytes at a time), the comms are
//! created and connected at the events the machines report, and then data flows.

use std::collections::VecDeque;

use ibnet_core::comm::{CommConfig, RecvBuf, RecvComm, SendComm};
use ibnet_core::handshake::{Acceptor, Connector, Event};
use ibnet_core::provider::Provider;
use ibnet_testkit::{fill_pattern, AlignedBuf, Loopback};

/// Moves up to `step` bytes from a machine's transmit queue into `pipe`.
macro_rules! pump_tx {
    ($m:expr, $pipe:expr, $step:expr) => {
        if let Some(tx) = $m.poll_transmit() {
            let n = tx.len().min($step);
            $pipe.extend(&tx[..n]);
            $m.handle_sent(n).unwrap();
        }
    };
}

/// Feeds up to `step` bytes (and no more than the machine asks for) from `pipe`.
macro_rules! pump_rx {
    ($m:expr, $pipe:expr, $step:expr) => {
        let n = $m.poll_recv_len().min($step).min($pipe.len());
        if n > 0 {
            let bytes: Vec<u8> = $pipe.drain(..n).collect();
            let used = $m.handle_recv(&bytes).unwrap();
            assert_eq!(used, n);
        }
    };
}

#[test]
fn handshake_over_byte_pipes_then_data() {
    let dev = Loopback::new();
    let cfg = CommConfig {
        nqps: 3,
        split_data: true,
        ..CommConfig::default()
    };
    let nonce = 0x5eed_1234_abcd_0001;
    let mut send = SendComm::new(dev.clone(), cfg).unwrap();
    let mut conn = Connector::new(nonce, &send.local_info()).unwrap();
    let mut acc = Acceptor::new(nonce, &dev.port_info());
    let (mut c2a, mut a2c) = (VecDeque::new(), VecDeque::new());
    let mut recv: Option<RecvComm<Loopback>> = None;
    let step = 7;
    for _ in 0..10_000 {
        if conn.is_done() && acc.is_done() {
            break;
        }
        pump_tx!(conn, c2a, step);
        pump_rx!(acc, c2a, step);
        if let Some(Event::PeerInfo(info)) = acc.poll_event() {
            let r = RecvComm::new(dev.clone(), cfg, &info).unwrap();
            acc.handle_local_info(r.local_info()).unwrap();
            recv = Some(r);
        }
        pump_tx!(acc, a2c, step);
        pump_rx!(conn, a2c, step);
        if let Some(Event::PeerInfo(info)) = conn.poll_event() {
            send.connect(&info).unwrap();
            conn.handle_qps_connected().unwrap();
        }
    }
    assert!(conn.is_done() && acc.is_done(), "handshake finished");
    let mut recv = recv.expect("acceptor created its comm");

    let mut src = AlignedBuf::new(100_000);
    let dst = AlignedBuf::new(100_000);
    fill_pattern(src.as_mut_slice(), 42);
    let sk = dev.register(src.addr(), 100_000).unwrap().0;
    let rk = dev.register(dst.addr(), 100_000).unwrap().0;
    let rid = recv
        .irecv(&[RecvBuf {
            addr: dst.addr(),
            size: 100_000,
            tag: 3,
            mr: rk,
        }])
        .unwrap()
        .unwrap();
    let sid = send.isend(src.addr(), 99_999, 3, sk).unwrap().unwrap();
    while send.test(sid).unwrap().is_none() {}
    let done = loop {
        if let Some(d) = recv.test(rid).unwrap() {
            break d;
        }
    };
    assert_eq!(done.sizes[0], 99_999);
    assert_eq!(&dst.as_slice()[..99_999], &src.as_slice()[..99_999]);
}
