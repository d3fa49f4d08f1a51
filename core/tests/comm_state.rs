//! A send comm's state check on every call that needs a connected comm (`isend`, `peek`,
//! `iwrite`): refused with `BadState` before `connect`, with `Poisoned` (reported as the first
//! failure was) after a failure, and let through once connected.

use ibnet_core::comm::{CommConfig, RecvComm, SendComm};
use ibnet_core::error::{Error, ErrorKind};
use ibnet_core::provider::{MrKeys, Sge};
use ibnet_testkit::{connect_pair, Loopback};

const KEYS: MrKeys = MrKeys { lkey: 1, rkey: 1 };
const SGE: Sge = Sge {
    addr: 0x1000,
    len: 8,
    lkey: 1,
};

#[test]
fn unconnected_send_comm_refuses_data_calls() {
    let dev = Loopback::new();
    let cfg = CommConfig::default();
    let mut s = SendComm::new(dev.clone(), cfg).expect("send comm");
    let not_connected = |op| Error::BadState {
        op,
        state: "not connected",
    };
    assert_eq!(
        s.isend(0x1000, 8, 1, KEYS).unwrap_err(),
        not_connected("isend")
    );
    assert_eq!(s.peek(1).unwrap_err(), not_connected("isend"));
    assert_eq!(
        s.iwrite(SGE, 0x2000, 1).unwrap_err(),
        not_connected("iwrite")
    );
    assert_eq!(
        s.isend(0x1000, 8, 1, KEYS).unwrap_err().kind(),
        ErrorKind::Internal
    );
    // A refusal of an unconnected comm does not poison it: it still connects, and then an
    // isend is let through ("not yet": nothing posted).
    let r = RecvComm::new(dev, cfg, &s.local_info()).expect("recv comm");
    s.connect(&r.local_info()).expect("connect");
    assert_eq!(s.isend(0x1000, 8, 1, KEYS), Ok(None));
}

#[test]
fn connected_then_failed_send_comm() {
    let dev = Loopback::new();
    let (mut s, _r) = connect_pair(&dev, CommConfig::default()).expect("connect");
    // Connected, nothing posted by the receiver yet: "not yet", no error.
    assert_eq!(s.isend(0x1000, 8, 1, KEYS), Ok(None));
    assert_eq!(s.peek(1), Ok(None));
    let cause = Error::BadState {
        op: "peer",
        state: "gone",
    };
    s.fail(&cause);
    let poisoned = |op| Error::Poisoned {
        op,
        cause: cause.kind(),
    };
    assert_eq!(s.isend(0x1000, 8, 1, KEYS).unwrap_err(), poisoned("isend"));
    assert_eq!(s.peek(1).unwrap_err(), poisoned("isend"));
    assert_eq!(s.iwrite(SGE, 0x2000, 1).unwrap_err(), poisoned("iwrite"));
}
