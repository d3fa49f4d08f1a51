//! Provider-level tests over the cross-process fabric: this test binary re-executes itself as a
//! helper process (`helper_entry` with `IBNET_SOFT_ROLE`), and the two exchange addresses over
//! the helper's stdin/stdout.

mod common;

use std::io::BufReader;
use std::process::{Child, ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use common::*;
use ibnet_core::provider::{Completion, Provider, WcStatus, WrOpcode};
use ibnet_soft::SoftMr;

const QUIT: u32 = u32::MAX;

/// The helper side; does nothing unless spawned with a role.
#[test]
#[ignore = "helper role: spawned by the two-process tests with IBNET_SOFT_ROLE"]
fn helper_entry() {
    let Ok(role) = std::env::var("IBNET_SOFT_ROLE") else {
        return;
    };
    let len: usize = std::env::var("IBNET_SOFT_ARG").unwrap().parse().unwrap();
    if role == "fifo" {
        return fifo_helper();
    }
    let p = provider();
    let mut me = Side::new(&p);
    let buf = Region::new(len);
    let mr = me.reg(&buf);
    let (addr, qpn) = me.info();
    let info = Info {
        addr,
        qpn,
        buf: buf.addr(),
        rkey: me.key(&mr),
        len: len as u64,
    };
    let mut out = std::io::stdout();
    write_line(&mut out, &info.to_line());
    let peer = read_info(&mut BufReader::new(std::io::stdin()));
    me.connect((peer.addr, peer.qpn)).unwrap();
    match role.as_str() {
        // Echo every WRITE_WITH_IMM back into the parent's buffer, same length.
        "echo" => {
            for i in 0..8 {
                me.recv(i);
            }
            // One poll may return several completions (an echo's own send completion and the
            // next receive, QUIT included): handle every one, never just the first.
            let mut pending = std::collections::VecDeque::new();
            loop {
                if pending.is_empty() {
                    pending.extend(me.wait(1));
                }
                let c = pending.pop_front().unwrap();
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                if c.opcode == ibnet_core::provider::WcOpcode::RdmaWrite {
                    continue; // an echo landed
                }
                if c.imm == QUIT {
                    break;
                }
                me.recv(c.wr_id);
                let n = c.byte_len;
                let w = wr(
                    1,
                    WrOpcode::WriteWithImm,
                    buf.addr(),
                    n,
                    me.key(&mr),
                    peer.buf,
                    peer.rkey,
                    n,
                    true,
                );
                me.post(&[w]).unwrap();
            }
        }
        // Take every WRITE_WITH_IMM (re-posting its receive; immediates must count up from 0,
        // as the RC order of the senders here numbers them); at QUIT print a hash of the
        // buffer.
        "sink" => {
            for i in 0..64 {
                me.recv(i);
            }
            let mut next = 0;
            'outer: loop {
                for c in me.wait(1) {
                    assert_eq!(c.status, WcStatus::Success, "{c:?}");
                    if c.imm == QUIT {
                        break 'outer;
                    }
                    assert_eq!(c.imm, next, "immediates out of order");
                    next += 1;
                    me.recv(c.wr_id);
                }
            }
            write_line(&mut out, &format!("SUM {:x}", fnv(buf.bytes())));
        }
        // Post receives and sleep until killed.
        "victim" => {
            for i in 0..64 {
                me.recv(i);
            }
            write_line(&mut out, "READY");
            std::thread::sleep(Duration::from_secs(600));
        }
        r => panic!("unknown role {r}"),
    }
    drop(mr);
}

/// FNV-1a of `b`.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The "fifo" helper: a FIFO ring from `alloc_fifo` (in the shared segment), registered for
/// remote writes and offered as the helper's buffer. On each WRITE_WITH_IMM (imm = a FIFO
/// sequence number) it reads that slot at once and prints `SLOT <seq> <n> <addr> <size> <rkey>
/// <tag>` (n = 0: not posted), until QUIT.
fn fifo_helper() {
    use ibnet_core::fifo::{FifoRing, PostedRecv, MAX_RECVS, MAX_REQUESTS};
    use ibnet_core::provider::{Access, RegKind};
    let p = provider();
    let mut me = Side::new(&p);
    let fifo = p.alloc_fifo().unwrap();
    assert!(
        fifo.is_shared(),
        "the FIFO ring lives in the shared segment"
    );
    let bytes = FifoRing::<MAX_REQUESTS>::BYTES as u64;
    let mr = p
        .reg_mr(fifo.base_addr(), bytes, Access::ALL, RegKind::Plain)
        .unwrap();
    let (addr, qpn) = me.info();
    let info = Info {
        addr,
        qpn,
        buf: fifo.base_addr(),
        rkey: me.key(&mr),
        len: bytes,
    };
    let mut out = std::io::stdout();
    write_line(&mut out, &info.to_line());
    let peer = read_info(&mut BufReader::new(std::io::stdin()));
    me.connect((peer.addr, peer.qpn)).unwrap();
    for i in 0..8 {
        me.recv(i);
    }
    loop {
        let c = me.wait(1)[0];
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        if c.imm == QUIT {
            break;
        }
        me.recv(c.wr_id);
        let mut got = [PostedRecv::default(); MAX_RECVS];
        let n = fifo.poll(c.imm as u64, &mut got).unwrap().unwrap_or(0);
        let g = got[0];
        let line = format!(
            "SLOT {} {n} {} {} {} {}",
            c.imm, g.addr, g.size, g.rkey, g.tag
        );
        write_line(&mut out, &line);
    }
    p.dereg_mr(mr).unwrap();
}

struct Helper {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    info: Info,
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns a helper with `role` and a `len`-byte buffer, connects `me` to it.
fn helper(role: &str, len: usize, me: &mut Side, my_buf: &Region, my_mr: &SoftMr) -> Helper {
    let mut child = spawn_helper("helper_entry", role, &len.to_string());
    let stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let info = read_info(&mut stdout);
    let mut h = Helper {
        child,
        stdin,
        stdout,
        info,
    };
    let (addr, qpn) = me.info();
    let mine = Info {
        addr,
        qpn,
        buf: my_buf.addr(),
        rkey: me.key(my_mr),
        len: my_buf.len() as u64,
    };
    write_line(&mut h.stdin, &mine.to_line());
    me.connect((info.addr, info.qpn)).unwrap();
    h
}

fn wait_line(h: &mut Helper, want: &str) {
    use std::io::BufRead;
    let mut l = String::new();
    loop {
        l.clear();
        assert!(h.stdout.read_line(&mut l).unwrap() > 0, "helper exited");
        if l.trim().ends_with(want) {
            return;
        }
    }
}

#[test]
fn two_process_echo_sizes_0_to_64mib_byte_for_byte() {
    const MAX: usize = 64 << 20;
    let p = provider();
    let mut me = Side::new(&p);
    let mut src = Region::new(MAX);
    let dst = Region::new(MAX);
    let (ms, md) = (me.reg(&src), me.reg(&dst));
    let mut h = helper("echo", MAX, &mut me, &dst, &md);
    for i in 0..4 {
        me.recv(i);
    }
    for (i, len) in [
        0usize,
        1,
        8,
        4095,
        4096,
        65_537,
        (1 << 20) + 1,
        16 << 20,
        MAX,
    ]
    .into_iter()
    .enumerate()
    {
        fill_pattern(&mut src.bytes_mut()[..len], i as u64 + 11);
        let w = wr(
            i as u64,
            WrOpcode::WriteWithImm,
            src.addr(),
            len as u32,
            me.key(&ms),
            h.info.buf,
            h.info.rkey,
            len as u32,
            true,
        );
        me.post(&[w]).unwrap();
        let mut sent = false;
        let mut echoed = None;
        while !sent || echoed.is_none() {
            for c in me.wait(1) {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                match c.opcode {
                    ibnet_core::provider::WcOpcode::RdmaWrite => sent = true,
                    _ => {
                        echoed = Some(c);
                        me.recv(c.wr_id);
                    }
                }
            }
        }
        let c = echoed.unwrap();
        assert_eq!((c.imm, c.byte_len), (len as u32, len as u32));
        assert!(
            dst.bytes()[..len] == src.bytes()[..len],
            "echo of {len} bytes differs"
        );
    }
    let q = wr(99, WrOpcode::WriteWithImm, 0, 0, 0, 0, 0, QUIT, true);
    me.post(&[q]).unwrap();
    assert_eq!(me.wait(1)[0].status, WcStatus::Success);
    assert!(h.child.wait().unwrap().success(), "helper failed");
}

/// WRITE_WITH_IMMs of sizes around the inline and bounce limits, in rounds (so that bounce
/// slots are reused once the target has copied them out, and fall back to a copy when none is
/// free), interleaved with larger copied ones: every byte lands where it was written.
#[test]
fn two_process_bounced_writes_land_byte_for_byte() {
    const LEN: usize = 4 << 20;
    // Every size up to the slot size bounces (the default stops at 4 KiB).
    let p = ibnet_soft::SoftProvider::open_with(ibnet_soft::Config {
        workers: 2,
        bounce_max: ibnet_soft::BOUNCE_MAX as u64,
        ..ibnet_soft::Config::default()
    })
    .unwrap();
    let mut me = Side::new(&p);
    let mut src = Region::new(LEN);
    fill_pattern(src.bytes_mut(), 5);
    let ms = me.reg(&src);
    let mut h = helper("sink", LEN, &mut me, &src, &ms);
    let sizes = [
        33usize, 100, 1000, 2049, 4095, 4096, 4097, 8192, 16_384, 40_000,
    ];
    let mut want = vec![0u8; LEN];
    let mut off = 0;
    let mut n = 0u64;
    for _round in 0..12 {
        let mut wrs = Vec::new();
        for _ in 0..20 {
            let len = sizes[n as usize % sizes.len()];
            want[off..off + len].copy_from_slice(&src.bytes()[off..off + len]);
            wrs.push(wr(
                n,
                WrOpcode::WriteWithImm,
                src.addr() + off as u64,
                len as u32,
                me.key(&ms),
                h.info.buf + off as u64,
                h.info.rkey,
                n as u32,
                true,
            ));
            off += len.next_multiple_of(64);
            n += 1;
        }
        me.post(&wrs).unwrap();
        for c in me.wait(wrs.len()) {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
    }
    let q = wr(999, WrOpcode::WriteWithImm, 0, 0, 0, 0, 0, QUIT, true);
    me.post(&[q]).unwrap();
    assert_eq!(me.wait(1)[0].status, WcStatus::Success);
    wait_line(&mut h, &format!("SUM {:x}", fnv(&want)));
    assert!(h.child.wait().unwrap().success(), "helper failed");
}

/// A stream of WRITE_WITH_IMMs, up to 16 outstanding, each posted alone, of sizes around
/// `stream_min` (inline, bounced, copied by the poster, whole to a worker, split over workers):
/// every byte lands where it was written and the immediates arrive in post order.
#[test]
fn two_process_streamed_writes_land_in_order_byte_for_byte() {
    const LEN: usize = 8 << 20;
    let p = ibnet_soft::SoftProvider::open_with(ibnet_soft::Config {
        workers: 2,
        stream_min: 4096,
        // 64 KiB (the default is 512 KiB) so that the larger sizes are split over workers.
        direct_max: 64 << 10,
        ..ibnet_soft::Config::default()
    })
    .unwrap();
    let mut me = Side::new(&p);
    let mut src = Region::new(LEN);
    fill_pattern(src.bytes_mut(), 7);
    let ms = me.reg(&src);
    let mut h = helper("sink", LEN, &mut me, &src, &ms);
    let sizes = [
        4096usize, 16_384, 8, 65_536, 1000, 4095, 300_000, 4097, 40_000, 65_537,
    ];
    let mut want = vec![0u8; LEN];
    let (mut off, mut out) = (0, 0);
    for n in 0..200u64 {
        let len = sizes[n as usize % sizes.len()];
        if off + len > LEN {
            off = 0; // rewrites the same bytes from the same source offsets
        }
        want[off..off + len].copy_from_slice(&src.bytes()[off..off + len]);
        let w = wr(
            n,
            WrOpcode::WriteWithImm,
            src.addr() + off as u64,
            len as u32,
            me.key(&ms),
            h.info.buf + off as u64,
            h.info.rkey,
            n as u32,
            true,
        );
        me.post(&[w]).unwrap();
        out += 1;
        if out == 16 {
            let cs = me.wait(4); // at least 4 (all that one poll returned)
            for c in &cs {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
            }
            out -= cs.len();
        }
        off += len.next_multiple_of(64);
    }
    for c in me.wait(out) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    let q = wr(999, WrOpcode::WriteWithImm, 0, 0, 0, 0, 0, QUIT, true);
    me.post(&[q]).unwrap();
    assert_eq!(me.wait(1)[0].status, WcStatus::Success);
    wait_line(&mut h, &format!("SUM {:x}", fnv(&want)));
    assert!(h.child.wait().unwrap().success(), "helper failed");
}

/// A bounce-sized WRITE_WITH_IMM with a stale rkey fails as a copied one does
/// (`RemoteAccessError`; the WR behind it flushed).
#[test]
fn two_process_bounced_write_with_a_bad_rkey_is_a_remote_access_error() {
    let p = provider();
    let mut me = Side::new(&p);
    let local = Region::new(1 << 20);
    let ml = me.reg(&local);
    let h = helper("victim", 1 << 20, &mut me, &local, &ml);
    let w = |id, rkey| {
        wr(
            id,
            WrOpcode::WriteWithImm,
            local.addr(),
            1000,
            me.key(&ml),
            h.info.buf,
            rkey,
            0,
            true,
        )
    };
    me.post(&[w(1, h.info.rkey ^ 0x1_0000), w(2, h.info.rkey)])
        .unwrap();
    let c = me.wait(2);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RemoteAccessError));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushError));
    drop(h);
}

#[test]
fn two_process_read_and_remote_errors() {
    let p = provider();
    let mut me = Side::new(&p);
    let local = Region::new(1 << 20);
    let ml = me.reg(&local);
    let h = helper("victim", 1 << 20, &mut me, &local, &ml);
    // READ the helper's (zeroed) buffer over our pattern.
    let mut l2 = Region::new(1 << 20);
    l2.fill(5);
    let m2 = me.reg(&l2);
    let r = wr(
        1,
        WrOpcode::Read,
        l2.addr(),
        1 << 20,
        me.key(&m2),
        h.info.buf,
        h.info.rkey,
        0,
        true,
    );
    me.post(&[r]).unwrap();
    assert_eq!(me.wait(1)[0].status, WcStatus::Success);
    assert!(
        l2.bytes().iter().all(|&b| b == 0),
        "read did not bring the remote bytes"
    );
    // Out of range in the helper's registration.
    let bad = wr(
        2,
        WrOpcode::Write,
        local.addr(),
        4096,
        me.key(&ml),
        h.info.buf + (1 << 20) - 100,
        h.info.rkey,
        0,
        true,
    );
    let good = wr(
        3,
        WrOpcode::Write,
        local.addr(),
        64,
        me.key(&ml),
        h.info.buf,
        h.info.rkey,
        0,
        true,
    );
    me.post(&[bad, good]).unwrap();
    let c = me.wait(2);
    assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::RemoteAccessError));
    assert_eq!((c[1].wr_id, c[1].status), (3, WcStatus::WrFlushError));
    drop(h);
}

/// A peer's FIFO ring lives in its shared segment: our RDMA WRITE of a clear-to-send element
/// into it (done with stores through our mapping of that segment, no syscall) is visible to the
/// peer when it sees a later WRITE_WITH_IMM of the same QP; the remote-access checks still
/// apply (a bad rkey, a range beyond the registration).
#[test]
fn two_process_fifo_writes_in_shared_memory() {
    use ibnet_core::fifo::{FifoRing, PostedRecv, MAX_REQUESTS};
    let p = provider();
    let mut me = Side::new(&p);
    let staging = p.alloc_fifo().unwrap();
    let mr = p
        .reg_mr(
            staging.base_addr(),
            FifoRing::<MAX_REQUESTS>::BYTES as u64,
            ibnet_core::provider::Access::ALL,
            ibnet_core::provider::RegKind::Plain,
        )
        .unwrap();
    let lkey = me.key(&mr);
    let dummy = Region::new(4096);
    let dmr = me.reg(&dummy);
    let mut h = helper("fifo", 0, &mut me, &dummy, &dmr);
    let slot = |h: &mut Helper| -> Vec<u64> {
        common::read_line_with(&mut h.stdout, |l| {
            l.strip_prefix("SLOT ")
                .map(|r| r.split_whitespace().map(|x| x.parse().unwrap()).collect())
        })
    };
    for seq in [0u64, 1, 2, 257] {
        let e = PostedRecv {
            addr: 0x1000 + seq,
            size: 64 + seq,
            rkey: 0x77 + seq as u32,
            tag: 5,
        };
        let (off, len) = staging.publish(seq, &[e]);
        let w = wr(
            10 + seq,
            WrOpcode::Write,
            staging.base_addr() + off as u64,
            len as u32,
            lkey,
            h.info.buf + off as u64,
            h.info.rkey,
            0,
            false,
        );
        let imm = wr(
            20 + seq,
            WrOpcode::WriteWithImm,
            0,
            0,
            0,
            0,
            0,
            seq as u32,
            true,
        );
        me.post(&[w, imm]).unwrap();
        assert_eq!(me.wait(1)[0].status, WcStatus::Success);
        let got = slot(&mut h);
        assert_eq!(
            got,
            vec![seq, 1, e.addr, e.size, e.rkey as u64, 5],
            "slot {seq}"
        );
    }
    // A wrong rkey, then a range past the end of the FIFO's registration: remote access errors.
    let bad_key = wr(
        30,
        WrOpcode::Write,
        staging.base_addr(),
        64,
        lkey,
        h.info.buf,
        h.info.rkey ^ 0x1_0000,
        0,
        true,
    );
    me.post(&[bad_key]).unwrap();
    let c = me.wait(1)[0];
    assert_eq!((c.wr_id, c.status), (30, WcStatus::RemoteAccessError));
    drop(h);
}

/// Kills the helper while large writes are in flight: every outstanding WR completes with an
/// error (no hang), RetryExceeded among them, and nothing succeeds after the first error.
#[test]
fn killed_target_fails_outstanding_work() {
    const LEN: usize = 32 << 20;
    let p = provider();
    let mut me = Side::new(&p);
    let mut src = Region::new(LEN);
    src.fill(1);
    let ms = me.reg(&src);
    let mut h = helper("victim", LEN, &mut me, &src, &ms);
    wait_line(&mut h, "READY");
    // Keep 8 large writes in flight, kill the helper after a few completed. Should every WR in
    // flight have landed before the kill (fast copies), keep posting after it until the death
    // shows: the test is about the first error and everything behind it.
    let mut posted = 0u64;
    let mut done: Vec<Completion> = Vec::new();
    let t = Instant::now();
    let mut killed = false;
    let failed = |d: &[Completion]| d.iter().any(|c| c.status != WcStatus::Success);
    loop {
        while posted - (done.len() as u64) < 8 && !(killed && failed(&done)) {
            let w = wr(
                posted,
                WrOpcode::WriteWithImm,
                src.addr(),
                LEN as u32,
                me.key(&ms),
                h.info.buf,
                h.info.rkey,
                0,
                true,
            );
            me.post(&[w]).unwrap();
            posted += 1;
        }
        let mut buf = [Completion::EMPTY; 16];
        let n = me.p.poll_cq(&mut me.cq, &mut buf).unwrap();
        done.extend_from_slice(&buf[..n]);
        if !killed && done.len() >= 3 {
            h.child.kill().unwrap();
            h.child.wait().unwrap();
            killed = true;
        }
        if killed && done.len() as u64 == posted && failed(&done) {
            break;
        }
        assert!(
            t.elapsed() < DEADLINE,
            "outstanding WRs never completed: {} of {posted}",
            done.len()
        );
    }
    let first_err = done
        .iter()
        .position(|c| c.status != WcStatus::Success)
        .expect("no error after the kill");
    assert!(
        done[first_err..]
            .iter()
            .all(|c| c.status != WcStatus::Success),
        "success after an error"
    );
    assert!(
        done.iter().any(|c| c.status == WcStatus::RetryExceeded),
        "{done:?}"
    );
    // New work on the dead connection is flushed.
    let w = wr(
        1000,
        WrOpcode::Write,
        src.addr(),
        8,
        me.key(&ms),
        h.info.buf,
        h.info.rkey,
        0,
        true,
    );
    me.post(&[w]).unwrap();
    assert_eq!(me.wait(1)[0].status, WcStatus::WrFlushError);
}

/// Kills the helper while this side has receives posted: they complete with RetryExceeded.
#[test]
fn killed_initiator_fails_posted_receives() {
    let p = provider();
    let mut me = Side::new(&p);
    let buf = Region::new(4096);
    let mb = me.reg(&buf);
    let mut h = helper("victim", 4096, &mut me, &buf, &mb);
    wait_line(&mut h, "READY");
    for i in 0..5 {
        me.recv(i);
    }
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    let c = me.wait(5);
    assert!(
        c.iter().all(|c| c.status == WcStatus::RetryExceeded),
        "{c:?}"
    );
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
}

#[test]
fn probe_reports_available_here() {
    // The CI and development machines allow same-user cross-memory attach.
    ibnet_soft::probe().unwrap();
}
