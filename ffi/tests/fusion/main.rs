//! Fusion through the plugin, one test binary: virtual NICs made by `makeVDevice` over two to
//! eight soft devices ([`vdev`], [`fused_api`], [`fused_eight`], [`fused_weighted`]), their
//! failover ([`fused_failover`], [`fused_failover_group`], [`fused_failover_many`],
//! [`fused_failover_off`], [`fused_last_rail`], [`fused_eight_failover`]) and failback
//! ([`fused_failback`], [`fused_failback_many`]), and `NCCL_IB_WARN_RAIL_LOCAL`
//! ([`warn_rail_local`]). Each test sets its environment and initialises the plugin, so each
//! runs in a process of its own ([`util::isolate`]).

mod eight;
mod fused_api;
mod fused_eight;
mod fused_eight_failover;
mod fused_failback;
mod fused_failback_many;
mod fused_failover;
mod fused_failover_group;
mod fused_failover_many;
mod fused_failover_off;
mod fused_last_rail;
mod fused_weighted;
#[path = "../util/mod.rs"]
mod util;
mod vdev;
mod warn_rail_local;
