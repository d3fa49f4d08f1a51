//! `makeVDevice` through the API (exported in the v9–v12 tables): one device is that device,
//! bad descriptions are refused with the right code and one WARN each, and the device count and
//! properties stay those of the physical devices. A real fusion over two soft devices, with
//! comms over it, is `fused_api.rs`; the fusion rules themselves are unit-tested over device
//! descriptions (`vdev::merge`).

use crate::util;

use ibnet_nccl::log::Level;
use ibnet_nccl::props::{Props11, VersionProps};
use ibnet_nccl::types::{ncclNetVDeviceProps_t, ncclNetVDeviceProps_v12_t, ncclResult_t};
use nccl_net_ibnet::api;

#[test]
fn make_vdevice_through_the_api() {
    if util::ran_in_child() {
        return;
    }
    if !util::init_soft(&[("NCCL_SOCKET_IFNAME", "lo")]) {
        return;
    }
    let mut n = 0;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    let mut d = -1;
    let one = ncclNetVDeviceProps_t {
        ndevs: 1,
        devs: [0, 0, 0, 0],
    };
    assert_eq!(api::make_vdevice(&mut d, &one), ncclResult_t::Success);
    assert_eq!(d, 0, "a vNIC of one device is that device");
    let _ = util::take_log();

    let bad = [
        (0, [0, 0, 0, 0]),  // no device
        (5, [0, 0, 0, 0]),  // more than 4
        (2, [0, 0, 0, 0]),  // device named twice
        (1, [n, 0, 0, 0]),  // beyond the physical devices
        (2, [0, -1, 0, 0]), // negative
    ];
    for (ndevs, devs) in bad {
        let p = ncclNetVDeviceProps_t { ndevs, devs };
        assert_eq!(
            api::make_vdevice(&mut d, &p),
            ncclResult_t::InvalidArgument,
            "{ndevs} {devs:?}"
        );
        let warns: Vec<String> = util::take_log()
            .into_iter()
            .filter(|(l, s)| *l == Level::Warn && s.contains("makeVDevice"))
            .map(|(_, s)| s)
            .collect();
        assert_eq!(warns.len(), 1, "{ndevs} {devs:?}: one WARN: {warns:?}");
        if ndevs == 2 && devs[1] == 0 {
            // The device named twice: the WARN says so and which, not "out of range".
            let w = &warns[0];
            assert!(
                w.contains("physical device 0 is listed twice") && w.contains("[0] and [1]"),
                "{w}"
            );
            assert!(!w.contains("out of range"), "{w}");
        }
    }
    assert_eq!(
        api::make_vdevice(core::ptr::null_mut(), &one),
        ncclResult_t::InternalError
    );
    assert_eq!(
        api::make_vdevice::<4>(&mut d, core::ptr::null()),
        ncclResult_t::InternalError
    );
    let mut again = 0;
    assert_eq!(api::devices(&mut again), ncclResult_t::Success);
    assert_eq!(again, n, "no vNIC was made");
    let p = api::properties(0).expect("properties");
    let v11 = Props11::from_props(&p, 0);
    assert_eq!((v11.v9.vprops.ndevs, v11.v9.vprops.devs[0]), (1, 0));
    assert_eq!(v11.v9.speed, p.speed);
    // The exported tables carry the entry (NCCL 2.28 calls it with NCCL_IB_MERGE_NICS on).
    assert!(nccl_net_ibnet::abi::exports::ncclNetPlugin_v9
        .make_vdevice
        .is_some());
    assert!(nccl_net_ibnet::abi::exports::ncclNetPlugin_v10
        .make_vdevice
        .is_some());
    assert!(nccl_net_ibnet::abi::exports::ncclNetPlugin_v11
        .make_vdevice
        .is_some());
    assert!(nccl_net_ibnet::abi::exports::ncclNetPlugin_v12
        .make_vdevice
        .is_some());
    // v12's struct holds 8 devices: 9 is refused naming that limit, as 5 is for v11's 4.
    let nine = ncclNetVDeviceProps_v12_t {
        ndevs: 9,
        devs: [0; 8],
    };
    assert_eq!(
        api::make_vdevice(&mut d, &nine),
        ncclResult_t::InvalidArgument
    );
    let w = util::take_log();
    assert!(
        w.iter()
            .any(|(l, s)| *l == Level::Warn && s.contains("out of range [1, 8]")),
        "{w:?}"
    );
}
