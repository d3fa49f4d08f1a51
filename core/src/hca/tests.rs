use super::*;
use crate::error::Error;

fn f(s: &str) -> HcaFilter {
    HcaFilter::parse(s)
}

/// Selection and ids of `mlx5_<d>` port `p`: `None` not used, else `(rail, plane)`.
fn sel(x: &HcaFilter, dev: &str, port: u8) -> Option<(i16, i16)> {
    x.select(dev, port).map(|i| (i.rail, i.plane))
}

/// The table of strings and what NCCL 2.30.7's `parseStringList`/`matchIfList` make of them
/// (read from `src/misc/utils.cc` and `net_ib/init.cc`): for each, the ports of a host with
/// `mlx5_0`, `mlx5_1`, `mlx5_10` (ports 1 and 2) it uses with their (rail, plane), and
/// whether ibnet reports the value as malformed. `-` = not used.
#[test]
fn nccl_table() {
    type Row = (&'static str, [Option<(i16, i16)>; 6], usize);
    const U: Option<(i16, i16)> = Some((-1, -1));
    const N: Option<(i16, i16)> = None;
    //            mlx5_0:1  mlx5_0:2  mlx5_1:1  mlx5_1:2  mlx5_10:1 mlx5_10:2   malformed
    let rows: &[Row] = &[
        ("", [U, U, U, U, U, U], 0),
        ("mlx5_0", [U, U, N, N, N, N], 0),
        ("mlx5_1", [N, N, U, U, U, U], 0),
        ("=mlx5_1", [N, N, U, U, N, N], 0),
        ("mlx5_0:1", [U, N, N, N, N, N], 0),
        ("mlx5_0:1:0:0", [Some((0, 0)), N, N, N, N, N], 0),
        (
            "mlx5_0:1:0:0,mlx5_1:1:1:0",
            [Some((0, 0)), N, Some((1, 0)), N, Some((1, 0)), N],
            0,
        ),
        (
            "=mlx5_0:1:0:0,mlx5_1:1:1:0",
            [Some((0, 0)), N, Some((1, 0)), N, N, N],
            0,
        ),
        ("mlx5_0:1:3", [Some((3, -1)), N, N, N, N, N], 0),
        ("mlx5_0::2", [Some((2, -1)), Some((2, -1)), N, N, N, N], 0),
        ("mlx5_0:::5", [Some((-1, 5)), Some((-1, 5)), N, N, N, N], 0),
        ("mlx5_0:-1:-1:-1", [U, U, N, N, N, N], 0),
        (
            "mlx5_0:2:7,mlx5_0:1:8",
            [Some((8, -1)), Some((7, -1)), N, N, N, N],
            0,
        ),
        // The first matching entry gives the ids.
        (
            "mlx5_1:1:4,=mlx5_10:1:5",
            [N, N, Some((4, -1)), N, Some((4, -1)), N],
            0,
        ),
        ("mlx5_0,,mlx5_1:2,", [U, U, N, U, N, U], 0),
        (",mlx5_0,,,", [U, U, N, N, N, N], 0),
        (",,,", [U, U, U, U, U, U], 0),
        ("=", [U, U, U, U, U, U], 0),
        ("^mlx5_0:2", [U, N, U, U, U, U], 0),
        ("^mlx5_1", [U, U, N, N, N, N], 0),
        ("^=mlx5_1", [U, U, N, N, U, U], 0),
        ("^mlx5_0:1:3:4", [N, U, U, U, U, U], 0),
        ("=^mlx5_0", [N, N, N, N, N, N], 0),
        // Not well formed: one diagnostic each, the rest of the list applies.
        ("^", [N, N, N, N, N, N], 1),
        ("^,", [N, N, N, N, N, N], 1),
        ("mlx5_0:x,mlx5_1:1", [N, N, U, N, U, N], 1),
        ("mlx5_0:1x,mlx5_1:1", [U, N, U, N, U, N], 1),
        ("mlx5_0:0,mlx5_1", [N, N, U, U, U, U], 1),
        ("mlx5_0:256", [N, N, N, N, N, N], 1),
        ("mlx5_0: 2", [N, U, N, N, N, N], 1),
        ("mlx5_0:+1", [U, N, N, N, N, N], 1),
        ("mlx5_0:99999999999999999999", [U, U, N, N, N, N], 1),
        ("mlx5_0:1:x:2", [Some((-1, 2)), N, N, N, N, N], 1),
        ("mlx5_0:1:-3", [U, N, N, N, N, N], 1),
        ("mlx5_0:1:40000", [U, N, N, N, N, N], 1),
        ("mlx5_0:1:0:16384", [Some((0, -1)), N, N, N, N, N], 1),
        ("mlx5_0:1:0:0:9,mlx5_1", [Some((0, 0)), N, U, U, U, U], 1),
        (":1,mlx5_1", [N, N, U, U, U, U], 1),
        ("mlx5_0 ,mlx5_1:2", [N, N, N, U, N, U], 1),
        ("mlx5_0:x,mlx5_1:y,mlx5_10", [N, N, N, N, U, U], 2),
        ("^mlx5_0:x", [U, U, U, U, U, U], 1),
    ];
    let ports = [
        ("mlx5_0", 1),
        ("mlx5_0", 2),
        ("mlx5_1", 1),
        ("mlx5_1", 2),
        ("mlx5_10", 1),
        ("mlx5_10", 2),
    ];
    for (s, want, bad) in rows {
        let x = f(s);
        for ((dev, port), w) in ports.iter().zip(want) {
            assert_eq!(sel(&x, dev, *port), *w, "{s:?} on {dev}:{port}");
        }
        assert_eq!(x.malformed().len(), *bad, "{s:?}: {:?}", x.malformed());
        for m in x.malformed() {
            assert!(!m.entry(s).is_empty(), "{s:?}: {m:?} names no entry");
        }
    }
}

#[test]
fn malformed_names_the_entry() {
    let s = "mlx5_0:1,mlx5_1:x:0,mlx5_2:1:0:0:7";
    let x = f(s);
    let named: heapless::Vec<&str, 4> = x.malformed().iter().map(|m| m.entry(s)).collect();
    assert_eq!(named.as_slice(), ["mlx5_1:x:0", "mlx5_2:1:0:0:7"]);
    assert!(x.malformed()[0].reason.contains("port"));
    assert!(x.malformed()[1].reason.contains("after the plane"));
    let s = "^=a:1,b::z";
    assert_eq!(f(s).malformed()[0].entry(s), "b::z");
    assert!(f("^").malformed()[0]
        .reason
        .contains("excludes every device"));
}

#[test]
fn capacity_and_long_names() {
    let mut s = String::new();
    for i in 0..MAX_ENTRIES {
        s.push_str(&format!("d{i},"));
    }
    assert_eq!(f(&s).entries().len(), MAX_ENTRIES);
    assert!(f(&s).malformed().is_empty());
    s.push_str(",one_more,and_more");
    let x = f(&s);
    assert_eq!(x.entries().len(), MAX_ENTRIES);
    assert_eq!(x.malformed().len(), 1);
    assert_eq!(x.malformed()[0].entry(&s), "one_more");
    assert!(!x.matches("one_more", 1) && x.matches("d31", 1));
    let name = "n".repeat(NAME_MAX);
    assert!(f(&name).matches(&name, 1) && f(&name).malformed().is_empty());
    let long = "n".repeat(NAME_MAX + 5);
    let x = f(&long);
    assert_eq!(x.entries()[0].name.len(), NAME_MAX);
    assert_eq!(x.malformed().len(), 1);
    // Cut at a character boundary.
    let wide = format!("{}é", "n".repeat(NAME_MAX - 1));
    assert_eq!(
        f(&wide).entries()[0].name.as_str(),
        "n".repeat(NAME_MAX - 1)
    );
}

#[test]
fn fused_ids_follow_nccl() {
    let id = |rail, plane| Ids { rail, plane };
    let all = [id(0, 0), id(0, 1), id(1, -1), id(-1, 1)];
    assert_eq!(fused_ids(&all[..1], &all), id(0, 0));
    // Common rail kept; planes 0 and 1 are indices 1 and 2 (0 is "unset").
    assert_eq!(fused_ids(&all[..2], &all), id(0, 1 << 14 | 0b110));
    assert_eq!(fused_ids(&all[1..3], &all), id(-1, 1 << 14 | 0b101));
    assert_eq!(fused_ids(&[all[3], all[3]], &all), id(-1, 1 << 14 | 0b100));
    assert_eq!(fused_ids(&[], &all), Ids::UNSET);
    // Planes past NCCL's 13 indices: unset.
    let many: Vec<Ids> = (0..20).map(|p| id(-1, p)).collect();
    assert_eq!(fused_ids(&many[15..17], &many).plane, UNSET);
}

#[test]
fn modifier_order_is_caret_then_equals() {
    let x = f("=^x");
    assert!(x.is_exact() && !x.is_exclude());
    assert!(x.matches("^x", 1) && !x.matches("x", 1));
}

/// Entries are kept as written, as NCCL reads them: a space inside the list is part of the
/// name (and reported), and so is any non-ASCII whitespace. `Params::set` drops ASCII
/// whitespace at the ends of the value only (`params::tests`).
#[test]
fn entries_are_kept_as_written() {
    let x = f("mlx5_0, mlx5_1:1");
    assert_eq!(x.entries()[1].name.as_str(), " mlx5_1");
    assert!(x.matches("mlx5_0", 1));
    assert!(!x.matches("mlx5_1", 1) && x.matches(" mlx5_1", 1));
    assert_eq!(x.malformed().len(), 1);
    let i = HcaFilter::parse_names("\u{b}eth0,ib\u{a0}").unwrap();
    assert!(i.matches_name("\u{b}eth0") && !i.matches_name("eth0"));
    assert!(i.matches_name("ib\u{a0}0") && !i.matches_name("ib0"));
}

#[test]
fn socket_ifname() {
    let x = HcaFilter::parse_names("^docker,lo").unwrap();
    assert!(!x.matches_name("docker0") && !x.matches_name("lo") && x.matches_name("eth0"));
    let x = HcaFilter::parse_names("=eth0:1").unwrap();
    assert_eq!(x.entries()[0].name.as_str(), "eth0:1");
    assert_eq!(x.entries()[0].port, -1);
    assert!(x.matches_name("eth0:1") && !x.matches_name("eth0"));
    assert!(HcaFilter::parse_names("").unwrap().matches_name("eth0"));
    for s in ["a,,b", "^", "="] {
        assert!(matches!(
            HcaFilter::parse_names(s),
            Err(Error::Param {
                name: "NCCL_SOCKET_IFNAME",
                ..
            })
        ));
    }
}

#[test]
fn atoi_is_glibcs() {
    use super::num::atoi;
    for (s, v) in [
        ("", 0),
        ("x", 0),
        ("12", 12),
        ("1x", 1),
        (" \t7", 7),
        ("+3", 3),
        ("-1", -1),
        ("-", 0),
        ("2147483648", i32::MIN),
        ("99999999999999999999", -1),
        ("-99999999999999999999", 0),
    ] {
        assert_eq!(atoi(s), v, "{s:?}");
    }
}

/// NCCL 2.30.7's reading, re-created from its C (strtok on ',', strsep on ':', `atoi`,
/// `snprintf` into 64 bytes, at most 32 entries; `matchIfList` with the first match's ids):
/// the reference the property test compares against.
mod nccl {
    pub struct If {
        pub prefix: String,
        pub port: i32,
        pub rail: (i16, String),
        pub plane: (i16, String),
    }
    pub fn parse(s: &str) -> (bool, bool, Vec<If>) {
        let mut s = s;
        let not = s.starts_with('^');
        if not {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let mut out = Vec::new();
        for entry in s.split(',').filter(|e| !e.is_empty()) {
            if out.len() == 32 {
                break;
            }
            let mut t = entry.split(':');
            let prefix = t.next().unwrap();
            if prefix.is_empty() {
                continue;
            }
            let mut num = || match t.next() {
                Some(x) if !x.is_empty() => (super::super::num::atoi(x), x.to_string()),
                _ => (-1, String::new()),
            };
            let port = num().0;
            let (r, rs) = num();
            let (p, ps) = num();
            out.push(If {
                prefix: prefix[..prefix.len().min(63)].to_string(),
                port,
                rail: (r as i16, rs),
                plane: (p as i16, ps),
            });
        }
        (not, exact, out)
    }
    pub fn select<'a>(
        l: &'a (bool, bool, Vec<If>),
        dev: &str,
        port: i32,
    ) -> (bool, Option<&'a If>) {
        let (not, exact, list) = l;
        let hit = list.iter().find(|i| {
            let name = if *exact {
                dev == i.prefix
            } else {
                dev.starts_with(&i.prefix)
            };
            name && (i.port == -1 || i.port == port)
        });
        let matched = list.is_empty() || hit.is_some();
        (matched != *not, if *not { None } else { hit })
    }
}

/// Property test: random strings over the grammar's alphabet (fixed seed), every device and
/// port of a small host: ibnet selects exactly the ports NCCL's reading selects, with NCCL's
/// rail and plane wherever the field is well formed (unset where it is not), and reports a
/// value as malformed only when some entry is not well formed.
#[test]
fn selection_is_nccls_for_random_strings() {
    const ALPHA: &[&str] = &[
        "mlx5_", "0", "1", "m", "x", ":", ":", ",", ",", "^", "=", "-", " ", "9", "+", "2", "-1",
        "16384", "99999",
    ];
    const DEVS: &[&str] = &["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_", "m", "x1"];
    let mut seed: u64 = 0x1b_e7_20_30;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let len = (next() % 16) as usize;
        let s: String = (0..len)
            .map(|_| ALPHA[(next() % ALPHA.len() as u64) as usize])
            .collect();
        let ours = HcaFilter::parse(&s);
        let theirs = nccl::parse(&s);
        let ok = |f: &str, max: i32| super::num::well_formed(f, 0, max).is_some();
        for dev in DEVS {
            for port in [1u8, 2, 9] {
                let (used, hit) = nccl::select(&theirs, dev, i32::from(port));
                let got = ours.select(dev, port);
                assert_eq!(got.is_some(), used, "{s:?} on {dev}:{port}");
                let (Some(got), Some(hit)) = (got, hit) else {
                    continue;
                };
                let want = |(v, f): &(i16, String), max: i32| if ok(f, max) { *v } else { UNSET };
                assert_eq!(
                    got.rail,
                    want(&hit.rail, i16::MAX.into()),
                    "{s:?} rail on {dev}:{port}"
                );
                assert_eq!(
                    got.plane,
                    want(&hit.plane, PLANE_MAX.into()),
                    "{s:?} plane on {dev}:{port}"
                );
            }
        }
        if ours.malformed().is_empty() {
            // Well formed: every entry's fields are, and an exclusion has entries.
            assert!(!(theirs.0 && theirs.2.is_empty()), "{s:?}");
            for i in &theirs.2 {
                assert!(
                    ok(&i.rail.1, i16::MAX.into()) && ok(&i.plane.1, PLANE_MAX.into()),
                    "{s:?}"
                );
                assert!(i.port == -1 || (1..=255).contains(&i.port), "{s:?}");
            }
        }
    }
}
