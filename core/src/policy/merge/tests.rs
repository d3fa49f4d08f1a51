use super::*;

const PF0: &str = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";
const PF1: &str = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1";
const VF: &str = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:01.3";
const OTHER: &str = "/sys/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0";

fn merged(p: &str, merge_vfs: bool) -> String {
    let mut b = p.as_bytes().to_vec();
    merge_pci_path(&mut b, merge_vfs);
    String::from_utf8(b).unwrap()
}

#[test]
fn pci_paths_merge_ports_and_with_merge_vfs_virtual_functions() {
    assert_eq!(merged(PF1, true), PF0);
    assert_eq!(merged(PF1, false), PF0);
    assert_eq!(merged(VF, true), PF0, "VF merged into its NIC");
    assert_eq!(
        merged(VF, false),
        "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:01.0",
        "without NCCL_IB_MERGE_VFS only the function digit goes"
    );
    assert_eq!(merged("ab", true), "ab", "too short: unchanged");
}

#[test]
fn real_port_counts_earlier_devices_of_the_same_nic_by_prefix() {
    let m = |p| merged(p, true);
    let (p0, p1, vf, o) = (m(PF0), m(PF1), m(VF), m(OTHER));
    // Discovery order: PF0, OTHER, PF1, VF.
    assert_eq!(real_port(Some(&p0), [], true), 0);
    assert_eq!(real_port(Some(&o), [Some(p0.as_str())], true), 0);
    assert_eq!(
        real_port(Some(&p1), [Some(p0.as_str()), Some(o.as_str())], true),
        1
    );
    assert_eq!(
        real_port(
            Some(&vf),
            [Some(p0.as_str()), Some(o.as_str()), Some(p1.as_str())],
            true
        ),
        2
    );
    assert_eq!(real_port(None, [Some(p0.as_str())], true), 0, "no path");
    assert_eq!(
        real_port(Some(&p1), [None], true),
        0,
        "earlier without path"
    );
}

#[test]
fn same_nic_is_a_prefix_match_not_equality() {
    // The earlier path only has to start with this one's prefix (NCCL's strncmp).
    assert!(same_nic(PF0, &format!("{PF0}/extra"), true));
    assert!(same_nic(
        "/sys/devices/x/0000:3b:00.0",
        "/sys/devices/x/0000:3b:17.5",
        true
    ));
    assert!(!same_nic(
        "/sys/devices/x/0000:3b:00.0",
        "/sys/devices/x/0000:3b:17.5",
        false
    ));
    assert!(same_nic(
        "/sys/devices/x/0000:3b:00.0",
        "/sys/devices/x/0000:3b:00.7",
        false
    ));
    assert!(!same_nic(PF0, OTHER, true));
    assert!(!same_nic("ab", "abc", true), "shorter than the cut");
}

fn desc(name: &str, link: u8, speed: i32, ptr: i32, comms: i32) -> PhysDesc<'_> {
    PhysDesc {
        name,
        link_layer: link,
        speed,
        ptr_support: ptr,
        max_comms: comms,
    }
}

fn name(v: &VNic, phys: &[PhysDesc<'_>]) -> String {
    let mut s = String::new();
    write_name(v, phys, &mut s).unwrap();
    s
}

#[test]
fn fused_properties_sum_speeds_and_keep_what_every_rail_honours() {
    let phys = [
        desc("mlx5_0", 2, 100_000, 0b111, 2048),
        desc("mlx5_1", 2, 200_000, 0b011, 1000),
        desc("mlx5_2", 1, 100_000, 0b111, 2048),
    ];
    let v = VNic::new(&[1, 0], 3).unwrap();
    let f = fuse(&v, &phys, true).unwrap();
    assert_eq!(name(&v, &phys), "mlx5_1+mlx5_0");
    assert_eq!(f.speed, 300_000);
    assert_eq!(f.ptr_support, 0b011);
    assert_eq!(f.max_comms, 1000);

    let single = fuse(&VNic::single(2), &phys, false).unwrap();
    assert_eq!(name(&VNic::single(2), &phys), "mlx5_2");
    assert_eq!(single.speed, 100_000, "one device needs no MERGE_NICS");

    assert_eq!(fuse(&v, &phys, false), Err(Refused::MergeNicsOff));
    let mixed = VNic::new(&[0, 2], 3).unwrap();
    assert_eq!(fuse(&mixed, &phys, true), Err(Refused::LinkLayers(0, 2)));
    assert!(matches!(
        Refused::MergeNicsOff.to_error().kind(),
        crate::ErrorKind::InvalidUsage
    ));
    let beyond = VNic::new(&[0, 3], 4).unwrap();
    assert_eq!(fuse(&beyond, &phys, true), Err(Refused::NoSuchDevice(3)));
}

/// Issue 28 point 6: the error a link-layer mismatch maps to names `NCCL_IB_HCA` as the fix.
#[test]
fn a_link_layer_mismatch_names_nccl_ib_hca() {
    let e = Refused::LinkLayers(0, 2).to_error();
    assert!(matches!(e.kind(), crate::ErrorKind::InvalidUsage));
    assert!(e.to_string().contains("NCCL_IB_HCA"), "{e}");
}
