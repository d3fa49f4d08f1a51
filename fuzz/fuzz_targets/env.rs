//! Every environment parser, called with the variable's value as a string (no process
//! environment is touched).
//!
//! Input: parser byte, variable byte, value (see `ibnet_fuzz::seeds_env` and `ENV_PARSERS`).
//! Oracles: no panic; a refused value leaves the parsed state unchanged; a value `Params::set`
//! accepts is one its consumers (`hca_filter`, `socket_ifname_filter`, ibnet-verbs' `Discovery`)
//! can use; a refused variable's check never panics;
//! the core's and hip-shim's C-integer parsers agree; the socket-interface filter that
//! validates `NCCL_SOCKET_IFNAME` (core) selects the same interfaces as the one that applies
//! it (ffi).
#![no_main]

use std::net::SocketAddr;

use ibnet_core::hca::HcaFilter;
use ibnet_core::params::{parse_int, AddrRange, Params};
use ibnet_core::provider::Gid;
use ibnet_core::Error;
use ibnet_fuzz::{Cursor, ENV_PARSERS};
use libfuzzer_sys::fuzz_target;

/// Names an interface or device filter is matched against.
const NAMES: &[&str] = &[
    "", "lo", "eth0", "eth0:1", "eth01", "ib0", "docker0", "mlx5_0", "mlx5_10", "^x", "=y", " a",
];

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let parser = usize::from(c.u8()) % ENV_PARSERS.len();
    let var = usize::from(c.u8());
    let raw = c.rest();
    let value = String::from_utf8_lossy(raw);
    let v: &str = &value;
    match parser {
        0 => {
            let names = ibnet_fuzz::plugin_vars();
            params(names[var % names.len()], v)
        }
        1 => filters(v),
        2 => addr_range(v),
        3 => ints(v),
        4 => hip_int(v),
        5 => soft(var, v),
        6 => refused(var, v),
        _ => ifaddr(v),
    }
});

fn params(name: &str, v: &str) {
    let mut p = Params::default();
    let before = p.clone();
    match p.set(name, v) {
        Ok(set) => {
            assert!(set, "{name} is a plugin variable of the table");
            // What was accepted can be used.
            let hca = p.hca_filter();
            let ifs = p.socket_ifname_filter();
            for n in NAMES {
                let _ = hca.matches(n, 1);
                let _ = ifs.matches_name(n);
            }
            if let Some(r) = p.gid_addr_range() {
                let _ = r.contains_gid(&Gid([0xAB; 16]));
            }
            let d = ibnet_verbs::discovery::Discovery::from_params(&p);
            assert_eq!(d.gid_index, p.ib_gid_index.map_or(-1, i64::from));
            // Setting it again with the same value is the same.
            let mut q = Params::default();
            assert_eq!(q.set(name, v), Ok(true));
            assert_eq!(q, p);
        }
        Err(e) => {
            assert!(
                matches!(e, Error::Param { name: n, .. } if n == name),
                "{name}: {e:?}"
            );
            assert_eq!(p, before, "a refused {name} changed the params");
        }
    }
    // An unknown name is not an error and changes nothing.
    if !ibnet_fuzz::plugin_vars().contains(&v) {
        let mut q = Params::default();
        assert_eq!(q.set(v, "1"), Ok(false));
        assert_eq!(q, Params::default());
    }
}

fn filters(v: &str) {
    {
        let f = HcaFilter::parse(v);
        assert!(f.entries().len() <= ibnet_core::hca::MAX_ENTRIES);
        assert!(f.malformed().len() <= ibnet_core::hca::MAX_MALFORMED);
        for m in f.malformed() {
            let _ = m.entry(v);
        }
        for n in NAMES {
            for port in [1u8, 2, 255] {
                let _ = f.matches(n, port);
            }
        }
    }
    if let Ok(f) = HcaFilter::parse_names(v) {
        assert!(f.entries().iter().all(|e| e.port == -1));
    }
    // NCCL_IB_HCA is parsed once, by `Params::set`, and that filter is what ibnet-verbs'
    // discovery applies: the stored text parses to the same filter.
    let mut p = Params::default();
    if p.set("NCCL_IB_HCA", v).is_ok() {
        let core = p.hca_filter();
        assert_eq!(&HcaFilter::parse(&p.ib_hca), core);
    }
    // NCCL_SOCKET_IFNAME is validated by core (`Params::set`) and applied by ffi
    // (`ifaddr::choose` on the stored value): both must select the same interfaces.
    let mut p = Params::default();
    if p.set("NCCL_SOCKET_IFNAME", v).is_ok() {
        let core = p.socket_ifname_filter();
        for n in NAMES
            .iter()
            .copied()
            .chain(core.entries().iter().map(|e| e.name.as_str()))
        {
            let one = [nccl_net_ibnet::ifaddr::IfAddr {
                name: n.into(),
                addr: SocketAddr::new([10, 0, 0, 1].into(), 0),
            }];
            let ffi = nccl_net_ibnet::ifaddr::choose(&one, Some(core), None);
            assert_eq!(
                core.matches_name(n),
                ffi.is_some(),
                "NCCL_SOCKET_IFNAME={v:?}: core and ffi disagree on interface {n:?}"
            );
        }
    }
}

fn addr_range(v: &str) {
    if let Ok(r) = AddrRange::parse(v) {
        let max = match r.family {
            ibnet_core::params::AddrFamily::Inet => 32,
            ibnet_core::params::AddrFamily::Inet6 => 128,
        };
        assert!(r.prefix_len <= max);
        // The range contains its own address.
        let mut g = Gid([0; 16]);
        match r.family {
            ibnet_core::params::AddrFamily::Inet => g.0[12..].copy_from_slice(&r.addr[..4]),
            ibnet_core::params::AddrFamily::Inet6 => g.0 = r.addr,
        }
        assert!(r.contains_gid(&g), "{v:?} does not contain its own address");
        let _ = r.contains_gid(&Gid([0xFF; 16]));
    }
}

fn ints(v: &str) {
    let core = parse_int(v).ok();
    let hip = ibnet_hip::env::parse_c_integer(v);
    // hip's also skips leading whitespace, as strtoll does; core's takes trimmed values.
    if !v.starts_with(|c: char| c.is_whitespace()) {
        assert_eq!(core, hip, "core and hip-shim parse {v:?} differently");
    }
}

fn hip_int(v: &str) {
    let env = ibnet_hip::Env::fixed([("NCCL_DMABUF_ENABLE", v)]);
    let p = env.int_param("NCCL_DMABUF_ENABLE", 7);
    let _ = p.to_string();
    match p.source {
        ibnet_hip::env::ParamSource::Env => {
            assert_eq!(Some(p.value), ibnet_hip::env::parse_c_integer(v));
        }
        _ => assert_eq!(p.value, 7),
    }
}

const SOFT: &[&str] = &[
    "IBNET_SOFT_WORKERS",
    "IBNET_SOFT_DIRECT_MAX",
    "IBNET_SOFT_CHUNK",
    "IBNET_SOFT_PTRACER",
    "IBNET_SOFT_BOUNCE_MAX",
    "IBNET_SOFT_STREAM_MIN",
    "IBNET_SOFT_SPIN_US",
    "IBNET_SOFT_MIN_PIECE",
    "IBNET_SOFT_MEM",
];

fn soft(var: usize, v: &str) {
    let name = SOFT[var % SOFT.len()];
    let (cfg, errs) = ibnet_soft::Config::from_lookup(|k| (k == name).then(|| v.to_string()));
    let def = ibnet_soft::Config::default();
    assert!(errs.len() <= 1);
    if !errs.is_empty() {
        assert_eq!(cfg, def, "{name}={v:?} refused but applied");
    }
    assert!(cfg.workers <= 64 && cfg.chunk >= 4096 && cfg.chunk <= 1 << 30);
    assert!(cfg.bounce_max <= ibnet_soft::BOUNCE_MAX as u64);
    assert!(cfg.mem >= 1 << 20 || cfg.mem == def.mem);
}

fn refused(var: usize, v: &str) {
    let vars = ibnet_fuzz::refused_vars();
    let d = vars[var % vars.len()];
    // Malformed, kept or refused: never a panic, and a kept value parses with the kind.
    if let Ok(None) = d.refusal(v) {
        assert!(d.kind.parse(v).is_ok() || matches!(d.reader, ibnet_core::config::Reader::Plugin));
    }
}

fn ifaddr(v: &str) {
    use nccl_net_ibnet::ifaddr::{choose, IfAddr};
    let a = |name: &str, ip: &str| IfAddr {
        name: name.into(),
        addr: SocketAddr::new(ip.parse().expect("fixed address"), 0),
    };
    let all = [
        a("lo", "127.0.0.1"),
        a("eth0", "10.0.0.1"),
        a("eth0:1", "fe80::1"),
        a("ib0", "192.168.1.1"),
        a("docker0", "172.17.0.1"),
        a("eth1", "2001:db8::1"),
    ];
    // NCCL_SOCKET_FAMILY has one parser, the core's; ibnet-verbs' `discovery::family` turns it into an AF_*.
    let mut p = Params::default();
    let family = p
        .set("NCCL_SOCKET_FAMILY", v)
        .ok()
        .and_then(|_| p.socket_family)
        .map(ibnet_verbs::discovery::family);
    // NCCL_SOCKET_IFNAME as the plugin applies it: parsed once, by `Params::set`.
    let mut q = Params::default();
    let ifname = q
        .set("NCCL_SOCKET_IFNAME", v)
        .ok()
        .map(|_| q.ifname.clone());
    for fam in [None, Some(libc_af(false)), Some(libc_af(true)), family] {
        if let Some(chosen) = choose(&all, ifname.as_ref(), fam) {
            assert!(all.contains(&chosen));
        }
    }
}

fn libc_af(v6: bool) -> i32 {
    // AF_INET / AF_INET6 on Linux.
    if v6 {
        10
    } else {
        2
    }
}
