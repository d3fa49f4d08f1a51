//! Shared pieces of ibnet's fuzz targets: the byte reader every target decodes its input with,
//! the fixed configurations the targets run against, and the seed inputs built from the real
//! encoders (written to `seeds/<target>/` by the `seedgen` binary, see README.md).
//!
//! Each target's input format is documented on its `seeds_*` function; the targets and the seed
//! builders share the constants here, so a seed always decodes the way its target reads it.

use ibnet_core::fifo::{FifoRing, PostedRecv, MAX_RECVS};
use ibnet_core::provider::{Ece, Gid, LinkLayer, Mtu, PortInfo, ProviderAddr};
use ibnet_core::wire::{
    ready_bytes, ConnectHandle, Hello, QpInfo, RemoteBuf, HANDLE_SCRATCH_OFFSET,
    NCCL_NET_HANDLE_MAXSIZE, QP_INFO_MAX_LEN,
};

/// Named seed inputs of one target.
pub type Seeds = Vec<(String, Vec<u8>)>;

/// Reads fixed-width little-endian values from fuzz input; past the end every value is 0.
pub struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// A reader over `b`.
    pub fn new(b: &'a [u8]) -> Self {
        Self { b }
    }
    /// The next `n` bytes (fewer at the end).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (h, t) = self.b.split_at(n.min(self.b.len()));
        self.b = t;
        h
    }
    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.b.len())
    }
    /// Bytes left.
    pub fn len(&self) -> usize {
        self.b.len()
    }
    /// No bytes left.
    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
    fn arr<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let s = self.take(N);
        a[..s.len()].copy_from_slice(s);
        a
    }
    /// One byte.
    pub fn u8(&mut self) -> u8 {
        self.arr::<1>()[0]
    }
    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.arr())
    }
    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.arr())
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.arr())
    }
}

// ------------------------------------------------------------------------------ handshake

/// The listener nonce both handshake machines run with.
pub const NONCE: u64 = 0x5EED_F00D_1234_5678;

/// `handshake` modes (first input byte, modulo 3).
pub const MODE_WIRE: u8 = 0;
/// The acceptor is fed the peer's bytes.
pub const MODE_ACCEPT: u8 = 1;
/// The connector is fed the peer's bytes.
pub const MODE_CONNECT: u8 = 2;

/// The local side of a handshake, from the config byte: `nqps = 1 + (cfg & 3)`, link layer
/// InfiniBand when bit 2 is set (else Ethernet), MTU `4096 >> ((cfg >> 3) % 5)`.
#[derive(Debug, Clone, Copy)]
pub struct Side {
    /// QPs of the local comm.
    pub nqps: usize,
    /// Link layer of the local port.
    pub link_layer: LinkLayer,
    /// MTU of the local port.
    pub mtu: Mtu,
}

impl Side {
    /// Decodes the config byte.
    pub fn from_cfg(cfg: u8) -> Self {
        let mtu = match (cfg >> 3) % 5 {
            0 => Mtu::M4096,
            1 => Mtu::M2048,
            2 => Mtu::M1024,
            3 => Mtu::M512,
            _ => Mtu::M256,
        };
        let link_layer = if cfg & 4 != 0 {
            LinkLayer::Infiniband
        } else {
            LinkLayer::Ethernet
        };
        Self {
            nqps: 1 + usize::from(cfg & 3),
            link_layer,
            mtu,
        }
    }

    /// The local port (acceptor side).
    pub fn port(&self) -> PortInfo {
        PortInfo {
            port: 1,
            link_layer: self.link_layer,
            lid: 7,
            gid: Gid([0xFE; 16]),
            gid_index: 3,
            mtu: self.mtu,
            addr: ProviderAddr::new(b"fuzz-local").unwrap_or(ProviderAddr::EMPTY),
        }
    }

    /// This side's QpInfo with `nqps` QPs (a connector carries its FIFO, an acceptor its sizes
    /// FIFO).
    pub fn info(&self, nqps: usize, fifo: bool) -> QpInfo {
        let mut qpn = heapless::Vec::new();
        for i in 0..nqps {
            let _ = qpn.push(0x100 + i as u32);
        }
        QpInfo {
            port: 1,
            link_layer: self.link_layer,
            mtu: self.mtu,
            lid: 7,
            gid: Gid([0xFE; 16]),
            sl: 0,
            tc: 0,
            qpn,
            fifo: fifo.then_some(RemoteBuf {
                addr: 0x7F00_0000_1000,
                rkey: 0x42,
            }),
            addr: ProviderAddr::new(b"fuzz-local").unwrap_or(ProviderAddr::EMPTY),
            ece: heapless::Vec::new(),
        }
    }
}

fn encode(i: &QpInfo) -> Vec<u8> {
    let mut b = [0u8; QP_INFO_MAX_LEN];
    let n = i.encode(&mut b).expect("seed QpInfo encodes");
    b[..n].to_vec()
}

/// The peer's QpInfo for seeds: `nqps` QPs, the given link layer and MTU.
fn peer_info(nqps: usize, ll: LinkLayer, mtu: Mtu, fifo: bool, addr: &[u8]) -> QpInfo {
    let mut i = Side {
        nqps,
        link_layer: ll,
        mtu,
    }
    .info(nqps, fifo);
    i.addr = ProviderAddr::new(addr).unwrap_or(ProviderAddr::EMPTY);
    i.qpn.iter_mut().for_each(|q| *q += 0x1000);
    i
}

/// Seeds of `handshake`. Input: `mode` byte, `cfg` byte ([`Side::from_cfg`]), `chunk` byte
/// (the peer's bytes are fed `1 + chunk % 64` at a time; the machine's own bytes are sent in
/// such chunks too), then the peer's bytes. In [`MODE_WIRE`] the bytes after `cfg` and `chunk`
/// are given to every decoder.
pub fn seeds_handshake() -> Seeds {
    let mut out = Vec::new();
    let with = |mode: u8, cfg: u8, chunk: u8, body: &[u8]| {
        let mut v = vec![mode, cfg, chunk];
        v.extend_from_slice(body);
        v
    };
    for (cfg, chunk) in [(0u8, 63u8), (0x0D, 0), (0x17, 5)] {
        let s = Side::from_cfg(cfg);
        // Acceptor: Hello, the connector's QpInfo (with FIFO), Ready.
        let mut acc = Hello { nonce: NONCE }.encode().to_vec();
        acc.extend(encode(&peer_info(
            s.nqps,
            s.link_layer,
            Mtu::M4096,
            true,
            b"peer",
        )));
        acc.extend(ready_bytes());
        out.push((
            format!("accept-{cfg:02x}"),
            with(MODE_ACCEPT, cfg, chunk, &acc),
        ));
        // Connector: the acceptor's answer.
        // Wire v3: the answer carries the acceptor's sizes FIFO.
        let ans = encode(&peer_info(s.nqps, s.link_layer, s.mtu, true, b""));
        out.push((
            format!("connect-{cfg:02x}"),
            with(MODE_CONNECT, cfg, chunk, &ans),
        ));
    }
    let mut big = peer_info(128, LinkLayer::Infiniband, Mtu::M256, true, &[7; 64]);
    // Wire v2: one ECE entry per QP (the longest QpInfo).
    for i in 0..128u32 {
        let _ = big.ece.push(Ece {
            vendor_id: 0x02c9,
            options: i,
            comp_mask: 0,
        });
    }
    out.push((
        "wire-qpinfo-max".into(),
        with(MODE_WIRE, 0, 0, &encode(&big)),
    ));
    let small = peer_info(1, LinkLayer::Ethernet, Mtu::M1024, false, b"x");
    out.push((
        "wire-qpinfo-min".into(),
        with(MODE_WIRE, 0, 0, &encode(&small)),
    ));
    out.push((
        "wire-hello".into(),
        with(MODE_WIRE, 0, 0, &Hello { nonce: NONCE }.encode()),
    ));
    out.push(("wire-ready".into(), with(MODE_WIRE, 0, 0, &ready_bytes())));
    out
}

// ------------------------------------------------------------------------------ fifo

/// Slots of the ring the `fifo` target polls (small, so sequence numbers hit every slot).
pub const FIFO_SLOTS: usize = 4;
/// The ring the `fifo` target uses.
pub type FuzzRing = FifoRing<FIFO_SLOTS>;
/// Bytes of one slot (`MAX_RECVS` elements of 64 bytes).
pub const FIFO_SLOT_BYTES: usize = MAX_RECVS * 64;

/// Seeds of `fifo`. Input: `seq` (u64), then the raw bytes of the slot `seq` maps to (up to
/// [`FIFO_SLOT_BYTES`], the rest zero), as an RDMA write from the peer would leave them.
pub fn seeds_fifo() -> Seeds {
    let mut out = Vec::new();
    // `rails`: a fused receiver's live-rail mask (0 from a plain comm).
    let slots = [
        ("one", 0u64, 1usize, 0u32),
        ("three", 5, 3, 0),
        ("full", 1 << 40, 8, 0),
        ("fused", 9, 2, 0b1011),
    ];
    for (name, seq, n, rails) in slots {
        let ring: Box<FuzzRing> = Box::default();
        let elems: Vec<PostedRecv> = (0..n as u64)
            .map(|i| PostedRecv {
                addr: 0x7F00_0000_0000 + 0x1000 * i,
                size: 1 << (10 + i),
                rkey: 0x100 + i as u32,
                tag: i as u32,
            })
            .collect();
        let (off, len) = ring.publish_rails(seq, &elems, rails);
        let mut v = seq.to_le_bytes().to_vec();
        v.extend_from_slice(&ring_bytes(&ring)[off..off + len]);
        out.push((name.to_string(), v));
    }
    out
}

/// The bytes of a ring (what a peer's RDMA write fills).
pub fn ring_bytes(r: &FuzzRing) -> &[u8] {
    // SAFETY: `FuzzRing` is plain memory (atomic integers, no padding bytes that are
    // uninitialised: every field and the explicit pads are integers); reading it as bytes while
    // no other thread writes it is a plain read of initialised memory.
    unsafe { std::slice::from_raw_parts(r as *const FuzzRing as *const u8, FuzzRing::BYTES) }
}

// ------------------------------------------------------------------------------ env

/// The parsers of the `env` target, selected by the first input byte (modulo the count).
pub const ENV_PARSERS: &[&str] = &[
    "core Params::set (every plugin variable of ibnet_core::config)",
    "core HcaFilter::parse/parse_names, applied by ffi ifaddr::choose (NCCL_IB_HCA, NCCL_SOCKET_IFNAME)",
    "core AddrRange::parse (NCCL_IB_ADDR_RANGE)",
    "core parse_int vs hip parse_c_integer",
    "hip Env::int_param",
    "soft Config::from_lookup (IBNET_SOFT_*)",
    "core Var::refusal (the 2.29–2.32 variables ibnet refuses)",
    "ffi ifaddr::choose (NCCL_SOCKET_IFNAME; NCCL_SOCKET_FAMILY through core Params)",
];

/// The variables `Params::set` stores (the configuration table's plugin variables), in the
/// table's order: what the `env` target's name byte indexes for parser 0.
pub fn plugin_vars() -> Vec<&'static str> {
    ibnet_core::config::all()
        .filter(|v| v.reader == ibnet_core::config::Reader::Plugin)
        .map(|v| v.name)
        .collect()
}

/// The variables ibnet refuses (parser 6's list).
pub fn refused_vars() -> Vec<&'static ibnet_core::config::Var> {
    ibnet_core::config::all()
        .filter(|v| matches!(v.reader, ibnet_core::config::Reader::Refused { .. }))
        .collect()
}

/// Seeds of `env`. Input: parser byte (index into [`ENV_PARSERS`]), name byte (which variable,
/// modulo the parser's list), then the value (UTF-8; other bytes are replaced).
pub fn seeds_env() -> Seeds {
    let names = plugin_vars();
    let idx = |n: &str| names.iter().position(|x| *x == n).unwrap_or(0) as u8;
    let mut out = Vec::new();
    let mut add = |name: &str, parser: u8, var: u8, v: &str| {
        let mut b = vec![parser, var];
        b.extend_from_slice(v.as_bytes());
        out.push((name.to_string(), b));
    };
    add("params-hca", 0, idx("NCCL_IB_HCA"), "^=mlx5_0:1,mlx5_1");
    add("params-gid", 0, idx("NCCL_IB_GID_INDEX"), "-1");
    add("params-pkey", 0, idx("NCCL_IB_PKEY"), "0x8001");
    add("params-range", 0, idx("NCCL_IB_ADDR_RANGE"), "fd00::/8");
    add("params-family", 0, idx("NCCL_IB_ADDR_FAMILY"), "AF_INET6");
    add("params-ifname", 0, idx("NCCL_SOCKET_IFNAME"), "=eth0,ib");
    add("params-provider", 0, idx("IBNET_PROVIDER"), "soft");
    add("params-timeout", 0, idx("NCCL_IB_TIMEOUT"), " 020 ");
    add("hca", 1, 0, "mlx5_0:1,mlx5_1:2,");
    add("ifname", 1, 1, "^docker,lo");
    add("range4", 2, 0, "10.0.0.0/8");
    add("range6", 2, 0, "fe80::1/64");
    add("int-hex", 3, 0, "-0x7fffffffffffffff");
    add("int-oct", 3, 0, "0777");
    add("hip-int", 4, 0, "  0x10");
    add("soft-chunk", 5, 2, "65536");
    add("refused-ooo", 6, 0, "1");
    add("ifaddr", 7, 0, "^=lo,docker0");
    out
}

// ------------------------------------------------------------------------------ connect

/// Seeds of `connect_handle`: NCCL's 128-byte handle as `listen` writes it (the rest of a
/// shorter input is zero; a longer one is cut).
pub fn seeds_connect_handle() -> Seeds {
    let mut out = Vec::new();
    // Provider tag 2 is ffi's soft provider (the target's device), 1 its verbs provider.
    // `gids`: the listener's GIDs (subnet-aware routing), zero when it is off.
    let mut routed = [Gid::default(); 2];
    routed[0].0[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 1, 1]);
    for (name, addr, provider, gids) in [
        ("v4", "127.0.0.1:4242", 2u8, Default::default()),
        ("v6", "[fe80::1%2]:61000", 2, Default::default()),
        ("v4-verbs", "10.1.2.3:1", 1, Default::default()),
        ("v4-gids", "127.0.0.1:4243", 2, routed),
    ] {
        let h = ConnectHandle {
            addr: addr.parse().expect("seed address"),
            nonce: NONCE,
            provider,
            gids,
        };
        let mut b = vec![0u8; NCCL_NET_HANDLE_MAXSIZE];
        h.encode(&mut b).expect("seed handle encodes");
        out.push((name.to_string(), b.clone()));
        // The same handle on NCCL's second call: a progress token in the scratch area.
        b[HANDLE_SCRATCH_OFFSET..HANDLE_SCRATCH_OFFSET + 8].copy_from_slice(&NONCE.to_le_bytes());
        out.push((format!("{name}-token"), b));
    }
    out
}

// ------------------------------------------------------------------------------ soft

/// Seeds of `soft_access`. Input: `op` byte (0 WRITE, 1 READ, 2 WRITE_WITH_IMM), local key
/// selector byte, local offset (i32), remote key selector byte, remote offset (i32), length
/// (u32, modulo 64 KiB + 1), then a raw local key (u32) and a raw remote key (u32) used when
/// a selector picks no registration (see the target for the registrations).
pub fn seeds_soft_access() -> Seeds {
    let mut out = Vec::new();
    for (name, op, lsel, loff, rsel, roff, len) in [
        ("write-ok", 0u8, 0u8, 0i32, 0u8, 0i32, 4096u32),
        ("read-ok", 1, 0, 16, 0, 8, 100),
        ("imm-ok", 2, 0, 0, 0, 4000, 96),
        ("write-past-end", 0, 0, 0, 0, 1, 8192),
        ("read-no-access", 1, 0, 0, 2, 0, 64),
        ("write-readonly", 0, 0, 0, 1, 0, 64),
    ] {
        let mut v = vec![op, lsel];
        v.extend(loff.to_le_bytes());
        v.push(rsel);
        v.extend(roff.to_le_bytes());
        v.extend(len.to_le_bytes());
        v.extend(0u32.to_le_bytes());
        v.extend(0u32.to_le_bytes());
        out.push((name.to_string(), v));
    }
    out
}

/// Every target's seeds, by target name.
pub fn all_seeds() -> Vec<(&'static str, Seeds)> {
    vec![
        ("handshake", seeds_handshake()),
        ("fifo", seeds_fifo()),
        ("env", seeds_env()),
        ("connect_handle", seeds_connect_handle()),
        ("soft_access", seeds_soft_access()),
    ]
}
