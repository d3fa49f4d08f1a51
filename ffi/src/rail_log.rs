//! What a comm's rails did, logged: a rail taken out of use (one WARN, naming the rail, its
//! device, why, where its traffic went, and the peer), a rail back in use (one INFO), and at
//! close one INFO line with what each rail carried. A comm of one rail has nothing to log.

use std::net::SocketAddr;

use ibnet_core::rails::{RailNews, RailStats};

use crate::nic::Nic;

/// Logs `news` of a comm (`side`: "send" or "receive") of `nic` to `peer`.
#[cold]
pub fn news(nic: &Nic, peer: Option<SocketAddr>, side: &str, news: RailNews) {
    let peer = peer.map_or("?".into(), |a| a.to_string());
    for e in news.failed {
        match e.to {
            Some(to) => ibnet_nccl::warn!(
                "{side} comm to {peer}: rail {} ({}) of the virtual NIC failed ({}); its \
                 traffic moved to rail {to} ({})",
                e.rail,
                nic.rail_name(e.rail),
                e.error,
                nic.rail_name(to)
            ),
            // The last rail: the call fails with the comm's error, whose WARN (`entry_at`,
            // naming the peer) is the failure's one WARN; this line adds which rail, at INFO.
            None => ibnet_nccl::info!(
                ibnet_nccl::log::NET,
                "{side} comm to {peer}: rail {} ({}) of the virtual NIC failed ({}); no \
                 healthy rail left: the comm fails",
                e.rail,
                nic.rail_name(e.rail),
                e.error
            ),
        }
    }
    for r in news.returned {
        ibnet_nccl::info!(
            ibnet_nccl::log::NET,
            "{side} comm to {peer}: rail {r} ({}) of the virtual NIC is healthy again at \
             both ends: it carries its share of the traffic again",
            nic.rail_name(r)
        );
    }
}

/// At close, one INFO line of a comm's rails (`stats`; `None`, one rail: nothing): what each
/// carried (`send`), which failed, the bytes written again.
#[cold]
pub fn closed(nic: &Nic, peer: Option<SocketAddr>, send: bool, stats: Option<RailStats>) {
    let Some(s) = stats else { return };
    let side = if send { "send" } else { "receive" };
    let peer = peer.map_or("?".into(), |a| a.to_string());
    let mut rails = String::new();
    for i in 0..s.rails {
        let name = nic.rail_name(i as u8);
        let state = if s.live[i] { "up" } else { "FAILED" };
        if send {
            rails += &format!(" rail {i} ({name}) {state} {} bytes;", s.rail_bytes[i]);
        } else {
            rails += &format!(" rail {i} ({name}) {state};");
        }
    }
    ibnet_nccl::info!(
        ibnet_nccl::log::NET,
        "{side} comm to {peer} closed: virtual NIC [{}]:{rails} {} bytes re-sent",
        nic.index,
        s.resent
    );
}
