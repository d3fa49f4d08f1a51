//! Reads NCCL's variables (and ibnet's `IBNET_*`) once, with NCCL 2.28's defaults.
//!
//! The NCCL variables the plugin uses are parsed by the core's `Params` (NCCL 2.28's defaults
//! and ranges; `NCCL_IB_HCA` and `NCCL_SOCKET_IFNAME` through the core's one grammar,
//! `ibnet_core::hca`); this module owns the environment access, which the core never does, and
//! ibnet's plugin-level `IBNET_*` knobs. A malformed value produces one WARN naming the
//! variable, and the default stands; a variable ibnet parses but does not implement
//! ([`UNIMPLEMENTED`]) is refused with one WARN at init. (`ibnet-hip` reads
//! `NCCL_DMABUF_ENABLE` and `NCCL_IB_PCI_RELAXED_ORDERING` again for its GPU-side decisions,
//! with RCCL's rules: that is the one other reader.)

use std::net::IpAddr;

use ibnet_core::hca::HcaFilter;
use ibnet_core::params::{AddrFamily, AddrRange, Params, ProviderKind, RelaxedOrdering};

/// Which provider backs the plugin's devices (`IBNET_PROVIDER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderChoice {
    /// `auto` (default): verbs devices if any, else none. Never the software provider.
    Auto,
    /// `verbs`: libibverbs only.
    Verbs,
    /// `soft`: the same-host software provider (tests, single-host runs).
    Soft,
}

/// The configuration the plugin runs with: NCCL's variables as the core's
/// [`Params`] parsed them, in
/// the shapes the verbs layer uses, plus ibnet's own plugin-level knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `IBNET_PROVIDER` (default `auto`).
    pub provider: ProviderChoice,
    /// `NCCL_IB_DISABLE`: no verbs devices.
    pub ib_disable: bool,
    /// `NCCL_IB_HCA` as written (`None`: every device), for messages.
    pub ib_hca: Option<String>,
    /// `NCCL_IB_HCA` as `Params::set` parsed it (the one parse; empty: every device).
    pub hca: HcaFilter,
    /// `NCCL_IB_GID_INDEX` (-1: auto-select).
    pub gid_index: i64,
    /// `NCCL_IB_ROCE_VERSION_NUM`: the RoCE version auto-selection prefers.
    pub roce_version: i64,
    /// `NCCL_IB_ADDR_FAMILY` as `AF_INET` / `AF_INET6`.
    pub addr_family: i32,
    /// `NCCL_IB_ADDR_RANGE` (only when its family matches `NCCL_IB_ADDR_FAMILY`, as NCCL).
    pub addr_range: Option<(IpAddr, u8)>,
    /// `NCCL_IB_TIMEOUT`.
    pub timeout: u8,
    /// `NCCL_IB_RETRY_CNT`.
    pub retry_cnt: u8,
    /// `NCCL_IB_QPS_PER_CONNECTION`.
    pub qps_per_conn: u8,
    /// `NCCL_IB_SPLIT_DATA_ON_QPS`.
    pub split_data: bool,
    /// `NCCL_IB_AR_THRESHOLD`.
    pub ar_threshold: u64,
    /// `NCCL_IB_ADAPTIVE_ROUTING` (-2: on for InfiniBand, off for RoCE).
    pub adaptive_routing: i64,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (0 off, 1 on, 2 auto).
    pub relaxed_ordering: i64,
    /// `NCCL_IB_USE_INLINE`.
    pub use_inline: bool,
    /// `NCCL_IB_SL` (-1: the communicator's traffic class, else 0).
    pub sl: i64,
    /// `NCCL_IB_TC` (-1: the communicator's traffic class, else 0).
    pub tc: i64,
    /// `NCCL_IB_PKEY`.
    pub pkey: u16,
    /// `NCCL_IB_MERGE_VFS`.
    pub merge_vfs: bool,
    /// `NCCL_GDR_FLUSH_DISABLE`.
    pub gdr_flush_disable: bool,
    /// `NCCL_DMABUF_ENABLE`.
    pub dmabuf_enable: bool,
    /// `NCCL_SOCKET_IFNAME` as written (`None`: NCCL's preference order), for messages.
    pub socket_ifname: Option<String>,
    /// `NCCL_SOCKET_IFNAME` as `Params::set` parsed it (`None` when unset).
    pub ifname: Option<HcaFilter>,
    /// `NCCL_SOCKET_FAMILY` as `AF_INET` / `AF_INET6`.
    pub socket_family: Option<i32>,
    /// Seconds a started handshake may stall before connect/accept fail
    /// (`IBNET_HANDSHAKE_TIMEOUT`, default 60).
    pub handshake_timeout_s: u64,
    /// Seconds a data-path call may wait on a live peer before one WARN names it (peer,
    /// comm, tag, what is awaited); 0: never (`IBNET_STALL_WARN`, default 60). A stall is no
    /// error: the wait goes on.
    pub stall_warn_s: u64,
    /// `IBNET_FORCE_FLUSH=1` (test and diagnosis): receive comms flush with an RDMA READ even
    /// when no GPU-direct is in use, so `iflush` can be exercised on host memory.
    pub force_flush: bool,
    /// `IBNET_FAULT_RO_EINVAL=1` (tests only): act as if the driver refused a relaxed-ordering
    /// registration with EINVAL, exercising the fallback to a plain registration.
    pub fault_ro_einval: bool,
    /// `IBNET_FAULT_MQP_ETIMEDOUT=N` (tests only): the first `N` `ibv_modify_qp` calls of the
    /// process fail with ETIMEDOUT before reaching the driver, exercising the retry.
    pub fault_mqp_etimedout: u32,
    /// `NCCL_IB_MQP_RETRY_ALL`: retry every failed `ibv_modify_qp`, not only ETIMEDOUT.
    pub mqp_retry_all: bool,
    /// `NCCL_IB_MQP_RETRY_CNT`: retries after the first attempt.
    pub mqp_retry_cnt: u32,
    /// `NCCL_IB_MQP_RETRY_SLEEP_MSEC`: the n-th retry sleeps n times this.
    pub mqp_retry_sleep_ms: u32,
    /// `NCCL_IB_ROUTABLE_FLID_GID_INDEX`.
    pub routable_flid_gid_index: u8,
    /// `NCCL_IB_ECE_ENABLE`.
    pub ece_enable: bool,
    /// `NCCL_IB_SOCK_CLIENT_PORT_REUSE`.
    pub sock_client_port_reuse: bool,
    /// `NCCL_IB_SOCK_SERVER_PORT_REUSE`.
    pub sock_server_port_reuse: bool,
    /// `IBNET_SOFT_DEVICES=N` (1..=8, default 1): with `IBNET_PROVIDER=soft`, open `soft0` ..
    /// `soft{N-1}`, each its own provider instance (fused-NIC tests on one host).
    pub soft_devices: u8,
    /// `IBNET_SOFT_FAULTS_DEV=N` (tests only): `IBNET_SOFT_FAULTS` arms only `softN` (unset:
    /// every soft device), so one rail of a fused NIC can fail.
    pub soft_faults_dev: Option<u8>,
}

impl Default for Config {
    fn default() -> Self {
        Self::from_params(&Params::default())
    }
}

/// The variables only ffi reads (everything else is in [`Params::NAMES`]).
pub const NAMES: &[&str] = &[
    "IBNET_HANDSHAKE_TIMEOUT",
    "IBNET_STALL_WARN",
    "IBNET_FORCE_FLUSH",
    "IBNET_FAULT_RO_EINVAL",
    "IBNET_FAULT_MQP_ETIMEDOUT",
    "IBNET_SOFT_DEVICES",
    "IBNET_SOFT_FAULTS_DEV",
];

fn family(f: AddrFamily) -> i32 {
    match f {
        AddrFamily::Inet => libc::AF_INET,
        AddrFamily::Inet6 => libc::AF_INET6,
    }
}

fn range(r: &AddrRange) -> (IpAddr, u8) {
    let ip = match r.family {
        AddrFamily::Inet => IpAddr::from([r.addr[0], r.addr[1], r.addr[2], r.addr[3]]),
        AddrFamily::Inet6 => IpAddr::from(r.addr),
    };
    (ip, r.prefix_len)
}

impl Config {
    /// The configuration `p` describes, with ffi's own knobs at their defaults.
    pub fn from_params(p: &Params) -> Self {
        let nonempty = |s: &str| Some(s.to_string()).filter(|s| !s.trim().is_empty());
        Self {
            provider: match p.provider {
                ProviderKind::Auto => ProviderChoice::Auto,
                ProviderKind::Verbs => ProviderChoice::Verbs,
                ProviderKind::Soft => ProviderChoice::Soft,
            },
            ib_disable: p.ib_disable,
            ib_hca: nonempty(&p.ib_hca),
            hca: p.hca.clone(),
            gid_index: p.ib_gid_index.map_or(-1, i64::from),
            roce_version: i64::from(p.ib_roce_version_num),
            addr_family: family(p.ib_addr_family),
            addr_range: p.gid_addr_range().as_ref().map(range),
            timeout: p.ib_timeout,
            retry_cnt: p.ib_retry_cnt,
            qps_per_conn: p.ib_qps_per_connection,
            split_data: p.ib_split_data_on_qps,
            ar_threshold: p.ib_ar_threshold,
            adaptive_routing: p.ib_adaptive_routing.map_or(-2, i64::from),
            relaxed_ordering: match p.ib_pci_relaxed_ordering {
                RelaxedOrdering::Off => 0,
                RelaxedOrdering::On => 1,
                RelaxedOrdering::Auto => 2,
            },
            use_inline: p.ib_use_inline,
            sl: p.ib_sl.map_or(-1, i64::from),
            tc: p.ib_tc.map_or(-1, i64::from),
            pkey: p.ib_pkey,
            merge_vfs: p.ib_merge_vfs,
            gdr_flush_disable: p.gdr_flush_disable,
            dmabuf_enable: p.dmabuf_enable,
            socket_ifname: nonempty(&p.socket_ifname),
            ifname: nonempty(&p.socket_ifname).map(|_| p.ifname.clone()),
            socket_family: p.socket_family.map(family),
            handshake_timeout_s: 60,
            stall_warn_s: 60,
            force_flush: false,
            fault_ro_einval: false,
            fault_mqp_etimedout: 0,
            mqp_retry_all: p.ib_mqp_retry_all,
            mqp_retry_cnt: p.ib_mqp_retry_cnt,
            mqp_retry_sleep_ms: p.ib_mqp_retry_sleep_msec,
            routable_flid_gid_index: p.ib_routable_flid_gid_index,
            ece_enable: p.ib_ece_enable,
            sock_client_port_reuse: p.ib_sock_client_port_reuse,
            sock_server_port_reuse: p.ib_sock_server_port_reuse,
            soft_devices: 1,
            soft_faults_dev: None,
        }
    }

    /// Applies one of ffi's own variables ([`NAMES`]). `Ok(false)`: not one of them.
    /// `Err(reason)`: malformed; the field keeps its value.
    pub fn set(&mut self, name: &str, v: &str) -> Result<bool, &'static str> {
        match name {
            "IBNET_HANDSHAKE_TIMEOUT" => {
                let n = ibnet_core::params::parse_int(v.trim())?;
                if !(1..=86_400).contains(&n) {
                    return Err("must be in 1..=86400 seconds");
                }
                self.handshake_timeout_s = n as u64;
            }
            "IBNET_FAULT_MQP_ETIMEDOUT" => {
                let n = ibnet_core::params::parse_int(v.trim())?;
                if !(0..=1000).contains(&n) {
                    return Err("must be in 0..=1000 calls");
                }
                self.fault_mqp_etimedout = n as u32;
            }
            "IBNET_SOFT_DEVICES" | "IBNET_SOFT_FAULTS_DEV" => {
                let n = ibnet_core::params::parse_int(v.trim())?;
                let max = if name == "IBNET_SOFT_DEVICES" { 8 } else { 7 };
                let min = if name == "IBNET_SOFT_DEVICES" { 1 } else { 0 };
                if !(min..=max).contains(&n) {
                    return Err(if name == "IBNET_SOFT_DEVICES" {
                        "must be in 1..=8 devices"
                    } else {
                        "must be a soft device number in 0..=7"
                    });
                }
                if name == "IBNET_SOFT_DEVICES" {
                    self.soft_devices = n as u8;
                } else {
                    self.soft_faults_dev = Some(n as u8);
                }
            }
            "IBNET_STALL_WARN" => {
                let n = ibnet_core::params::parse_int(v.trim())?;
                if !(0..=86_400 * 365).contains(&n) {
                    return Err("must be in 0..=31536000 seconds (0: never warn)");
                }
                self.stall_warn_s = n as u64;
            }
            "IBNET_FORCE_FLUSH" | "IBNET_FAULT_RO_EINVAL" => {
                let on = match ibnet_core::params::parse_int(v.trim())? {
                    0 => false,
                    1 => true,
                    _ => return Err("must be 0 or 1"),
                };
                if name == "IBNET_FORCE_FLUSH" {
                    self.force_flush = on;
                } else {
                    self.fault_ro_einval = on;
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads NCCL's variables (through the core's [`Params`]) and ibnet's own
    /// from the process environment, once. An empty variable counts as unset, as in NCCL; a
    /// malformed one is one WARN naming it, and its default stands.
    pub fn from_env() -> (Self, Params) {
        let mut p = Params::default();
        let mut own: Vec<(&str, String)> = Vec::new();
        for n in Params::NAMES.iter().copied().chain(NAMES.iter().copied()) {
            let Some(v) = std::env::var_os(n) else {
                continue;
            };
            let v = v.to_string_lossy().into_owned();
            if v.trim().is_empty() {
                continue;
            }
            if NAMES.contains(&n) {
                own.push((n, v));
                continue;
            }
            match p.set(n, &v) {
                Ok(_) => crate::info!(crate::log::ENV, "{n} set by environment to {v}"),
                Err(e) => crate::warn!("ignoring {n}={v:?}: {e}; the default stands"),
            }
        }
        warn_malformed_hca(&p);
        refuse_unimplemented(&mut p);
        refuse_alive_msg(&p);
        let mut c = Self::from_params(&p);
        for (n, v) in own {
            match c.set(n, &v) {
                Ok(_) => crate::info!(crate::log::ENV, "{n} set by environment to {v}"),
                Err(why) => crate::warn!("ignoring {n}={v:?}: {why}; the default stands"),
            }
        }
        (c, p)
    }
}

/// One WARN per `NCCL_IB_HCA` entry that is not well formed, naming it and saying what ibnet
/// does with it; the rest of the list applies (`ibnet_core::hca`).
fn warn_malformed_hca(p: &Params) {
    for m in p.hca.malformed() {
        crate::warn!(
            "NCCL_IB_HCA={:?}: entry {:?}: {}; the rest of the list applies",
            p.ib_hca.as_str(),
            m.entry(&p.ib_hca),
            m.reason
        );
    }
}

/// One WARN per `NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_*` set: NCCL's alive messages
/// have no counterpart in ibnet's failback.
fn refuse_alive_msg(p: &Params) {
    for (i, n) in ibnet_core::params::RECOVERY_ALIVE_MSG.iter().enumerate() {
        if p.ib_resiliency_port_recovery_alive_msg >> i & 1 == 1 {
            crate::warn!(
                "{n} has no effect in ibnet: a returning rail is proven by one RDMA READ over \
                 it, not by batches of alive messages (NCCL_IB_RESILIENCY_PORT_RECOVERY_\
                 ACK_TIMEOUT bounds the wait)"
            );
        }
    }
}

/// Variables ibnet parses but does not implement. Each one set to a non-default value is one
/// WARN at init and is reset to its default ([`Config::from_env`]), so nothing is silently
/// ignored. None at present (`NCCL_IB_WARN_RAIL_LOCAL` is implemented by `api::accepting`,
/// `NCCL_IB_SOCK_SERVER_PORT_REUSE` by `api::shared_listen`).
pub const UNIMPLEMENTED: &[&str] = &[];

/// Resets every [`UNIMPLEMENTED`] variable that is set, with one WARN each.
fn refuse_unimplemented(_p: &mut Params) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_mirrors_the_core_params() {
        assert_eq!(Config::default().timeout, 20);
        assert_eq!(Config::default().gid_index, -1);
        assert_eq!(Config::default().adaptive_routing, -2);
        let mut p = Params::default();
        p.set("NCCL_IB_TIMEOUT", "0").unwrap();
        p.set("NCCL_IB_PKEY", "0x8001").unwrap();
        p.set("NCCL_IB_GID_INDEX", "3").unwrap();
        p.set("IBNET_PROVIDER", "soft").unwrap();
        p.set("NCCL_IB_ADDR_RANGE", "10.0.0.0/8").unwrap();
        p.set("NCCL_IB_ADAPTIVE_ROUTING", "1").unwrap();
        let c = Config::from_params(&p);
        assert_eq!((c.timeout, c.pkey, c.gid_index), (0, 0x8001, 3));
        assert_eq!(c.provider, ProviderChoice::Soft);
        assert_eq!(c.addr_range, Some(("10.0.0.0".parse().unwrap(), 8)));
        assert_eq!(c.adaptive_routing, 1);
    }

    #[test]
    fn own_variables_are_checked() {
        let mut c = Config::default();
        assert!(c.set("IBNET_HANDSHAKE_TIMEOUT", "abc").is_err());
        assert!(c.set("IBNET_HANDSHAKE_TIMEOUT", "0").is_err());
        assert_eq!(c.handshake_timeout_s, 60);
        assert_eq!(c.set("IBNET_HANDSHAKE_TIMEOUT", "5"), Ok(true));
        assert_eq!(c.handshake_timeout_s, 5);
        assert_eq!(c.stall_warn_s, 60);
        assert!(c.set("IBNET_STALL_WARN", "-1").is_err());
        assert_eq!(c.set("IBNET_STALL_WARN", "0"), Ok(true));
        assert_eq!(c.stall_warn_s, 0);
        assert_eq!(
            c.set("NCCL_IB_TIMEOUT", "5"),
            Ok(false),
            "NCCL's variables are Params'"
        );
        assert!(c.set("IBNET_FAULT_MQP_ETIMEDOUT", "1001").is_err());
        assert_eq!(c.set("IBNET_FAULT_MQP_ETIMEDOUT", "3"), Ok(true));
        assert_eq!(c.fault_mqp_etimedout, 3);
    }

    #[test]
    fn port_reuse_variables_are_kept() {
        let mut p = Params::default();
        p.set("NCCL_IB_SOCK_SERVER_PORT_REUSE", "1").unwrap();
        p.set("NCCL_IB_SOCK_CLIENT_PORT_REUSE", "1").unwrap();
        refuse_unimplemented(&mut p);
        assert!(UNIMPLEMENTED.is_empty());
        assert!(p.ib_sock_server_port_reuse, "implemented: kept");
        assert!(p.ib_sock_client_port_reuse, "implemented: kept");
        let c = Config::from_params(&p);
        assert!(c.sock_client_port_reuse && c.sock_server_port_reuse);
    }

    #[test]
    fn every_nccl_variable_reaches_the_config() {
        let mut p = Params::default();
        for (n, v) in [
            ("NCCL_IB_MQP_RETRY_ALL", "1"),
            ("NCCL_IB_MQP_RETRY_CNT", "3"),
            ("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "7"),
            ("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "2"),
            ("NCCL_IB_ECE_ENABLE", "0"),
        ] {
            p.set(n, v).unwrap();
        }
        let c = Config::from_params(&p);
        assert!(c.mqp_retry_all && !c.ece_enable);
        assert_eq!((c.mqp_retry_cnt, c.mqp_retry_sleep_ms), (3, 7));
        assert_eq!(c.routable_flid_gid_index, 2);
    }
}
