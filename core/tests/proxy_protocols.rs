//! The proxy engine end to end with a simulated GPU: LL and LL128 (flag-checked readiness),
//! shared buffers (offsets through `connFifo`), grouped multi-receives over shared comms,
//! registered user buffers split on the network, GPU-direct with `iflush` and GDR-copy
//! credits/flush. Every scenario runs 1,000 operations with byte-for-byte verification.

mod proxy_common;

use ibnet_core::proxy::Protocol;
use proxy_common::{run, Scenario};

#[test]
fn ll_dedicated() {
    let r = run(Scenario {
        proto: Protocol::Ll,
        nsubs: 2,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
}

#[test]
fn ll128_dedicated_host_memory() {
    let r = run(Scenario {
        proto: Protocol::Ll128,
        nsubs: 2,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
}

#[test]
fn ll128_gpu_direct_trusts_tail() {
    let r = run(Scenario {
        proto: Protocol::Ll128,
        use_gdr: true,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
}

#[test]
fn simple_shared_buffers_grouped_one_to_eight() {
    for n in [1, 2, 3, 5, 8] {
        let r = run(Scenario {
            shared: true,
            nsubs: n,
            ops: 1000,
            max_slices: 3,
            ..Scenario::simple()
        });
        assert_eq!(r.ops, 1000);
        assert_eq!(
            r.groups_max, n,
            "{n} subs on one shared comm form one group"
        );
    }
}

#[test]
fn shared_buffers_group_limit_follows_max_recvs() {
    let r = run(Scenario {
        shared: true,
        nsubs: 6,
        max_recvs: 4,
        ops: 200,
        max_slices: 2,
        ..Scenario::simple()
    });
    assert_eq!(r.groups_max, 4);
}

#[test]
fn registered_buffers_split_on_the_network() {
    // 64 KiB network pieces: each op moves 1..=200 KiB in 1..=4 pieces.
    for n in [1, 3, 8] {
        let r = run(Scenario {
            shared: true,
            reg: true,
            nsubs: n,
            ops: 1000,
            reg_bytes: 200 << 10,
            max_net_size: 64 << 10,
            ..Scenario::simple()
        });
        assert_eq!(r.ops, 1000);
    }
}

#[test]
fn gpu_direct_receives_flush_with_iflush() {
    let r = run(Scenario {
        use_gdr: true,
        need_flush: true,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
    assert_eq!(r.flush_reads, 0);
}

#[test]
fn gdr_copy_credits_and_flush_read() {
    let r = run(Scenario {
        use_gdr: true,
        need_flush: true,
        gdc: true,
        gdc_flush: true,
        nsubs: 2,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
    assert!(
        r.flush_reads >= 1000,
        "one GDR-copy read per received SIMPLE step"
    );
}

#[test]
fn gdr_copy_with_shared_buffers() {
    let r = run(Scenario {
        shared: true,
        gdc: true,
        nsubs: 3,
        max_slices: 3,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
}
