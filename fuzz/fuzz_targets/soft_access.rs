//! The soft provider's access checks: RDMA WRITE / READ / WRITE_WITH_IMM work requests with
//! fuzzed keys, addresses and lengths on a loopback QP pair of one `SoftProvider`.
//!
//! Input: see `ibnet_fuzz::seeds_soft_access`. One 64 KiB arena holds every registration:
//! ```text
//!  A [ 4 KiB, 20 KiB)  local write, remote write, remote read
//!  F [ 8 KiB, 12 KiB)  remote read only (overlaps A)
//!  B [24 KiB, 32 KiB)  remote read only
//!  C [36 KiB, 40 KiB)  local write only
//!  D [44 KiB, 52 KiB)  local write, remote write
//!  E [52 KiB, 56 KiB)  deregistered (its key is stale)
//! ```
//! A key selector picks A, B, C, D, F, E's stale key, a raw key from the input, or A's key
//! with the next generation; the offset is from that registration's start.
//! Oracle: the completion status is exactly what the rules say (local key, range and access
//! checked first: `LocalProtectionError`, then the remote: `RemoteAccessError`); on success
//! exactly the destination range changed, to the source's bytes; on failure no byte changed.
#![no_main]

use std::alloc::Layout;
use std::cell::RefCell;

use ibnet_core::provider::{
    Access, Completion, ConnectAttr, Gid, LinkLayer, Mtu, Provider, QpAttr, RegKind, SendWr, Sge,
    WcStatus, WrOpcode,
};
use ibnet_fuzz::Cursor;
use ibnet_soft::{Config, SoftCq, SoftMr, SoftProvider, SoftQp};
use libfuzzer_sys::fuzz_target;

const ARENA: usize = 64 << 10;
const KIB: usize = 1024;

/// A registration of the arena: offset, length, access, key.
#[derive(Clone, Copy)]
struct Reg {
    off: usize,
    len: usize,
    local_write: bool,
    remote_write: bool,
    remote_read: bool,
    key: u32,
}

struct Qps {
    a_cq: SoftCq,
    a: SoftQp,
    b_cq: SoftCq,
    b: SoftQp,
}

struct State {
    p: SoftProvider,
    arena: *mut u8,
    /// A, F, B, C, D (live), then E (deregistered).
    regs: Vec<Reg>,
    _mrs: Vec<SoftMr>,
    qps: Option<Qps>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn access(r: &Reg) -> Access {
    Access {
        local_write: r.local_write,
        remote_write: r.remote_write,
        remote_read: r.remote_read,
        relaxed_ordering: false,
    }
}

fn setup() -> State {
    let p = SoftProvider::open_with(Config {
        workers: 0,
        ..Config::default()
    })
    .expect("soft provider opens");
    let layout = Layout::from_size_align(ARENA, 4096).expect("layout");
    // SAFETY: non-zero size; the arena lives for the whole process (never freed).
    let arena = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!arena.is_null());
    let r = |off: usize, len: usize, lw: bool, rw: bool, rr: bool| Reg {
        off: off * KIB,
        len: len * KIB,
        local_write: lw,
        remote_write: rw,
        remote_read: rr,
        key: 0,
    };
    let mut regs = vec![
        r(4, 16, true, true, true),
        r(8, 4, false, false, true),
        r(24, 8, false, false, true),
        r(36, 4, true, false, false),
        r(44, 8, true, true, false),
        r(52, 4, true, true, true),
    ];
    let mut mrs = Vec::new();
    for g in regs.iter_mut() {
        let mr = p
            .reg_mr(
                arena as u64 + g.off as u64,
                g.len as u64,
                access(g),
                RegKind::Plain,
            )
            .expect("reg_mr");
        let k = p.mr_keys(&mr);
        assert_eq!(k.lkey, k.rkey, "soft uses one key for both");
        g.key = k.rkey;
        mrs.push(mr);
    }
    let stale = mrs.pop().expect("E");
    p.dereg_mr(stale).expect("dereg E");
    State {
        p,
        arena,
        regs,
        _mrs: mrs,
        qps: None,
    }
}

fn attr() -> QpAttr {
    QpAttr {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_inline: 0,
        access: Access::ALL,
    }
}

fn connect(p: &SoftProvider, qp: &mut SoftQp, remote_qpn: u32) {
    let a = ConnectAttr {
        remote_qpn,
        remote_lid: 0,
        remote_gid: Gid::default(),
        remote_addr: p.port_info().addr,
        link_layer: LinkLayer::Ethernet,
        mtu: Mtu::M4096,
        gid_index: 0,
        timeout: 14,
        retry_cnt: 7,
        sl: 0,
        tc: 0,
        pkey_index: 0,
    };
    p.connect_qp(qp, &a).expect("loopback connect");
}

fn new_qps(p: &SoftProvider) -> Qps {
    let a_cq = p.create_cq(64).expect("cq");
    let b_cq = p.create_cq(64).expect("cq");
    let mut a = p.create_qp(&a_cq, &attr()).expect("qp");
    let mut b = p.create_qp(&b_cq, &attr()).expect("qp");
    let (qa, qb) = (p.qp_num(&a), p.qp_num(&b));
    connect(p, &mut a, qb);
    connect(p, &mut b, qa);
    Qps { a_cq, a, b_cq, b }
}

fn drop_qps(p: &SoftProvider, q: Qps) {
    p.destroy_qp(q.a).expect("destroy qp");
    p.destroy_qp(q.b).expect("destroy qp");
    p.destroy_cq(q.a_cq).expect("destroy cq");
    p.destroy_cq(q.b_cq).expect("destroy cq");
}

/// The key and base address a selector names.
fn pick(s: &State, sel: u8, raw: u32) -> (u32, u64) {
    let base = |r: &Reg| s.arena as u64 + r.off as u64;
    let a = s.regs[0];
    match sel % 8 {
        i @ 0..=5 => (s.regs[i as usize].key, base(&s.regs[i as usize])),
        6 => (raw, base(&a)),
        _ => (a.key.wrapping_add(0x1_0000), base(&a)),
    }
}

/// The live registration `key` names, if any.
fn live(s: &State, key: u32) -> Option<Reg> {
    s.regs[..5].iter().copied().find(|r| r.key == key)
}

/// Whether `[addr, addr + len)` is inside `r` and `r` grants `need`.
fn allows(s: &State, r: Option<Reg>, addr: u64, len: u64, need: impl Fn(&Reg) -> bool) -> bool {
    let Some(r) = r else { return false };
    let start = s.arena as u64 + r.off as u64;
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    addr >= start && end <= start + r.len as u64 && need(&r)
}

fn poll_one(p: &SoftProvider, cq: &mut SoftCq) -> Completion {
    let mut buf = [Completion::EMPTY; 4];
    for _ in 0..100_000 {
        let n = p.poll_cq(cq, &mut buf).expect("poll_cq");
        if n > 0 {
            assert_eq!(n, 1, "one WR, one completion");
            return buf[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion for a posted WR");
}

fn fill(arena: &mut [u8]) {
    for (i, b) in arena.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ (i >> 8) as u8;
    }
}

fuzz_target!(|data: &[u8]| {
    STATE.with(|st| {
        let mut st = st.borrow_mut();
        let s = st.get_or_insert_with(setup);
        run(s, data);
    })
});

fn run(s: &mut State, data: &[u8]) {
    let mut c = Cursor::new(data);
    let op = match c.u8() % 3 {
        0 => WrOpcode::Write,
        1 => WrOpcode::Read,
        _ => WrOpcode::WriteWithImm,
    };
    let lsel = c.u8();
    let loff = c.u32() as i32;
    let rsel = c.u8();
    let roff = c.u32() as i32;
    let len = c.u32() % (64 * 1024 + 1);
    let (lraw, rraw) = (c.u32(), c.u32());
    let (lkey, lbase) = pick(s, lsel, lraw);
    let (rkey, rbase) = pick(s, rsel, rraw);
    let laddr = lbase.wrapping_add_signed(i64::from(loff));
    let raddr = rbase.wrapping_add_signed(i64::from(roff));

    // SAFETY: the arena is ARENA bytes, allocated in `setup` and never freed; no WR is in
    // flight between executions (each waits for its completion), so nothing else writes it.
    let arena = unsafe { std::slice::from_raw_parts_mut(s.arena, ARENA) };
    fill(arena);
    let before = arena.to_vec();

    let read = op == WrOpcode::Read;
    let n = u64::from(len);
    let local_ok = allows(s, live(s, lkey), laddr, n, |r| !read || r.local_write);
    let remote_ok = allows(s, live(s, rkey), raddr, n, |r| {
        if read {
            r.remote_read
        } else {
            r.remote_write
        }
    });
    let want = if len == 0 || (local_ok && remote_ok) {
        WcStatus::Success
    } else if !local_ok {
        WcStatus::LocalProtectionError
    } else {
        WcStatus::RemoteAccessError
    };

    let mut q = s.qps.take().unwrap_or_else(|| new_qps(&s.p));
    let imm = op == WrOpcode::WriteWithImm;
    if imm {
        s.p.post_recv(&mut q.b, 77).expect("post_recv");
    }
    let wr = SendWr {
        wr_id: 9,
        opcode: op,
        sge: Sge {
            addr: laddr,
            len,
            lkey,
        },
        remote_addr: raddr,
        rkey,
        imm: 0xABCD,
        signaled: true,
        inline: false,
    };
    s.p.post_send(&mut q.a, &[wr]).expect("post_send");
    let got = poll_one(&s.p, &mut q.a_cq);
    assert_eq!(
        got.status, want,
        "{op:?} lkey {lkey:#x} laddr {laddr:#x} rkey {rkey:#x} raddr {raddr:#x} len {len}"
    );
    assert_eq!(got.wr_id, 9);
    if want == WcStatus::Success && imm {
        // The target's completion first: a WRITE_WITH_IMM of at most 32 bytes travels inline
        // in the target's ring entry and lands when the target polls it (soft `qp.rs`, "Inline
        // payloads"), as a receiver consumes such a write only after its own completion.
        let r = poll_one(&s.p, &mut q.b_cq);
        assert_eq!(
            (r.status, r.wr_id, r.imm, r.byte_len),
            (WcStatus::Success, 77, 0xABCD, len)
        );
    }
    // SAFETY: as above; the WR has completed.
    let arena = unsafe { std::slice::from_raw_parts(s.arena, ARENA) };
    if want == WcStatus::Success && len > 0 {
        let at = |a: u64| (a - s.arena as u64) as usize;
        let (dst, src) = if read {
            (at(laddr), at(raddr))
        } else {
            (at(raddr), at(laddr))
        };
        let l = len as usize;
        let overlap = dst < src + l && src < dst + l;
        if !overlap {
            assert!(
                arena[dst..dst + l] == before[src..src + l],
                "payload differs"
            );
        }
        assert!(
            arena[..dst] == before[..dst],
            "bytes before the destination changed"
        );
        assert!(
            arena[dst + l..] == before[dst + l..],
            "bytes after the destination changed"
        );
    } else {
        assert!(arena == &before[..], "a refused WR changed memory");
    }
    if want == WcStatus::Success {
        s.qps = Some(q);
    } else {
        // The QPs are in the error state now: start over with a fresh pair.
        drop_qps(&s.p, q);
    }
}
