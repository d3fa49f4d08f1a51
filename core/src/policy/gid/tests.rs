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

fn auto(family: AddrFamily, range: Option<&str>, roce_version: u8) -> Auto {
    Auto {
        family,
        range: range.map(|r| AddrRange::parse(r).unwrap()),
        roce_version,
    }
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
    assert_eq!(select_auto(&gids, &auto(inet, None, 2)), Ok(3));
    assert_eq!(select_auto(&gids, &auto(inet, None, 1)), Ok(2));
    assert_eq!(
        select_auto(&gids, &auto(inet, Some("10.0.0.8/29"), 2)),
        Ok(4)
    );
    // No version match: the first in range of any version.
    let v1only = [c(0, link_local(), 1), c(5, v4(3), 1)];
    assert_eq!(select_auto(&v1only, &auto(inet, None, 2)), Ok(5));
    let six = [c(0, v4(1), 2), c(1, global_v6(), 2)];
    assert_eq!(select_auto(&six, &auto(AddrFamily::Inet6, None, 2)), Ok(1));
}

/// Issue 28 point 6: nothing in the range or family is an error, never a fallback (ffi's
/// `select_gid` chose index 0 here, outside 10.9.0.0/16, and an IPv4 GID under AF_INET6).
#[test]
fn auto_selection_never_picks_a_gid_outside_range_or_family() {
    let gids = [c(0, v4(1), 2), c(1, v4(2), 2)];
    let inet = AddrFamily::Inet;
    assert_eq!(
        select_auto(&gids, &auto(inet, Some("10.9.0.0/16"), 2)),
        Err(NoMatch { ranged: true })
    );
    assert_eq!(
        select_auto(&gids, &auto(AddrFamily::Inet6, None, 2)),
        Err(NoMatch { ranged: false })
    );
    // Only link-local / unconfigured GIDs: nothing valid either.
    let none = [c(0, link_local(), 2), c(1, [0; 16], 2)];
    assert!(select_auto(&none, &auto(inet, None, 2)).is_err());
    assert!(select_auto(&[], &auto(inet, None, 2)).is_err());
    let e = NoMatch { ranged: true }.to_error();
    assert!(matches!(e.kind(), crate::ErrorKind::InvalidUsage));
    let s = e.to_string();
    assert!(
        s.contains("NCCL_IB_ADDR_RANGE") && s.contains("NCCL_IB_ADDR_FAMILY"),
        "{s}"
    );
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
        ib_addr_family: AddrFamily::Inet6,
        ..Default::default()
    };
    assert_eq!(Auto::from_params(&p).range, None);
    p.ib_addr_family = AddrFamily::Inet;
    assert!(Auto::from_params(&p).range.is_some());
}
