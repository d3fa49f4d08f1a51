//! The proxy engine end to end with a simulated GPU, SIMPLE protocol over dedicated buffers:
//! 1,000 operations of 1..12 steps each, every byte verified on the receiving "GPU", every
//! resource released at the end.

mod proxy_common;

use ibnet_core::proxy::Protocol;
use proxy_common::{run, Scenario};

#[test]
fn simple_dedicated_one_sub() {
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
        ..Scenario::simple()
    });
    assert_eq!(r.ops, 1000);
    assert_eq!(r.groups_max, 1, "dedicated connections do not share comms");
    assert_eq!(Protocol::Simple.index(), 2);
}
