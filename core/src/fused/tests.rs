use super::*;
use crate::fifo::PostedRecv;
use crate::Error;

#[test]
fn vnic_shape_is_checked() {
    let v = VNic::new(&[2, 0], 4).unwrap();
    assert_eq!(v.devs(), &[2, 0]);
    assert!(v.is_fused());
    assert_eq!(v.ndevs(), 2);
    assert!(!VNic::single(3).is_fused());
    assert_eq!(VNic::single(3).devs(), &[3]);
    for bad in [&[][..], &[0, 1, 2, 3, 4], &[4], &[-1], &[1, 1]] {
        assert!(
            matches!(VNic::new(bad, 4), Err(Error::OutOfRange { .. })),
            "{bad:?}"
        );
    }
    assert!(VNic::new(&[0, 1, 2, 3], 4).is_ok());
}

#[test]
fn rails_differ_when_either_side_has_a_device_the_other_lacks() {
    let v = VNic::new(&[0, 1], 2).unwrap();
    assert!(!v.rails_differ(&[0, 1]));
    assert!(!v.rails_differ(&[1, 0]), "order does not matter");
    assert!(v.rails_differ(&[0]), "remote has fewer devices");
    assert!(v.rails_differ(&[0, 1, 2]), "remote has more devices");
    assert!(v.rails_differ(&[2, 3]));
    assert!(!VNic::single(0).rails_differ(&[0]));
}

#[test]
fn stripes_cover_the_message_exactly_in_aligned_parts() {
    for rails in 1..=MAX_DEVS_PER_NIC {
        for size in [
            0u64,
            1,
            127,
            128,
            129,
            255,
            256,
            1000,
            4096,
            1 << 20,
            (1 << 20) + 3,
        ] {
            let p = stripe(size, rails);
            let mut next = 0;
            for (i, part) in p.iter().enumerate() {
                if i >= rails {
                    assert_eq!(part.len, 0);
                    continue;
                }
                assert_eq!(part.off, next.min(size), "{size} over {rails}");
                next = part.off + part.len;
                if part.off + part.len < size {
                    assert_eq!(part.len % STRIPE_ALIGN, 0, "only the last part is ragged");
                }
            }
            assert_eq!(next, size, "{size} over {rails}: covered exactly");
        }
    }
    let p = stripe(1000, 2);
    assert_eq!((p[0].off, p[0].len, p[1].off, p[1].len), (0, 512, 512, 488));
    let small = stripe(100, 4);
    assert_eq!(small[0].len, 100);
    assert!(
        small[1..].iter().all(|p| p.len == 0),
        "small: first rail only"
    );
}

#[test]
fn notices_round_trip_and_hostile_ones_are_refused() {
    let n = Notice {
        seq: 42,
        rail: 1,
        bytes: 4096,
        mask: 1,
    };
    let e = n.encode();
    assert_eq!(Notice::decode(&e, 42, 2, 8192), Some(n));
    assert_eq!(
        Notice::decode(&e, 43, 2, 8192),
        None,
        "another slot's message"
    );
    assert_eq!(
        Notice::decode(&e, 42, 1, 8192),
        None,
        "rail beyond the comm's"
    );
    assert_eq!(
        Notice::decode(&e, 42, 2, 4095),
        None,
        "more bytes than the receive"
    );
    let forged = PostedRecv {
        rkey: 0x1234_5601,
        ..e
    };
    assert_eq!(
        Notice::decode(&forged, 42, 2, 8192),
        None,
        "not a notice key"
    );
    let high = PostedRecv {
        rkey: NOTICE_KEY | 0x80,
        ..e
    };
    assert_eq!(Notice::decode(&high, 42, 4, 8192), None);
}

#[test]
fn group_notices_round_trip_and_hostile_ones_are_refused() {
    let g = GroupNotice {
        seq: 9,
        rails: 0b101,
        index: 3,
        size: 5000,
        stripe: 0b111,
    };
    let e = g.encode();
    assert_eq!(GroupNotice::decode(&e, 9, 3, 0b1111, 5000), Some(g));
    assert_eq!(GroupNotice::decode(&e, 10, 3, 0b1111, 5000), None, "slot");
    assert_eq!(
        GroupNotice::decode(&e, 9, 2, 0b1111, 5000),
        None,
        "other receive"
    );
    assert_eq!(
        GroupNotice::decode(&e, 9, 3, 0b011, 5000),
        None,
        "rail 2 outside the receive's mask"
    );
    assert_eq!(GroupNotice::decode(&e, 9, 3, 0b1111, 4999), None, "too big");
    let empty = PostedRecv {
        rkey: GROUP_NOTICE_KEY,
        ..e
    };
    assert_eq!(
        GroupNotice::decode(&empty, 9, 3, 0b1111, 5000),
        None,
        "no rail"
    );
    for stripe in [0u32, 0b1000, 0x100] {
        let bad = PostedRecv {
            tag: 3 | stripe << 8,
            ..e
        };
        assert_eq!(
            GroupNotice::decode(&bad, 9, 3, 0b111, 5000),
            None,
            "stripe {stripe:#x}: empty, outside the mask, or past the byte"
        );
    }
    // A peer that only knows single-receive notices refuses the element (and vice versa).
    assert_eq!(Notice::decode(&e, 9, 4, 5000), None);
    let single = Notice {
        seq: 9,
        rail: 1,
        bytes: 10,
        mask: 3,
    }
    .encode();
    assert_eq!(GroupNotice::decode(&single, 9, 3, 0b1111, 5000), None);
}

#[test]
fn a_stripe_over_a_set_of_rails_leaves_the_others_empty() {
    // The full set is the plain stripe.
    for size in [0u64, 1, 1000, (1 << 20) + 3] {
        for n in 1..=MAX_DEVS_PER_NIC {
            assert_eq!(stripe_set(size, ((1u16 << n) - 1) as u8), stripe(size, n));
        }
    }
    for set in 1u8..16 {
        for size in [0u64, 1, 127, 129, 1000, 70_001, (1 << 20) + 3] {
            let p = stripe_set(size, set);
            let k = set.count_ones() as usize;
            let dense = stripe(size, k);
            let mut j = 0;
            for (i, part) in p.iter().enumerate() {
                if set >> i & 1 == 0 {
                    assert_eq!(*part, Part::default(), "rail {i} outside {set:#b}");
                } else {
                    assert_eq!(*part, dense[j], "rail {i} of {set:#b}, {size} B");
                    j += 1;
                }
            }
            assert_eq!(p.iter().map(|x| x.len).sum::<u64>(), size);
        }
    }
    assert_eq!(
        stripe_set(1000, 0),
        stripe(1000, 1),
        "an empty set is rail 0"
    );
    let p = stripe_set(1000, 0b1010);
    assert_eq!((p[1].off, p[1].len, p[3].off, p[3].len), (0, 512, 512, 488));
}
