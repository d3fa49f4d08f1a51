//! Fused comms over two real verbs devices: in the rxe VM, `rxe0` and `rxe1` (soft-RoCE on two
//! dummy netdevs; each rail's two ends share its device). Messages are striped over both rails
//! with every byte verified and traffic counted on each device; with `IBNET_FUSED_FAULT_CMD`
//! set, that command (e.g. `ip link set dummy1 down`) runs while messages are in flight and
//! the comm must carry on over the other rail, every byte verified, reporting the failover
//! detection time and the bytes written again (no more than one batch's rail-1 parts).
//!
//! Without two verbs devices named by `IBNET_FUSED_DEVS` (default `rxe0,rxe1`) the tests skip,
//! unless `IBNET_FUSED_REQUIRE=1` (the VM's fused cases set it).

use crate::util;

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibnet_core::comm::{CommConfig, Done};
use ibnet_core::fused::{stripe, FusedBuf, FusedRecv, FusedSend, MAX_DEVS_PER_NIC};
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::request::ReqId;
use ibnet_testkit::{fill_pattern, AlignedBuf};
use ibnet_verbs::device;
use ibnet_verbs::discovery::Discovery;
use ibnet_verbs::provider::VerbsPort;
use ibnet_verbs::qp::QpOpts;

/// The rails, or `None` (skip) when this host lacks them.
fn rails() -> Option<(Vec<VerbsPort>, CommConfig)> {
    let want = std::env::var("IBNET_FUSED_DEVS").unwrap_or_else(|_| "rxe0,rxe1".into());
    let require = std::env::var("IBNET_FUSED_REQUIRE").is_ok_and(|v| v == "1");
    let (params, _) = ibnet_nccl::env::load();
    let cfg = Discovery::from_params(&params);
    let found = device::discover(&cfg).unwrap_or_default();
    let qp = Arc::new(QpOpts {
        retry_all: params.ib_mqp_retry_all,
        retry_cnt: params.ib_mqp_retry_cnt,
        retry_sleep_ms: params.ib_mqp_retry_sleep_msec,
        ece: params.ib_ece_enable,
        fault_timeouts: AtomicU32::new(0),
    });
    let mut out = Vec::new();
    for name in want.split(',') {
        match found.iter().find(|d| d.name.to_str() == Ok(name)) {
            Some(d) => out.push(VerbsPort {
                gid: (d.gid_index, d.gid),
                dev: d.clone(),
                relaxed_ordering: cfg.relaxed_ordering != 0,
                fault_ro_einval: false,
                qp: qp.clone(),
            }),
            None if require => panic!("verbs device {name} not found (IBNET_FUSED_REQUIRE=1)"),
            None => {
                eprintln!("SKIP: no verbs device {name}");
                return None;
            }
        }
    }
    let link = out[0].port_info().link_layer;
    Some((out, CommConfig::from_params(&params, link, None, false)))
}

struct Pair {
    rails: Vec<VerbsPort>,
    s: Box<FusedSend<VerbsPort>>,
    r: Box<FusedRecv<VerbsPort>>,
}

fn pair(rails: Vec<VerbsPort>, cfg: CommConfig) -> Pair {
    let n = rails.len();
    let mut s = nccl_net_ibnet::boxed::send(&rails, cfg).expect("fused send");
    let infos: Vec<_> = (0..n).map(|i| s.local_info(i).unwrap()).collect();
    let r = nccl_net_ibnet::boxed::recv(&rails, cfg, &infos).expect("fused recv");
    for i in 0..n {
        s.connect(i, &r.local_info(i).unwrap()).expect("connect");
    }
    s.set_notice_ring(&r.notice_ring()).expect("ring");
    let mut r = r;
    r.set_back_ring(&s.back_ring()).expect("back ring");
    Pair { rails, s, r }
}

fn reg(rails: &[VerbsPort], b: &AlignedBuf) -> [MrKeys; MAX_DEVS_PER_NIC] {
    let mut k = [MrKeys::default(); MAX_DEVS_PER_NIC];
    for (i, d) in rails.iter().enumerate() {
        // Never deregistered: held until the process exits, as the buffers are.
        let mr = d
            .reg_mr(b.addr(), b.len() as u64, Access::ALL, RegKind::Plain)
            .expect("reg_mr");
        k[i] = d.mr_keys(&mr);
    }
    k
}

/// A device's packet counters (sent, received): rxe's `hw_counters`, else the port counters.
fn counters(dev: &str) -> (u64, u64) {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/1/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let sent = read("hw_counters/sent_pkts").or_else(|| read("counters/port_xmit_packets"));
    let rcvd = read("hw_counters/rcvd_pkts").or_else(|| read("counters/port_rcv_packets"));
    (sent.unwrap_or(0), rcvd.unwrap_or(0))
}

fn wait(what: &str, mut f: impl FnMut() -> ibnet_core::Result<Option<Done>>) -> Done {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(90) {
        if let Some(d) = f().unwrap_or_else(|e| panic!("{what}: {e}")) {
            return d;
        }
    }
    panic!("{what}: not done after 90 s");
}

fn post(p: &mut Pair, rb: &AlignedBuf, tag: u32) -> ReqId {
    let buf = FusedBuf {
        addr: rb.addr(),
        size: rb.len() as u64,
        tag,
        mrs: reg(&p.rails, rb),
    };
    p.r.irecv(&[buf]).expect("irecv").expect("posted")
}

/// Sends until the receive is posted on every live rail, driving the receive `rid` meanwhile
/// (as NCCL's proxy thread progresses both): a receiver that finds a rail failed tells the
/// sender, which then stops waiting for it.
fn send(p: &mut Pair, sb: &AlignedBuf, size: usize, tag: u32, rid: ReqId) -> ReqId {
    let k = reg(&p.rails, sb);
    let n = p.rails.len();
    let t0 = Instant::now();
    loop {
        if let Some(id) =
            p.s.isend(sb.addr(), size as u64, tag, &k[..n])
                .expect("isend")
        {
            return id;
        }
        assert!(p.r.test(rid).expect("recv test").is_none());
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "receive never posted"
        );
    }
}

#[test]
fn verbs_fused_two_rails_stripe_every_message() {
    if util::ran_in_child() {
        return;
    }
    let Some((rails, cfg)) = rails() else { return };
    let names: Vec<String> = rails
        .iter()
        .map(|r| r.dev.name.to_string_lossy().into_owned())
        .collect();
    let before: Vec<_> = names.iter().map(|n| counters(n)).collect();
    let mut p = pair(rails, cfg);
    for (i, size) in [0usize, 1, 4097, 1 << 20, (8 << 20) + 5]
        .into_iter()
        .enumerate()
    {
        let mut sb = AlignedBuf::new(size.max(1));
        fill_pattern(sb.as_mut_slice(), 7 + i as u64);
        let rb = AlignedBuf::new(size.max(1));
        let rid = post(&mut p, &rb, 5);
        let sid = send(&mut p, &sb, size, 5, rid);
        assert_eq!(wait("send", || p.s.test(sid)).sizes[0], size as u64);
        assert_eq!(wait("recv", || p.r.test(rid)).sizes[0], size as u64);
        assert_eq!(&rb.as_slice()[..size], &sb.as_slice()[..size], "{size} B");
        let parts = stripe(size as u64, names.len());
        println!(
            "fused {size} B: parts {:?}",
            parts[..names.len()]
                .iter()
                .map(|p| p.len)
                .collect::<Vec<_>>()
        );
    }
    for (n, b) in names.iter().zip(&before) {
        let a = counters(n);
        println!(
            "FUSED-COUNTERS {n}: sent_pkts +{} rcvd_pkts +{}",
            a.0 - b.0,
            a.1 - b.1
        );
        assert!(a.0 > b.0 && a.1 > b.1, "no traffic on {n}");
    }
    assert!(p.s.take_events().is_empty() && p.r.take_events().is_empty());
}

#[test]
fn verbs_fused_failover_keeps_every_byte() {
    if util::ran_in_child() {
        return;
    }
    let Ok(cmd) = std::env::var("IBNET_FUSED_FAULT_CMD") else {
        eprintln!("SKIP: IBNET_FUSED_FAULT_CMD not set");
        return;
    };
    let Some((rails, cfg)) = rails() else { return };
    let mut p = pair(rails, cfg);
    // Batches of `window` messages in flight at once; the fault hits batch `fault_batch` right
    // after its sends are posted.
    let (size, batches, window, fault_batch) = (4 << 20, 4, 4, 1);
    let mut fault_time: Option<Instant> = None;
    let mut detected: Option<Duration> = None;
    let mut in_flight_resent = 0;
    for b in 0..batches {
        let mut sbs = Vec::new();
        let mut rbs = Vec::new();
        let mut rids = Vec::new();
        for j in 0..window {
            let mut sb = AlignedBuf::new(size);
            fill_pattern(sb.as_mut_slice(), 100 + (b * window + j) as u64);
            let rb = AlignedBuf::new(size);
            rids.push(post(&mut p, &rb, 9));
            sbs.push(sb);
            rbs.push(rb);
        }
        let sids: Vec<ReqId> = (0..window)
            .map(|j| send(&mut p, &sbs[j], size, 9, rids[j]))
            .collect();
        let resent_before = p.s.resent_bytes();
        if b == fault_batch {
            println!("+ {cmd} ({window} messages of {size} B in flight)");
            let st = std::process::Command::new("sh")
                .args(["-c", &cmd])
                .status()
                .expect("run the fault command");
            assert!(st.success(), "{cmd}: {st}");
            fault_time = Some(Instant::now());
        }
        let (mut sd, mut rd) = (vec![None; window], vec![None; window]);
        let t0 = Instant::now();
        while sd.iter().chain(&rd).any(Option::is_none) {
            for j in 0..window {
                if sd[j].is_none() {
                    sd[j] =
                        p.s.test(sids[j])
                            .unwrap_or_else(|e| panic!("send {b}.{j}: {e}"));
                }
                if rd[j].is_none() {
                    rd[j] =
                        p.r.test(rids[j])
                            .unwrap_or_else(|e| panic!("recv {b}.{j}: {e}"));
                }
            }
            let at = fault_time.map(|t| t.elapsed()).unwrap_or_default();
            for ev in p.s.take_events() {
                println!(
                    "FUSED-RAIL-EVENT sender: rail {} failed ({}); its traffic goes to rail {:?}; {} ms after the fault",
                    ev.rail, ev.error, ev.to, at.as_millis()
                );
                detected.get_or_insert(at);
            }
            for ev in p.r.take_events() {
                println!(
                    "FUSED-RAIL-EVENT receiver: rail {} out of use ({}); {} ms after the fault",
                    ev.rail,
                    ev.error,
                    at.as_millis()
                );
                detected.get_or_insert(at);
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "batch {b} stuck");
        }
        for j in 0..window {
            assert_eq!(sd[j].unwrap().sizes[0], size as u64);
            assert_eq!(
                rd[j].unwrap().sizes[0],
                size as u64,
                "message {b}.{j} counted once"
            );
            assert!(
                rbs[j].as_slice() == sbs[j].as_slice(),
                "message {b}.{j}: bytes differ"
            );
        }
        if b == fault_batch {
            in_flight_resent = p.s.resent_bytes() - resent_before;
        }
    }
    let det = detected.expect("no rail failed after the fault command");
    println!(
        "FUSED-FAILOVER detect_ms={} resent_in_flight_bytes={in_flight_resent} \
         resent_bytes={} messages={} size={size} (every byte verified)",
        det.as_millis(),
        p.s.resent_bytes(),
        batches * window
    );
    // Only parts in flight on rail 1 when the sender learned of the failure go twice (none,
    // when they were acknowledged before the link went down); messages after it are striped
    // over rail 0 alone. A batch completes before the next is posted, so at most one batch's
    // rail-1 parts were in flight (before, every later message's rail-1 part went again too).
    let bound = window as u64 * stripe(size as u64, 2)[1].len;
    assert!(
        p.s.resent_bytes() <= bound,
        "{} B re-sent, more than one batch in flight ({bound} B)",
        p.s.resent_bytes()
    );
    assert!(!p.s.rail_live(1) && p.s.rail_live(0));
}
