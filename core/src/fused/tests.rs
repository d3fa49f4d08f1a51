use super::*;
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
