//! `NCCL_IB_HCA` through `Params::set` as NCCL 2.30 reads it: the `dev:port:rail:plane` form
//! selects only the devices it names (ibnet before 2.30 support called `mlx5_0:1:0:0` a "bad
//! port" and then used every HCA), one odd entry leaves the rest of the list in force, empty
//! fields and commas are NCCL's, and the first matching entry gives v12's rail and plane.

use ibnet_core::params::Params;

#[test]
fn rail_plane_entries_select_only_their_devices() {
    let mut p = Params::default();
    let r = p.set("NCCL_IB_HCA", "mlx5_0:1:0:0,mlx5_1:1:1:0");
    assert!(r.is_ok(), "NCCL 2.30 form refused: {r:?}");
    let f = p.hca_filter();
    assert!(f.matches("mlx5_0", 1) && f.matches("mlx5_1", 1));
    assert!(!f.matches("mlx5_2", 1), "an unlisted HCA is used");
}
#[test]
fn one_odd_entry_keeps_the_rest() {
    let mut p = Params::default();
    let _ = p.set("NCCL_IB_HCA", "mlx5_0:x,mlx5_1");
    let f = p.hca_filter();
    assert!(f.matches("mlx5_1", 1), "the good entry is dropped");
    assert!(!f.matches("mlx5_2", 1), "an unlisted HCA is used");
}
#[test]
fn empty_fields_and_commas() {
    let mut p = Params::default();
    let r = p.set("NCCL_IB_HCA", "mlx5_0::3,,mlx5_1,");
    assert!(r.is_ok(), "{r:?}");
    assert!(!p.hca_filter().matches("mlx5_2", 1));
}

/// NCCL 2.30's `dev:port:rail:plane` gives v12's railId/planeId, first matching entry first.
#[test]
fn rail_and_plane_come_from_the_entry() {
    let mut p = Params::default();
    p.set("NCCL_IB_HCA", "=mlx5_0:1:0:0,mlx5_1::1,mlx5_2:1::3")
        .unwrap();
    let f = p.hca_filter();
    let ids = |d, port| f.select(d, port).map(|i| (i.rail, i.plane));
    assert_eq!(ids("mlx5_0", 1), Some((0, 0)));
    assert_eq!(ids("mlx5_0", 2), None);
    assert_eq!(ids("mlx5_1", 2), Some((1, -1)));
    assert_eq!(ids("mlx5_2", 1), Some((-1, 3)));
    assert_eq!(ids("mlx5_10", 1), None, "= is exact");
    assert!(f.malformed().is_empty());
}
