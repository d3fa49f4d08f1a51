//! The proxy engine end to end over the soft provider (in-process fabric: copies through
//! leased registrations, completions polled from its CQs), with a simulated GPU on each side:
//! SIMPLE, LL and LL128; dedicated and shared buffers; 1–8 sub-operations grouped into one
//! multi-receive; registered user buffers split on the network; GPU-direct flushes. Every byte
//! is verified on the receiving "GPU". One 1,000-operation run per protocol; the other
//! scenarios run fewer operations to keep CI time modest.

mod proxy_soft;

use ibnet_core::proxy::Protocol;
use proxy_soft::common::Scenario;
use proxy_soft::run;

#[test]
fn simple_dedicated_1000_ops() {
    let r = run(Scenario::simple());
    assert_eq!(r.ops, 1000);
    assert!(r.bytes_verified > 1000 * 4096);
}

#[test]
fn simple_dedicated_four_subs_slice_two_chunk_four() {
    let r = run(Scenario {
        nsubs: 4,
        slice: 2,
        chunk: 4,
        max_slices: 4,
        ops: 300,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 300);
    assert_eq!(r.groups_max, 1, "dedicated connections do not share comms");
}

#[test]
fn ll_dedicated_1000_ops() {
    let r = run(Scenario {
        proto: Protocol::Ll,
        nsubs: 2,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
}

#[test]
fn ll128_dedicated_host_memory_1000_ops() {
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
        ops: 300,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 300);
}

#[test]
fn simple_shared_buffers_grouped_one_to_eight() {
    for (n, ops) in [(1, 200), (2, 200), (3, 200), (5, 200), (8, 1000)] {
        let r = run(Scenario {
            shared: true,
            nsubs: n,
            ops,
            max_slices: 3,
            ..Scenario::simple()
        });
        assert_eq!(r.ops, ops);
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
    for (n, ops) in [(1, 1000), (3, 200), (8, 200)] {
        let r = run(Scenario {
            shared: true,
            reg: true,
            nsubs: n,
            ops,
            reg_bytes: 200 << 10,
            max_net_size: 64 << 10,
            ..Scenario::simple()
        });
        assert_eq!(r.ops, ops);
    }
}

#[test]
fn registered_buffers_large_pieces_through_the_copy_engine() {
    // 1 MiB pieces of up to 3 MiB: copies above the soft provider's direct limit run on its
    // copy-engine workers, completing asynchronously.
    let r = run(Scenario {
        shared: true,
        reg: true,
        nsubs: 2,
        ops: 50,
        reg_bytes: 3 << 20,
        max_net_size: 1 << 20,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 50);
}

#[test]
fn gpu_direct_receives_flush_with_iflush() {
    let r = run(Scenario {
        use_gdr: true,
        need_flush: true,
        ops: 300,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 300);
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
        ops: 300,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 300);
    assert!(
        r.flush_reads >= 300,
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
        ops: 300,
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 300);
}
