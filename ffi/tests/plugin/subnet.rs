//! `NCCL_IB_SUBNET_AWARE_ROUTING` over two soft devices on different subnets
//! (`IBNET_SOFT_GIDS`: soft0 `10.0.0.1`, soft1 `10.0.1.1`): the listener on soft1 advertises
//! its GID in the handle; a connect from soft0 then runs on soft1 (its registrations are
//! soft1's, the bytes arrive, one INFO names both devices), and with routing off it stays on
//! soft0 (zero GIDs in the handle, no INFO). A prefix length that puts both devices on one
//! subnet keeps NCCL's device.

use crate::util;

use std::time::Duration;

use ibnet_nccl::log::Level;
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use nccl_net_ibnet::handles::mh_decode;
use util::*;

const GIDS: (&str, &str) = ("IBNET_SOFT_GIDS", "10.0.0.1,10.0.1.1");

/// `::ffff:a.b.c.d`.
fn v4_gid(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

/// The handle's GIDs.
fn gids(h: &Handle) -> [[u8; 16]; 2] {
    let c = ibnet_core::wire::ConnectHandle::decode(&h[..]).unwrap();
    [c.gids[0].0, c.gids[1].0]
}

/// The device a send comm registers on: its `mhandle` names it.
fn send_dev(s: *mut core::ffi::c_void) -> u8 {
    let mut b = vec![0u8; 4096];
    let mh = reg(s, &mut b);
    let dev = (0..=u8::MAX)
        .find(|&d| mh_decode(mh as usize, d).is_ok())
        .expect("an mhandle of some device");
    assert_eq!(api::dereg_mr(s, mh), ncclResult_t::Success);
    dev
}

/// The routing INFO lines logged so far.
fn routing_infos() -> Vec<String> {
    take_log()
        .into_iter()
        .filter(|(l, m)| *l == Level::Info && m.contains("subnet-aware routing"))
        .map(|(_, m)| m)
        .collect()
}

/// Listens on soft1 and connects asking for `dev`; the send comm's device, after a verified
/// transfer, and the routing INFO lines.
fn connect_to_soft1_from(dev: i32) -> (u8, Vec<String>, [[u8; 16]; 2]) {
    let (mut h, l) = listen_on(1);
    let advertised = gids(&h);
    let _ = take_log();
    let (s, r, _) = establish_on(dev, &mut h, l, Duration::from_secs(30));
    let infos = routing_infos();
    transfer(s, r, 1 << 16, 5);
    let d = send_dev(s);
    close(s, r, l);
    (d, infos, advertised)
}

/// Initialises the plugin over soft0 (10.0.0.1) and soft1 (10.0.1.1) with `extra` set too
/// (false: the soft provider is unavailable here).
fn init_two(extra: &[(&str, &str)]) -> bool {
    let mut vars = vec![
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "2"),
        GIDS,
    ];
    vars.extend_from_slice(extra);
    init_soft(&vars)
}

#[test]
fn routing_on_moves_the_connect_to_the_device_on_the_listeners_subnet() {
    if util::ran_in_child() {
        return;
    }
    if !init_two(&[("NCCL_IB_SUBNET_AWARE_ROUTING", "1")]) {
        return;
    }
    let (d, infos, advertised) = connect_to_soft1_from(0);
    assert_eq!(
        advertised,
        [v4_gid([10, 0, 1, 1]), [0; 16]],
        "soft1's GID only"
    );
    assert_eq!(d, 1, "the connect asked for soft0 runs on soft1");
    assert_eq!(infos.len(), 1, "one INFO per connect: {infos:?}");
    assert!(
        infos[0].contains("dev 1 (soft1) instead of dev 0 (soft0)"),
        "{infos:?}"
    );
    // Asked for the device already on the subnet: kept, no INFO.
    let (d, infos, _) = connect_to_soft1_from(1);
    assert_eq!((d, infos), (1, vec![]));
}

#[test]
fn a_fused_nic_with_a_rail_off_the_subnet_gives_way_to_a_device_on_it() {
    if util::ran_in_child() {
        return;
    }
    if !init_two(&[("NCCL_IB_SUBNET_AWARE_ROUTING", "1")]) {
        return;
    }
    let fused = fuse_first_two();
    // A fused listener advertises both rails' GIDs, rail order.
    let (h, l) = listen_on(fused);
    assert_eq!(gids(&h), [v4_gid([10, 0, 0, 1]), v4_gid([10, 0, 1, 1])]);
    assert_eq!(api::close_listen(l), ncclResult_t::Success);
    // soft0+soft1 cannot reach a listener on 10.0.1.0/24 with both rails: the connect runs on
    // soft1 alone (and so matches the listener's one rail; unrouted, the acceptor would refuse
    // the two-rail Hello).
    let (d, infos, _) = connect_to_soft1_from(fused);
    assert_eq!(d, 1);
    assert_eq!(infos.len(), 1, "{infos:?}");
    assert!(
        infos[0].contains(&format!(
            "dev 1 (soft1) instead of dev {fused} (soft0+soft1)"
        )),
        "{infos:?}"
    );
}

#[test]
fn routing_off_keeps_the_device_nccl_asked_for() {
    if util::ran_in_child() {
        return;
    }
    if !init_two(&[]) {
        return;
    }
    let (d, infos, advertised) = connect_to_soft1_from(0);
    assert_eq!(advertised, [[0; 16]; 2], "no GIDs in the handle");
    assert_eq!((d, infos), (0, vec![]));
}

#[test]
fn a_prefix_len_that_joins_the_subnets_keeps_the_asked_device() {
    if util::ran_in_child() {
        return;
    }
    if !init_two(&[
        ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
        ("NCCL_IB_SUBNET_PREFIX_LEN", "16"),
    ]) {
        return;
    }
    let (d, infos, _) = connect_to_soft1_from(0);
    assert_eq!((d, infos), (0, vec![]), "10.0.0.1 and 10.0.1.1 share a /16");
}

#[test]
fn an_out_of_range_prefix_len_is_one_warn_and_the_default_routes() {
    if util::ran_in_child() {
        return;
    }
    if !init_two(&[
        ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
        ("NCCL_IB_SUBNET_PREFIX_LEN", "33"),
    ]) {
        return;
    }
    let warns: Vec<_> = take_log()
        .into_iter()
        .filter(|(l, m)| *l == Level::Warn && m.contains("NCCL_IB_SUBNET_PREFIX_LEN"))
        .map(|(_, m)| m)
        .collect();
    assert_eq!(warns.len(), 1, "{warns:?}");
    assert!(warns[0].contains("1..=32"), "names the range: {warns:?}");
    let (d, _, _) = connect_to_soft1_from(0);
    assert_eq!(d, 1, "the default /24 separates the devices");
}
