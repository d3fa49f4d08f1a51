//! `ibnet_core::rails`: one send and one receive comm type for 1..=8 rails. The tests make
//! both ends through the rails API alone (local infos → connect → join, as the plugin's
//! handshake passes them), move byte-verified messages over one, two and eight rails, and
//! walk the lifecycle: connecting, ready, rail-degraded after a rail fails, failed.

use ibnet_core::comm::{CommConfig, Done, RecvComm, SendComm};
use ibnet_core::error::Error;
use ibnet_core::fused::{FusedRecv, FusedSend, Resilience, EQUAL_WEIGHTS};
use ibnet_core::provider::{MrKeys, WcStatus};
use ibnet_core::rails::{Lifecycle, RailBuf, RailKeys, RailRecv, RailSend, MAX_DEVS_PER_NIC};
use ibnet_core::request::ReqId;
use ibnet_core::Result;
use ibnet_testkit::{fill_pattern, AlignedBuf, Fault, Loopback};

type Send = RailSend<Loopback, Box<FusedSend<Loopback>>>;
type Recv = RailRecv<Loopback, Box<FusedRecv<Loopback>>>;

/// Both ends over `rails` (one device per rail at each end), connected through the rails
/// API: the sender's infos make the receiver, the receiver's infos connect the sender.
fn pair(rails: &[Loopback]) -> (Send, Recv) {
    let cfg = CommConfig::default();
    let devs: Vec<u16> = (0..rails.len() as u16).collect();
    let mut s: Send = if rails.len() == 1 {
        RailSend::One(SendComm::new(rails[0].clone(), cfg).expect("send comm"))
    } else {
        RailSend::Striped(ibnet_testkit::fused_send(rails, cfg).expect("fused send"))
    };
    assert_eq!(s.lifecycle(), Lifecycle::Connecting);
    let (s_infos, s_list) = s.local_infos(&devs);
    assert_eq!(s_infos.len(), rails.len());
    let mut r: Recv = if rails.len() == 1 {
        RailRecv::One(RecvComm::new(rails[0].clone(), cfg, &s_infos[0]).expect("recv comm"))
    } else {
        RailRecv::Striped(ibnet_testkit::fused_recv(rails, cfg, &s_infos).expect("fused recv"))
    };
    r.join(&s_list, &EQUAL_WEIGHTS).expect("join");
    let (r_infos, r_list) = r.local_infos(&devs);
    s.connect(&r_infos, &r_list).expect("connect");
    assert_eq!((s.rails(), r.rails()), (rails.len(), rails.len()));
    (s, r)
}

fn keys(rails: &[Loopback], b: &AlignedBuf) -> RailKeys {
    let mut k = [MrKeys::default(); MAX_DEVS_PER_NIC];
    for (i, d) in rails.iter().enumerate() {
        k[i] = d.register(b.addr(), b.len() as u64).expect("register").0;
    }
    k
}

fn wait(mut f: impl FnMut() -> Result<Option<Done>>) -> Done {
    for _ in 0..100_000 {
        if let Some(d) = f().expect("test") {
            return d;
        }
    }
    panic!("request never completed");
}

const NOW: fn() -> u64 = || 0;

/// One message of `size` bytes, every byte checked at the receiver.
fn one_message(rails: &[Loopback], s: &mut Send, r: &mut Recv, size: usize, seed: u64) {
    message_then(rails, s, r, size, seed, || {});
}

/// [`one_message`], calling `posted` once the receive is posted, before the send.
fn message_then(
    rails: &[Loopback],
    s: &mut Send,
    r: &mut Recv,
    size: usize,
    seed: u64,
    posted: impl FnOnce(),
) {
    let mut sb = AlignedBuf::new(size);
    fill_pattern(sb.as_mut_slice(), seed);
    let rb = AlignedBuf::new(size);
    let (sk, rk) = (keys(rails, &sb), keys(rails, &rb));
    let buf = RailBuf {
        addr: rb.addr(),
        size: size as u64,
        tag: 7,
        mrs: rk,
    };
    let rid: ReqId = r.irecv(&[buf], &[0], NOW).expect("irecv").expect("posted");
    posted();
    let n = s.rails();
    let sid = s
        .isend(sb.addr(), size as u64, 7, &sk[..n], 0, NOW)
        .expect("isend")
        .expect("receive posted");
    assert_eq!(wait(|| s.test(sid, NOW)).sizes[0], size as u64);
    assert_eq!(wait(|| r.test(rid, NOW)).sizes[0], size as u64);
    assert_eq!(
        rb.as_slice(),
        sb.as_slice(),
        "every byte, {} rails",
        rails.len()
    );
}

#[test]
fn one_two_and_eight_rails_move_verified_bytes() {
    for n in [1, 2, MAX_DEVS_PER_NIC] {
        let rails: Vec<Loopback> = (0..n).map(|_| Loopback::new()).collect();
        let (mut s, mut r) = pair(&rails);
        assert_eq!(
            (s.lifecycle(), r.lifecycle()),
            (Lifecycle::Ready, Lifecycle::Ready)
        );
        for (i, size) in [0usize, 1, 4096, (1 << 20) + 77].into_iter().enumerate() {
            one_message(&rails, &mut s, &mut r, size, i as u64 + 1);
        }
        // Only several rails keep per-rail counters, and every rail carried a share.
        match s.stats() {
            None => assert_eq!(n, 1),
            Some(st) => {
                assert_eq!(st.rails, n);
                assert!(st.rail_bytes[..n].iter().all(|&b| b > 0), "{st:?}");
            }
        }
        s.close().expect("close send");
        r.close().expect("close recv");
    }
}

#[test]
fn a_failed_rail_degrades_the_comm_and_the_last_one_fails_it() {
    let rails: Vec<Loopback> = (0..2).map(|_| Loopback::new()).collect();
    let (mut s, mut r) = pair(&rails);
    s.set_resilience(Resilience::default());
    r.set_resilience(Resilience::default());
    // The sender's part on rail 1 fails, as when its link went down.
    message_then(&rails, &mut s, &mut r, (1 << 16) + 5, 3, || {
        rails[1].inject(Fault::FailWr {
            after: 0,
            status: WcStatus::RetryExceeded,
        })
    });
    assert_eq!(s.lifecycle(), Lifecycle::RailDegraded);
    assert!(s.has_rail_news());
    let news = s.take_news();
    assert_eq!(news.failed.len(), 1);
    assert_eq!((news.failed[0].rail, news.failed[0].to), (1, Some(0)));
    assert!(!s.has_rail_news(), "taken once");
    // Still moving data on rail 0.
    one_message(&rails, &mut s, &mut r, 4096, 4);

    s.fail(&Error::Missing { what: "test" });
    assert_eq!(
        s.lifecycle(),
        Lifecycle::Failed(Error::Missing { what: "test" }.kind())
    );
    let e = s.isend(0, 0, 1, &[MrKeys::default(); 2], 0, NOW);
    assert!(matches!(e, Err(Error::Poisoned { .. })), "{e:?}");
}

#[test]
fn one_rail_has_no_rail_news_and_fails_as_a_plain_comm() {
    let rails = [Loopback::new()];
    let (mut s, mut r) = pair(&rails);
    assert!(!s.has_rail_news() && !r.has_rail_news());
    assert!(s.take_news().failed.is_empty());
    r.fail(&Error::Missing { what: "test" });
    assert_eq!(
        r.lifecycle(),
        Lifecycle::Failed(Error::Missing { what: "test" }.kind())
    );
    let e = r.irecv(&[RailBuf::default()], &[0], NOW);
    assert!(matches!(e, Err(Error::Poisoned { .. })), "{e:?}");
    // A send with no keys is refused, not a panic.
    let e = s.isend(0, 0, 1, &[], 0, NOW);
    assert!(matches!(e, Err(Error::Missing { .. })), "{e:?}");
}
