//! The `NCCL_IB_HCA` grammar, and matching device ports against it.
//!
//! ```text
//!  filter  := [ '^' ] [ '=' ] entry { ',' entry } [ ',' ]
//!  entry   := name [ ':' port ]          port: decimal 1..=255
//!
//!  "mlx5"             every port of every device whose name starts with "mlx5"
//!  "mlx5_0:1,mlx5_1"  port 1 of mlx5_0* and every port of mlx5_1*
//!  "=mlx5_1"          only the device named exactly "mlx5_1" (not mlx5_10)
//!  "^mlx5_0:2"        everything except port 2 of mlx5_0*
//!  "^=mlx5_1"         everything except the device named exactly "mlx5_1"
//!  ""                 everything
//! ```
//!
//! As in NCCL, `^` must come first and `=` second (`=^x` names a device called `^x`), the
//! modifiers apply to the whole list, an entry without a port matches every port, and an empty
//! filter matches everything. ibnet is stricter than NCCL about malformed lists: an empty entry
//! (`a,,b`), a bad port (`a:`, `a:x`, `a:0`, `a:256`), a name longer than [`NAME_MAX`] bytes, or
//! more than [`MAX_ENTRIES`] entries is an error. One trailing comma is accepted.
//!
//! `NCCL_SOCKET_IFNAME` uses the same grammar without ports ([`HcaFilter::parse_names`]): there
//! a `:` is part of the interface name (`eth0:1` is an alias interface).

use crate::error::{Error, Result};

/// Most entries in one filter.
pub const MAX_ENTRIES: usize = 32;
/// Longest name in an entry, in bytes.
pub const NAME_MAX: usize = 64;

/// One `name[:port]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device (or interface) name, or its prefix.
    pub name: heapless::String<NAME_MAX>,
    /// Port (1-based); `None` matches every port.
    pub port: Option<u8>,
}

/// A parsed `NCCL_IB_HCA` (or `NCCL_SOCKET_IFNAME`) filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: heapless::Vec<HcaEntry, MAX_ENTRIES>,
}

impl HcaFilter {
    /// Parses an `NCCL_IB_HCA` value. Errors are [`Error::Param`] naming `NCCL_IB_HCA`.
    pub fn parse(s: &str) -> Result<Self> {
        Self::parse_as(s, "NCCL_IB_HCA", true)
    }

    /// Parses an `NCCL_SOCKET_IFNAME` value (no ports). Errors are [`Error::Param`] naming
    /// `NCCL_SOCKET_IFNAME`.
    pub fn parse_names(s: &str) -> Result<Self> {
        Self::parse_as(s, "NCCL_SOCKET_IFNAME", false)
    }

    fn parse_as(s: &str, var: &'static str, ports: bool) -> Result<Self> {
        let err = |reason| Error::Param { name: var, reason };
        let mut f = Self::default();
        let mut rest = s;
        if let Some(r) = rest.strip_prefix('^') {
            f.exclude = true;
            rest = r;
        }
        if let Some(r) = rest.strip_prefix('=') {
            f.exact = true;
            rest = r;
        }
        if rest.is_empty() {
            // "" matches everything; "^" or "=" with no list is a mistake.
            return if f.exclude || f.exact {
                Err(err("modifier without a list"))
            } else {
                Ok(f)
            };
        }
        let rest = rest.strip_suffix(',').unwrap_or(rest);
        for item in rest.split(',') {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) if ports => (n, Some(parse_port(p).ok_or(err("bad port"))?)),
                _ => (item, None),
            };
            if name.is_empty() {
                return Err(err("empty name in list"));
            }
            let name =
                heapless::String::try_from(name).map_err(|_| err("name longer than 64 bytes"))?;
            f.entries
                .push(HcaEntry { name, port })
                .map_err(|_| err("more than 32 entries"))?;
        }
        Ok(f)
    }

    /// Whether port `port` of device `dev` passes the filter.
    pub fn matches(&self, dev: &str, port: u8) -> bool {
        self.select(|e| self.name_matches(&e.name, dev) && e.port.is_none_or(|p| p == port))
    }

    /// Whether the interface (or device) `name` passes the filter, ignoring ports.
    pub fn matches_name(&self, name: &str) -> bool {
        self.select(|e| self.name_matches(&e.name, name))
    }

    fn select(&self, hit: impl Fn(&HcaEntry) -> bool) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        self.entries.iter().any(hit) != self.exclude
    }

    fn name_matches(&self, entry: &str, name: &str) -> bool {
        if self.exact {
            name == entry
        } else {
            name.starts_with(entry)
        }
    }

    /// No entries: matches everything.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The list names what to exclude (`^`).
    pub fn is_exclude(&self) -> bool {
        self.exclude
    }

    /// Names match exactly (`=`), not by prefix.
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[HcaEntry] {
        &self.entries
    }
}

fn parse_port(p: &str) -> Option<u8> {
    if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse::<u8>().ok().filter(|&n| n != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> HcaFilter {
        HcaFilter::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn empty_matches_everything() {
        let e = f("");
        assert!(e.is_empty());
        assert!(e.matches("mlx5_0", 1));
        assert!(e.matches("anything", 9));
        assert!(HcaFilter::parse_names("").unwrap().matches_name("eth0"));
    }

    #[test]
    fn prefix_include() {
        let x = f("mlx5_1");
        assert!(x.matches("mlx5_1", 1));
        assert!(x.matches("mlx5_10", 2), "prefix match");
        assert!(!x.matches("mlx5_0", 1));
        assert!(!x.matches("mlx5_", 1));
        assert!(!x.is_exact() && !x.is_exclude());
    }

    #[test]
    fn exact_include() {
        let x = f("=mlx5_1");
        assert!(x.is_exact());
        assert!(x.matches("mlx5_1", 1));
        assert!(!x.matches("mlx5_10", 1));
    }

    #[test]
    fn ports() {
        let x = f("mlx5_0:1,mlx5_1");
        assert_eq!(x.entries().len(), 2);
        assert_eq!(x.entries()[0].port, Some(1));
        assert_eq!(x.entries()[1].port, None);
        assert!(x.matches("mlx5_0", 1));
        assert!(!x.matches("mlx5_0", 2));
        assert!(x.matches("mlx5_1", 2));
        assert!(!x.matches("mlx4_0", 1));
        assert!(f("a:255").matches("a", 255));
    }

    #[test]
    fn exclude() {
        let x = f("^mlx5_0:2");
        assert!(x.is_exclude());
        assert!(!x.matches("mlx5_0", 2));
        assert!(x.matches("mlx5_0", 1));
        assert!(x.matches("mlx5_1", 2));
        assert!(!x.matches("mlx5_01", 2), "prefix applies to exclusion too");
    }

    #[test]
    fn exclude_exact() {
        let x = f("^=mlx5_1,mlx5_2:1");
        assert!(x.is_exclude() && x.is_exact());
        assert!(!x.matches("mlx5_1", 1));
        assert!(x.matches("mlx5_10", 1));
        assert!(!x.matches("mlx5_2", 1));
        assert!(x.matches("mlx5_2", 2));
        assert!(x.matches("mlx5_0", 1));
    }

    #[test]
    fn modifier_order_is_caret_then_equals() {
        // "=^x" names a device called "^x", exactly.
        let x = f("=^x");
        assert!(x.is_exact() && !x.is_exclude());
        assert!(x.matches("^x", 1));
        assert!(!x.matches("x", 1));
    }

    #[test]
    fn trailing_comma_is_accepted() {
        assert_eq!(f("a,b,"), f("a,b"));
    }

    #[test]
    fn capacity() {
        let mut s = String::new();
        for i in 0..MAX_ENTRIES {
            s.push_str(&format!("d{i},"));
        }
        assert_eq!(f(&s).entries().len(), MAX_ENTRIES);
        s.push_str("one_more");
        assert!(matches!(
            HcaFilter::parse(&s),
            Err(Error::Param {
                name: "NCCL_IB_HCA",
                reason: "more than 32 entries"
            })
        ));
        let name = "n".repeat(NAME_MAX);
        assert!(f(&name).matches(&name, 1));
        let name = "n".repeat(NAME_MAX + 1);
        assert!(HcaFilter::parse(&name).is_err());
    }

    #[test]
    fn malformed() {
        for s in [
            "^", "=", "^=", ",", "a,,b", ",a", "a,,", ":1", "a:", "a:x", "a:0", "a:256", "a:1:2",
            "a:+1", "a:-1", "a: 1", "a:0001",
        ] {
            match HcaFilter::parse(s) {
                Err(Error::Param {
                    name: "NCCL_IB_HCA",
                    ..
                }) => {}
                other => panic!("{s:?}: {other:?}"),
            }
        }
    }

    /// Entries are kept as written, as NCCL reads them: a space inside the list is part of the
    /// name, and so is any non-ASCII whitespace (found by the `env` fuzz target against ffi's
    /// since removed duplicate parser, which trimmed every entry). `Params::set` drops ASCII
    /// whitespace at the ends of the value only (`params::tests`).
    #[test]
    fn entries_are_kept_as_written() {
        let x = f("mlx5_0, mlx5_1:1");
        assert_eq!(x.entries()[1].name.as_str(), " mlx5_1");
        assert!(x.matches("mlx5_0", 1));
        assert!(!x.matches("mlx5_1", 1) && x.matches(" mlx5_1", 1));
        let i = HcaFilter::parse_names("\u{b}eth0,ib\u{a0}").unwrap();
        assert!(i.matches_name("\u{b}eth0") && !i.matches_name("eth0"));
        assert!(i.matches_name("ib\u{a0}0") && !i.matches_name("ib0"));
    }

    #[test]
    fn socket_ifname() {
        let x = HcaFilter::parse_names("^docker,lo").unwrap();
        assert!(!x.matches_name("docker0"));
        assert!(!x.matches_name("lo"));
        assert!(x.matches_name("eth0"));
        let x = HcaFilter::parse_names("=eth0:1").unwrap();
        assert_eq!(x.entries()[0].name.as_str(), "eth0:1");
        assert_eq!(x.entries()[0].port, None);
        assert!(x.matches_name("eth0:1"));
        assert!(!x.matches_name("eth0"));
        assert!(matches!(
            HcaFilter::parse_names("a,,b"),
            Err(Error::Param {
                name: "NCCL_SOCKET_IFNAME",
                ..
            })
        ));
    }
}
