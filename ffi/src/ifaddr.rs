//! Chooses the IP interface for the bootstrap sockets, as NCCL does.
//!
//! * `NCCL_SOCKET_IFNAME` set: a comma-separated list of prefixes; a leading `^` excludes the
//!   listed interfaces instead, a leading `=` requires exact names (both may combine: `^=eth0`).
//!   The grammar is the core's, shared with `NCCL_IB_HCA` ([`ibnet_core::hca`]).
//! * Unset: every interface except `docker*` and `lo` first (`ib*` before the rest), then
//!   `docker*`, then `lo`.
//! * `NCCL_SOCKET_FAMILY` = `AF_INET` / `AF_INET6` restricts the address family.
//!
//! The first matching address (interfaces in the system's order) wins.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ibnet_core::hca::HcaFilter;

/// One interface address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name.
    pub name: String,
    /// Its address (port 0; IPv6 link-local addresses carry the scope id).
    pub addr: SocketAddr,
}

/// Every IPv4/IPv6 address of every interface that is up, in the system's order.
pub fn list() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = core::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-NULL and points at a sockaddr of the family it declares.
        let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let addr = match fam {
            libc::AF_INET => {
                // SAFETY: family AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))),
                    0,
                )
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6: the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                SocketAddr::V6(std::net::SocketAddrV6::new(ip, 0, 0, sin6.sin6_scope_id))
            }
            _ => continue,
        };
        out.push(IfAddr { name, addr });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

fn family_ok(a: &SocketAddr, family: Option<i32>) -> bool {
    match family {
        Some(libc::AF_INET) => a.is_ipv4(),
        Some(libc::AF_INET6) => a.is_ipv6(),
        _ => true,
    }
}

/// Picks the bootstrap interface from `addrs` per `ifname` (`NCCL_SOCKET_IFNAME` as
/// `Params::set` parsed it, the one parse; `None`: unset) and `family`
/// (`NCCL_SOCKET_FAMILY`). `None` when nothing qualifies.
pub fn choose(addrs: &[IfAddr], ifname: Option<&HcaFilter>, family: Option<i32>) -> Option<IfAddr> {
    let ok = |a: &&IfAddr| family_ok(&a.addr, family);
    if let Some(f) = ifname {
        return addrs
            .iter()
            .filter(ok)
            .find(|a| f.matches_name(&a.name))
            .cloned();
    }
    let other = |a: &&IfAddr| !a.name.starts_with("docker") && !a.name.starts_with("lo");
    // NCCL prefers ib* among the ordinary interfaces, then the others; IPv4 before IPv6
    // link-local (an IPv6 link-local address needs a scope id the peer cannot use).
    let usable = |a: &&IfAddr| !matches!(a.addr.ip(), IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
    addrs
        .iter()
        .filter(ok)
        .filter(other)
        .filter(usable)
        .find(|a| a.name.starts_with("ib"))
        .or_else(|| addrs.iter().filter(ok).filter(other).find(usable))
        .or_else(|| {
            addrs
                .iter()
                .filter(ok)
                .find(|a| a.name.starts_with("docker"))
        })
        .or_else(|| addrs.iter().filter(ok).find(|a| a.name.starts_with("lo")))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(name: &str, ip: &str) -> IfAddr {
        IfAddr {
            name: name.into(),
            addr: SocketAddr::new(ip.parse().unwrap(), 0),
        }
    }

    #[test]
    fn default_preference() {
        let v = vec![
            a("lo", "127.0.0.1"),
            a("docker0", "172.17.0.1"),
            a("eth0", "10.0.0.2"),
            a("ib0", "10.1.0.2"),
        ];
        assert_eq!(choose(&v, None, None).unwrap().name, "ib0");
        assert_eq!(choose(&v[..3], None, None).unwrap().name, "eth0");
        assert_eq!(choose(&v[..2], None, None).unwrap().name, "docker0");
        assert_eq!(choose(&v[..1], None, None).unwrap().name, "lo");
        assert_eq!(
            choose(&v, Some(&names("^ib,eth")), None).unwrap().name,
            "lo"
        );
        assert_eq!(
            choose(&v, Some(&names("=eth0")), None).unwrap().name,
            "eth0"
        );
        assert!(choose(&v, Some(&names("xyz")), None).is_none());
        assert!(choose(&v, None, Some(libc::AF_INET6)).is_none());
    }

    /// Found by the `env` fuzz target (against the since removed duplicate parser, which
    /// trimmed every entry and Unicode whitespace): `choose` must apply the list exactly as
    /// the core validated and stored it, so a name written `" ib0"` selects `" ib0"` only.
    /// `NCCL_SOCKET_IFNAME=s` as the plugin applies it: parsed by `Params::set`.
    fn names(s: &str) -> HcaFilter {
        let mut p = ibnet_core::params::Params::default();
        p.set("NCCL_SOCKET_IFNAME", s).unwrap();
        p.ifname
    }

    #[test]
    fn applies_the_list_the_core_validated() {
        for v in ["eth0, ib0", "^= lo,eth0 ", "\u{b}eth0", "eth\u{a0},ib"] {
            let mut p = ibnet_core::params::Params::default();
            p.set("NCCL_SOCKET_IFNAME", v).unwrap();
            let core = p.socket_ifname_filter();
            for n in [
                "eth0",
                "ib0",
                " ib0",
                "lo",
                " lo",
                "\u{b}eth0",
                "eth\u{a0}",
                "ib",
            ] {
                let ffi = choose(&[a(n, "10.0.0.1")], Some(&p.ifname), None).is_some();
                assert_eq!(core.matches_name(n), ffi, "{v:?} on {n:?}");
            }
        }
        let v = [a("ib0", "10.0.0.1"), a(" ib0", "10.0.0.2")];
        assert_eq!(
            choose(&v, Some(&names(" eth0, ib0 ")), None).unwrap().name,
            " ib0"
        );
    }
}
