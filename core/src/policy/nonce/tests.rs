use super::*;
use crate::error::PeerId;

fn gone() -> Error {
    Error::PeerGone {
        peer: PeerId::default(),
    }
}

fn junk() -> Error {
    Error::Wire {
        what: "bad magic",
        value: 1,
    }
}

#[test]
fn the_nonce_is_single_use_and_completion_forgets_a_death() {
    let mut n: Nonce<u32> = Nonce::new();
    assert!(!n.spent());
    assert_eq!(n.classify(true, &gone(), || false), Failure::HolderDied);
    assert!(!n.holder_died(7, false));
    assert!(n.holder_died(8, true), "another holder is in progress");
    assert_eq!(n.verdict(true), None, "a holder in progress: wait for it");
    assert_eq!(
        n.verdict(false),
        Some(7),
        "the first death is the one reported"
    );
    n.completed();
    assert!(n.spent());
    assert_eq!(n.verdict(false), None, "completion forgets the death");
    assert_eq!(
        n.classify(true, &gone(), || true),
        Failure::Dropped,
        "after the nonce is spent a death is only a drop"
    );
    assert!(matches!(replay(5), Error::Wire { value: 5, .. }));
}

#[test]
fn what_fails_accept() {
    let n: Nonce<()> = Nonce::new();
    assert_eq!(
        n.classify(false, &gone(), || true),
        Failure::Dropped,
        "no nonce shown"
    );
    assert_eq!(
        n.classify(true, &junk(), || false),
        Failure::Dropped,
        "junk, socket open"
    );
    assert_eq!(
        n.classify(true, &junk(), || true),
        Failure::HolderDied,
        "socket closed"
    );
    let full = Error::Full {
        what: "comms",
        cap: 1,
    };
    assert_eq!(n.classify(true, &full, || false), Failure::HolderDied);
    let timeout = Error::Provider {
        call: "bootstrap handshake timed out in RecvInfo",
        errno: 0,
    };
    assert!(!is_death(&timeout, || panic!(
        "a stall is decided without the socket"
    )));
    let reset = Error::Provider {
        call: "recv (handshake)",
        errno: 104,
    };
    assert!(is_death(&reset, || false));
}

#[test]
fn a_full_table_evicts_the_oldest_idle_connection() {
    assert_eq!(room(0, []), Room::Free);
    assert_eq!(room(MAX_PENDING - 1, [false; 4]), Room::Free);
    let mut idle = [false; MAX_PENDING];
    assert_eq!(room(MAX_PENDING, idle), Room::Full);
    idle[5] = true;
    idle[9] = true;
    assert_eq!(room(MAX_PENDING, idle), Room::Evict(5));
}

#[test]
fn drops_are_logged_once_per_interval_and_counted_between() {
    let mut l = DropLog::default();
    let s = Duration::from_millis;
    assert!(l.may_log(s(10_000)));
    assert!(!l.may_log(s(10_100)));
    assert!(!l.may_log(s(10_999)));
    assert!(l.may_log(s(11_000)));
    assert_eq!(l.take_quiet(), 2);
    assert_eq!(l.take_quiet(), 0);
}

/// A nonce holder whose comm this side cannot make because the port's GID in
/// `NCCL_IB_ADDR_FAMILY`/`_RANGE` vanished after init fails `accept` (as `Error::Full`): no
/// other connection could succeed, and dropping it left NCCL's peer waiting for ever.
#[test]
fn a_vanished_gid_fails_accept() {
    use crate::params::AddrFamily;
    use crate::policy::gid::NoMatch;
    let n: Nonce<()> = Nonce::new();
    let e = NoMatch {
        family: AddrFamily::Inet,
        range: None,
    }
    .to_error(crate::verbs::DevName::new("mlx5_0"), 1);
    assert!(fails_accept(&e, || false));
    assert_eq!(n.classify(true, &e, || false), Failure::HolderDied);
    assert_eq!(
        n.classify(false, &e, || false),
        Failure::Dropped,
        "no nonce shown: junk"
    );
}
