//! A v12 virtual NIC of 8 soft devices (`IBNET_SOFT_DEVICES=8`), through the exported
//! `ncclNetPlugin_v12` table: `makeVDevice` of all 8 (v11's struct holds 4: 5 are refused
//! there), the v12 properties (8 devices in `vProps`, `railId`/`planeId` as NCCL 2.30 fuses the
//! ids `NCCL_IB_HCA` gave each device), then comms over it with messages striped over all 8
//! rails, every byte and every reported size verified, and traffic counted on each rail.

use crate::eight;
use crate::util;

use std::time::Duration;

use eight::{fuse_eight, message, props12, HCA};
use ibnet_nccl::types::{ncclNetVDeviceProps_t, ncclResult_t};
use nccl_net_ibnet::abi::exports::ncclNetPlugin_v11;
use nccl_net_ibnet::api;
use util::*;

#[test]
fn eight_soft_devices_fused_through_v12() {
    if util::ran_in_child() {
        return;
    }
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "8"),
        ("NCCL_IB_HCA", HCA),
    ];
    if !init_soft(&env) {
        return;
    }
    let mut n = 0;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    assert_eq!(n, 8, "soft0..soft7");
    let p3 = props12(3);
    assert_eq!(
        (p3.rail_id, p3.plane_id),
        (0, 3),
        "soft3's ids from NCCL_IB_HCA"
    );

    // Through v11, a vNIC holds at most 4 devices (its struct's size).
    let mut d = -1;
    let mut five = ncclNetVDeviceProps_t {
        ndevs: 5,
        devs: [0, 1, 2, 3],
    };
    let mk11 = ncclNetPlugin_v11.make_vdevice.expect("v11 makeVDevice");
    // SAFETY: the exported v11 entry with valid pointers.
    let rc = unsafe { mk11(&mut d, &mut five) };
    assert_eq!(rc, ncclResult_t::InvalidArgument);
    let _ = take_log();

    let d = fuse_eight();
    assert_eq!(d, 8, "the vNIC comes after the 8 physical devices");
    let p = props12(d);
    assert_eq!(p.vprops.ndevs, 8);
    assert_eq!(p.vprops.devs, [0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(p.speed, 8 * props12(0).speed, "speeds summed");
    // Every device is on rail 0: the vNIC is too. Its plane is NCCL's virtual bit with the
    // indices of planes 0..3 (1..4).
    assert_eq!(p.rail_id, 0);
    assert_eq!(p.plane_id, 1 << 14 | 0b1_1110);
    // SAFETY: the name is a NUL-terminated string the plugin keeps.
    let name = unsafe { std::ffi::CStr::from_ptr(p.name) };
    assert_eq!(
        name.to_str().unwrap(),
        "soft0+soft1+soft2+soft3+soft4+soft5+soft6+soft7"
    );

    let (mut h, l) = listen_on(d);
    let (s, r, _) = establish_on(d, &mut h, l, Duration::from_secs(60));
    let _ = take_log();
    // Sizes around the 128-byte stripe unit times 8 rails, every byte verified.
    for (k, len) in [
        0usize,
        1,
        127,
        1023,
        1024,
        1025,
        8 * 128 * 3 + 5,
        65536,
        (1 << 20) + 3,
    ]
    .into_iter()
    .enumerate()
    {
        message(s, r, len, k as u8);
    }
    let st = api::rail_stats(s).expect("fused send comm");
    assert_eq!(st.rails, 8);
    assert!(
        st.rail_bytes.iter().all(|&b| b > 0),
        "traffic on every rail: {st:?}"
    );
    assert!(st.live.iter().all(|&l| l), "{st:?}");
    assert_eq!(st.resent, 0);
    println!("per-rail bytes: {:?}", st.rail_bytes);
    let warns: Vec<_> = take_log()
        .into_iter()
        .filter(|(l, _)| *l == ibnet_nccl::log::Level::Warn)
        .collect();
    assert!(
        warns.is_empty(),
        "no WARN on a healthy fused comm: {warns:?}"
    );
    close(s, r, l);
}
