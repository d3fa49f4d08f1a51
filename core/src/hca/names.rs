//! One `NCCL_IB_HCA` entry as NCCL 2.30's `parseStringList` reads it, and the stricter
//! `NCCL_SOCKET_IFNAME` list.

use super::num::{atoi, well_formed};
use super::{HcaEntry, HcaFilter, NAME_MAX, PLANE_MAX, UNSET};
use crate::error::{Error, Result};

/// What [`entry`] could not take as written: the entry as ibnet uses it (`None`: skipped), and
/// why it is malformed.
pub type Odd = (Option<HcaEntry>, &'static str);

/// Reads one non-empty entry `name[:port[:rail[:plane]]]` (see [`crate::hca`] for the rules).
pub fn entry(item: &str) -> core::result::Result<HcaEntry, Odd> {
    let mut fields = item.split(':');
    let name = fields.next().unwrap_or("");
    if name.is_empty() {
        return Err((None, "no device name: the entry is skipped, as NCCL"));
    }
    let (port, rail, plane) = (fields.next(), fields.next(), fields.next());
    let extra = fields.next().is_some();
    let mut why: Option<&'static str> = None;
    let mut note = |w| {
        why.get_or_insert(w);
    };
    let kept = cut(name);
    if kept.len() < name.len() {
        note("name longer than 63 bytes: cut to 63, as NCCL");
    }
    let port = port.unwrap_or("");
    let port_v = match well_formed(port, 1, 255) {
        Some(p) => p,
        None => {
            note("port is not -1 or 1..=255: read as C's atoi reads it, as NCCL (0: no port)");
            atoi(port)
        }
    };
    let mut id = |f: Option<&str>, max: i16, what| match well_formed(f.unwrap_or(""), 0, max.into())
    {
        Some(v) => v as i16,
        None => {
            note(what);
            UNSET
        }
    };
    let rail = id(
        rail,
        i16::MAX,
        "rail is not -1 or 0..=32767: taken as unset",
    );
    let plane = id(
        plane,
        PLANE_MAX,
        "plane is not -1 or 0..=16383: taken as unset",
    );
    if extra {
        note("fields after the plane are ignored, as NCCL");
    }
    if name.bytes().any(|b| b.is_ascii_whitespace()) {
        note("name contains whitespace: kept as written, it matches no device");
    }
    let e = HcaEntry {
        // Cannot fail: `cut` keeps at most NAME_MAX bytes.
        name: heapless::String::try_from(kept).unwrap_or_default(),
        port: port_v,
        rail,
        plane,
    };
    match why {
        None => Ok(e),
        Some(w) => Err((Some(e), w)),
    }
}

/// The longest prefix of `name` of at most [`NAME_MAX`] bytes ending at a character boundary.
fn cut(name: &str) -> &str {
    let mut n = name.len().min(NAME_MAX);
    while !name.is_char_boundary(n) {
        n -= 1;
    }
    &name[..n]
}

/// `NCCL_SOCKET_IFNAME`: `[^][=]name{,name}[,]`, strict: an empty name, a name longer than
/// [`NAME_MAX`] bytes, more than [`MAX_ENTRIES`](super::MAX_ENTRIES) names, or a modifier without a list is an
/// error. A `:` is part of the name.
pub fn parse_names(s: &str) -> Result<HcaFilter> {
    let err = |reason| Error::Param {
        name: "NCCL_SOCKET_IFNAME",
        reason,
    };
    let mut f = HcaFilter::default();
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
        return if f.exclude || f.exact {
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
        f.entries.push(e).map_err(|_| err("more than 32 entries"))?;
    }
    Ok(f)
}
