//! Reliability of the soft provider when a peer dies or fails (issue 13): a dead peer's leases
//! never keep `dereg_mr` busy, and a remote access error moves the *target's* QP to the error
//! state too (as RC does), in one process and across two. The two-process tests re-execute this
//! binary as the peer (`helper_entry` with `IBNET_SOFT_ROLE`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, ChildStdout};

use common::*;
use ibnet_core::provider::{Completion, Provider, WcOpcode, WcStatus, WrOpcode};

/// Trials of the kill-then-deregister test.
const KILL_TRIALS: usize = 10;
/// Size of one write of the killed writer (large: a kill lands mid-copy).
const BIG: usize = 16 << 20;

/// The helper side; does nothing unless spawned with a role.
#[test]
#[ignore = "helper role: spawned by the two-process tests with IBNET_SOFT_ROLE"]
fn helper_entry() {
    let Ok(role) = std::env::var("IBNET_SOFT_ROLE") else {
        return;
    };
    let len: usize = std::env::var("IBNET_SOFT_ARG").unwrap().parse().unwrap();
    let p = provider();
    let mut me = Side::new(&p);
    let mut buf = Region::new(len);
    buf.fill(3);
    let mr = me.reg(&buf);
    let (addr, qpn) = me.info();
    let mine = Info {
        addr,
        qpn,
        buf: buf.addr(),
        rkey: me.key(&mr),
        len: len as u64,
    };
    let mut out = std::io::stdout();
    write_line(&mut out, &mine.to_line());
    let mut stdin = BufReader::new(std::io::stdin());
    let peer = read_info(&mut stdin);
    me.connect((peer.addr, peer.qpn)).unwrap();
    let lkey = me.key(&mr);
    let write = |id: u64, n: usize| {
        wr(
            id,
            WrOpcode::Write,
            buf.addr(),
            n as u32,
            lkey,
            peer.buf,
            peer.rkey,
            7,
            true,
        )
    };
    match role.as_str() {
        // Keeps 4 large writes in flight into the parent's buffer until killed.
        "writer" => {
            let mut posted = 0u64;
            let mut done = 0u64;
            let mut buf_c = [Completion::EMPTY; 16];
            loop {
                while posted - done < 4 {
                    me.post(&[write(posted, len)]).unwrap();
                    posted += 1;
                }
                let k = me.p.poll_cq(&mut me.cq, &mut buf_c).unwrap();
                if done == 0 && k > 0 {
                    write_line(&mut out, "WRITING");
                }
                done += k as u64;
            }
        }
        // Waits for GO, then writes with the parent's (by then stale) rkey; reports the status.
        "stale_writer" => {
            read_line_with(&mut stdin, |l| (l == "GO").then_some(()));
            me.post(&[write(1, 4096)]).unwrap();
            let c = me.wait(1);
            write_line(&mut out, &format!("STATUS {}", c[0].status as u32));
            read_line_with(&mut stdin, |l| (l == "QUIT").then_some(()));
        }
        // Waits for GO, then writes `mixed_sequence` (inline and copied writes) into the
        // parent's buffer; reports whether every WR succeeded.
        "mixed_writer" => {
            read_line_with(&mut stdin, |l| (l == "GO").then_some(()));
            let wrs: Vec<_> = mixed_sequence()
                .iter()
                .enumerate()
                .map(|(i, &(o, l, op))| {
                    let (sa, da) = (buf.addr() + o as u64, peer.buf + o as u64);
                    wr(
                        i as u64, op, sa, l as u32, lkey, da, peer.rkey, i as u32, true,
                    )
                })
                .collect();
            me.post(&wrs).unwrap();
            let c = me.wait(wrs.len());
            let ok = c.iter().all(|c| c.status == WcStatus::Success);
            write_line(&mut out, &format!("STATUS {ok}"));
            read_line_with(&mut stdin, |l| (l == "QUIT").then_some(()));
        }
        r => panic!("unknown role {r}"),
    }
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

/// Spawns a helper with `role` and a `len`-byte buffer and connects `me` to it; the helper gets
/// `dst`'s address and rkey as ours.
fn helper(role: &str, len: usize, me: &mut Side, dst: &Region, rkey: u32) -> Helper {
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
        buf: dst.addr(),
        rkey,
        len: dst.len() as u64,
    };
    write_line(&mut h.stdin, &mine.to_line());
    me.connect((info.addr, info.qpn)).unwrap();
    h
}

fn wait_line(h: &mut Helper, want: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(h.stdout.read_line(&mut l).unwrap() > 0, "helper exited");
        if let Some(i) = l.find(want) {
            return l[i..].trim().to_string();
        }
    }
}

/// The writer is killed while its large writes into our buffer are in flight (so it dies
/// holding a lease on our registration, most trials): deregistering the buffer succeeds,
/// every trial — the dead process's lease is void.
#[test]
fn dereg_after_the_writer_is_killed_mid_transfer_succeeds() {
    for trial in 0..KILL_TRIALS {
        let p = provider();
        let mut me = Side::new(&p);
        let dst = Region::new(BIG);
        let md = me.reg(&dst);
        let key = me.key(&md);
        let mut h = helper("writer", BIG, &mut me, &dst, key);
        for i in 0..64 {
            me.recv(i);
        }
        wait_line(&mut h, "WRITING");
        h.child.kill().unwrap();
        h.child.wait().unwrap();
        match p.dereg_mr(md) {
            Ok(()) => {}
            Err(e) => panic!("trial {trial}: dereg_mr after the writer died: {e}"),
        }
        drop(h);
    }
}

/// Target side of a remote access error in one process: the receiver deregisters its buffer,
/// the writer's WR fails with `RemoteAccessError`, and the receiver's posted receives complete
/// with `WrFlushError` (the target QP is in the error state, as with RC).
#[test]
fn remote_access_error_flushes_the_targets_receives_in_process() {
    let (pa, pb) = (provider(), provider());
    let (mut a, mut b) = pair(&pa, &pb);
    let src = Region::new(4096);
    let dst = Region::new(4096);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    let stale = b.key(&md);
    for i in 0..3 {
        b.recv(100 + i);
    }
    pb.dereg_mr(md).unwrap();
    let w = wr(
        1,
        WrOpcode::WriteWithImm,
        src.addr(),
        4096,
        a.key(&ms),
        dst.addr(),
        stale,
        9,
        true,
    );
    a.post(&[w]).unwrap();
    let ca = a.wait(1);
    assert_eq!(ca[0].status, WcStatus::RemoteAccessError, "{ca:?}");
    let cb = b.wait(3);
    assert!(
        cb.iter()
            .all(|c| c.status == WcStatus::WrFlushError && c.opcode == WcOpcode::RecvRdmaWithImm),
        "{cb:?}"
    );
    let ids: Vec<u64> = cb.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![100, 101, 102]);
    // The target QP stays in the error state: a later receive is flushed too.
    b.recv(200);
    assert_eq!(b.wait(1)[0].status, WcStatus::WrFlushError);
}

/// A target whose QP went to the error state on its own (a failed send of its own, here a bad
/// local key) flushes the receives nobody wrote to, and a write-with-immediate into one of them
/// afterwards fails at the initiator (`RetryExceeded`, as an RC responder in error sends no
/// acknowledgement): never acknowledged at the initiator and flushed at the target, which would
/// leave the two sides disagreeing on whether the message arrived. The one delivered before
/// the failure completes at both.
#[test]
fn a_target_in_the_error_state_never_acknowledges_a_receive_it_flushed() {
    let (pa, pb) = (provider(), provider());
    let (mut a, mut b) = pair(&pa, &pb);
    let src = Region::new(4096);
    let dst = Region::new(4096);
    let (ms, md) = (a.reg(&src), b.reg(&dst));
    let (lkey, rkey) = (a.key(&ms), b.key(&md));
    let imm = |id| {
        let w = WrOpcode::WriteWithImm;
        wr(
            id,
            w,
            src.addr(),
            4096,
            lkey,
            dst.addr(),
            rkey,
            id as u32,
            true,
        )
    };
    b.recv(100);
    b.recv(101);
    a.post(&[imm(1)]).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    // The target fails on its own: a send with a key it does not have.
    let bad = wr(
        7,
        WrOpcode::Write,
        dst.addr(),
        64,
        0xdead,
        src.addr(),
        lkey,
        0,
        true,
    );
    b.post(&[bad]).unwrap();
    let cb = b.wait(3);
    let st = |id| cb.iter().find(|c| c.wr_id == id).map(|c| c.status);
    assert_eq!(st(100), Some(WcStatus::Success), "delivered before: {cb:?}");
    assert_ne!(st(7), Some(WcStatus::Success), "the bad send fails: {cb:?}");
    assert_eq!(st(101), Some(WcStatus::WrFlushError), "flushed: {cb:?}");
    a.post(&[imm(2)]).unwrap();
    let ca = a.wait(1);
    assert_eq!(
        ca[0].status,
        WcStatus::RetryExceeded,
        "a write into a flushed receive is not acknowledged: {ca:?}"
    );
    assert!(
        b.drain_for(std::time::Duration::from_millis(50)).is_empty(),
        "nothing more at the target"
    );
}

/// The same across two processes: the helper writes with our stale rkey after we deregistered.
#[test]
fn remote_access_error_flushes_the_targets_receives_across_processes() {
    let p = provider();
    let mut me = Side::new(&p);
    let dst = Region::new(4096);
    let md = me.reg(&dst);
    let stale = me.key(&md);
    let mut h = helper("stale_writer", 4096, &mut me, &dst, stale);
    for i in 0..2 {
        me.recv(i);
    }
    p.dereg_mr(md).unwrap();
    write_line(&mut h.stdin, "GO");
    let status = wait_line(&mut h, "STATUS ");
    assert_eq!(
        status,
        format!("STATUS {}", WcStatus::RemoteAccessError as u32),
        "the writer's WR"
    );
    let c = me.wait(2);
    assert!(
        c.iter().all(|c| c.status == WcStatus::WrFlushError),
        "{c:?}"
    );
    write_line(&mut h.stdin, "QUIT");
    assert!(h.child.wait().unwrap().success(), "helper failed");
    let _ = h.info;
}

/// Inline (≤ 32 B WRITE_WITH_IMM, through the ring entry) and copied writes interleaved on one
/// QP across two processes: every receive arrives in WR order with its bytes, and those of
/// every earlier WR, in place.
#[test]
fn inline_and_copied_writes_interleave_in_order_across_processes() {
    let p = provider();
    let mut me = Side::new(&p);
    let span = mixed_span();
    let dst = Region::new(span);
    let md = me.reg(&dst);
    let key = me.key(&md);
    let mut h = helper("mixed_writer", span, &mut me, &dst, key);
    let seq = mixed_sequence();
    let imms: Vec<usize> = (0..seq.len())
        .filter(|&i| seq[i].2 == WrOpcode::WriteWithImm)
        .collect();
    for &i in &imms {
        me.recv(i as u64);
    }
    write_line(&mut h.stdin, "GO");
    let want = pattern(span, 3);
    let mut got = 0;
    while got < imms.len() {
        for c in me.wait(1) {
            let i = imms[got];
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            assert_eq!((c.wr_id, c.imm), (i as u64, i as u32), "order");
            assert_eq!(c.byte_len as usize, seq[i].1);
            for &(o, l, _) in seq.iter().take(i + 1) {
                assert_eq!(
                    &dst.bytes()[o..o + l],
                    &want[o..o + l],
                    "WR at {o} at receive {i}"
                );
            }
            got += 1;
        }
    }
    assert_eq!(
        wait_line(&mut h, "STATUS "),
        "STATUS true",
        "the writer's WRs"
    );
    write_line(&mut h.stdin, "QUIT");
    assert!(h.child.wait().unwrap().success(), "helper failed");
}
