//! GID selection, as NCCL's `ncclIbGetGidIndex` decides it, over GIDs the caller read
//! (`ibv_query_gid`, sysfs `gid_attrs/types`):
//!
//! ```text
//!  InfiniBand: NCCL_IB_ROUTABLE_FLID_GID_INDEX when in the table and its GID carries a
//!              routable FLID, else index 0                        (infiniband_index)
//!  RoCE:       NCCL_IB_GID_INDEX when set (≥ 0), else auto-selection (select_auto):
//!              among the valid GIDs (configured, not link-local) of NCCL_IB_ADDR_FAMILY
//!              (unset: AF_INET) inside NCCL_IB_ADDR_RANGE: the first of RoCE version
//!              NCCL_IB_ROCE_VERSION_NUM, else the first of any version;
//!              none, NCCL_IB_ADDR_FAMILY or NCCL_IB_ADDR_RANGE set: NoMatch (an error;
//!                never a GID outside the family or range the user set)
//!              none, both unset: index 0, as NCCL does (Chosen::fallback)
//! ```
//! NCCL leaves index 0 in place when nothing matches, whatever its address; ibnet does too
//! when the user set neither variable (a RoCE port with only IPv6 or link-local GIDs stays
//! usable, as under NCCL), and refuses when the user set one (the port would talk from an
//! address the user excluded).

use crate::params::{AddrFamily, AddrRange, Params};
use crate::verbs::{DevName, Gid};
use crate::Error;

/// One GID of a port's table, as the caller read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Its index in the port's GID table.
    pub index: i32,
    /// The GID.
    pub gid: [u8; 16],
    /// Its RoCE version ([`roce_version`] of its sysfs type), `None` when unknown.
    pub roce: Option<u8>,
}

/// What RoCE auto-selection looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Auto {
    /// `NCCL_IB_ADDR_FAMILY` (unset: `AF_INET`, NCCL's default).
    pub family: AddrFamily,
    /// `NCCL_IB_ADDR_RANGE`, when set in that family (a range of the other family is
    /// ignored, as NCCL's parser fails it).
    pub range: Option<AddrRange>,
    /// `NCCL_IB_ROCE_VERSION_NUM`.
    pub roce_version: u8,
    /// `NCCL_IB_ADDR_FAMILY` or `NCCL_IB_ADDR_RANGE` was set by the user: no GID outside
    /// them ([`NoMatch`]). Both unset: NCCL's fallback to index 0.
    pub strict: bool,
}

impl Auto {
    /// The selection `p` asks for.
    pub fn from_params(p: &Params) -> Self {
        Self {
            family: p.addr_family(),
            range: p.gid_addr_range(),
            roce_version: p.ib_roce_version_num,
            strict: p.ib_addr_family.is_some() || p.ib_addr_range.is_some(),
        }
    }
}

/// The index auto-selection chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chosen {
    /// The GID index.
    pub index: i32,
    /// No GID matched and neither variable was set: index 0, NCCL's fallback (the caller
    /// says so in its INFO line).
    pub fallback: bool,
}

/// No GID of the port is valid, of the family and inside the range the user set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoMatch {
    /// The family looked for.
    pub family: AddrFamily,
    /// The range looked for (`None`: any).
    pub range: Option<AddrRange>,
}

impl NoMatch {
    /// As the core's error on port `port` of `dev` ([`Error::NoGid`], `ncclInvalidUsage`: the
    /// configuration excludes every address of the port).
    pub fn to_error(self, dev: DevName, port: u8) -> Error {
        Error::NoGid {
            dev,
            port,
            inet6: self.family == AddrFamily::Inet6,
            range: self.range.map(|r| (Gid(r.addr), r.prefix_len)),
        }
    }
}

/// The address family of a GID: IPv4 for an IPv4-mapped GID (`::ffff:a.b.c.d`), else IPv6.
pub fn family_of(g: &[u8; 16]) -> AddrFamily {
    if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
        AddrFamily::Inet
    } else {
        AddrFamily::Inet6
    }
}

/// A GID the selection may use: configured (non-zero interface id) and not link-local.
pub fn valid(g: &[u8; 16]) -> bool {
    g[8..].iter().any(|&b| b != 0) && !(g[0] == 0xfe && g[1] & 0xc0 == 0x80)
}

/// Whether `g` lies in `range` (no range: every GID does). An IPv4 range holds only IPv4
/// GIDs, an IPv6 range only IPv6 ones.
pub fn in_range(g: &[u8; 16], range: Option<&AddrRange>) -> bool {
    let Some(r) = range else { return true };
    family_of(g) == r.family && r.contains_gid(&Gid(*g))
}

/// The RoCE version named by a sysfs `gid_attrs/types/N` text (`RoCE v2` → 2, `IB/RoCE v1`
/// → 1); `None` for anything else.
pub fn roce_version(type_text: &str) -> Option<u8> {
    if type_text.contains("RoCE v2") {
        Some(2)
    } else if type_text.contains("RoCE") {
        Some(1)
    } else {
        None
    }
}

/// RoCE auto-selection over `gids` (see the module doc): the chosen index, or [`NoMatch`]
/// when nothing matches and `sel.strict`.
pub fn select_auto(gids: &[Candidate], sel: &Auto) -> Result<Chosen, NoMatch> {
    let cands = || {
        gids.iter().filter(|c| {
            valid(&c.gid) && family_of(&c.gid) == sel.family && in_range(&c.gid, sel.range.as_ref())
        })
    };
    let found = cands()
        .find(|c| c.roce == Some(sel.roce_version))
        .or_else(|| cands().next());
    match found {
        Some(c) => Ok(Chosen {
            index: c.index,
            fallback: false,
        }),
        None if sel.strict => Err(NoMatch {
            family: sel.family,
            range: sel.range,
        }),
        None => Ok(Chosen {
            index: 0,
            fallback: true,
        }),
    }
}

/// InfiniBand: `flid_index` (`NCCL_IB_ROUTABLE_FLID_GID_INDEX`) when it is inside a table of
/// `gid_tbl_len` entries and `flid`, the FLID of the GID there (`None`: unreadable), is
/// non-zero; else 0.
pub fn infiniband_index(flid_index: u8, gid_tbl_len: i32, flid: Option<u16>) -> i32 {
    let f = i32::from(flid_index);
    match flid {
        Some(fl) if f < gid_tbl_len && fl != 0 => f,
        _ => 0,
    }
}

#[cfg(test)]
mod tests;
