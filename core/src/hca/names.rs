//! The `NCCL_SOCKET_IFNAME` list: stricter than `NCCL_IB_HCA`, without ports.

use super::entry::{HcaEntry, UNSET};
use crate::error::{Error, Result};

/// A parsed list: excluding (`^`), exact (`=`), the names.
pub type Names = (bool, bool, heapless::Vec<HcaEntry, MAX>);
/// Most names in one list.
pub const MAX: usize = 32;

/// `NCCL_SOCKET_IFNAME`: `[^][=]name{,name}[,]`, strict: an empty name, a name longer than
/// 63 bytes, more than [`MAX`] names, or a modifier without a list is an error. A `:` is part
/// of the name.
pub fn parse_names(s: &str) -> Result<Names> {
    let err = |reason| Error::Param {
        name: "NCCL_SOCKET_IFNAME",
        reason,
    };
    let mut f: Names = (false, false, heapless::Vec::new());
    let mut rest = s;
    if let Some(r) = rest.strip_prefix('^') {
        f.0 = true;
        rest = r;
    }
    if let Some(r) = rest.strip_prefix('=') {
        f.1 = true;
        rest = r;
    }
    if rest.is_empty() {
        return if f.0 || f.1 {
            Err(err("modifier without a list"))
        } else {
            Ok(f)
        };
    }
    let rest = rest.strip_suffix(',').unwrap_or(rest);
    for item in rest.split(',') {
        if item.is_empty() {
            return Err(err("empty name in list"));
        }
        let name =
            heapless::String::try_from(item).map_err(|_| err("name longer than 63 bytes"))?;
        let e = HcaEntry {
            name,
            port: -1,
            rail: UNSET,
            plane: UNSET,
        };
        f.2.push(e).map_err(|_| err("more than 32 entries"))?;
    }
    Ok(f)
}
