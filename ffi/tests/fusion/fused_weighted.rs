//! Weighted striping through the plugin (issue 28, point 4): a virtual NIC of a 100 Gb/s and
//! a 25 Gb/s soft device (`SoftProvider::set_speed_mbps`) reports their summed speed, and its
//! comm carries each message 4:1 over the two rails (the speeds travel in the handshake's rail
//! lists, so both ends cut alike), every byte verified.

use crate::util;

use core::ffi::c_int;
use std::time::Duration;

use ibnet_nccl::types::{ncclNetVDeviceProps_t, ncclResult_t};
use nccl_net_ibnet::api;
use nccl_net_ibnet::dev::Dev;
use util::*;

/// Makes soft device `dev` report `mbps`.
fn set_speed(dev: usize, mbps: u32) {
    let p = nccl_net_ibnet::plugin::current().expect("plugin initialised");
    match &p.devs[dev] {
        Dev::Soft(s, _) => s.set_speed_mbps(mbps),
        _ => panic!("device {dev} is not a soft device"),
    }
}

#[test]
fn a_fast_and_a_slow_rail_carry_bytes_in_proportion_to_their_speeds() {
    if util::ran_in_child() {
        return;
    }
    if !init_soft(&[("NCCL_SOCKET_IFNAME", "lo"), ("IBNET_SOFT_DEVICES", "2")]) {
        return;
    }
    set_speed(0, 100_000);
    set_speed(1, 25_000);
    let mut d: c_int = -1;
    let p = ncclNetVDeviceProps_t {
        ndevs: 2,
        devs: [0, 1, 0, 0],
    };
    assert_eq!(api::make_vdevice(&mut d, &p), ncclResult_t::Success);
    assert_eq!(
        api::properties(d).unwrap().speed,
        125_000,
        "the speeds summed"
    );
    assert_eq!(
        api::properties(1).unwrap().speed,
        25_000,
        "soft1 reports its knob"
    );
    let (mut h, l) = listen_on(d);
    let (s, r, _) = establish_on(d, &mut h, l, Duration::from_secs(30));
    let mut total = 0u64;
    for (k, size) in [1usize, 1000, 65_537, 1 << 20, 8 << 20]
        .into_iter()
        .enumerate()
    {
        let before = api::rail_stats(s).expect("a fused comm").rail_bytes;
        transfer(s, r, size, k as u8);
        let after = api::rail_stats(s).unwrap().rail_bytes;
        let got = [after[0] - before[0], after[1] - before[1]];
        assert_eq!(got[0] + got[1], size as u64, "{size}");
        if size >= 1 << 20 {
            // 4:1 within one 128-byte alignment unit.
            assert!(got[0].abs_diff(4 * got[1]) <= 4 * 128, "{size}: {got:?}");
        }
        total += size as u64;
    }
    let st = api::rail_stats(s).unwrap();
    assert_eq!(st.rail_bytes[0] + st.rail_bytes[1], total);
    assert!(st.live[0] && st.live[1]);
    close(s, r, l);
}
