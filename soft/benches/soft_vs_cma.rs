//! Side-by-side, in one run, between two processes of this host:
//! * raw `process_vm_writev`: bandwidth of one thread, one call at a time, per size, and the
//!   time of one 8-byte call — the mechanism's limit;
//! * the soft provider: WRITE_WITH_IMM bandwidth (a window of outstanding WRs, completions
//!   polled), and one-way latency of 8-byte WRITE_WITH_IMM ping-pong (round trip / 2);
//! * per size, 8 B to 64 MiB: one raw `process_vm_writev` of the size (p50) beside the soft
//!   provider's one-way latency of that size (ping-pong on an idle QP).
//!
//! * the core's comms (`SendComm` here, `RecvComm` in the peer; see `comms/mod.rs`): one-way
//!   8-byte latency and bandwidth per size, against the raw figures of the same run.
//!
//! * the in-process fabric (two providers of this process, one thread): one-way 8-byte latency
//!   and WRITE_WITH_IMM bandwidth, next to a plain `memcpy` of the same sizes.
//!
//! `cargo bench -p ibnet-soft --bench soft_vs_cma` (add `-- --quick` for a short run,
//! `--inproc` for the in-process section only, `--comm-only SIZE` for ~10 s of the comm
//! bandwidth of one size against the raw loop, e.g. under a profiler, `--lat-only` for the
//! latency sections only: 8 bytes and the per-size table, 8 B to 64 MiB; `--comm-lat` for those and
//! then the comms' one-way latency per size, 8 B to 4 KiB). The
//! binary re-executes itself as the peer (`IBNET_SOFT_BENCH_CHILD=1`).
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use ibnet_core::provider::{
    Access, Completion, ConnectAttr, Gid, LinkLayer, Mtu, Provider, ProviderAddr, QpAttr, RegKind,
    SendWr, Sge, WcStatus, WrOpcode,
};
use ibnet_soft::{Config, SoftCq, SoftProvider, SoftQp};

mod comms;

const MAX: usize = 64 << 20;
/// Each side's buffer: in-flight messages use distinct slots of it (no two copies in flight
/// touch the same bytes, as in real traffic).
const BUF: usize = 256 << 20;
const SWITCH_TO_SINK: u32 = u32::MAX - 1;
const QUIT: u32 = u32::MAX;
const RECVS: u64 = ibnet_soft::MAX_RECV_WR as u64;

struct Region {
    ptr: *mut u8,
    len: usize,
}

impl Region {
    fn new(len: usize) -> Self {
        let l = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(l) };
        assert!(!ptr.is_null());
        // Touch every page so the first measurement does not pay page faults.
        // SAFETY: `len` bytes were just allocated.
        unsafe { std::ptr::write_bytes(ptr, 1, len) };
        Self { ptr, len }
    }
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

struct End {
    p: SoftProvider,
    cq: SoftCq,
    qp: SoftQp,
    buf: Region,
    key: u32,
    _mr: ibnet_soft::SoftMr,
}

fn end() -> End {
    end_with(BUF)
}

fn end_with(buf_len: usize) -> End {
    let (cfg, _) = Config::from_lookup(|k| std::env::var(k).ok());
    let p = SoftProvider::open_with(cfg).unwrap();
    let cq = p.create_cq(4096).unwrap();
    let attr = QpAttr {
        max_send_wr: 1024,
        max_recv_wr: ibnet_soft::MAX_RECV_WR,
        max_inline: 64,
        access: Access::ALL,
    };
    let qp = p.create_qp(&cq, &attr).unwrap();
    let buf = Region::new(buf_len);
    let mr = p
        .reg_mr(buf.addr(), buf.len as u64, Access::ALL, RegKind::Plain)
        .unwrap();
    let key = p.mr_keys(&mr).rkey;
    End {
        p,
        cq,
        qp,
        buf,
        key,
        _mr: mr,
    }
}

fn line(e: &End) -> String {
    let hex: String =
        e.p.port_info()
            .addr
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
    format!(
        "IBNET {hex} {} {} {} {}",
        e.p.qp_num(&e.qp),
        e.buf.addr(),
        e.key,
        std::process::id()
    )
}

struct Peer {
    addr: ProviderAddr,
    qpn: u32,
    buf: u64,
    key: u32,
    pid: i32,
}

fn parse(r: &mut impl BufRead) -> Peer {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(r.read_line(&mut l).unwrap() > 0, "peer closed");
        if let Some(i) = l.find("IBNET ") {
            let f: Vec<&str> = l[i + 6..].split_whitespace().collect();
            let bytes: Vec<u8> = (0..f[0].len() / 2)
                .map(|i| u8::from_str_radix(&f[0][2 * i..2 * i + 2], 16).unwrap())
                .collect();
            return Peer {
                addr: ProviderAddr::new(&bytes).unwrap(),
                qpn: f[1].parse().unwrap(),
                buf: f[2].parse().unwrap(),
                key: f[3].parse().unwrap(),
                pid: f[4].parse().unwrap(),
            };
        }
    }
}

fn connect(e: &mut End, peer: &Peer) {
    let a = ConnectAttr {
        remote_qpn: peer.qpn,
        remote_lid: 0,
        remote_gid: Gid::default(),
        remote_addr: peer.addr,
        link_layer: LinkLayer::Ethernet,
        mtu: Mtu::M4096,
        gid_index: 0,
        timeout: 14,
        retry_cnt: 7,
        sl: 0,
        tc: 0,
        pkey_index: 0,
    };
    e.p.connect_qp(&mut e.qp, &a).unwrap();
}

fn wri(e: &End, peer: &Peer, len: usize, imm: u32, wr_id: u64) -> SendWr {
    SendWr {
        wr_id,
        opcode: WrOpcode::WriteWithImm,
        sge: Sge {
            addr: e.buf.addr(),
            len: len as u32,
            lkey: e.key,
        },
        remote_addr: peer.buf,
        rkey: peer.key,
        imm,
        signaled: true,
        inline: false,
    }
}

/// The peer: echoes 8-byte messages until told to sink, then reposts receives until QUIT, then
/// runs the comm section's peer.
fn child() {
    let mut e = end();
    let mut out = std::io::stdout();
    writeln!(out, "{}", line(&e)).unwrap();
    out.flush().unwrap();
    let peer = parse(&mut BufReader::new(std::io::stdin()));
    connect(&mut e, &peer);
    for i in 0..RECVS {
        e.p.post_recv(&mut e.qp, i).unwrap();
    }
    let mut echo = true;
    let mut cs = [Completion::EMPTY; 64];
    'run: loop {
        let n = e.p.poll_cq(&mut e.cq, &mut cs).unwrap();
        for c in &cs[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode != ibnet_core::provider::WcOpcode::RecvRdmaWithImm {
                continue;
            }
            match c.imm {
                QUIT => break 'run,
                SWITCH_TO_SINK => echo = false,
                _ => {}
            }
            e.p.post_recv(&mut e.qp, c.wr_id).unwrap();
            if echo && c.imm != SWITCH_TO_SINK {
                let w = wri(&e, &peer, c.byte_len as usize, 0, 0);
                e.p.post_send(&mut e.qp, &[w]).unwrap();
            }
        }
    }
    comms::peer(&e, &mut std::io::stdin().lock(), &mut out);
}

/// Busy-polls, but after [`comms::BUSY`] empty polls in a row yields the CPU between polls: on
/// a host with few cores, two processes busy-polling would otherwise starve the provider's copy
/// worker (WRs above `direct_max`). The 8-byte latency loops never get that far.
#[derive(Default)]
struct Idle(u32);

impl Idle {
    fn polled(&mut self, n: usize) {
        if n > 0 {
            self.0 = 0;
        } else {
            self.0 += 1;
            if self.0 >= comms::BUSY {
                std::thread::yield_now();
            }
        }
    }
}

fn slots(size: usize) -> usize {
    (BUF / size.max(1)).clamp(1, 16)
}

/// What `e` tells an in-process peer about itself.
fn peer_of(e: &End) -> Peer {
    Peer {
        addr: e.p.port_info().addr,
        qpn: e.p.qp_num(&e.qp),
        buf: e.buf.addr(),
        key: e.key,
        pid: std::process::id() as i32,
    }
}

/// Polls `e` once; reposts every receive; returns (receives, sends) completed.
fn poll_side(e: &mut End, cs: &mut [Completion]) -> (usize, usize) {
    let k = e.p.poll_cq(&mut e.cq, cs).unwrap();
    let mut r = 0;
    for c in &cs[..k] {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        if c.opcode == ibnet_core::provider::WcOpcode::RecvRdmaWithImm {
            e.p.post_recv(&mut e.qp, c.wr_id).unwrap();
            r += 1;
        }
    }
    (r, k - r)
}

/// In-process fabric, one thread driving both ends: (one-way 8-byte µs, [(size, memcpy GB/s,
/// soft GB/s)]).
fn inproc(quick: bool) -> (f64, Vec<(usize, f64, f64)>) {
    const IBUF: usize = 64 << 20;
    let mut a = end_with(IBUF);
    let mut b = end_with(IBUF);
    let (pa, pb) = (peer_of(&a), peer_of(&b));
    connect(&mut a, &pb);
    connect(&mut b, &pa);
    for i in 0..RECVS {
        a.p.post_recv(&mut a.qp, i).unwrap();
        b.p.post_recv(&mut b.qp, i).unwrap();
    }
    let mut cs = [Completion::EMPTY; 64];
    let iters = if quick { 50_000 } else { 500_000 };
    let mut ping = |n: usize, a: &mut End, b: &mut End| {
        for _ in 0..n {
            let w = wri(a, &pb, 8, 8, 0);
            a.p.post_send(&mut a.qp, &[w]).unwrap();
            while poll_side(b, &mut cs).0 == 0 {}
            let w = wri(b, &pa, 8, 8, 0);
            b.p.post_send(&mut b.qp, &[w]).unwrap();
            while poll_side(a, &mut cs).0 == 0 {}
        }
    };
    ping(iters / 10, &mut a, &mut b);
    let t = Instant::now();
    ping(iters, &mut a, &mut b);
    let lat = t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
    while poll_side(&mut a, &mut cs) != (0, 0) || poll_side(&mut b, &mut cs) != (0, 0) {}

    let mut rows = Vec::new();
    let budget = if quick { 64usize << 20 } else { 1usize << 30 };
    let mut size = 64;
    while size <= 16 << 20 {
        let iters = (budget / size).clamp(8, 100_000);
        let k = (IBUF / size).clamp(1, 16);
        let t = Instant::now();
        for i in 0..iters {
            let off = (i % k) * size;
            // SAFETY: `off + size <= IBUF`: inside both buffers, which do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(a.buf.ptr.add(off), b.buf.ptr.add(off), size) };
        }
        let raw = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let (mut posted, mut done) = (0usize, 0usize);
        let t = Instant::now();
        while done < iters {
            while posted < iters && posted - done < 16 {
                let off = ((posted % k) * size) as u64;
                let mut w = wri(&a, &pb, size, 1, posted as u64);
                w.sge.addr += off;
                w.remote_addr += off;
                a.p.post_send(&mut a.qp, &[w]).unwrap();
                posted += 1;
            }
            done += poll_side(&mut a, &mut cs).1;
            poll_side(&mut b, &mut cs);
        }
        let soft = (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
        while poll_side(&mut b, &mut cs) != (0, 0) {}
        rows.push((size, raw, soft));
        size *= 4;
    }
    (lat, rows)
}

fn unit(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

/// One raw `process_vm_writev` of `size` bytes at `off` of our buffer to `off` of the peer's
/// (at `dst` in process `pid`).
fn raw_write(pid: i32, src: &Region, dst: u64, off: usize, size: usize) {
    assert!(off + size <= BUF, "inside both buffers");
    let l = libc::iovec {
        // SAFETY: `off + size <= BUF` (asserted): inside our buffer.
        iov_base: unsafe { src.ptr.add(off) }.cast(),
        iov_len: size,
    };
    let r = libc::iovec {
        iov_base: (dst + off as u64) as *mut libc::c_void,
        iov_len: size,
    };
    // SAFETY: both iovecs describe `size` bytes of live buffers (ours and the peer's).
    let n = unsafe { libc::process_vm_writev(pid, &l, 1, &r, 1, 0) };
    assert_eq!(
        n,
        size as isize,
        "process_vm_writev: {}",
        std::io::Error::last_os_error()
    );
}

/// Polls until the peer's echo has arrived (its receive reposted) and our send completed.
fn await_echo(e: &mut End, cs: &mut [Completion]) {
    let (mut got_recv, mut got_send) = (false, false);
    while !(got_recv && got_send) {
        let k = e.p.poll_cq(&mut e.cq, cs).unwrap();
        for c in &cs[..k] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode == ibnet_core::provider::WcOpcode::RecvRdmaWithImm {
                e.p.post_recv(&mut e.qp, c.wr_id).unwrap();
                got_recv = true;
            } else {
                got_send = true;
            }
        }
    }
}

fn raw_bw(pid: i32, src: &Region, dst: u64, size: usize, iters: usize) -> f64 {
    let k = slots(size);
    let t = Instant::now();
    for i in 0..iters {
        raw_write(pid, src, dst, (i % k) * size, size);
    }
    (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn raw_call_us(pid: i32, src: &Region, dst: u64, iters: usize) -> f64 {
    let t = Instant::now();
    raw_bw(pid, src, dst, 8, iters);
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// Soft provider: keeps `window` WRITE_WITH_IMMs of `size` in flight; GB/s.
fn soft_bw(e: &mut End, peer: &Peer, size: usize, iters: usize, window: usize) -> f64 {
    let mut cs = [Completion::EMPTY; 64];
    let mut idle = Idle::default();
    let (mut posted, mut done) = (0usize, 0usize);
    let t = Instant::now();
    while done < iters {
        while posted < iters && posted - done < window {
            let off = ((posted % slots(size)) * size) as u64;
            let mut w = wri(e, peer, size, 1, posted as u64);
            w.sge.addr += off;
            w.remote_addr += off;
            e.p.post_send(&mut e.qp, &[w]).unwrap();
            posted += 1;
        }
        let n = e.p.poll_cq(&mut e.cq, &mut cs).unwrap();
        idle.polled(n);
        for c in &cs[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
        done += n;
    }
    (size * iters) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// Soft provider: 8-byte ping-pong; one-way latency in µs.
fn soft_lat(e: &mut End, peer: &Peer, iters: usize) -> f64 {
    let mut cs = [Completion::EMPTY; 16];
    for i in 0..RECVS {
        e.p.post_recv(&mut e.qp, i).unwrap();
    }
    let mut run = |n: usize, e: &mut End| {
        for _ in 0..n {
            let w = wri(e, peer, 8, 8, 0);
            e.p.post_send(&mut e.qp, &[w]).unwrap();
            await_echo(e, &mut cs);
        }
    };
    run(iters / 10, e); // warm-up
    let t = Instant::now();
    run(iters, e);
    t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0
}

/// The median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Where the per-size ping-pong sends from and to: the second half of both buffers, which the
/// peer's echo (from the start of its buffer to the start of ours) never touches, so that, as
/// in ibnet-perf (separate send and receive buffers), no buffer moves between the two sides.
const PING_OFF: usize = BUF / 2;

/// Soft provider: ping-pong of `size` bytes (the peer echoes the same size; receives posted by
/// [`soft_lat`]), one message at a time on an idle QP as ibnet-perf's latency phase: (p50
/// one-way µs, p50 of the `post_send` call µs: the posting thread's own share of the copy).
fn soft_lat_size(e: &mut End, peer: &Peer, size: usize, iters: usize) -> (f64, f64) {
    let mut cs = [Completion::EMPTY; 16];
    let warm = iters / 10;
    let (mut one, mut post) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for i in 0..warm + iters {
        let mut w = wri(e, peer, size, 1, 0);
        w.sge.addr += PING_OFF as u64;
        w.remote_addr += PING_OFF as u64;
        let t0 = Instant::now();
        e.p.post_send(&mut e.qp, &[w]).unwrap();
        let tp = t0.elapsed();
        await_echo(e, &mut cs);
        if i >= warm {
            one.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            post.push(tp.as_secs_f64() * 1e6);
        }
    }
    (median(&mut one), median(&mut post))
}

/// One raw `process_vm_writev` of `size` bytes from and to the addresses of
/// [`soft_lat_size`], `iters` times: p50 µs.
fn raw_once_us(pid: i32, src: &Region, dst: u64, size: usize, iters: usize) -> f64 {
    let mut v: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            raw_write(pid, src, dst, PING_OFF, size);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    median(&mut v)
}

/// The per-size latency section: where a single message's time goes as the size doubles.
fn print_lat_sizes(e: &mut End, peer: &Peer, quick: bool) {
    let iters = if quick { 200 } else { 2000 };
    println!(
        "
provider one-way latency per size (ping-pong of the size, idle QP; p50)"
    );
    println!("      size    raw call us   soft us   post_send us   soft/raw   x prev");
    let mut prev = 0.0;
    let mut size = 8;
    while size <= MAX {
        // Fewer iterations above 1 MiB: the same bytes per size as 1 MiB's.
        let n = if size <= 1 << 20 {
            iters
        } else {
            (iters * (1 << 20) / size).max(20)
        };
        let raw = raw_once_us(peer.pid, &e.buf, peer.buf, size, n);
        let (one, post) = soft_lat_size(e, peer, size, n);
        let step = if prev > 0.0 { one / prev } else { 0.0 };
        println!(
            "  {:>8}      {raw:9.2}  {one:8.3}   {post:12.2}   {:8.2}   {step:6.2}",
            unit(size),
            one / raw
        );
        prev = one;
        size *= 2;
    }
}

fn main() {
    if std::env::var_os("IBNET_SOFT_BENCH_CHILD").is_some() {
        child();
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--inproc") {
        print_inproc(quick);
        return;
    }
    if let Err(u) = ibnet_soft::probe() {
        eprintln!("{u}");
        return;
    }
    let mut ch = std::process::Command::new(std::env::current_exe().unwrap())
        .env("IBNET_SOFT_BENCH_CHILD", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = ch.stdin.take().unwrap();
    let mut stdout = BufReader::new(ch.stdout.take().unwrap());
    let mut e = end();
    let peer = parse(&mut stdout);
    writeln!(stdin, "{}", line(&e)).unwrap();
    stdin.flush().unwrap();
    connect(&mut e, &peer);

    if let Some(size) = arg_after("--comm-only") {
        comm_only(e, peer, &mut stdout, &mut stdin, size);
        assert!(ch.wait().unwrap().success(), "peer process failed");
        return;
    }
    let cfg = e.p.config();
    println!(
        "ibnet-soft vs raw process_vm_writev (two processes; workers {}, direct_max {} KiB, chunk {} KiB, min_piece {} KiB, bounce_max {} B, stream_min {} B, spin {} us; {} cores)",
        cfg.workers,
        cfg.direct_max >> 10,
        cfg.chunk >> 10,
        cfg.min_piece >> 10,
        cfg.bounce_max,
        cfg.stream_min,
        cfg.spin_us,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let lat_iters = if quick { 20_000 } else { 200_000 };
    let raw_us = raw_call_us(peer.pid, &e.buf, peer.buf, lat_iters);
    let soft_us = soft_lat(&mut e, &peer, lat_iters / 4);
    println!("\n8-byte latency");
    println!("  raw process_vm_writev, one call      {raw_us:8.2} us");
    println!(
        "  soft WRITE_WITH_IMM one-way (RTT/2)  {soft_us:8.2} us   ratio {:.2} (goal <= 2.0)",
        soft_us / raw_us
    );
    print_lat_sizes(&mut e, &peer, quick);
    if std::env::args().any(|a| a == "--comm-lat") {
        comm_lat(e, peer, &mut stdout, &mut stdin, quick, raw_us);
        assert!(ch.wait().unwrap().success(), "peer process failed");
        return;
    }
    if std::env::args().any(|a| a == "--lat-only") {
        // The peer sits in its echo loop: this process spawned it, and ends it.
        let _ = ch.kill();
        let _ = ch.wait();
        return;
    }

    // Switch the peer to sink mode (it reposts receives, no echo).
    let w = wri(&e, &peer, 0, SWITCH_TO_SINK, 0);
    e.p.post_send(&mut e.qp, &[w]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut cs = [Completion::EMPTY; 64];
    while e.p.poll_cq(&mut e.cq, &mut cs).unwrap() > 0 {}

    println!("\nbandwidth (GB/s; rotating distinct buffer slots per size, up to 16)");
    println!("                        raw CMA   soft w=16   ratio");
    let budget = if quick { 64usize << 20 } else { 1usize << 30 };
    let mut raws = Vec::new();
    let mut size = 4096;
    while size <= MAX {
        let iters = (budget / size).clamp(8, 50_000);
        let raw = raw_bw(peer.pid, &e.buf, peer.buf, size, iters);
        raws.push((size, raw));
        let soft = soft_bw(&mut e, &peer, size, iters, 16);
        let unit = unit(size);
        println!(
            "  {unit:>8}            {raw:8.2}   {soft:9.2}   {:5.2}",
            soft / raw
        );
        size *= 4;
    }
    let w = wri(&e, &peer, 0, QUIT, 0);
    e.p.post_send(&mut e.qp, &[w]).unwrap();
    let c = comms::Comms::connect(&e, &mut stdout, &mut stdin);
    comms::print(c, quick, raw_us, &raws);
    assert!(ch.wait().unwrap().success(), "peer process failed");
    print_inproc(quick);
}

/// The value after `flag` on the command line, if any.
fn arg_after(flag: &str) -> Option<usize> {
    let a: Vec<String> = std::env::args().collect();
    let i = a.iter().position(|x| x == flag)?;
    Some(a.get(i + 1)?.parse().expect("a size in bytes"))
}

/// `--comm-lat`: the comms' one-way latency (ping-pong, p50 of rounds) per size, 8 B to 4 KiB,
/// next to one raw 8-byte call (`raw_us`) and one raw call of the size.
fn comm_lat<I: BufRead, O: Write>(
    mut e: End,
    peer: Peer,
    inp: I,
    out: O,
    quick: bool,
    raw_us: f64,
) {
    let w = wri(&e, &peer, 0, QUIT, 0);
    e.p.post_send(&mut e.qp, &[w]).unwrap();
    let mut cs = [Completion::EMPTY; 4];
    while e.p.poll_cq(&mut e.cq, &mut cs).unwrap() == 0 {
        std::thread::yield_now();
    }
    let mut c = comms::Comms::connect(&e, inp, out);
    let iters = if quick { 2_000 } else { 20_000 };
    println!("\ncomm one-way latency per size (SendComm -> RecvComm ping-pong, p50 of 9 rounds)");
    println!("      size    raw call us   comm us   goal us (1.5 x (raw + raw 8 B))   comm/goal");
    let mut size = 8;
    while size <= 4096 {
        let raw = raw_once_us(peer.pid, &e.buf, peer.buf, size, 2000);
        let mut v: Vec<f64> = (0..9).map(|_| c.latency(size, iters)).collect();
        let us = median(&mut v);
        let goal = 1.5 * (raw + raw_us);
        println!(
            "  {:>8}      {raw:9.2}  {us:8.3}   {goal:8.2}                           {:6.2}",
            unit(size),
            us / goal
        );
        size *= 2;
    }
    c.end();
}

/// `--comm-only SIZE`: only the comm bandwidth of `SIZE`, for about 10 s (for a profiler:
/// `perf record -g`, callgrind); prints GB/s per round of up to 200 000 messages, with the raw
/// `process_vm_writev` loop of the same size and count run just before it, and their ratio.
fn comm_only<I: BufRead, O: Write>(mut e: End, peer: Peer, inp: I, out: O, size: usize) {
    let w = wri(&e, &peer, 0, QUIT, 0);
    e.p.post_send(&mut e.qp, &[w]).unwrap();
    // Poll until it completes: polls drive the retries while the peer has no receive posted
    // yet (RNR).
    let mut cs = [Completion::EMPTY; 4];
    while e.p.poll_cq(&mut e.cq, &mut cs).unwrap() == 0 {
        std::thread::yield_now();
    }
    let mut c = comms::Comms::connect(&e, inp, out);
    let iters = ((1usize << 30) / size).clamp(8, 200_000);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        // The raw loop of the same size and count just before (the peer idles meanwhile,
        // waiting for the next command; the slots it writes are the comm's, one at a time).
        let raw = raw_bw(peer.pid, &e.buf, peer.buf, size, iters);
        let gbs = c.bandwidth(size, iters, slots(size));
        println!(
            "comm {} (w={}): {gbs:.2} GB/s   raw CMA {raw:.2} GB/s   ratio {:.2}",
            unit(size),
            slots(size),
            gbs / raw
        );
    }
    c.end();
}

fn print_inproc(quick: bool) {
    let (lat, rows) = inproc(quick);
    println!("\nin-process fabric (two providers, one thread)");
    println!("  soft WRITE_WITH_IMM one-way (RTT/2)  {lat:8.3} us");
    println!("                        memcpy    soft w=16   ratio");
    for (size, raw, soft) in rows {
        let unit = unit(size);
        println!(
            "  {unit:>8}            {raw:8.2}   {soft:9.2}   {:5.2}",
            soft / raw
        );
    }
}
