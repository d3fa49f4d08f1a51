//! Capacity matches what is advertised (issue 13): `maxComms` comms fit for any
//! `NCCL_IB_QPS_PER_CONNECTION` (soft provider). (The MR cache and open/close cycles:
//! `open_close.rs`, a process of its own so that RSS is this test's alone.)

use ibnet_core::comm::CommConfig;
use ibnet_core::params::Params;
use ibnet_core::provider::LinkLayer;
use nccl_net_ibnet::dev::{AnySend, Dev};

fn soft() -> Option<ibnet_soft::SoftProvider> {
    if let Err(u) = ibnet_soft::probe_with(false) {
        eprintln!("SKIP: soft provider unavailable ({u:?})");
        return None;
    }
    Some(ibnet_soft::SoftProvider::open_with(ibnet_soft::Config::default()).unwrap())
}

fn cfg(nqps: u8, flush: bool) -> CommConfig {
    let p = Params {
        ib_qps_per_connection: nqps,
        ..Params::default()
    };
    CommConfig::from_params(&p, LinkLayer::Ethernet, None, flush)
}

/// `maxComms` send comms open at once for every QPs-per-connection setting, and not one more
/// (the budget is the soft provider's real QP table, capped at `MAX_COMMS`).
#[test]
fn max_comms_fit_for_any_qps_per_connection() {
    let Some(_probe) = soft() else { return };
    for (nqps, flush) in [(1, false), (2, false), (3, true), (16, false), (128, false)] {
        let Some(sp) = soft() else { return };
        let d = Dev::Soft(sp.clone(), 0);
        let c = cfg(nqps, flush);
        let n = d.max_comms(&c);
        assert!(n >= 1);
        let comms: Vec<AnySend> = (0..n)
            .map(|i| {
                d.new_send(c)
                    .unwrap_or_else(|e| panic!("nqps {nqps}: comm {i} of {n} advertised: {e}"))
            })
            .collect();
        for s in comms {
            s.close().unwrap();
        }
        eprintln!("NCCL_IB_QPS_PER_CONNECTION={nqps} flush={flush}: maxComms {n}, all opened");
        sp.shutdown();
    }
}
