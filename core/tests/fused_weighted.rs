//! Weighted striping (issue 28, point 4): a fused comm whose rails have unequal speeds cuts
//! each message in proportion to them ([`stripe_weighted`]), over loopback rails: the bytes
//! each rail carries follow the ratio, every byte verified; a multi-receive whose rail fails
//! under it keeps exact sizes (the receiver cuts the group notice's parts with the same
//! weights); equal weights cut exactly as the unweighted stripe.

use ibnet_core::comm::{CommConfig, Done};
use ibnet_core::fused::{
    stripe_set, stripe_weighted, FusedBuf, FusedRecv, FusedSend, Weights, MAX_DEVS_PER_NIC,
    STRIPE_ALIGN,
};
use ibnet_core::provider::{MrKeys, WcStatus};
use ibnet_core::request::ReqId;
use ibnet_testkit::{fill_pattern, AlignedBuf, Fault, Loopback};

struct Pair {
    rails: Vec<Loopback>,
    s: Box<FusedSend<Loopback>>,
    r: Box<FusedRecv<Loopback>>,
}

/// A fused pair over `w.len()` loopback rails with stripe weights `w` at both ends.
fn pair(w: &[u32]) -> Pair {
    let rails: Vec<Loopback> = (0..w.len()).map(|_| Loopback::new()).collect();
    let (mut s, mut r) =
        ibnet_testkit::fused_pair(&rails, CommConfig::default()).expect("fused pair");
    s.set_rail_weights(w);
    r.set_rail_weights(w);
    Pair { rails, s, r }
}

fn reg(rails: &[Loopback], b: &AlignedBuf) -> [MrKeys; MAX_DEVS_PER_NIC] {
    let mut k = [MrKeys::default(); MAX_DEVS_PER_NIC];
    for (i, d) in rails.iter().enumerate() {
        k[i] = d.register(b.addr(), b.len() as u64).expect("register").0;
    }
    k
}

fn wait(mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> Done {
    for _ in 0..10_000 {
        if let Some(d) = f().expect("test") {
            return d;
        }
    }
    panic!("request never completed");
}

/// One message of `size` bytes through `p`, bytes and sizes checked; the bytes each rail
/// carried for it.
fn one(p: &mut Pair, size: usize, seed: u64) -> Vec<u64> {
    let n = p.rails.len();
    let before: Vec<u64> = (0..n).map(|i| p.s.rail_bytes(i)).collect();
    let mut sb = AlignedBuf::new(size.max(1));
    fill_pattern(sb.as_mut_slice(), seed);
    let rb = AlignedBuf::new(size.max(1) + 4096);
    let (sk, rk) = (reg(&p.rails, &sb), reg(&p.rails, &rb));
    let buf = FusedBuf {
        addr: rb.addr(),
        size: rb.len() as u64,
        tag: 7,
        mrs: rk,
    };
    let rid = p.r.irecv(&[buf]).expect("irecv").expect("posted");
    let sid =
        p.s.isend(sb.addr(), size as u64, 7, &sk[..n])
            .expect("isend")
            .expect("posted");
    assert_eq!(wait(|| p.s.test(sid)).sizes[0], size as u64);
    let rd = wait(|| p.r.test(rid));
    assert_eq!((rd.n, rd.sizes[0]), (1, size as u64), "{size} B");
    assert_eq!(&rb.as_slice()[..size], &sb.as_slice()[..size], "{size} B");
    assert!(rb.as_slice()[size..].iter().all(|&b| b == 0));
    (0..n).map(|i| p.s.rail_bytes(i) - before[i]).collect()
}

#[test]
fn rails_carry_bytes_in_proportion_to_their_weights() {
    // A 100 Gb/s and a 25 Gb/s rail (weights in units of 100 Mb/s, as the plugin sets them).
    let mut p = pair(&[1000, 250]);
    let size = 10 << 20;
    let got = one(&mut p, size, 1);
    assert_eq!(got.iter().sum::<u64>(), size as u64);
    // 4:1, within one alignment unit.
    assert!(got[0].abs_diff(4 * got[1]) <= 4 * STRIPE_ALIGN, "{got:?}");
    assert!(got[1] > 0);

    // Three rails 4:1:2, many sizes (small ones may leave a light rail empty): every byte
    // verified, the parts add up, and large messages follow the ratio.
    let w = [400, 100, 200];
    let mut p = pair(&w);
    for (k, size) in [
        0usize,
        1,
        127,
        128,
        129,
        1000,
        4096,
        65_537,
        1 << 20,
        3 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        let got = one(&mut p, size, 10 + k as u64);
        assert_eq!(got.iter().sum::<u64>(), size as u64, "{size}");
        if size >= 1 << 20 {
            for i in 0..3 {
                let want = size as u64 * u64::from(w[i]) / 700;
                assert!(got[i].abs_diff(want) <= STRIPE_ALIGN, "{size}: {got:?}");
            }
        }
    }
    assert_eq!(p.s.requests_in_use(), 0);
    assert_eq!(p.r.requests_in_use(), 0);
}

#[test]
fn the_weighted_cut_is_aligned_exact_and_equal_weights_change_nothing() {
    let w: Weights = [5, 1, 3, 7, 2, 2, 9, 1];
    for set in 1..=255u8 {
        for size in [0u64, 1, 100, 128, 129, 1000, 4096, 1 << 20, (1 << 20) + 77] {
            let p = stripe_weighted(size, set, &w);
            let mut next = 0;
            for (i, part) in p.iter().enumerate() {
                if set >> i & 1 == 0 {
                    assert_eq!(part.len, 0);
                    continue;
                }
                assert_eq!(part.off, next, "{size} over {set:#b}");
                next = part.off + part.len;
                if next < size {
                    assert_eq!(next % STRIPE_ALIGN, 0, "only the last part is ragged");
                }
            }
            assert_eq!(next, size, "{size} over {set:#b}: covered exactly");
            // Equal weights, and a weight unknown (0), cut as the unweighted stripe.
            assert_eq!(stripe_weighted(size, set, &[3; 8]), stripe_set(size, set));
            let mut z = w;
            z[set.trailing_zeros() as usize] = 0;
            assert_eq!(stripe_weighted(size, set, &z), stripe_set(size, set));
        }
    }
}

/// The sizes of a multi-receive: empty, small, and spread over every rail.
const GROUP: [usize; 6] = [0, 100, 129, 5000, 70_001, 300_000];

#[test]
fn a_multi_receive_on_weighted_rails_survives_a_rail_failing_with_exact_sizes() {
    for (w, dead) in [(&[1000u32, 250][..], 1usize), (&[100, 400, 200][..], 0)] {
        let mut p = pair(w);
        let n = w.len();
        let (mut sbs, mut rbs, mut bufs) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &s) in GROUP.iter().enumerate() {
            let mut sb = AlignedBuf::new(s.max(1));
            fill_pattern(sb.as_mut_slice(), 70 + i as u64);
            let rb = AlignedBuf::new(s + 4096);
            bufs.push(FusedBuf {
                addr: rb.addr(),
                size: rb.len() as u64,
                tag: 20 + i as u32,
                mrs: reg(&p.rails, &rb),
            });
            sbs.push(sb);
            rbs.push(rb);
        }
        let rid = p.r.irecv(&bufs).expect("irecv").expect("posted");
        p.rails[dead].inject(Fault::FailWr {
            after: 0,
            status: WcStatus::RetryExceeded,
        });
        let mut sids: Vec<(usize, ReqId)> = Vec::new();
        for i in (0..GROUP.len()).rev() {
            let sk = reg(&p.rails, &sbs[i]);
            let mut sid = None;
            for _ in 0..100 {
                sid =
                    p.s.isend(sbs[i].addr(), GROUP[i] as u64, 20 + i as u32, &sk[..n])
                        .expect("isend");
                if sid.is_some() {
                    break;
                }
                assert!(p.r.test(rid).expect("recv test").is_none());
            }
            sids.push((i, sid.expect("receive posted")));
        }
        for (i, id) in sids {
            assert_eq!(wait(|| p.s.test(id)).sizes[0], GROUP[i] as u64);
        }
        let d = wait(|| p.r.test(rid));
        for (i, &s) in GROUP.iter().enumerate() {
            assert_eq!(d.sizes[i], s as u64, "{w:?}: receive {i} exact");
            assert_eq!(&rbs[i].as_slice()[..s], &sbs[i].as_slice()[..s]);
        }
        assert!(!p.s.rail_live(dead) && !p.r.rail_live(dead), "{w:?}");
        // The group's parts on the dead rail, as the weighted stripe cut them, went again.
        let mut ws = [1u32; MAX_DEVS_PER_NIC];
        ws[..n].copy_from_slice(w);
        let all = ((1u16 << n) - 1) as u8;
        let part: u64 = GROUP
            .iter()
            .map(|&s| stripe_weighted(s as u64, all, &ws)[dead].len)
            .sum();
        assert_eq!(p.s.resent_bytes(), part, "{w:?}");
    }
}
