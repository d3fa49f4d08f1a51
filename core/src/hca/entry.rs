//! One `NCCL_IB_HCA` entry as NCCL 2.30's `parseStringList` reads it (see [`crate::hca`]).

use super::num::{atoi, well_formed};

/// Longest name kept from an entry, in bytes (NCCL's `char prefix[64]` less its NUL).
pub const NAME_MAX: usize = 63;
/// Largest plane id NCCL accepts (bit 14 marks a fused NIC's plane set, `NCCL_IB_PLANE_VIRT_BIT`).
pub const PLANE_MAX: i16 = (1 << 14) - 1;
/// NCCL's "not set" for ports, rails and planes (`NCCL_NET_ID_UNDEF`).
pub const UNSET: i16 = -1;

/// One `name[:port[:rail[:plane]]]` entry, as NCCL reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device (or interface) name, or its prefix.
    pub name: heapless::String<NAME_MAX>,
    /// Port as NCCL's `atoi` reads it; -1 matches every port (0 or > 255: none).
    pub port: i32,
    /// Rail id (v12 `railId`), -1 unset.
    pub rail: i16,
    /// Plane id (v12 `planeId`), -1 unset.
    pub plane: i16,
}

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
