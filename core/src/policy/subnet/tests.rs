use super::*;

fn v4(a: u8, b: u8, c: u8, d: u8) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[a, b, c, d]);
    Gid(g)
}

/// An IPv6 GID: `prefix` as its first 8 bytes' last byte (2001:db8:0:<prefix>::), host `h`.
fn v6(prefix: u8, h: u8) -> Gid {
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    g[7] = prefix;
    g[15] = h;
    Gid(g)
}

fn link_local(h: u8) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[15] = h;
    Gid(g)
}

fn roce(g: Gid) -> Rail {
    Rail {
        link_layer: LinkLayer::Ethernet,
        gid: g,
    }
}

fn ib(g: Gid) -> Rail {
    Rail {
        link_layer: LinkLayer::Infiniband,
        gid: g,
    }
}

const ZERO: Gid = Gid([0; 16]);

#[test]
fn ipv4_mapped_gids_compare_the_first_prefix_len_bits() {
    let a = v4(10, 1, 2, 3);
    assert!(same_subnet(&a, &v4(10, 1, 2, 200), 24));
    assert!(!same_subnet(&a, &v4(10, 1, 3, 3), 24));
    assert!(same_subnet(&a, &v4(10, 1, 3, 3), 16));
    assert!(!same_subnet(&a, &v4(10, 2, 3, 3), 16));
    // Bit granularity: 10.1.2.0/23 holds 10.1.3.x, not 10.1.4.x.
    assert!(same_subnet(&v4(10, 1, 2, 1), &v4(10, 1, 3, 1), 23));
    assert!(!same_subnet(&v4(10, 1, 2, 1), &v4(10, 1, 4, 1), 23));
    // The ends of the range: /32 is the host itself, /1 the top bit.
    assert!(same_subnet(&a, &a, 32));
    assert!(!same_subnet(&a, &v4(10, 1, 2, 4), 32));
    assert!(same_subnet(&v4(10, 0, 0, 1), &v4(127, 9, 9, 9), 1));
    assert!(!same_subnet(&v4(10, 0, 0, 1), &v4(128, 0, 0, 1), 1));
}

#[test]
fn a_prefix_len_outside_1_to_32_is_clamped_never_a_panic() {
    // The configuration refuses such values (one WARN, the default stands); the rule itself
    // still never shifts by 32 or more.
    let (a, b) = (v4(10, 0, 0, 1), v4(11, 0, 0, 1));
    assert_eq!(same_subnet(&a, &b, 0), same_subnet(&a, &b, 1));
    assert!(
        same_subnet(&a, &b, 0),
        "/0 acts as /1: both below 128.0.0.0"
    );
    assert!(!same_subnet(&a, &v4(10, 0, 0, 2), 200), "acts as /32");
}

#[test]
fn ipv6_gids_compare_the_64_bit_subnet_prefix_whatever_the_prefix_len() {
    assert!(same_subnet(&v6(1, 1), &v6(1, 2), 24));
    assert!(!same_subnet(&v6(1, 1), &v6(2, 1), 24));
    assert!(!same_subnet(&v6(1, 1), &v6(2, 1), 1));
    // A difference in the first bytes too.
    let mut other = v6(1, 1);
    other.0[0] = 0x30;
    assert!(!same_subnet(&v6(1, 1), &other, 32));
}

#[test]
fn gids_of_different_families_never_share_a_subnet() {
    // ::ffff:10.0.0.1 against an IPv6 GID whose last four bytes are 10.0.0.1.
    let mut six = v6(0, 0);
    six.0[12..].copy_from_slice(&[10, 0, 0, 1]);
    assert!(!same_subnet(&v4(10, 0, 0, 1), &six, 24));
    assert!(!same_subnet(&six, &v4(10, 0, 0, 1), 1));
}

#[test]
fn listen_gids_carry_the_first_two_roce_rails_and_skip_infiniband() {
    let (a, b, c) = (v4(10, 0, 0, 1), v4(10, 0, 1, 1), v4(10, 0, 2, 1));
    assert_eq!(listen_gids([roce(a)]), [a, ZERO]);
    assert_eq!(listen_gids([roce(a), roce(b), roce(c)]), [a, b]);
    assert_eq!(listen_gids([ib(v6(1, 1)), roce(b)]), [b, ZERO]);
    assert_eq!(listen_gids([ib(v6(1, 1)), ib(v6(2, 1))]), [ZERO, ZERO]);
    assert_eq!(listen_gids([]), [ZERO, ZERO]);
}

#[test]
fn a_device_reaches_the_peer_only_when_every_roce_rail_is_on_a_peer_subnet() {
    let remote = [v4(10, 0, 0, 9), v4(10, 0, 1, 9)];
    assert!(reaches(&[roce(v4(10, 0, 0, 1))], &remote, 24));
    assert!(reaches(&[roce(v4(10, 0, 1, 1))], &remote, 24), "either GID");
    assert!(reaches(
        &[roce(v4(10, 0, 0, 1)), roce(v4(10, 0, 1, 1))],
        &remote,
        24
    ));
    assert!(
        !reaches(&[roce(v4(10, 0, 0, 1)), roce(v4(10, 0, 2, 1))], &remote, 24),
        "one rail off the subnet"
    );
    assert!(!reaches(&[roce(v4(10, 0, 2, 1))], &remote, 24));
    // InfiniBand rails neither count nor spoil; a device of none reaches nothing.
    assert!(reaches(&[ib(v6(1, 1)), roce(v4(10, 0, 0, 1))], &remote, 24));
    assert!(!reaches(&[ib(v6(1, 1))], &remote, 24));
    assert!(!reaches(&[], &remote, 24));
    // An invalid local GID (zero, link-local) is a rail that does not match.
    assert!(!reaches(&[roce(ZERO)], &[ZERO], 24));
    assert!(!reaches(&[roce(link_local(1))], &[link_local(2)], 24));
    // Invalid remote GIDs are ignored.
    assert!(!reaches(&[roce(link_local(1))], &[link_local(1), ZERO], 24));
}

#[test]
fn choose_keeps_the_asked_device_when_it_reaches_the_peer() {
    let remote = [v4(10, 0, 1, 9), ZERO];
    let devs = [vec![roce(v4(10, 0, 1, 1))], vec![roce(v4(10, 0, 1, 2))]];
    assert_eq!(choose(&remote, 24, 1, &devs), Route::Asked);
    assert_eq!(choose(&remote, 24, 0, &devs), Route::Asked);
}

#[test]
fn choose_picks_the_first_other_device_on_the_peer_subnet() {
    let remote = [v4(10, 0, 2, 9), ZERO];
    let devs = [
        vec![roce(v4(10, 0, 0, 1))],
        vec![roce(v4(10, 0, 1, 1))],
        vec![roce(v4(10, 0, 2, 1))],
        vec![roce(v4(10, 0, 2, 2))],
    ];
    assert_eq!(choose(&remote, 24, 0, &devs), Route::Other(2));
    assert_eq!(choose(&remote, 24, 1, &devs), Route::Other(2));
    assert_eq!(choose(&remote, 24, 3, &devs), Route::Asked);
    // A wider prefix makes the asked device good enough.
    assert_eq!(choose(&remote, 16, 0, &devs), Route::Asked);
}

#[test]
fn choose_prefers_a_whole_device_over_a_fused_one_with_a_rail_off_the_subnet() {
    // Device 2 fuses devices 0 and 1 (rails on two subnets); the peer is on 10.0.1.0/24 only.
    let (r0, r1) = (roce(v4(10, 0, 0, 1)), roce(v4(10, 0, 1, 1)));
    let devs = [vec![r0], vec![r1], vec![r0, r1]];
    assert_eq!(
        choose(&[v4(10, 0, 1, 9), ZERO], 24, 2, &devs),
        Route::Other(1)
    );
    // A peer whose two PFs cover both subnets keeps the fused device.
    let both = [v4(10, 0, 1, 9), v4(10, 0, 0, 9)];
    assert_eq!(choose(&both, 24, 2, &devs), Route::Asked);
}

#[test]
fn choose_falls_back_to_the_asked_device_when_nothing_matches() {
    let devs = [vec![roce(v4(10, 0, 0, 1))], vec![roce(v4(10, 0, 1, 1))]];
    assert_eq!(
        choose(&[v4(192, 168, 0, 1), ZERO], 24, 1, &devs),
        Route::Asked
    );
    // Asked device out of the table: the search still runs, else the asked one stays.
    assert_eq!(
        choose(&[v4(10, 0, 1, 5), ZERO], 24, 7, &devs),
        Route::Other(1)
    );
    assert_eq!(choose(&[v4(10, 9, 1, 5), ZERO], 24, 7, &devs), Route::Asked);
}

#[test]
fn choose_changes_nothing_without_a_valid_peer_gid() {
    // An InfiniBand listener (or one with routing off) sends zeros; link-local GIDs are not
    // routable either.
    let devs = [vec![roce(v4(10, 0, 0, 1))], vec![roce(link_local(1))]];
    assert_eq!(choose(&[ZERO, ZERO], 24, 0, &devs), Route::Asked);
    assert_eq!(choose(&[link_local(2), ZERO], 24, 0, &devs), Route::Asked);
    let empty: [Vec<Rail>; 0] = [];
    assert_eq!(choose(&[v4(10, 0, 0, 1)], 24, 0, &empty), Route::Asked);
}

#[test]
fn choose_matches_ipv6_peers_by_prefix() {
    let devs = [vec![roce(v6(1, 1))], vec![roce(v6(2, 1))]];
    assert_eq!(choose(&[v6(2, 9), ZERO], 24, 0, &devs), Route::Other(1));
    assert_eq!(choose(&[v6(3, 9), ZERO], 24, 0, &devs), Route::Asked);
    // An IPv4 peer never matches IPv6 rails.
    assert_eq!(choose(&[v4(10, 0, 0, 1), ZERO], 24, 0, &devs), Route::Asked);
}
