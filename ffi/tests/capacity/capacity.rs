//! Capacity matches what is advertised (issue 13): `maxComms` comms fit for any
//! `NCCL_IB_QPS_PER_CONNECTION` (soft provider), and where the provider's QP memory budget
//! (`IBNET_SOFT_MEM`) is what bounds `maxComms`, the comm after them is refused (issue 30).
//! (The MR cache and open/close cycles: `plugin/open_close.rs`, a process of its own so that RSS is
//! this test's alone; the cost of opening comms: `comm_open_cost.rs`.)

use crate::util;

use ibnet_core::comm::CommConfig;
use ibnet_core::params::Params;
use ibnet_core::provider::LinkLayer;
use nccl_net_ibnet::dev::{AnySend, Dev};

fn soft() -> Option<ibnet_soft::SoftProvider> {
    if let Err(u) = ibnet_soft::probe_with(false) {
        eprintln!("SKIP: soft provider unavailable ({u:?})");
        return None;
    }
    // A budget large enough for 2,048 comms at 128 QPs (23 GB, a large host's): the same
    // test on every host, at its largest.
    let big = ibnet_soft::Config {
        mem: 64 << 30,
        ..ibnet_soft::Config::default()
    };
    Some(ibnet_soft::SoftProvider::open_with(big).unwrap())
}

fn cfg(nqps: u8, flush: bool) -> CommConfig {
    let p = Params {
        ib_qps_per_connection: nqps,
        ..Params::default()
    };
    CommConfig::from_params(&p, LinkLayer::Ethernet, None, flush)
}

/// `maxComms` send comms open at once for every QPs-per-connection setting, and not one more
/// (the budget is the soft provider's real QP table, capped at `MAX_COMMS`, the provider's CQ
/// cap; the memory budget is one large enough for all of them, as on a large host). Idle QPs
/// commit no queue memory: 2,048 comms of 128 QPs stay under 1 GB of RSS.
#[test]
fn max_comms_fit_for_any_qps_per_connection() {
    if util::ran_in_child() {
        return;
    }
    let Some(_probe) = soft() else { return };
    for (nqps, flush) in [(1, false), (2, false), (3, true), (16, false), (128, false)] {
        let Some(sp) = soft() else { return };
        let d = Dev::Soft(sp.clone(), 0);
        let c = cfg(nqps, flush);
        let n = d.max_comms(&c);
        assert!(n >= 1);
        let comms: Vec<AnySend> = (0..n)
            .map(|i| {
                AnySend::new(std::slice::from_ref(&d), c)
                    .unwrap_or_else(|e| panic!("nqps {nqps}: comm {i} of {n} advertised: {e}"))
            })
            .collect();
        match AnySend::new(std::slice::from_ref(&d), c) {
            Err(ibnet_core::Error::Full { .. }) => {}
            Err(e) => panic!("nqps {nqps}: comm {n} + 1: wrong error {e}"),
            Ok(_) => panic!("nqps {nqps}: comm {n} + 1 opened past maxComms"),
        }
        for s in comms {
            s.close().unwrap();
        }
        eprintln!("NCCL_IB_QPS_PER_CONNECTION={nqps} flush={flush}: maxComms {n}, all opened");
        sp.shutdown();
    }
}

/// With a small memory budget (64 MiB, no bounce slots), `maxComms` is what fits in it: that
/// many comms open, the next one fails with the budget's `Full` error (naming
/// `IBNET_SOFT_MEM`), and once a comm is closed its share is back and one more opens.
#[test]
fn past_the_memory_budget_the_next_comm_is_refused() {
    if util::ran_in_child() {
        return;
    }
    let Some(_probe) = soft() else { return };
    const MEM: u64 = 64 << 20;
    for nqps in [1, 16, 128] {
        let sp = ibnet_soft::SoftProvider::open_with(ibnet_soft::Config {
            mem: MEM,
            bounce_max: 0,
            ..ibnet_soft::Config::default()
        })
        .unwrap();
        let d = Dev::Soft(sp.clone(), 0);
        let c = cfg(nqps, false);
        let n = d.max_comms(&c);
        let by_mem = MEM / d.comm_bytes(&c);
        assert_eq!(
            n as u64,
            by_mem.min(2048),
            "nqps {nqps}: maxComms is the budget's"
        );
        let mut comms: Vec<AnySend> = (0..n)
            .map(|i| {
                AnySend::new(std::slice::from_ref(&d), c)
                    .unwrap_or_else(|e| panic!("nqps {nqps}: comm {i} of {n} advertised: {e}"))
            })
            .collect();
        match AnySend::new(std::slice::from_ref(&d), c) {
            Err(e @ ibnet_core::Error::Full { what, cap }) => {
                assert!(what.contains("IBNET_SOFT_MEM"), "{e}");
                assert_eq!(cap as u64, MEM);
            }
            Err(e) => panic!("nqps {nqps}: comm {n} + 1: wrong error {e}"),
            Ok(_) => panic!("nqps {nqps}: comm {n} + 1 opened past maxComms"),
        }
        comms.pop().unwrap().close().unwrap();
        comms.push(
            AnySend::new(std::slice::from_ref(&d), c).expect("a closed comm's budget is back"),
        );
        for s in comms {
            s.close().unwrap();
        }
        assert_eq!(sp.qp_memory().1, 0, "every QP gave its share back");
        eprintln!("NCCL_IB_QPS_PER_CONNECTION={nqps} IBNET_SOFT_MEM={MEM}: maxComms {n}");
        sp.shutdown();
    }
}
