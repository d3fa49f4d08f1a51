use super::*;

fn v4(a: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, a]);
    g
}

fn link_local() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[15] = 1;
    g
}

fn global_v6() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    g[15] = 7;
    g
}

fn c(index: i32, gid: [u8; 16], roce: u8) -> Candidate {
    Candidate {
        index,
        gid,
        roce: Some(roce),
    }
}

/// A selection the user configured (`NCCL_IB_ADDR_FAMILY` set): strict.
fn auto(family: AddrFamily, range: Option<&str>, roce_version: u8) -> Auto {
    Auto {
        family,
        range: range.map(|r| AddrRange::parse(r).unwrap()),
        roce_version,
        strict: true,
    }
}

fn at(index: i32) -> Result<Chosen, NoMatch> {
    Ok(Chosen {
        index,
        fallback: false,
    })
}

/// The choices today's selection made, kept (moved from ffi's `gid_selection`).
#[test]
fn gid_selection() {
    let gids = [
        c(0, link_local(), 1),
        c(1, link_local(), 2),
        c(2, v4(1), 1),
        c(3, v4(1), 2),
        c(4, v4(9), 2),
    ];
    let inet = AddrFamily::Inet;
    assert_eq!(select_auto(&gids, &auto(inet, None, 2)), at(3));
    assert_eq!(select_auto(&gids, &auto(inet, None, 1)), at(2));
    assert_eq!(
        select_auto(&gids, &auto(inet, Some("10.0.0.8/29"), 2)),
        at(4)
    );
    // No version match: the first in range of any version.
    let v1only = [c(0, link_local(), 1), c(5, v4(3), 1)];
    assert_eq!(select_auto(&v1only, &auto(inet, None, 2)), at(5));
    let six = [c(0, v4(1), 2), c(1, global_v6(), 2)];
    assert_eq!(select_auto(&six, &auto(AddrFamily::Inet6, None, 2)), at(1));
}

/// Issue 28 point 6: nothing in the range or family the user set is an error, never a
/// fallback (ffi's `select_gid` chose index 0 here, outside 10.9.0.0/16, and an IPv4 GID under
/// AF_INET6).
#[test]
fn auto_selection_never_picks_a_gid_outside_range_or_family() {
    let gids = [c(0, v4(1), 2), c(1, v4(2), 2)];
    let inet = AddrFamily::Inet;
    let r = AddrRange::parse("10.9.0.0/16").unwrap();
    assert_eq!(
        select_auto(&gids, &auto(inet, Some("10.9.0.0/16"), 2)),
        Err(NoMatch {
            family: inet,
            range: Some(r)
        })
    );
    assert_eq!(
        select_auto(&gids, &auto(AddrFamily::Inet6, None, 2)),
        Err(NoMatch {
            family: AddrFamily::Inet6,
            range: None
        })
    );
    // Only link-local / unconfigured GIDs: nothing valid either.
    let none = [c(0, link_local(), 2), c(1, [0; 16], 2)];
    assert!(select_auto(&none, &auto(inet, None, 2)).is_err());
    assert!(select_auto(&[], &auto(inet, None, 2)).is_err());
    let e = NoMatch {
        family: inet,
        range: Some(r),
    }
    .to_error(DevName::new("mlx5_0"), 1);
    assert!(matches!(e.kind(), crate::ErrorKind::InvalidUsage));
    let s = e.to_string();
    assert!(
        s.contains("NCCL_IB_ADDR_RANGE=10.9.0.0/16")
            && s.contains("NCCL_IB_ADDR_FAMILY=AF_INET ")
            && s.contains("mlx5_0:1")
            && s.contains("NCCL_IB_GID_INDEX"),
        "{s}"
    );
}

/// Nothing set (NCCL's defaults): a RoCE port with only IPv6 and link-local GIDs keeps
/// index 0, as NCCL's `ncclIbGetGidIndex` does, instead of being dropped; the same table is
/// refused once the user sets the family or a range.
#[test]
fn unset_family_and_range_fall_back_to_index_0_as_nccl() {
    let p = Params::default();
    let sel = Auto::from_params(&p);
    assert!(!sel.strict, "the table's default is not the user's setting");
    assert_eq!(sel.family, AddrFamily::Inet);
    let v6only = [
        c(0, link_local(), 1),
        c(1, link_local(), 2),
        c(2, global_v6(), 2),
    ];
    assert_eq!(
        select_auto(&v6only, &sel),
        Ok(Chosen {
            index: 0,
            fallback: true
        })
    );
    assert_eq!(
        select_auto(&[], &sel),
        Ok(Chosen {
            index: 0,
            fallback: true
        })
    );
    // A match is no fallback.
    let mixed = [c(0, link_local(), 2), c(1, v4(1), 2)];
    assert_eq!(select_auto(&mixed, &sel), at(1));
    // Set by the user, even to the default family, or a range: strict.
    for (n, v) in [
        ("NCCL_IB_ADDR_FAMILY", "AF_INET"),
        ("NCCL_IB_ADDR_RANGE", "10.0.0.0/8"),
    ] {
        let mut p = Params::default();
        p.set(n, v).unwrap();
        let sel = Auto::from_params(&p);
        assert!(sel.strict, "{n}={v}");
        assert!(select_auto(&v6only, &sel).is_err(), "{n}={v}");
    }
}

/// The no-GID error is one line with single spaces (the old ffi WARN carried runs of spaces
/// from a lost line continuation).
#[test]
fn the_no_gid_line_has_no_runs_of_spaces() {
    for range in [None, Some(AddrRange::parse("fd00::/64").unwrap())] {
        let e = NoMatch {
            family: AddrFamily::Inet6,
            range,
        }
        .to_error(DevName::new("mlx5_1"), 2);
        let s = e.to_string();
        assert!(!s.contains("  ") && !s.contains('\n'), "{s:?}");
        assert!(
            s.starts_with("mlx5_1:2: no valid GID of NCCL_IB_ADDR_FAMILY=AF_INET6"),
            "{s}"
        );
    }
    let s = NoMatch {
        family: AddrFamily::Inet6,
        range: Some(AddrRange::parse("fd00::/64").unwrap()),
    }
    .to_error(DevName::new("mlx5_1"), 2)
    .to_string();
    assert!(s.contains("NCCL_IB_ADDR_RANGE=fd00::/64 "), "{s}");
}

#[test]
fn ranges_hold_only_their_family() {
    let r4 = AddrRange::parse("10.0.0.0/8").unwrap();
    assert!(in_range(&v4(1), Some(&r4)));
    assert!(!in_range(&global_v6(), Some(&r4)), "v6 GID vs v4 range");
    let r6 = AddrRange::parse("2001:db8::/32").unwrap();
    assert!(in_range(&global_v6(), Some(&r6)));
    assert!(!in_range(&v4(1), Some(&r6)));
    assert!(in_range(&global_v6(), None));
    assert_eq!(family_of(&v4(1)), AddrFamily::Inet);
    assert_eq!(family_of(&link_local()), AddrFamily::Inet6);
    assert!(!valid(&link_local()) && !valid(&[0; 16]) && valid(&v4(1)));
}

#[test]
fn roce_versions_and_infiniband_flid() {
    assert_eq!(roce_version("RoCE v2\n"), Some(2));
    assert_eq!(roce_version("IB/RoCE v1\n"), Some(1));
    assert_eq!(roce_version("IB\n"), None);
    assert_eq!(infiniband_index(1, 16, Some(0x12)), 1);
    assert_eq!(infiniband_index(1, 16, Some(0)), 0, "no routable FLID");
    assert_eq!(infiniband_index(1, 16, None), 0, "unreadable");
    assert_eq!(infiniband_index(20, 16, Some(5)), 0, "beyond the table");
}

#[test]
fn from_params_ignores_a_range_of_the_other_family() {
    let mut p = Params {
        ib_addr_range: Some(AddrRange::parse("10.0.0.0/8").unwrap()),
        ib_addr_family: Some(AddrFamily::Inet6),
        ..Default::default()
    };
    assert_eq!(Auto::from_params(&p).range, None);
    p.ib_addr_family = Some(AddrFamily::Inet);
    assert!(Auto::from_params(&p).range.is_some());
}
