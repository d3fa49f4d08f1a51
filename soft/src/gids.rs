//! `IBNET_SOFT_GIDS`: the GID each soft device reports, so tests on one host can put soft
//! devices on different subnets (subnet-aware routing). The soft provider itself never routes
//! by GID: a peer is found by its provider address; the GID only travels in the handshake and
//! the listen handle.
//!
//! The value is a comma-separated list of IP addresses, the `i`-th for `soft{i}`: an IPv4
//! address becomes the IPv4-mapped GID `::ffff:a.b.c.d`, an IPv6 address is the GID itself.
//! Devices past the list (and every device when the variable is unset) report
//! [`DEFAULT_GID`].

use core::net::IpAddr;

use ibnet_core::config::soft::MAX_DEVICES;
use ibnet_core::provider::Gid;
use ibnet_core::Error;

/// The variable's name.
pub const VAR: &str = "IBNET_SOFT_GIDS";

/// The GID of a soft device the list does not name: `::ffff:127.0.0.1`.
pub const DEFAULT_GID: Gid = Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]);

/// The GID of each soft device, `soft0` first (`None`: [`DEFAULT_GID`]).
pub type Gids = [Option<Gid>; MAX_DEVICES as usize];

/// Parses the list. Malformed (an entry that is not an IP address, more entries than soft
/// devices may exist): an [`Error::Param`] naming [`VAR`], for the caller to report.
pub fn parse(text: &str) -> Result<Gids, Error> {
    let bad = |reason| Error::Param { name: VAR, reason };
    let mut out: Gids = [None; MAX_DEVICES as usize];
    for (n, entry) in text.split(',').enumerate() {
        let slot = out
            .get_mut(n)
            .ok_or(bad("more entries than soft devices (8); default used"))?;
        let ip: IpAddr = entry
            .trim()
            .parse()
            .map_err(|_| bad("not a list of IP addresses; default used"))?;
        *slot = Some(Gid(match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        }));
    }
    Ok(out)
}

/// The GID `soft{index}` reports under `gids`.
pub fn of(gids: &Gids, index: u8) -> Gid {
    gids.get(usize::from(index))
        .copied()
        .flatten()
        .unwrap_or(DEFAULT_GID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_map_to_devices_in_order_and_ipv4_is_mapped() {
        let g = parse("10.0.0.1, 10.0.1.1,2001:db8::7").unwrap();
        assert_eq!(
            of(&g, 0).0,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
        );
        assert_eq!(of(&g, 1).0[12..], [10, 0, 1, 1]);
        assert_eq!(
            of(&g, 2).0,
            "2001:db8::7"
                .parse::<core::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        assert_eq!(of(&g, 3), DEFAULT_GID, "past the list");
        assert_eq!(of(&g, 200), DEFAULT_GID, "past the table");
    }

    #[test]
    fn malformed_lists_are_refused() {
        let reason = |t| match parse(t) {
            Err(Error::Param { name, reason }) => {
                assert_eq!(name, VAR);
                reason
            }
            other => panic!("{t}: {other:?}"),
        };
        assert_eq!(
            reason("10.0.0.1,banana"),
            "not a list of IP addresses; default used"
        );
        assert_eq!(
            reason("10.0.0.1,,10.0.0.2"),
            "not a list of IP addresses; default used"
        );
        assert_eq!(
            reason("1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4,1.1.1.5,1.1.1.6,1.1.1.7,1.1.1.8,1.1.1.9"),
            "more entries than soft devices (8); default used"
        );
    }
}
