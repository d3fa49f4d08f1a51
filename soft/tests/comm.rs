//! The core's comms (`SendComm`/`RecvComm`) over the soft provider: in-process (sender and
//! receiver on two threads) and two-process (this test binary re-executed as the peer, the
//! handshake's `QpInfo` carried over stdin/stdout with the core's wire encoding). Every payload
//! is verified byte for byte against a pattern both sides derive from the message number.

mod common;

use std::collections::VecDeque;
use std::io::BufReader;
use std::time::Instant;

use common::{
    fill_pattern, parse_qp_info, qp_info_line, read_line_with, recv_from_helper, reg, spawn_helper,
    write_line, Region, DEADLINE,
};
use ibnet_core::comm::{CommConfig, Done, RecvBuf, RecvComm, SendComm};
use ibnet_core::error::Error;
use ibnet_core::provider::{MrKeys, WcStatus};
use ibnet_core::request::ReqId;
use ibnet_soft::{SoftMr, SoftProvider};

type S = SendComm<SoftProvider>;
type R = RecvComm<SoftProvider>;

/// What both sides agree on: message `i` has `n` buffers with tags and sizes from `seed`.
#[derive(Clone, Copy, Debug)]
struct Plan {
    seed: u64,
    msgs: usize,
    max_bufs: usize,
    max_size: usize,
    /// Messages in flight.
    window: usize,
    /// Use `SIZES[i]` as the single buffer's size instead of random sizes.
    sweep: bool,
}

const SIZES: [usize; 12] = [
    0,
    1,
    7,
    128,
    4095,
    4096,
    65_537,
    300_000,
    1 << 20,
    (4 << 20) + 1,
    16 << 20,
    64 << 20,
];

impl Plan {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.seed, self.msgs, self.max_bufs, self.max_size, self.window, self.sweep
        )
    }
    fn decode(s: &str) -> Self {
        let f: Vec<&str> = s.split_whitespace().collect();
        Plan {
            seed: f[0].parse().unwrap(),
            msgs: f[1].parse().unwrap(),
            max_bufs: f[2].parse().unwrap(),
            max_size: f[3].parse().unwrap(),
            window: f[4].parse().unwrap(),
            sweep: f[5].parse().unwrap(),
        }
    }
    /// (tags, sizes) of message `i`.
    fn msg(&self, i: usize) -> (Vec<u32>, Vec<usize>) {
        if self.sweep {
            return (
                vec![i as u32],
                vec![SIZES[i % SIZES.len()].min(self.max_size)],
            );
        }
        let mut x = self.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let n = 1 + rnd(self.max_bufs as u64) as usize;
        let base = rnd(1 << 24) as u32;
        let tags = (0..n as u32).map(|j| base + j).collect();
        // Mostly small sizes, some zero, some up to the max.
        let sizes = (0..n)
            .map(|_| match rnd(8) {
                0 => 0,
                1 => rnd(self.max_size as u64 + 1) as usize,
                _ => rnd(self.max_size.min(512) as u64 + 1) as usize,
            })
            .collect();
        (tags, sizes)
    }
    fn seed_of(i: usize, j: usize) -> u64 {
        (i * 8 + j) as u64 + 1
    }
}

fn wait(
    what: &str,
    mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>,
) -> ibnet_core::Result<Done> {
    let t = Instant::now();
    loop {
        if let Some(d) = f()? {
            return Ok(d);
        }
        assert!(t.elapsed() < DEADLINE, "{what} never completed");
        std::hint::spin_loop();
    }
}

/// Buffer sets: `window` × `max_bufs` regions of `max_size` bytes, registered.
struct Bufs {
    regions: Vec<Region>,
    keys: Vec<MrKeys>,
    _mrs: Vec<SoftMr>,
    per: usize,
}

impl Bufs {
    fn new(p: &SoftProvider, plan: &Plan) -> Self {
        let per = plan.max_bufs;
        let regions: Vec<Region> = (0..plan.window * per)
            .map(|_| Region::new(plan.max_size.max(1)))
            .collect();
        let (mrs, keys) = regions.iter().map(|r| reg(p, r)).unzip();
        Self {
            regions,
            keys,
            _mrs: mrs,
            per,
        }
    }
    fn idx(&self, i: usize, j: usize, window: usize) -> usize {
        (i % window) * self.per + j
    }
}

/// The receiving side of `plan`: keeps `window` multi-receives posted, verifies each.
fn run_recv(p: &SoftProvider, r: &mut R, plan: &Plan) -> ibnet_core::Result<()> {
    let b = Bufs::new(p, plan);
    let mut inflight: VecDeque<(usize, ReqId)> = VecDeque::new();
    let mut next = 0;
    let mut done = 0;
    // A hang guard, not a speed limit: the clock restarts at every verified message.
    let mut t = Instant::now();
    while done < plan.msgs {
        while next < plan.msgs && inflight.len() < plan.window {
            let (tags, _) = plan.msg(next);
            let bufs: Vec<RecvBuf> = tags
                .iter()
                .enumerate()
                .map(|(j, &tag)| {
                    let k = b.idx(next, j, plan.window);
                    RecvBuf {
                        addr: b.regions[k].addr(),
                        size: plan.max_size as u64,
                        tag,
                        mr: b.keys[k],
                    }
                })
                .collect();
            let id = r.irecv(&bufs)?.expect("irecv always accepts");
            inflight.push_back((next, id));
            next += 1;
        }
        let (i, id) = *inflight.front().unwrap();
        if let Some(d) = r.test(id)? {
            inflight.pop_front();
            let (tags, sizes) = plan.msg(i);
            assert_eq!(d.n as usize, tags.len(), "msg {i}");
            let mut want = Vec::new();
            for (j, &n) in sizes.iter().enumerate() {
                // Bytes per receive, multi-receives too (the sizes FIFO).
                assert_eq!(d.sizes[j], n as u64, "msg {i} buf {j} size");
                want.resize(n, 0);
                fill_pattern(&mut want, Plan::seed_of(i, j));
                let k = b.idx(i, j, plan.window);
                assert!(
                    b.regions[k].bytes()[..n] == want[..],
                    "msg {i} buf {j}: {n} bytes differ"
                );
            }
            done += 1;
            t = Instant::now();
        }
        assert!(t.elapsed() < DEADLINE, "receiver stuck at message {done}");
    }
    Ok(())
}

/// The sending side of `plan`.
fn run_send(p: &SoftProvider, s: &mut S, plan: &Plan) -> ibnet_core::Result<()> {
    let mut b = Bufs::new(p, plan);
    let mut inflight: VecDeque<Vec<ReqId>> = VecDeque::new();
    // A hang guard, not a speed limit: the clock restarts at every accepted send.
    let mut t = Instant::now();
    for i in 0..plan.msgs {
        if inflight.len() == plan.window {
            for id in inflight.pop_front().unwrap() {
                wait("send", || s.test(id))?;
            }
        }
        let (tags, sizes) = plan.msg(i);
        let mut ids = Vec::new();
        // Send the buffers of a multi-receive in reverse order: matching is by tag.
        for j in (0..tags.len()).rev() {
            let k = b.idx(i, j, plan.window);
            fill_pattern(
                &mut b.regions[k].bytes_mut()[..sizes[j]],
                Plan::seed_of(i, j),
            );
            let (addr, key) = (b.regions[k].addr(), b.keys[k]);
            let id = loop {
                if let Some(id) = s.isend(addr, sizes[j] as u64, tags[j], key)? {
                    break id;
                }
                // While waiting for the receiver, retire finished sends.
                if let Some(front) = inflight.front_mut() {
                    if let Some(&id0) = front.first() {
                        if s.test(id0)?.is_some() {
                            front.remove(0);
                            if front.is_empty() {
                                inflight.pop_front();
                            }
                        }
                    }
                }
                assert!(t.elapsed() < DEADLINE, "sender stuck at message {i}");
            };
            t = Instant::now();
            ids.push(id);
        }
        inflight.push_back(ids);
    }
    for ids in inflight {
        for id in ids {
            wait("send", || s.test(id))?;
        }
    }
    Ok(())
}

fn provider() -> SoftProvider {
    common::provider()
}

fn in_process(plan: Plan, cfg: CommConfig) {
    let (ps, pr) = (provider(), provider());
    let mut s = S::new(ps.clone(), cfg).unwrap();
    let mut r = R::new(pr.clone(), cfg, &s.local_info()).unwrap();
    s.connect(&r.local_info()).unwrap();
    let t = std::thread::spawn(move || {
        run_recv(&pr, &mut r, &plan).unwrap();
        r.close().unwrap();
    });
    run_send(&ps, &mut s, &plan).unwrap();
    t.join().unwrap();
    s.close().unwrap();
}

#[test]
fn comm_in_process_sizes_0_to_64mib() {
    let plan = Plan {
        seed: 1,
        msgs: SIZES.len(),
        max_bufs: 1,
        max_size: 64 << 20,
        window: 2,
        sweep: true,
    };
    in_process(plan, CommConfig::default());
}

#[test]
fn comm_in_process_multi_receive_8_random_tags_and_sizes_two_qps_split() {
    let plan = Plan {
        seed: 7,
        msgs: 3000,
        max_bufs: 8,
        max_size: 256 << 10,
        window: 4,
        sweep: false,
    };
    in_process(
        plan,
        CommConfig {
            nqps: 2,
            split_data: true,
            ..CommConfig::default()
        },
    );
}

#[test]
fn comm_in_process_100k_small_messages() {
    let plan = Plan {
        seed: 3,
        msgs: 100_000,
        max_bufs: 1,
        max_size: 256,
        window: 8,
        sweep: false,
    };
    in_process(plan, CommConfig::default());
}

#[test]
fn comm_in_process_bad_rkey_is_a_remote_access_error() {
    let p = provider();
    let mut s = S::new(p.clone(), CommConfig::default()).unwrap();
    let mut r = R::new(p.clone(), CommConfig::default(), &s.local_info()).unwrap();
    s.connect(&r.local_info()).unwrap();
    let src = Region::new(4096);
    let dst = Region::new(4096);
    let (_ms, sk) = reg(&p, &src);
    let (_md, mut rk) = reg(&p, &dst);
    rk.rkey ^= 0x0001_0000; // stale generation
    r.irecv(&[RecvBuf {
        addr: dst.addr(),
        size: 4096,
        tag: 1,
        mr: rk,
    }])
    .unwrap()
    .unwrap();
    let id = loop {
        if let Some(id) = s.isend(src.addr(), 4096, 1, sk).unwrap() {
            break id;
        }
    };
    let e = wait("send", || s.test(id)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Completion {
                status: WcStatus::RemoteAccessError,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        s.isend(src.addr(), 1, 1, sk),
        Err(Error::Poisoned { .. })
    ));
    assert!(dst.bytes().iter().all(|&b| b == 0));
}

// ------------------------------------------------------------------ two processes

/// The peer process: `recv` runs the receiving side of the plan; `send-then-hang` sends the
/// plan's messages, says `SENT`, and sleeps until killed.
#[test]
#[ignore = "helper role: spawned by the two-process tests with IBNET_SOFT_ROLE"]
fn comm_helper_entry() {
    let Ok(role) = std::env::var("IBNET_SOFT_ROLE") else {
        return;
    };
    let plan = Plan::decode(&std::env::var("IBNET_SOFT_ARG").unwrap());
    let p = provider();
    let mut out = std::io::stdout();
    let mut inp = BufReader::new(std::io::stdin());
    let cfg = CommConfig::default();
    match role.as_str() {
        "recv" => {
            let si = read_line_with(&mut inp, parse_qp_info);
            let mut r = R::new(p.clone(), cfg, &si).unwrap();
            write_line(&mut out, &qp_info_line(&r.local_info()));
            run_recv(&p, &mut r, &plan).unwrap();
            write_line(&mut out, "DONE");
        }
        "send-then-hang" => {
            let mut s = S::new(p.clone(), cfg).unwrap();
            write_line(&mut out, &qp_info_line(&s.local_info()));
            let ri = read_line_with(&mut inp, parse_qp_info);
            s.connect(&ri).unwrap();
            run_send(&p, &mut s, &plan).unwrap();
            write_line(&mut out, "SENT");
            std::thread::sleep(std::time::Duration::from_secs(600));
        }
        r => panic!("unknown role {r}"),
    }
}

fn two_process(plan: Plan) {
    let p = provider();
    let mut child = spawn_helper("comm_helper_entry", "recv", &plan.encode());
    let mut cin = child.stdin.take().unwrap();
    let mut cout = BufReader::new(child.stdout.take().unwrap());
    let mut s = S::new(p.clone(), CommConfig::default()).unwrap();
    write_line(&mut cin, &qp_info_line(&s.local_info()));
    let ri = read_line_with(&mut cout, parse_qp_info);
    s.connect(&ri).unwrap();
    run_send(&p, &mut s, &plan).unwrap();
    read_line_with(&mut cout, |l| l.contains("DONE").then_some(()));
    assert!(child.wait().unwrap().success(), "receiver process failed");
}

#[test]
fn comm_two_process_sizes_0_to_64mib() {
    two_process(Plan {
        seed: 2,
        msgs: SIZES.len(),
        max_bufs: 1,
        max_size: 64 << 20,
        window: 2,
        sweep: true,
    });
}

#[test]
fn comm_two_process_multi_receive_random() {
    two_process(Plan {
        seed: 11,
        msgs: 2000,
        max_bufs: 8,
        max_size: 128 << 10,
        window: 4,
        sweep: false,
    });
}

#[test]
fn comm_two_process_100k_small_messages() {
    two_process(Plan {
        seed: 5,
        msgs: 100_000,
        max_bufs: 1,
        max_size: 128,
        window: 8,
        sweep: false,
    });
}

/// The sender process is killed while this side has receives posted: `test` reports a
/// completion error (RetryExceeded) instead of waiting forever.
#[test]
fn comm_two_process_killed_sender_fails_posted_receives() {
    let plan = Plan {
        seed: 9,
        msgs: 10,
        max_bufs: 1,
        max_size: 4096,
        window: 1,
        sweep: false,
    };
    let p = provider();
    let (mut peer, mut r) =
        recv_from_helper(&p, "comm_helper_entry", "send-then-hang", &plan.encode());
    run_recv(&p, &mut r, &plan).unwrap();
    read_line_with(&mut peer.cout, |l| l.contains("SENT").then_some(()));
    // One more receive that will never be matched, then the sender dies.
    let buf = Region::new(4096);
    let (_m, k) = reg(&p, &buf);
    let id = r
        .irecv(&[RecvBuf {
            addr: buf.addr(),
            size: 4096,
            tag: 1,
            mr: k,
        }])
        .unwrap()
        .unwrap();
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    let e = wait("recv", || r.test(id)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Completion {
                status: WcStatus::RetryExceeded,
                ..
            }
        ),
        "{e}"
    );
}
