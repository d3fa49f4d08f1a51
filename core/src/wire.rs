//! Handshake messages on the wire: explicit, versioned, little-endian, validated.
//!
//! Four messages cross between ranks. Each starts with its own 4-byte magic and a 16-bit
//! version ([`WIRE_VERSION`]); both peers must run the same ibnet wire version. Every integer is
//! little-endian. Decoding checks every field and every count and returns
//! [`Error::Wire`] naming the first bad one; it never panics, whatever the bytes.
//!
//! ```text
//!  listener ──ConnectHandle (≤128 B, carried by NCCL's bootstrap)──▶ connector
//!  connector ── socket ──▶ acceptor:  Hello{nonce} · QpInfo{fifo}
//!  acceptor  ── socket ──▶ connector: QpInfo{mtu = negotiated, fifo = its sizes FIFO}
//!  connector ── socket ──▶ acceptor:  Ready
//! ```
//!
//! `QpInfo` (48-byte header, then the variable part):
//! ```text
//!  off len  field
//!   0   4   magic "IBNQ"               36   8   fifo addr (0 when no FIFO)
//!   4   2   version                    44   4   fifo rkey (0 when no FIFO)
//!   6   2   total length in bytes      48  4·n  qpn[n], each < 2^24
//!   8   1   port (≥ 1)                  ..  a   provider address
//!   9   1   link layer (1 IB, 2 Eth)
//!  10   1   mtu (ibv_mtu 1..=5)
//!  11   1   sl (0..=15)
//!  12   1   tc
//!  13   1   flags (bit 0: FIFO present; bit 1: ECE present; other bits 0)
//!  14   2   lid
//!  16  16   gid
//!  32   1   n = nqps (1..=MAX_QPS)
//!  33   1   a = provider address length (≤ PROVIDER_ADDR_MAX)
//!  34   2   reserved (0)
//! ```
//! With the ECE flag, `12·n` bytes follow the provider address: per QP its `ibv_ece`
//! (`vendor_id`, `options`, `comp_mask`, 4 bytes each) for enhanced connection establishment
//! (`NCCL_IB_ECE_ENABLE`): the connector sends what `ibv_query_ece` reported for its QPs, the
//! acceptor answers with the options its QPs settled on.
//!
//! A receiver reads the fixed header first; [`QpInfo::frame_len`] validates it and says how
//! many bytes the whole message has.
//!
//! `Hello` (16 B): magic "IBNH", version, reserved 0 (1 B), rails (1 B, 1..=[`MAX_RAILS`]: the
//! connector's devices, more than one for a fused NIC), nonce (8 B): the connector proves it
//! read this listener's handle (NCCL's socket magic plays this role in the seed).
//! `Ready` (8 B): magic "IBNR", version, reserved 0 (2 B).
//!
//! Devices (multi-rail): each side sends one `QpInfo` per rail (rail order), then one
//! [`RailList`] (`8 + 16·n` B) naming each rail's physical device and, for a fused comm
//! (`n > 1`), the ring its peer writes rail notices into (the receiver's notice ring, the
//! sender's back ring; see `crate::fused`):
//! ```text
//!   0   4   magic "IBNL"      8+16i   8   ring addr   (0 for one rail, ≠ 0 for more)
//!   4   2   version          16+16i   4   ring rkey   (idem)
//!   6   1   n (1..=8)        20+16i   2   physical device index
//!   7   1   reserved (0)     22+16i   2   rail speed (100 Mb/s units; 0 unknown)
//! ```
//! The speeds weigh a fused comm's stripes (`crate::fused::stripe_weighted`): each end weighs
//! rail `i` by the smaller of the two ends' speeds of it, so both cut alike (the acceptor
//! announces that smaller speed already). A plain comm announces 0. (The speed field was
//! reserved before wire version 5.)
//! Both sides must have the same number of rails: the acceptor refuses a Hello whose rail
//! count differs from its listener's (a fused NIC on one side only).
//!
//! [`ConnectHandle`] (76 B encoded inside NCCL's 128-byte handle):
//! ```text
//!   0   4   magic "IBNC"              12  16   IP (IPv4 in the first 4 bytes, rest 0)
//!   4   2   version                   28   4   IPv6 flowinfo (0 for IPv4)
//!   6   1   family (4 or 6)           32   4   IPv6 scope id (0 for IPv4)
//!   7   1   provider tag (opaque)     36   8   nonce
//!   8   2   port (≠ 0)                44  16   listener GID 0 (all 0: none)
//!  10   2   reserved (0)              60  16   listener GID 1 (all 0: none)
//!                                     76..80   reserved (0)
//!                                     80..128  scratch for the connecting side (ignored)
//! ```
//! The GIDs are those of the listener's first two RoCE rails when subnet-aware routing is on
//! (`NCCL_IB_SUBNET_AWARE_ROUTING`; the connector picks a local device on their subnets,
//! `crate::policy::subnet`), else zero; any bytes decode (the policy ignores invalid GIDs).

use core::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::error::{Error, Result};
use crate::provider::{Ece, Gid, LinkLayer, Mtu, ProviderAddr, PROVIDER_ADDR_MAX};

/// Most QPs one comm may use (`NCCL_IB_QPS_PER_CONNECTION` ≤ 128, as NCCL's `NCCL_IB_MAX_QPS`).
pub const MAX_QPS: usize = 128;

/// The handshake wire version. Peers with another version are rejected.
///
/// 6: the [`ConnectHandle`] carries the listener's GIDs (subnet-aware routing), its scratch
/// area moved to offset 80;
/// 5: each rail entry of a [`RailList`] carries the rail's speed (weighted striping), and a
/// fused comm's back ring carries failback's READY / JOIN words (`crate::fused::heal`);
/// 4: the Hello carries the connector's rail count, each side sends one `QpInfo` per rail and a
/// [`RailList`] (NIC fusion); a clear-to-send (FIFO element) carries a fused receiver's
/// live-rail mask in its formerly reserved word 28..32, covered by its check, and a
/// multi-receive's rail notice each send's stripe (`crate::fused`); 3: the acceptor's `QpInfo` carries its sizes FIFO in the FIFO fields (where the sender writes
/// a multi-receive's sizes); 2: `QpInfo` carries each QP's ECE.
pub const WIRE_VERSION: u16 = 6;

/// Most rails (physical devices) of one comm: a fused NIC's `NCCL_NET_MAX_DEVS_PER_NIC` of
/// NCCL 2.30's v12 table, 8 (v9–v11 tables fuse at most 4). The masks of rails that travel on
/// the wire (clear-to-send, notices) are one byte, so 8 is also the most they can say.
pub const MAX_RAILS: usize = 8;

/// Largest QP number a verbs QP can have (24 bits).
pub const MAX_QPN: u32 = 0x00FF_FFFF;

/// NCCL's `NCCL_NET_HANDLE_MAXSIZE`: the bytes NCCL carries from `listen` to `connect`.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;

const QP_INFO_MAGIC: u32 = u32::from_le_bytes(*b"IBNQ");
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"IBNH");
const READY_MAGIC: u32 = u32::from_le_bytes(*b"IBNR");
const RAILS_MAGIC: u32 = u32::from_le_bytes(*b"IBNL");
const HANDLE_MAGIC: u32 = u32::from_le_bytes(*b"IBNC");

const FLAG_FIFO: u8 = 1;
const FLAG_ECE: u8 = 2;
/// Bytes of one encoded [`Ece`].
const ECE_LEN: usize = 12;

/// Where a peer may write: a registered buffer's address and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// Address in the peer's memory.
    pub addr: u64,
    /// The registration's rkey.
    pub rkey: u32,
}

/// What one side of a comm tells the other: its QPs and how to reach them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpInfo {
    /// Port number.
    pub port: u8,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// Active MTU (the acceptor answers with the negotiated minimum).
    pub mtu: Mtu,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID in use.
    pub gid: Gid,
    /// Service level the sender asks for.
    pub sl: u8,
    /// Traffic class the sender asks for.
    pub tc: u8,
    /// QP numbers, one per QP of the comm.
    pub qpn: heapless::Vec<u32, MAX_QPS>,
    /// The sender's FIFO (set by the connecting/sending side only).
    pub fifo: Option<RemoteBuf>,
    /// The provider's opaque address.
    pub addr: ProviderAddr,
    /// ECE options, one per QP (same order as `qpn`), or empty: ECE off or not supported.
    pub ece: heapless::Vec<Ece, MAX_QPS>,
}

/// Bytes of the fixed part of an encoded [`QpInfo`].
pub const QP_INFO_HEADER_LEN: usize = 48;
/// Largest encoded [`QpInfo`]: size stack buffers with it.
pub const QP_INFO_MAX_LEN: usize = QP_INFO_HEADER_LEN + (4 + ECE_LEN) * MAX_QPS + PROVIDER_ADDR_MAX;
/// Bytes of an encoded [`Hello`].
pub const HELLO_LEN: usize = 16;
/// Bytes of an encoded ready message.
pub const READY_LEN: usize = 8;
/// Largest encoded [`RailList`].
pub const RAILS_MAX_LEN: usize = RailList::encoded_len(MAX_RAILS);

const _: () = assert!(QP_INFO_MAX_LEN <= u16::MAX as usize);
// The counts travel in one byte each.
const _: () = assert!(MAX_QPS <= 255);
const _: () = assert!(PROVIDER_ADDR_MAX <= 255);

fn wire(what: &'static str, value: impl Into<u64>) -> Error {
    Error::Wire {
        what,
        value: value.into(),
    }
}

fn too_small(cap: usize) -> Error {
    Error::Full {
        what: "handshake encode buffer",
        cap,
    }
}

/// Little-endian writer over a caller buffer whose size was checked up front.
struct Wr<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl Wr<'_> {
    fn put(&mut self, v: &[u8]) {
        self.b[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
    }
    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
}

/// Little-endian reader that reports running off the end as a wire error, never a panic.
struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or(wire("truncated message (bytes)", self.b.len() as u64))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.arr::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    /// Magic, then version.
    fn preamble(&mut self, magic: u32, what: &'static str) -> Result<()> {
        let m = self.u32()?;
        if m != magic {
            return Err(wire(what, m));
        }
        let v = self.u16()?;
        if v != WIRE_VERSION {
            return Err(wire("wire version", v));
        }
        Ok(())
    }
    fn zero(&mut self, n: usize) -> Result<()> {
        let s = self.take(n)?;
        match s.iter().position(|&b| b != 0) {
            None => Ok(()),
            Some(i) => Err(wire(
                "reserved byte not zero (offset)",
                (self.at - n + i) as u64,
            )),
        }
    }
    fn end(&self) -> Result<()> {
        if self.at != self.b.len() {
            return Err(wire(
                "trailing bytes after message",
                (self.b.len() - self.at) as u64,
            ));
        }
        Ok(())
    }
}

impl QpInfo {
    /// Bytes [`QpInfo::encode`] writes for this info.
    pub fn encoded_len(&self) -> usize {
        QP_INFO_HEADER_LEN
            + (4 + ECE_LEN * usize::from(!self.ece.is_empty())) * self.qpn.len()
            + self.addr.as_bytes().len()
    }

    /// Checks what [`QpInfo::decode`] would reject, for the local side before sending.
    fn check_local(&self) -> Result<()> {
        let range = |what, value: u64, min, max| Error::OutOfRange {
            what,
            value: value as i64,
            min,
            max,
        };
        if self.qpn.is_empty() {
            return Err(range("local nqps", 0, 1, MAX_QPS as i64));
        }
        if self.port == 0 {
            return Err(range("local port", 0, 1, 255));
        }
        if self.sl > 15 {
            return Err(range("local sl", self.sl.into(), 0, 15));
        }
        if !self.ece.is_empty() && self.ece.len() != self.qpn.len() {
            return Err(range(
                "local ECE entries (one per QP)",
                self.ece.len() as u64,
                self.qpn.len() as i64,
                self.qpn.len() as i64,
            ));
        }
        if let Some(&q) = self.qpn.iter().find(|&&q| q > MAX_QPN) {
            return Err(range("local qpn", q.into(), 0, MAX_QPN.into()));
        }
        if let Some(f) = self.fifo {
            if f.addr == 0 {
                return Err(Error::Missing {
                    what: "local FIFO address",
                });
            }
        }
        Ok(())
    }

    /// Encodes into `out`, returning the bytes written ([`QpInfo::encoded_len`]).
    ///
    /// Errors: [`Error::Full`] when `out` is shorter than that; [`Error::OutOfRange`] /
    /// [`Error::Missing`] for local values the peer would reject (no QPs, port 0, SL > 15, a
    /// QP number above 24 bits, a FIFO at address 0).
    pub fn encode(&self, out: &mut [u8]) -> Result<usize> {
        self.check_local()?;
        let len = self.encoded_len();
        if out.len() < len {
            return Err(too_small(out.len()));
        }
        let mut w = Wr { b: out, at: 0 };
        w.u32(QP_INFO_MAGIC);
        w.u16(WIRE_VERSION);
        w.u16(len as u16);
        w.u8(self.port);
        w.u8(self.link_layer as u8);
        w.u8(self.mtu as u8);
        w.u8(self.sl);
        w.u8(self.tc);
        let ece = if self.ece.is_empty() { 0 } else { FLAG_ECE };
        w.u8(if self.fifo.is_some() { FLAG_FIFO } else { 0 } | ece);
        w.u16(self.lid);
        w.put(&self.gid.0);
        w.u8(self.qpn.len() as u8);
        w.u8(self.addr.as_bytes().len() as u8);
        w.u16(0);
        let fifo = self.fifo.unwrap_or_default();
        w.u64(fifo.addr);
        w.u32(fifo.rkey);
        for &q in &self.qpn {
            w.u32(q);
        }
        w.put(self.addr.as_bytes());
        for e in &self.ece {
            w.u32(e.vendor_id);
            w.u32(e.options);
            w.u32(e.comp_mask);
        }
        debug_assert_eq!(w.at, len);
        Ok(len)
    }

    /// Validates the fixed header (the first [`QP_INFO_HEADER_LEN`] bytes of a message) and
    /// returns the length of the whole message, so a receiver knows how much more to read.
    /// Fewer than [`QP_INFO_HEADER_LEN`] bytes is an error.
    pub fn frame_len(header: &[u8]) -> Result<usize> {
        let mut r = Rd { b: header, at: 0 };
        r.preamble(QP_INFO_MAGIC, "QpInfo magic")?;
        let len = usize::from(r.u16()?);
        let (Some(&flags), Some(&nqps), Some(&alen), true) = (
            header.get(13),
            header.get(32),
            header.get(33),
            header.len() >= QP_INFO_HEADER_LEN,
        ) else {
            return Err(wire("truncated message (bytes)", header.len() as u64));
        };
        if nqps == 0 || usize::from(nqps) > MAX_QPS {
            return Err(wire("nqps", nqps));
        }
        if usize::from(alen) > PROVIDER_ADDR_MAX {
            return Err(wire("provider address length", alen));
        }
        if flags & !(FLAG_FIFO | FLAG_ECE) != 0 {
            return Err(wire("flags", flags));
        }
        let ece = if flags & FLAG_ECE != 0 { ECE_LEN } else { 0 };
        let want = QP_INFO_HEADER_LEN + (4 + ece) * usize::from(nqps) + usize::from(alen);
        if len != want {
            return Err(wire("QpInfo length", len as u64));
        }
        Ok(len)
    }

    /// Decodes and validates one whole message: exactly [`QpInfo::frame_len`] bytes, no more.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let len = Self::frame_len(b)?;
        if b.len() < len {
            return Err(wire("truncated message (bytes)", b.len() as u64));
        }
        let mut r = Rd { b, at: 8 };
        let port = r.u8()?;
        if port == 0 {
            return Err(wire("port", port));
        }
        let ll = r.u8()?;
        let link_layer = match ll {
            1 => LinkLayer::Infiniband,
            2 => LinkLayer::Ethernet,
            _ => return Err(wire("link layer", ll)),
        };
        let m = r.u8()?;
        let mtu = Mtu::from_raw(m).ok_or(wire("mtu", m))?;
        let sl = r.u8()?;
        if sl > 15 {
            return Err(wire("sl", sl));
        }
        let tc = r.u8()?;
        let flags = r.u8()?;
        if flags & !(FLAG_FIFO | FLAG_ECE) != 0 {
            return Err(wire("flags", flags));
        }
        let lid = r.u16()?;
        let gid = Gid(r.arr()?);
        let nqps = usize::from(r.u8()?);
        let alen = usize::from(r.u8()?);
        r.zero(2)?;
        let fifo_addr = r.u64()?;
        let fifo_rkey = r.u32()?;
        let fifo = if flags & FLAG_FIFO != 0 {
            if fifo_addr == 0 {
                return Err(wire("fifo address", 0u64));
            }
            Some(RemoteBuf {
                addr: fifo_addr,
                rkey: fifo_rkey,
            })
        } else {
            if fifo_addr != 0 {
                return Err(wire("fifo address without FIFO flag", fifo_addr));
            }
            if fifo_rkey != 0 {
                return Err(wire("fifo rkey without FIFO flag", fifo_rkey));
            }
            None
        };
        let mut qpn = heapless::Vec::new();
        for _ in 0..nqps {
            let q = r.u32()?;
            if q > MAX_QPN {
                return Err(wire("qpn", q));
            }
            // Cannot fail: nqps ≤ MAX_QPS was checked by frame_len.
            qpn.push(q).map_err(|_| wire("nqps", nqps as u64))?;
        }
        let addr =
            ProviderAddr::new(r.take(alen)?).ok_or(wire("provider address length", alen as u64))?;
        let mut ece = heapless::Vec::new();
        if flags & FLAG_ECE != 0 {
            for _ in 0..nqps {
                let e = Ece {
                    vendor_id: r.u32()?,
                    options: r.u32()?,
                    comp_mask: r.u32()?,
                };
                // Cannot fail: nqps ≤ MAX_QPS was checked by frame_len.
                ece.push(e).map_err(|_| wire("nqps", nqps as u64))?;
            }
        }
        r.end()?;
        Ok(Self {
            port,
            link_layer,
            mtu,
            lid,
            gid,
            sl,
            tc,
            qpn,
            fifo,
            addr,
            ece,
        })
    }
}

/// The connector's first message: proves it holds this listener's [`ConnectHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The nonce from the listener's handle.
    pub nonce: u64,
}

impl Hello {
    /// The encoded message of a one-rail connector.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        self.encode_rails(1)
    }

    /// The encoded message of a connector with `rails` devices (1..=[`MAX_RAILS`]; the
    /// caller's [`RailList`] has that many).
    pub fn encode_rails(&self, rails: u8) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        let mut w = Wr { b: &mut b, at: 0 };
        w.u32(HELLO_MAGIC);
        w.u16(WIRE_VERSION);
        w.u8(0);
        w.u8(rails);
        w.u64(self.nonce);
        b
    }

    /// Decodes exactly [`HELLO_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Self> {
        Self::decode_rails(b).map(|(h, _)| h)
    }

    /// Decodes exactly [`HELLO_LEN`] bytes: the Hello and the connector's rail count
    /// (1..=[`MAX_RAILS`]).
    pub fn decode_rails(b: &[u8]) -> Result<(Self, u8)> {
        let mut r = Rd { b, at: 0 };
        r.preamble(HELLO_MAGIC, "Hello magic")?;
        r.zero(1)?;
        let rails = r.u8()?;
        if rails == 0 || usize::from(rails) > MAX_RAILS {
            return Err(wire("Hello rail count", rails));
        }
        let nonce = r.u64()?;
        r.end()?;
        Ok((Self { nonce }, rails))
    }
}

/// One rail of a comm as its side announces it (see [`RailList`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RailInfo {
    /// The rail's physical device index on this side (what `NCCL_IB_WARN_RAIL_LOCAL` compares).
    pub dev: u16,
    /// The ring the peer writes rail notices into (fused comms only).
    pub ring: Option<RemoteBuf>,
    /// The rail's speed in units of 100 Mb/s (0: unknown; a plain comm's), the stripe weight
    /// (see the module doc).
    pub speed: u16,
}

/// The devices of one side of a comm, rail order (wire v4; see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RailList(pub heapless::Vec<RailInfo, MAX_RAILS>);

impl RailList {
    /// One rail on device `dev` (a plain comm).
    pub fn single(dev: u16) -> Self {
        let mut v = heapless::Vec::new();
        // Cannot fail: capacity MAX_RAILS ≥ 1.
        let _ = v.push(RailInfo {
            dev,
            ring: None,
            speed: 0,
        });
        Self(v)
    }

    /// How many rails.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no rail (never true of a decoded list).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes of an encoded list of `n` rails.
    pub const fn encoded_len(n: usize) -> usize {
        8 + 16 * n
    }

    /// Checks what [`RailList::decode`] would reject: 1..=[`MAX_RAILS`] rails, a ring on
    /// every rail exactly when there are several.
    fn check(&self, what: &'static str) -> Result<()> {
        let n = self.0.len();
        if n == 0 {
            return Err(wire(what, 0u64));
        }
        for r in &self.0 {
            match (n > 1, r.ring) {
                (true, Some(b)) if b.addr != 0 && b.rkey != 0 => {}
                (false, None) => {}
                (true, _) => return Err(wire("fused rail without a notice ring", r.dev)),
                (false, Some(_)) => return Err(wire("notice ring on a one-rail comm", r.dev)),
            }
        }
        Ok(())
    }

    /// Encodes into `out`, returning the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize> {
        self.check("local rail list (no rail)")?;
        let len = Self::encoded_len(self.0.len());
        if out.len() < len {
            return Err(too_small(out.len()));
        }
        let mut w = Wr { b: out, at: 0 };
        w.u32(RAILS_MAGIC);
        w.u16(WIRE_VERSION);
        w.u8(self.0.len() as u8);
        w.u8(0);
        for r in &self.0 {
            let ring = r.ring.unwrap_or_default();
            w.u64(ring.addr);
            w.u32(ring.rkey);
            w.u16(r.dev);
            w.u16(r.speed);
        }
        Ok(len)
    }

    /// Decodes exactly [`RailList::encoded_len`]`(n)` bytes of a list that must have `n` rails.
    pub fn decode(b: &[u8], n: usize) -> Result<Self> {
        let mut r = Rd { b, at: 0 };
        r.preamble(RAILS_MAGIC, "rail list magic")?;
        let got = r.u8()?;
        if usize::from(got) != n {
            return Err(wire(
                "rail list count differs from the rails announced",
                got,
            ));
        }
        r.zero(1)?;
        let mut v = heapless::Vec::new();
        for _ in 0..n {
            let (addr, rkey) = (r.u64()?, r.u32()?);
            let (dev, speed) = (r.u16()?, r.u16()?);
            let ring = (addr != 0 || rkey != 0).then_some(RemoteBuf { addr, rkey });
            v.push(RailInfo { dev, ring, speed })
                .map_err(|_| wire("rail list count", got))?;
        }
        r.end()?;
        let l = Self(v);
        l.check("rail list count")?;
        Ok(l)
    }
}

/// The encoded ready message (the connector's last word: its QPs are connected).
pub fn ready_bytes() -> [u8; READY_LEN] {
    let mut b = [0u8; READY_LEN];
    let mut w = Wr { b: &mut b, at: 0 };
    w.u32(READY_MAGIC);
    w.u16(WIRE_VERSION);
    w.u16(0);
    b
}

/// Validates a received ready message (exactly [`READY_LEN`] bytes).
pub fn check_ready(b: &[u8]) -> Result<()> {
    let mut r = Rd { b, at: 0 };
    r.preamble(READY_MAGIC, "Ready magic")?;
    r.zero(2)?;
    r.end()
}

/// What `listen` writes into NCCL's opaque handle and `connect` reads back on another rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectHandle {
    /// The listener's socket address.
    pub addr: SocketAddr,
    /// A random number chosen per `listen`; the connector sends it back in its [`Hello`], so the
    /// acceptor rejects connections that did not come from this handle.
    pub nonce: u64,
    /// Which provider family the listener runs (opaque to the core; `ffi` defines the values),
    /// so a connector on another provider fails fast.
    pub provider: u8,
    /// The GIDs of the listener's first RoCE rails, for subnet-aware routing (all-zero slots:
    /// none; `crate::policy::subnet`).
    pub gids: [Gid; HANDLE_GIDS],
}

/// GIDs a [`ConnectHandle`] carries (NCCL 2.30's handle carries two PFs' GIDs).
pub const HANDLE_GIDS: usize = 2;
/// Bytes [`ConnectHandle::encode`] writes.
pub const HANDLE_ENCODED_LEN: usize = 44 + 16 * HANDLE_GIDS;
/// Offset of the scratch area of NCCL's handle that the connecting side may use for its own
/// in-progress state (the seed keeps its `stage` there). Encoding zeroes it; decoding ignores it.
pub const HANDLE_SCRATCH_OFFSET: usize = 80;
/// Bytes of the scratch area.
pub const HANDLE_SCRATCH_LEN: usize = NCCL_NET_HANDLE_MAXSIZE - HANDLE_SCRATCH_OFFSET;

const _: () = assert!(HANDLE_ENCODED_LEN <= HANDLE_SCRATCH_OFFSET);
const _: () = assert!(HANDLE_SCRATCH_OFFSET + HANDLE_SCRATCH_LEN <= NCCL_NET_HANDLE_MAXSIZE);

impl ConnectHandle {
    /// Encodes into NCCL's handle buffer (at least [`HANDLE_ENCODED_LEN`] bytes, normally
    /// [`NCCL_NET_HANDLE_MAXSIZE`]). Every byte of `out` after the encoding, up to
    /// [`NCCL_NET_HANDLE_MAXSIZE`], is zeroed, including the scratch area.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize> {
        if out.len() < HANDLE_ENCODED_LEN {
            return Err(too_small(out.len()));
        }
        let zero_to = out.len().min(NCCL_NET_HANDLE_MAXSIZE);
        out[..zero_to].fill(0);
        let (family, ip, flow, scope) = match self.addr {
            SocketAddr::V4(a) => {
                let mut ip = [0u8; 16];
                ip[..4].copy_from_slice(&a.ip().octets());
                (4, ip, 0, 0)
            }
            SocketAddr::V6(a) => (6, a.ip().octets(), a.flowinfo(), a.scope_id()),
        };
        if self.addr.port() == 0 {
            return Err(Error::OutOfRange {
                what: "listen port",
                value: 0,
                min: 1,
                max: 65535,
            });
        }
        let mut w = Wr { b: out, at: 0 };
        w.u32(HANDLE_MAGIC);
        w.u16(WIRE_VERSION);
        w.u8(family);
        w.u8(self.provider);
        w.u16(self.addr.port());
        w.u16(0);
        w.put(&ip);
        w.u32(flow);
        w.u32(scope);
        w.u64(self.nonce);
        for g in &self.gids {
            w.put(&g.0);
        }
        debug_assert_eq!(w.at, HANDLE_ENCODED_LEN);
        Ok(HANDLE_ENCODED_LEN)
    }

    /// Decodes NCCL's handle buffer (at least [`HANDLE_ENCODED_LEN`] bytes). Rejects a foreign
    /// handle (magic), another version, an unknown family, port 0, and non-zero reserved bytes;
    /// ignores the scratch area.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let mut r = Rd { b, at: 0 };
        r.preamble(HANDLE_MAGIC, "handle magic")?;
        let family = r.u8()?;
        let provider = r.u8()?;
        let port = r.u16()?;
        if port == 0 {
            return Err(wire("handle port", 0u64));
        }
        r.zero(2)?;
        let ip: [u8; 16] = r.arr()?;
        let flow = r.u32()?;
        let scope = r.u32()?;
        let nonce = r.u64()?;
        let mut gids = [Gid::default(); HANDLE_GIDS];
        for g in &mut gids {
            *g = Gid(r.arr()?);
        }
        let reserved_end = b.len().min(HANDLE_SCRATCH_OFFSET);
        r.zero(reserved_end - HANDLE_ENCODED_LEN)?;
        let addr = match family {
            4 => {
                if ip[4..].iter().any(|&x| x != 0) || flow != 0 || scope != 0 {
                    return Err(wire("IPv4 handle with IPv6 fields", 4u64));
                }
                let v4 = Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]);
                SocketAddr::V4(SocketAddrV4::new(v4, port))
            }
            6 => SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope)),
            _ => return Err(wire("handle address family", family)),
        };
        Ok(Self {
            addr,
            nonce,
            provider,
            gids,
        })
    }
}

#[cfg(test)]
mod tests;
