//! Capacity: one provider holds every QP the plugin may create for the comms it advertises
//! (`maxComms` 1024 send and 1024 receive comms, each with up to 128 QPs and a flush QP), and
//! one CQ per comm, not one more.

use ibnet_core::provider::{Access, Provider, QpAttr};
use ibnet_core::Error;
use ibnet_soft::{Config, SoftProvider, MAX_QPS};

/// The plugin's `maxComms` for soft0, counted once for send and once for receive comms.
const COMMS: usize = 2 * 1024;
/// QPs of one comm at `NCCL_IB_QPS_PER_CONNECTION=128`, plus the flush QP.
const QPS_PER_COMM: usize = 128 + 1;

#[test]
fn holds_every_qp_of_the_advertised_comms_at_128_qps_per_connection() {
    const { assert!(MAX_QPS >= COMMS * QPS_PER_COMM) };
    // A memory budget no host has: this test is about the QP table (idle QPs commit no
    // queue memory; the budget's own test is ffi's `capacity.rs`).
    let p = SoftProvider::open_with(Config {
        workers: 0,
        mem: 1 << 50,
        ..Config::default()
    })
    .unwrap();
    let attr = QpAttr {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_inline: 0,
        access: Access::ALL,
    };
    // One CQ per comm, as the core creates them.
    let mut comms = Vec::with_capacity(COMMS);
    for c in 0..COMMS {
        let cq = p.create_cq(4).unwrap();
        let qps: Vec<_> = (0..QPS_PER_COMM)
            .map(|q| {
                p.create_qp(&cq, &attr)
                    .unwrap_or_else(|e| panic!("comm {c}, QP {q}: {e}"))
            })
            .collect();
        comms.push((cq, qps));
    }
    let numbers: std::collections::HashSet<u32> = comms
        .iter()
        .flat_map(|(_, qps)| qps.iter().map(|q| p.qp_num(q)))
        .collect();
    assert_eq!(numbers.len(), COMMS * QPS_PER_COMM, "QP numbers are unique");
    assert!(
        numbers.iter().all(|&n| n >> 24 == 0),
        "QP numbers fit 24 bits"
    );
    // As many CQs as comms: the next one is refused (the cap of the plugin's maxComms).
    match p.create_cq(4) {
        Err(Error::Full { cap, what }) => {
            assert_eq!(cap, COMMS, "{what}");
        }
        r => panic!("expected Full, got {:?}", r.map(|_| ())),
    }
    // The table is full at exactly MAX_QPS, with a clean error (the extra QPs on a comm's CQ).
    let cq = &comms[0].0;
    let extra: Vec<_> = (COMMS * QPS_PER_COMM..MAX_QPS)
        .map(|_| p.create_qp(cq, &attr).unwrap())
        .collect();
    match p.create_qp(cq, &attr) {
        Err(Error::Full { cap, .. }) => assert_eq!(cap, MAX_QPS),
        r => panic!("expected Full, got {:?}", r.map(|_| ())),
    }
    drop(extra);
    // A freed slot is reusable.
    let q = comms[0].1.pop().unwrap();
    p.destroy_qp(q).unwrap();
    let again = p.create_qp(&comms[0].0, &attr).unwrap();
    comms[0].1.push(again);
    for (cq, qps) in comms {
        for q in qps {
            p.destroy_qp(q).unwrap();
        }
        p.destroy_cq(cq).unwrap();
    }
}
