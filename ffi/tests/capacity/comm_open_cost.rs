//! Opening comms up to `maxComms` through the plugin (issue 30), a process of its own (its
//! environment and RSS are its alone):
//!
//! * `advertised_comms_open_and_the_next_is_refused`: with a small soft memory budget, the
//!   advertised `maxComms` open as connect/accept pairs, the next `connect` fails with one
//!   WARN naming the budget and the peer, and a closed pair's share is back; when the
//!   accepting side is the one past the budget, `accept` fails with one WARN naming it.
//! * `open_cost_table` (ignored: a measurement, not a check): the time and RSS to open one more
//!   pair at 1, 16 and 128 QPs per connection with 1, 512 and 2,040 comms already open (a
//!   budget large enough for them; the last 8 of the 2,048 a soft device holds). Each
//!   row runs in a child process (`open_cost_row`, its own plugin and environment):
//!   `cargo test -p ibnet-ffi --release --test capacity -- --ignored --nocapture open_cost_table`
//! * `xproc_row` (ignored, with `IBNET_XPROC_QPS=N`): the same between two processes at the
//!   default budget: the advertised `maxComms` pairs open, timed, and the next is refused
//!   (the child, `xproc_child`, connects; one WARN there).

use crate::util;

use core::ffi::c_void;
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;

/// The bytes one comm of `nqps` QPs holds of the soft budget (no flush QP: soft has no
/// GPU-direct).
fn comm_bytes(nqps: u64) -> u64 {
    nqps * ibnet_soft::budget::qp_bytes(512, 256)
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Opens one connect/accept pair (two comms) on a listen comm of its own, closed after.
fn pair() -> (*mut c_void, *mut c_void) {
    let (mut h, l) = util::listen();
    let (s, r, _) = util::establish(&mut h, l, Duration::from_secs(60));
    assert_eq!(api::close_listen(l), ncclResult_t::Success);
    (s, r)
}

fn close_pair((s, r): (*mut c_void, *mut c_void)) {
    assert_eq!(api::close_send(s), ncclResult_t::Success);
    assert_eq!(api::close_recv(r), ncclResult_t::Success);
}

/// A budget of exactly 8 comms at 16 QPs (no bounce slots): `maxComms` is 8, four pairs
/// open, the fifth `connect` fails at once with one WARN that names `IBNET_SOFT_MEM` and the
/// listener's address; after a pair is closed another opens.
#[test]
fn advertised_comms_open_and_the_next_is_refused() {
    if util::ran_in_child() {
        return;
    }
    let mem = (8 * comm_bytes(16) + 4096).to_string();
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_IB_QPS_PER_CONNECTION", "16"),
        ("IBNET_SOFT_BOUNCE_MAX", "0"),
        ("IBNET_SOFT_MEM", mem.as_str()),
    ];
    if !util::init_soft(&env) {
        return;
    }
    let n = api::properties(0).unwrap().max_comms;
    assert_eq!(n, 8, "maxComms at 16 QPs in a budget of 8 such comms");
    let mut open: Vec<_> = (0..n / 2).map(|_| pair()).collect();
    util::take_log();

    let (mut h, l) = util::listen();
    let t0 = Instant::now();
    let rc = loop {
        let (rc, s) = util::connect_once(&mut h);
        if rc != ncclResult_t::Success || !s.is_null() {
            break rc;
        }
        // The refusal comes once the TCP connect is done (the comm is made then).
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "connect neither failed nor connected"
        );
        let (rc, r) = util::accept_once(l);
        assert_eq!(rc, ncclResult_t::Success);
        assert!(r.is_null(), "accepted a comm past maxComms");
    };
    assert_ne!(rc, ncclResult_t::Success);
    let warns: Vec<String> = util::take_log()
        .into_iter()
        .filter(|(lv, _)| *lv == Level::Warn)
        .map(|(_, s)| s)
        .collect();
    assert_eq!(warns.len(), 1, "one WARN: {warns:?}");
    let w = &warns[0];
    assert!(w.contains("IBNET_SOFT_MEM"), "names the limit: {w}");
    assert!(
        w.contains(&util::addr(&h).to_string()),
        "names the peer: {w}"
    );
    assert_eq!(api::close_listen(l), ncclResult_t::Success);

    close_pair(open.pop().unwrap());
    open.push(pair());
    close_pair(open.pop().unwrap());
    accept_side_past_the_budget();
    open.push(pair());
    for p in open {
        close_pair(p);
    }
}

/// With 6 of the 8 comms open: two connects make comms 7 and 8 (each makes its comm once its
/// TCP connect is done, before any accept), so the accepting side is the one past the budget.
/// `accept` fails at once with one WARN naming the limit (a nonce holder this side can't make
/// a comm for is not junk: dropping it left `accept` waiting for ever), and the connectors
/// fail in turn; the budget is then back.
fn accept_side_past_the_budget() {
    let (mut ha, la) = util::listen();
    let (mut hb, lb) = util::listen();
    let t0 = Instant::now();
    // Both connectors past their TCP connect and their first flight sent (comms made).
    while t0.elapsed() < Duration::from_secs(1) {
        for h in [&mut ha, &mut hb] {
            let (rc, s) = util::connect_once(h);
            assert_eq!((rc, s.is_null()), (ncclResult_t::Success, true));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    util::take_log();
    let t0 = Instant::now();
    let rc = loop {
        let (rc, r) = util::accept_once(la);
        if rc != ncclResult_t::Success {
            break rc;
        }
        assert!(r.is_null(), "accepted a comm past maxComms");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "accept neither failed nor accepted past the budget"
        );
        let _ = util::connect_once(&mut ha);
    };
    assert_ne!(rc, ncclResult_t::Success);
    let warns: Vec<String> = util::take_log()
        .into_iter()
        .filter(|(lv, _)| *lv == Level::Warn)
        .map(|(_, s)| s)
        .collect();
    assert_eq!(warns.len(), 1, "one WARN: {warns:?}");
    assert!(
        warns[0].contains("accept") && warns[0].contains("IBNET_SOFT_MEM"),
        "names accept and the limit: {}",
        warns[0]
    );
    // The connectors fail (their peer closed them), which frees comms 7 and 8.
    assert_eq!(api::close_listen(la), ncclResult_t::Success);
    assert_eq!(api::close_listen(lb), ncclResult_t::Success);
    for h in [&mut ha, &mut hb] {
        let t0 = Instant::now();
        loop {
            let (rc, s) = util::connect_once(h);
            assert!(s.is_null(), "a connect past the budget connected");
            if rc != ncclResult_t::Success {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "a connector whose listener closed never failed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    util::take_log();
}

/// One row of the table (a child of `open_cost_table`; does nothing without its variables):
/// `IBNET_COST_QPS` QPs per connection, pairs opened until 1 (2: one pair), 512 and 2,040
/// comms are open, then 4 more pairs timed at each of those points. Prints `ROW qps comms ms_per_comm
/// rss_kib kib_per_comm`.
#[test]
#[ignore]
fn open_cost_row() {
    let Some(q) = std::env::var("IBNET_COST_QPS").ok() else {
        return;
    };
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_IB_QPS_PER_CONNECTION", q.as_str()),
        // Large enough for 2,048 comms at any QP count: this measures the cost, not the limit.
        ("IBNET_SOFT_MEM", "0x100000000000"),
    ];
    if !util::init_soft(&env) {
        return;
    }
    let mut open = Vec::new();
    let rss0 = rss_kib();
    // 2,040: its 8 timed comms are the last of the 2,048 a device holds.
    for at in [1usize, 512, 2040] {
        // Open pairs until `at` comms are open (1: one pair is the smallest step, 2 comms).
        while open.len() * 2 < at.max(2) {
            open.push(pair());
        }
        let probe = 4;
        let (r0, t0) = (rss_kib(), Instant::now());
        for _ in 0..probe {
            open.push(pair());
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / (2 * probe) as f64;
        let r1 = rss_kib();
        // The process's mappings (each QP's queues are mappings of their own; the kernel merges
        // neighbours, and `vm.max_map_count` is 65530 by default).
        let maps = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
        println!(
            "ROW {q} {at} {ms:.3} {r1} {:.1} {:.1} {maps}",
            (r1.saturating_sub(r0)) as f64 / (2 * probe) as f64,
            (r1.saturating_sub(rss0)) as f64 / (2 * open.len()) as f64
        );
        for p in open.drain(open.len() - probe..) {
            close_pair(p);
        }
    }
    let t0 = Instant::now();
    let n = open.len() * 2;
    for p in open {
        close_pair(p);
    }
    println!(
        "CLOSE {q} {n} {:.3}",
        t0.elapsed().as_secs_f64() * 1e3 / n as f64
    );
}

/// Runs `open_cost_row` at 1, 16 and 128 QPs per connection, each in a child process, and
/// prints their rows as a table; then `xproc_row` at each.
#[test]
#[ignore]
fn open_cost_table() {
    let exe = std::env::current_exe().unwrap();
    let row = util::test_path(module_path!(), "open_cost_row");
    println!("qps  comms open  ms/comm  RSS (MiB)  KiB/comm (last 8)  KiB/comm (avg)  mappings");
    for q in [1, 16, 128] {
        let out = std::process::Command::new(&exe)
            .args(["--ignored", "--exact", row.as_str(), "--nocapture"])
            .env("IBNET_COST_QPS", q.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "row {q}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for l in text.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["ROW", q, at, ms, rss, last, avg, maps] => {
                    let mib = rss.parse::<f64>().unwrap_or(0.0) / 1024.0;
                    println!(
                        "{q:>3}  {at:>10}  {ms:>7}  {mib:>9.0}  {last:>17}  {avg:>14}  {maps:>8}"
                    )
                }
                ["CLOSE", q, n, ms] => println!("{q:>3}  closing {n} comms: {ms} ms/comm"),
                _ => {}
            }
        }
    }
    let row = util::test_path(module_path!(), "xproc_row");
    println!("two processes, default budget: qps  maxComms  s(all)  ms(1st)  ms(512th)  ms(2048th)  RSS KiB  child RSS KiB");
    for q in [1, 16, 128] {
        let out = std::process::Command::new(&exe)
            .args(["--ignored", "--exact", row.as_str(), "--nocapture"])
            .env("IBNET_XPROC_QPS", q.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "xproc {q}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for l in text
            .lines()
            .filter(|l| l.starts_with("XPROC") || l.starts_with("CHILD"))
        {
            println!("{l}");
        }
    }
}

/// The hex form of a listen handle (a line between the two processes of `xproc_row`).
fn hex(h: &util::Handle) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// The child of `xproc_row` (does nothing without `IBNET_XPROC_QPS`): reads listen handles
/// from stdin, one a line, connects to each until it has a send comm (`OK`) or `connect`
/// fails (`REFUSED rc`, then it stops); keeps its comms open; at EOF prints `RSS kib` and
/// its WARN lines.
#[test]
#[ignore]
fn xproc_child() {
    use std::io::{BufRead, Write};
    let Some(q) = std::env::var("IBNET_XPROC_QPS").ok() else {
        return;
    };
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_IB_QPS_PER_CONNECTION", q.as_str()),
    ];
    if !util::init_soft(&env) {
        return;
    }
    let mut out = std::io::stdout();
    let mut comms = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let mut h = [0u8; 128];
        for (i, b) in h.iter_mut().enumerate() {
            *b = u8::from_str_radix(&line[2 * i..2 * i + 2], 16).unwrap();
        }
        let t0 = Instant::now();
        let rc = loop {
            let (rc, s) = util::connect_once(&mut h);
            if rc != ncclResult_t::Success {
                break rc;
            }
            if !s.is_null() {
                comms.push(s);
                break rc;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "connect hangs");
        };
        if rc == ncclResult_t::Success {
            writeln!(out, "OK").unwrap();
        } else {
            writeln!(out, "REFUSED {rc:?}").unwrap();
        }
        out.flush().unwrap();
    }
    writeln!(out, "RSS {}", rss_kib()).unwrap();
    for (lv, s) in util::take_log() {
        if lv == Level::Warn {
            writeln!(out, "WARN {s}").unwrap();
        }
    }
    for s in comms {
        assert_eq!(api::close_send(s), ncclResult_t::Success);
    }
}

/// Between two processes, at `IBNET_XPROC_QPS` QPs per connection and the default budget:
/// opens `maxComms` pairs (each process then holds `maxComms` comms: receive comms here, send
/// comms in the child), timing each, then one more, which the child's `connect` must refuse.
/// Prints `XPROC qps maxComms seconds ms(first) ms(512th) ms(2048th) rss_kib child_rss_kib`
/// and the child's WARN lines.
#[test]
#[ignore]
fn xproc_row() {
    use std::io::{BufRead, BufReader, Write};
    let Some(q) = std::env::var("IBNET_XPROC_QPS").ok() else {
        return;
    };
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_IB_QPS_PER_CONNECTION", q.as_str()),
    ];
    if !util::init_soft(&env) {
        return;
    }
    let n = api::properties(0).unwrap().max_comms as usize;
    let role = util::test_path(module_path!(), "xproc_child");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", role.as_str(), "--nocapture", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let from = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        // Only the child's own lines (not the test harness's).
        let ours = |l: &String| {
            ["OK", "REFUSED", "RSS ", "WARN "]
                .iter()
                .any(|p| l.starts_with(p))
        };
        for l in from.lines().map_while(Result::ok).filter(ours) {
            let _ = tx.send(l);
        }
    });
    let mut recvs = Vec::new();
    let mut ms = Vec::new();
    let start = Instant::now();
    let refused = loop {
        let (h, l) = util::listen();
        writeln!(to, "{}", hex(&h)).unwrap();
        to.flush().unwrap();
        let t0 = Instant::now();
        let verdict = loop {
            let (rc, r) = util::accept_once(l);
            assert_eq!(rc, ncclResult_t::Success);
            if !r.is_null() {
                recvs.push(r);
            }
            if let Ok(v) = rx.try_recv() {
                if v.starts_with("REFUSED") || !r.is_null() {
                    break v;
                }
                // The child's OK before this side's accept returned: wait for the comm.
                while recvs.len() < ms.len() + 1 {
                    let (rc, r) = util::accept_once(l);
                    assert_eq!(rc, ncclResult_t::Success);
                    if !r.is_null() {
                        recvs.push(r);
                    }
                    assert!(t0.elapsed() < Duration::from_secs(60), "accept hangs");
                }
                break v;
            }
            if !r.is_null() {
                let v = rx
                    .recv_timeout(Duration::from_secs(60))
                    .expect("child answers");
                break v;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "pair {} hangs",
                ms.len()
            );
        };
        assert_eq!(api::close_listen(l), ncclResult_t::Success);
        if verdict.starts_with("REFUSED") {
            break Some(ms.len());
        }
        assert_eq!(verdict, "OK");
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if ms.len() > n + 1 {
            break None;
        }
    };
    let secs = start.elapsed().as_secs_f64();
    drop(to);
    let mut child_rss = String::new();
    let mut warns = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(60)) {
        if let Some(r) = l.strip_prefix("RSS ") {
            child_rss = r.to_string();
        } else if let Some(w) = l.strip_prefix("WARN ") {
            warns.push(w.to_string());
        }
    }
    assert!(child.wait().unwrap().success());
    let at = |i: usize| ms.get(i).map_or("-".to_string(), |m| format!("{m:.2}"));
    println!(
        "XPROC {q} {n} {secs:.2} {} {} {} {} {child_rss}",
        at(0),
        at(511),
        at(2047),
        rss_kib()
    );
    for w in &warns {
        println!("CHILD WARN {w}");
    }
    assert_eq!(
        refused,
        Some(n),
        "the advertised {n} open, the next is refused"
    );
    assert_eq!(warns.len(), 1, "one WARN: {warns:?}");
    for r in recvs {
        assert_eq!(api::close_recv(r), ncclResult_t::Success);
    }
}
