//! The `NCCL_IB_HCA` grammar as NCCL 2.30 reads it (`parseStringList` and `matchIfList` in
//! `src/misc/utils.cc`, applied by `net_ib/init.cc`), and matching device ports against it.
//!
//! ```text
//!  filter  := [ '^' ] [ '=' ] entry { ',' entry }         (empty entries are skipped)
//!  entry   := name [ ':' port [ ':' rail [ ':' plane ] ] ]  (an empty field is unset, -1)
//!
//!  "mlx5"                 every port of every device whose name starts with "mlx5"
//!  "mlx5_0:1,mlx5_1"      port 1 of mlx5_0* and every port of mlx5_1*
//!  "mlx5_0:1:0:0"         port 1 of mlx5_0*, rail 0, plane 0 (v12's railId / planeId)
//!  "mlx5_0::2"            every port of mlx5_0*, rail 2, plane unset
//!  "=mlx5_1"              only the device named exactly "mlx5_1" (not mlx5_10)
//!  "^mlx5_0:2"            everything except port 2 of mlx5_0*
//!  "^=mlx5_1"             everything except the device named exactly "mlx5_1"
//!  "", "=", ",,"          everything
//!  "^", "^,"              nothing (an exclusion of no entries excludes every device, as NCCL)
//! ```
//!
//! `^` must come first and `=` second (`=^x` names a device called `^x`); the modifiers apply
//! to the whole list. A port matches when either side is -1 or both are equal; the **first**
//! entry that matches a port gives its rail and plane (an excluding list gives none: every
//! device it lets through has rail and plane -1). The table of strings and the meaning taken
//! from NCCL's parser is the test `hca::tests::nccl_table`.
//!
//! # Malformed entries
//! NCCL reads numbers with C's `atoi` and never complains. ibnet selects exactly the ports
//! NCCL selects for **every** string, but says so once per entry that is not well formed
//! ([`HcaFilter::malformed`]: ffi logs one WARN naming the entry), and the rest of the list
//! applies as written. A field is well formed when it is empty, `-1`, or decimal digits in
//! range (port 1..=255, rail 0..=32767, plane 0..=[`PLANE_MAX`]). For a malformed entry:
//! * a port that is not well formed keeps NCCL's reading (glibc `atoi`: `x` is 0, which no
//!   port has, so the entry selects nothing; `1x` is 1), so selection stays NCCL's;
//! * a rail or plane that is not well formed is unset (-1), where `atoi` would make a number
//!   of junk (`x` → rail 0) or NCCL would fail its init (a plane with bit 14 set);
//! * fields after the plane are ignored, an entry with no name is skipped, a name longer than
//!   63 bytes is cut to 63 (at a character boundary), entries after the 32nd are ignored, all
//!   as NCCL does; a name with ASCII whitespace is kept as written (it matches no device).
//!
//! `NCCL_SOCKET_IFNAME` has its own, stricter reading without ports
//! ([`HcaFilter::parse_names`]): there a `:` is part of the interface name (`eth0:1` is an
//! alias interface).

mod entry;
mod names;
mod num;
#[cfg(test)]
mod tests;

/// Most entries in one filter (NCCL's `MAX_IB_DEVS`); later ones are ignored, with a WARN.
pub const MAX_ENTRIES: usize = 32;
pub use entry::{HcaEntry, NAME_MAX, PLANE_MAX, UNSET};

/// Most diagnostics one parse keeps: one per entry, the ignored tail, an empty exclusion.
pub const MAX_MALFORMED: usize = MAX_ENTRIES + 2;

/// What a matching entry gives a device: its v12 rail and plane ids (-1: unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// `railId`.
    pub rail: i16,
    /// `planeId`.
    pub plane: i16,
}

impl Ids {
    /// Neither set.
    pub const UNSET: Self = Self {
        rail: UNSET,
        plane: UNSET,
    };
}

/// One entry that is not well formed: where it is in the parsed text, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed {
    start: u16,
    end: u16,
    /// What is wrong, and what ibnet does about it.
    pub reason: &'static str,
}

impl Malformed {
    /// The entry's text in `src`, the string that was parsed.
    pub fn entry<'a>(&self, src: &'a str) -> &'a str {
        src.get(usize::from(self.start)..usize::from(self.end))
            .unwrap_or("")
    }
}

/// A parsed `NCCL_IB_HCA` (or `NCCL_SOCKET_IFNAME`) filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: heapless::Vec<HcaEntry, MAX_ENTRIES>,
    malformed: heapless::Vec<Malformed, MAX_MALFORMED>,
}

impl HcaFilter {
    /// Parses an `NCCL_IB_HCA` value as NCCL 2.30 does. Never fails: what is not well formed
    /// is listed by [`Self::malformed`] (at most [`MAX_MALFORMED`]; only a value longer than
    /// 65535 bytes, which `Params` refuses first, loses their positions).
    pub fn parse(s: &str) -> Self {
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
        let base = s.len() - rest.len();
        let mut at = base;
        for item in rest.split(',') {
            let start = at;
            at += item.len() + 1;
            if item.is_empty() {
                continue; // strtok skips empty entries
            }
            let mut bad = |reason| {
                let (start, end) = (
                    start.min(u16::MAX.into()),
                    (start + item.len()).min(u16::MAX.into()),
                );
                let m = Malformed {
                    start: start as u16,
                    end: end as u16,
                    reason,
                };
                // Cannot fail: at most one per entry (≤ MAX_ENTRIES) plus the two below.
                let _ = f.malformed.push(m);
            };
            if f.entries.is_full() {
                bad("more than 32 entries: this one and the rest are ignored, as NCCL");
                break;
            }
            match entry::entry(item) {
                Ok(e) => {
                    let _ = f.entries.push(e);
                }
                Err((Some(e), why)) => {
                    bad(why);
                    let _ = f.entries.push(e);
                }
                Err((None, why)) => bad(why),
            }
        }
        if f.exclude && f.entries.is_empty() {
            let m = Malformed {
                start: 0,
                end: s.len().min(u16::MAX.into()) as u16,
                reason: "an exclusion of no entries excludes every device (as NCCL)",
            };
            let _ = f.malformed.push(m);
        }
        f
    }

    /// Parses an `NCCL_SOCKET_IFNAME` value (names only; a `:` belongs to the name). Errors
    /// are [`Error::Param`](crate::Error::Param) naming `NCCL_SOCKET_IFNAME`.
    pub fn parse_names(s: &str) -> crate::error::Result<Self> {
        let (exclude, exact, entries) = names::parse_names(s)?;
        Ok(Self {
            exclude,
            exact,
            entries,
            malformed: heapless::Vec::new(),
        })
    }

    /// The entries that were not well formed, in order, each to be reported once.
    pub fn malformed(&self) -> &[Malformed] {
        &self.malformed
    }

    /// Whether port `port` of device `dev` passes the filter, and if so the rail and plane
    /// the first matching entry gives it (`None`: the device is not used).
    pub fn select(&self, dev: &str, port: u8) -> Option<Ids> {
        if self.entries.is_empty() {
            return (!self.exclude).then_some(Ids::UNSET);
        }
        let hit = self.entries.iter().find(|e| {
            self.name_matches(&e.name, dev) && (e.port == -1 || e.port == i32::from(port))
        });
        match (hit, self.exclude) {
            (Some(e), false) => Some(Ids {
                rail: e.rail,
                plane: e.plane,
            }),
            (None, true) => Some(Ids::UNSET),
            _ => None,
        }
    }

    /// Whether port `port` of device `dev` passes the filter.
    pub fn matches(&self, dev: &str, port: u8) -> bool {
        self.select(dev, port).is_some()
    }

    /// Whether the interface (or device) `name` passes the filter, ignoring ports.
    pub fn matches_name(&self, name: &str) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        self.entries
            .iter()
            .any(|e| self.name_matches(&e.name, name))
            != self.exclude
    }

    fn name_matches(&self, entry: &str, name: &str) -> bool {
        if self.exact {
            name == entry
        } else {
            name.starts_with(entry)
        }
    }

    /// No entries (with `^`: nothing passes; else everything does).
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

/// The rail and plane of a fused NIC whose devices have `members` ids, as NCCL 2.30's
/// `ncclIbMakeVDeviceInternal`: the rail is the devices' common rail (-1 when any is unset or
/// two differ); the plane of one device is its own, of several
/// `1 << 14 | Σ 1 << index(plane)`, where `index` numbers the distinct planes of `all` (every
/// physical device, in device order) from 1, 0 being "unset". A plane past NCCL's 13 indices
/// (which NCCL refuses at init) makes the fused plane unset.
pub fn fused_ids(members: &[Ids], all: &[Ids]) -> Ids {
    let Some(first) = members.first() else {
        return Ids::UNSET;
    };
    let same = members
        .iter()
        .all(|m| m.rail != UNSET && m.rail == first.rail);
    let rail = if same { first.rail } else { UNSET };
    if members.len() == 1 {
        return Ids {
            rail,
            plane: first.plane,
        };
    }
    let mut planes: heapless::Vec<i16, 13> = heapless::Vec::new();
    let _ = planes.push(UNSET);
    for d in all {
        if !planes.contains(&d.plane) && planes.push(d.plane).is_err() {
            break;
        }
    }
    let mut plane = 1i16 << 14;
    for m in members {
        match planes.iter().position(|&p| p == m.plane) {
            Some(i) => plane |= 1 << i,
            None => return Ids { rail, plane: UNSET },
        }
    }
    Ids { rail, plane }
}
