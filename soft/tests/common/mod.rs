//! Shared helpers of the provider-level tests: buffers, sides, polling with a deadline, and the
//! line protocol to a helper process (the test binary re-executed with a role).
#![allow(dead_code, unsafe_code)]

use std::alloc::Layout;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use ibnet_core::comm::{CommConfig, RecvComm};
use ibnet_core::provider::{
    Access, Completion, ConnectAttr, Gid, LinkLayer, MrKeys, Mtu, Provider, ProviderAddr, QpAttr,
    RegKind, SendWr, Sge, WrOpcode,
};
use ibnet_core::wire::QpInfo;
use ibnet_soft::{Config, SoftCq, SoftMr, SoftProvider, SoftQp};

/// Fails the test instead of hanging.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Page-aligned heap memory that the provider may write into behind Rust's back; read it only
/// after the completion that covers the write.
pub struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain heap memory; concurrent access is governed by the RDMA completion protocol.
unsafe impl Send for Region {}

impl Region {
    pub fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1), 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Self { ptr, len }
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes; no transfer is in flight when tests read.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    pub fn fill(&mut self, seed: u64) {
        fill_pattern(self.bytes_mut(), seed);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                Layout::from_size_align(self.len.max(1), 4096).unwrap(),
            )
        }
    }
}

/// A deterministic byte pattern (xorshift) for byte-for-byte checks.
pub fn fill_pattern(b: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for c in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = x.to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_pattern(&mut v, seed);
    v
}

pub fn provider() -> SoftProvider {
    SoftProvider::open_with(Config {
        workers: 2,
        // Medium WRs of a stream go to the workers ("Streams" in `qp.rs`), as on a host of 8
        // cores or more (the default is 0 below).
        stream_min: 4096,
        ..Config::default()
    })
    .unwrap()
}

pub fn qp_attr() -> QpAttr {
    QpAttr {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_inline: 256,
        access: Access::ALL,
    }
}

/// One end: provider, CQ, QP.
pub struct Side {
    pub p: SoftProvider,
    pub cq: SoftCq,
    pub qp: SoftQp,
}

impl Side {
    pub fn new(p: &SoftProvider) -> Self {
        Self::with(p, 1024, qp_attr())
    }
    pub fn with(p: &SoftProvider, depth: u32, attr: QpAttr) -> Self {
        let cq = p.create_cq(depth).unwrap();
        let qp = p.create_qp(&cq, &attr).unwrap();
        Self {
            p: p.clone(),
            cq,
            qp,
        }
    }
    pub fn info(&self) -> (ProviderAddr, u32) {
        (self.p.port_info().addr, self.p.qp_num(&self.qp))
    }
    pub fn connect(&mut self, (addr, qpn): (ProviderAddr, u32)) -> ibnet_core::Result<()> {
        let a = connect_attr(addr, qpn);
        self.p.connect_qp(&mut self.qp, &a)
    }
    pub fn reg(&self, r: &Region) -> SoftMr {
        self.p
            .reg_mr(r.addr(), r.len() as u64, Access::ALL, RegKind::Plain)
            .unwrap()
    }
    pub fn key(&self, mr: &SoftMr) -> u32 {
        self.p.mr_keys(mr).rkey
    }
    pub fn post(&mut self, wrs: &[SendWr]) -> ibnet_core::Result<()> {
        self.p.post_send(&mut self.qp, wrs)
    }
    pub fn recv(&mut self, wr_id: u64) {
        self.p.post_recv(&mut self.qp, wr_id).unwrap()
    }
    /// Polls until `n` completions arrived (panics after [`DEADLINE`]).
    pub fn wait(&mut self, n: usize) -> Vec<Completion> {
        let mut out = Vec::new();
        let mut buf = [Completion::EMPTY; 16];
        let t = Instant::now();
        while out.len() < n {
            let k = self.p.poll_cq(&mut self.cq, &mut buf).unwrap();
            out.extend_from_slice(&buf[..k]);
            assert!(
                t.elapsed() < DEADLINE,
                "timed out with {} of {n} completions: {out:?}",
                out.len()
            );
            if k == 0 {
                std::thread::yield_now();
            }
        }
        out
    }
    /// Polls for a while and returns whatever arrived (for "nothing arrives" checks).
    pub fn drain_for(&mut self, d: Duration) -> Vec<Completion> {
        let mut out = Vec::new();
        let mut buf = [Completion::EMPTY; 16];
        let t = Instant::now();
        while t.elapsed() < d {
            let k = self.p.poll_cq(&mut self.cq, &mut buf).unwrap();
            out.extend_from_slice(&buf[..k]);
            std::thread::yield_now();
        }
        out
    }
}

pub fn connect_attr(addr: ProviderAddr, qpn: u32) -> ConnectAttr {
    ConnectAttr {
        remote_qpn: qpn,
        remote_lid: 0,
        remote_gid: Gid::default(),
        remote_addr: addr,
        link_layer: LinkLayer::Ethernet,
        mtu: Mtu::M4096,
        gid_index: 0,
        timeout: 14,
        retry_cnt: 7,
        sl: 0,
        tc: 0,
        pkey_index: 0,
    }
}

/// Two connected sides.
pub fn pair(pa: &SoftProvider, pb: &SoftProvider) -> (Side, Side) {
    let mut a = Side::new(pa);
    let mut b = Side::new(pb);
    let (ia, ib) = (a.info(), b.info());
    a.connect(ib).unwrap();
    b.connect(ia).unwrap();
    (a, b)
}

#[allow(clippy::too_many_arguments)]
pub fn wr(
    wr_id: u64,
    opcode: WrOpcode,
    laddr: u64,
    len: u32,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    imm: u32,
    signaled: bool,
) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        sge: Sge {
            addr: laddr,
            len,
            lkey,
        },
        remote_addr: raddr,
        rkey,
        imm,
        signaled,
        inline: false,
    }
}

// ---------------------------------------------------------------- helper-process line protocol

/// What one side tells the other: provider address, QP number, buffer address, rkey, length.
#[derive(Debug, Clone, Copy)]
pub struct Info {
    pub addr: ProviderAddr,
    pub qpn: u32,
    pub buf: u64,
    pub rkey: u32,
    pub len: u64,
}

impl Info {
    pub fn to_line(self) -> String {
        let hex: String = self
            .addr
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "IBNET {hex} {} {} {} {}",
            self.qpn, self.buf, self.rkey, self.len
        )
    }
    pub fn parse(line: &str) -> Option<Self> {
        // libtest may have printed "test helper_entry ... " on the same line.
        let mut it = line[line.find("IBNET ")? + 6..].split_whitespace();
        let hex = it.next()?;
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        Some(Self {
            addr: ProviderAddr::new(&bytes)?,
            qpn: it.next()?.parse().ok()?,
            buf: it.next()?.parse().ok()?,
            rkey: it.next()?.parse().ok()?,
            len: it.next()?.parse().ok()?,
        })
    }
}

/// Reads lines until one parses as [`Info`].
pub fn read_info(r: &mut impl BufRead) -> Info {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "helper closed its output"
        );
        if let Some(i) = Info::parse(line.trim()) {
            return i;
        }
    }
}

pub fn write_line(w: &mut impl Write, s: &str) {
    writeln!(w, "{s}").unwrap();
    w.flush().unwrap();
}

/// Spawns this test binary as a helper running the test `entry` with `IBNET_SOFT_ROLE=role`.
/// Helper entries are `#[ignore]`d (so a plain `cargo test` does not count them as passes);
/// `--include-ignored --exact` runs exactly the one named, ignored or not.
pub fn spawn_helper(entry: &str, role: &str, arg: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--include-ignored",
            "--exact",
            entry,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IBNET_SOFT_ROLE", role)
        .env("IBNET_SOFT_ARG", arg)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads lines until `f` accepts one.
pub fn read_line_with<T>(r: &mut impl BufRead, f: impl Fn(&str) -> Option<T>) -> T {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "peer closed its output"
        );
        if let Some(v) = f(line.trim()) {
            return v;
        }
    }
}

/// Registers all of `r` on `p` (plain host memory, every access); the registration and its
/// keys.
pub fn reg(p: &SoftProvider, r: &Region) -> (SoftMr, MrKeys) {
    let mr = p
        .reg_mr(r.addr(), r.len() as u64, Access::ALL, RegKind::Plain)
        .unwrap();
    let k = p.mr_keys(&mr);
    (mr, k)
}

/// A comm's `QpInfo` as one line (`QPINFO <hex of the wire encoding>`).
pub fn qp_info_line(i: &QpInfo) -> String {
    let mut b = [0u8; ibnet_core::wire::QP_INFO_MAX_LEN];
    let n = i.encode(&mut b).unwrap();
    let hex: String = b[..n].iter().map(|x| format!("{x:02x}")).collect();
    format!("QPINFO {hex}")
}

/// The `QpInfo` of a [`qp_info_line`], if `l` is one.
pub fn parse_qp_info(l: &str) -> Option<QpInfo> {
    let hex = l[l.find("QPINFO ")? + 7..].trim();
    let b: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    QpInfo::decode(&b).ok()
}

/// A helper process whose send comm is connected to a receive comm of ours; killed and reaped
/// when dropped. Its stdin stays open as long as this lives.
pub struct SendingPeer {
    /// The process.
    pub child: Child,
    /// Its stdin.
    pub cin: ChildStdin,
    /// Its stdout.
    pub cout: BufReader<ChildStdout>,
}

impl Drop for SendingPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns the helper `entry` in `role` with `arg` ([`spawn_helper`]), which sends its send
/// comm's [`qp_info_line`] first; makes our receive comm on `p` connected to it and sends its
/// info back.
pub fn recv_from_helper(
    p: &SoftProvider,
    entry: &str,
    role: &str,
    arg: &str,
) -> (SendingPeer, RecvComm<SoftProvider>) {
    let mut child = spawn_helper(entry, role, arg);
    let cin = child.stdin.take().unwrap();
    let cout = BufReader::new(child.stdout.take().unwrap());
    let mut peer = SendingPeer { child, cin, cout };
    let si = read_line_with(&mut peer.cout, parse_qp_info);
    let r = RecvComm::new(p.clone(), CommConfig::default(), &si).unwrap();
    write_line(&mut peer.cin, &qp_info_line(&r.local_info()));
    (peer, r)
}

// ---------------------------------------------------------------- inline payloads

/// `(offset, length, opcode)` of a sequence mixing inline (≤ 32 B WRITE_WITH_IMM) and copied
/// writes (larger ones, and plain writes of any size), into consecutive ranges.
pub fn mixed_sequence() -> Vec<(usize, usize, WrOpcode)> {
    use WrOpcode::{Write, WriteWithImm as Imm};
    let shape = [
        (8, Imm),
        (4096, Imm),
        (1, Imm),
        (32, Imm),
        (33, Imm),
        (8, Write),
        (16, Imm),
        (70_000, Imm),
        (24, Write),
        (7, Imm),
        (300_000, Write),
        (32, Imm),
    ];
    let mut off = 0;
    shape
        .iter()
        .map(|&(len, op)| {
            let o = off;
            off += len + 3; // odd offsets: unaligned destinations too
            (o, len, op)
        })
        .collect()
}

/// Bytes the sequence spans.
pub fn mixed_span() -> usize {
    mixed_sequence().last().map(|&(o, l, _)| o + l).unwrap_or(0)
}
