//! Subnet-aware routing (`NCCL_IB_SUBNET_AWARE_ROUTING`), the plugin's side: reads the
//! devices' link layers and GIDs and hands them to the core's rules
//! ([`ibnet_core::policy::subnet`]).
//!
//! ```text
//!  listen(dev)   listen_gids: the GIDs of dev's first 2 RoCE rails (chosen now, as a new
//!                comm would) ─▶ ConnectHandle::gids
//!  connect(dev)  route, on the first call of a connect: every device's rails (physical
//!                devices, then fused vNICs) ─▶ subnet::choose ─▶ the device used (one INFO
//!                when it is not dev); remembered in the handle's scratch area, so later
//!                calls of the same connect use it without asking the devices again
//! ```
//! Off (the default), the handle's GIDs are zero and `connect` uses the device NCCL asked for.
//! A rail whose GID cannot be chosen (`NCCL_IB_ADDR_RANGE` excludes all) fails `listen`, as
//! NCCL's listen fails; on the connecting side it takes no part (NCCL skips it too).

use core::ffi::c_int;

use ibnet_core::fused::MAX_DEVS_PER_NIC;
use ibnet_core::policy::subnet::{self, Rail, Route};
use ibnet_core::provider::{Gid, LinkLayer};
use ibnet_core::wire::{ConnectHandle, HANDLE_GIDS, HANDLE_SCRATCH_LEN, HANDLE_SCRATCH_OFFSET};
use ibnet_core::Result;

use crate::connect_registry::TOKEN_OFF;
use crate::dev::Dev;
use crate::nic::Nic;
use crate::plugin::Plugin;
use ibnet_nccl::info;
use ibnet_nccl::types::NCCL_NET_HANDLE_MAXSIZE;

/// Where `connect` remembers the device routing chose: 4 bytes after the connector's token,
/// the device NCCL asked for and the one chosen, each plus one, 16-bit little-endian (0: not
/// routed yet; the listener zeroes the scratch area). A later call asking for another device
/// (a handle reused for another connect) routes afresh.
const ROUTE_OFF: usize = TOKEN_OFF + 8;
const _: () = assert!(ROUTE_OFF + 4 <= HANDLE_SCRATCH_OFFSET + HANDLE_SCRATCH_LEN);

/// The rails of one device, as the core's rules take them.
type Rails = heapless::Vec<Rail, MAX_DEVS_PER_NIC>;

/// The GIDs `listen` advertises for `nic`: with routing on, those of its first
/// [`HANDLE_GIDS`] RoCE rails (rail order); else zero.
pub fn listen_gids(p: &Plugin, nic: &Nic) -> Result<[Gid; HANDLE_GIDS]> {
    let mut rails = Rails::new();
    if !p.params.ib_subnet_aware_routing {
        return Ok(subnet::listen_gids(rails));
    }
    for &i in &nic.rail_devs() {
        let Some(d) = p.devs.get(usize::from(i)) else {
            continue;
        };
        if d.port_info().link_layer != LinkLayer::Ethernet {
            continue;
        }
        if rails.len() == HANDLE_GIDS {
            break;
        }
        let gid = d.choose_gid()?.port_info().gid;
        // Cannot fail: at most HANDLE_GIDS ≤ MAX_DEVS_PER_NIC pushed.
        let _ = rails.push(Rail {
            link_layer: LinkLayer::Ethernet,
            gid,
        });
    }
    Ok(subnet::listen_gids(rails))
}

/// The device `connect` uses when NCCL asks for `dev` with handle `h` (`hb`, its bytes, where
/// the choice is remembered across the calls of one connect). Routing off, or `dev` not a
/// device (the connect then reports it): `dev`.
pub fn route(
    p: &Plugin,
    dev: c_int,
    h: &ConnectHandle,
    hb: &mut [u8; NCCL_NET_HANDLE_MAXSIZE],
) -> c_int {
    if !p.params.ib_subnet_aware_routing {
        return dev;
    }
    let nphys = p.devs.len();
    let n = nphys + crate::vdev::count();
    let Some(asked) = usize::try_from(dev).ok().filter(|&d| d < n) else {
        return dev;
    };
    let slot = &mut hb[ROUTE_OFF..ROUTE_OFF + 4];
    let word = |i: usize| usize::from(u16::from_le_bytes([slot[i], slot[i + 1]]));
    if word(0) == asked + 1 && (1..=n).contains(&word(2)) {
        return (word(2) - 1) as c_int;
    }
    let phys: Vec<Option<Rail>> = p.devs.iter().map(rail).collect();
    let devices: Vec<Rails> = (0..n).map(|i| rails(nphys, i, &phys)).collect();
    let prefix = p.params.ib_subnet_prefix_len;
    let chosen = match subnet::choose(&h.gids, prefix, asked, &devices) {
        Route::Asked => dev,
        Route::Other(i) => {
            let i = c_int::try_from(i).unwrap_or(dev);
            info!(
                ibnet_nccl::log::NET,
                "subnet-aware routing: connect to {} uses dev {i} ({}) instead of dev {dev} ({}), \
                 not all of whose RoCE rails are on a subnet of the listener's GIDs {} \
                 (NCCL_IB_SUBNET_PREFIX_LEN={prefix})",
                h.addr,
                names(p, i),
                names(p, dev),
                peer_gids(&h.gids),
            );
            i
        }
    };
    // Both are device numbers in 0..n (the physical devices plus at most `vdev::MAX_VNICS`),
    // so each plus one fits 16 bits.
    slot[..2].copy_from_slice(&(asked as u16 + 1).to_le_bytes());
    slot[2..].copy_from_slice(&(chosen as u16 + 1).to_le_bytes());
    chosen
}

/// A physical device as routing sees it: its link layer and the GID a new comm would use
/// (`None` when none can be chosen now).
fn rail(d: &Dev) -> Option<Rail> {
    let link_layer = d.port_info().link_layer;
    let gid = d.choose_gid().ok()?.port_info().gid;
    Some(Rail { link_layer, gid })
}

/// The rails of device number `i` (a physical device, or a fused vNIC's devices), from the
/// physical devices' `phys`.
fn rails(nphys: usize, i: usize, phys: &[Option<Rail>]) -> Rails {
    let Some(v) = c_int::try_from(i)
        .ok()
        .and_then(|d| crate::vdev::resolve(nphys, d))
    else {
        return Rails::new();
    };
    v.devs()
        .iter()
        .filter_map(|&d| phys.get(usize::from(d)).copied().flatten())
        .collect()
}

/// The names of device number `dev`'s physical devices (`mlx5_0`, `soft0+soft1`).
fn names(p: &Plugin, dev: c_int) -> String {
    let Some(v) = crate::vdev::resolve(p.devs.len(), dev) else {
        return "?".into();
    };
    let names: Vec<_> = v
        .devs()
        .iter()
        .filter_map(|&d| p.devs.get(usize::from(d)))
        .map(|d| d.name().to_string_lossy().into_owned())
        .collect();
    names.join("+")
}

/// The handle's GIDs that are set, as addresses (`::ffff:10.0.1.2`).
fn peer_gids(gids: &[Gid]) -> String {
    let set: Vec<_> = gids
        .iter()
        .filter(|g| g.0 != [0; 16])
        .map(|g| std::net::Ipv6Addr::from(g.0).to_string())
        .collect();
    set.join(", ")
}
