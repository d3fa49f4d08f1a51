//! The plugin's variables (NCCL's and ibnet's own `IBNET_*`), typed: the one value the plugin
//! runs with.
//!
//! Each variable is declared once, in [`crate::config`] (name, type, range, default, version,
//! doc); this file holds where the plugin keeps its value. The core reads no environment.
//! `ibnet-ffi`'s `env.rs` reads each declared plugin variable once and feeds the non-empty
//! values to [`Params::set`], which parses them with the table's [`crate::config::Kind`]; a
//! value that `set` rejects is logged as a WARN naming the variable, and the default stands (so
//! an existing job's settings carry over, and a typo never aborts a job).
//!
//! ```text
//!  ffi:  for v in config::all() (Plugin) { if let Some(s) = getenv(v.name) { p.set(v.name, s) -> WARN on Err } }
//!  core: p.ib_timeout, p.adaptive_routing(link), p.sl(config_tc), p.hca_filter(), …
//! ```
//!
//! # Integer syntax
//! Integers follow NCCL (`strtoll(value, .., 0)`): optional leading/trailing ASCII whitespace,
//! an optional `+`/`-`, then decimal, `0x`/`0X` hexadecimal, or octal with a leading `0`.
//! Unlike NCCL, which silently ignores trailing junk (`"12abc"` reads as 12), ibnet rejects it,
//! and rejects values outside each variable's range. Negative values are accepted only where
//! NCCL's default is negative (the "auto" sentinels: `NCCL_IB_GID_INDEX`, `NCCL_IB_SL`,
//! `NCCL_IB_TC`, `NCCL_IB_FIFO_TC`, `NCCL_IB_ADAPTIVE_ROUTING`). Boolean variables take any
//! integer, non-zero meaning "on", as NCCL does.
//!
//! # Defaults where the seed differs from NCCL 2.28
//! The seed (`net_ib.cc`, close to NCCL 2.18) has `NCCL_IB_TIMEOUT=18`,
//! `NCCL_IB_SPLIT_DATA_ON_QPS=1`, `NCCL_IB_GID_INDEX=0`, `NCCL_IB_SL=0` and `NCCL_IB_TC=0`;
//! ibnet uses NCCL 2.28's 20, 0, -1 (auto), -1 and -1 (from the comm config, else 0).

use core::net::{Ipv4Addr, Ipv6Addr};
use core::str::FromStr;

use crate::config::{self, Reader, Value};
use crate::error::{Error, Result};
use crate::hca::HcaFilter;
use crate::provider::{Gid, LinkLayer};

pub use crate::config::nccl_ib::{HCA_MAX_LEN, IFNAME_MAX_LEN};
pub use crate::config::parse_int;

/// A value of another kind than the table declares (a table bug the tests catch).
const KIND: &str = "value of the wrong kind for this variable";

/// NCCL's "no traffic class in the comm config" (`NCCL_NET_TRAFFIC_CLASS_UNDEF`).
pub const TRAFFIC_CLASS_UNDEF: i32 = -1;

/// An address family, as `NCCL_IB_ADDR_FAMILY` and `NCCL_SOCKET_FAMILY` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrFamily {
    /// `AF_INET` (IPv4).
    Inet,
    /// `AF_INET6` (IPv6).
    Inet6,
}

impl AddrFamily {
    fn parse(v: &str) -> Option<Self> {
        match v {
            "AF_INET" => Some(Self::Inet),
            "AF_INET6" => Some(Self::Inet6),
            _ => None,
        }
    }
}

/// A subnet `addr/prefix` (`NCCL_IB_ADDR_RANGE`), used to pick a RoCE GID automatically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrRange {
    /// The family the address was written in.
    pub family: AddrFamily,
    /// The address: IPv4 in the first 4 bytes (rest zero), or IPv6.
    pub addr: [u8; 16],
    /// Prefix length: ≤ 32 for IPv4, ≤ 128 for IPv6.
    pub prefix_len: u8,
}

impl AddrRange {
    /// Parses `a.b.c.d/n` or `ipv6/n`.
    pub fn parse(v: &str) -> core::result::Result<Self, &'static str> {
        let (a, n) = v.split_once('/').ok_or("expected ADDRESS/PREFIX")?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.len() > 3 {
            return Err("prefix length is not a decimal number");
        }
        let prefix_len: u8 = n
            .parse()
            .map_err(|_| "prefix length is not a decimal number")?;
        let mut addr = [0u8; 16];
        let family = if let Ok(v4) = Ipv4Addr::from_str(a) {
            addr[..4].copy_from_slice(&v4.octets());
            if prefix_len > 32 {
                return Err("IPv4 prefix length above 32");
            }
            AddrFamily::Inet
        } else if let Ok(v6) = Ipv6Addr::from_str(a) {
            addr = v6.octets();
            if prefix_len > 128 {
                return Err("IPv6 prefix length above 128");
            }
            AddrFamily::Inet6
        } else {
            return Err("not an IPv4 or IPv6 address");
        };
        Ok(Self {
            family,
            addr,
            prefix_len,
        })
    }

    /// Whether a GID lies in the range: an IPv4 range is compared with the GID's last 4 bytes
    /// (an IPv4-mapped RoCE v2 GID), an IPv6 range with all 16 bytes, as NCCL does.
    pub fn contains_gid(&self, gid: &Gid) -> bool {
        let (ours, theirs): (&[u8], &[u8]) = match self.family {
            AddrFamily::Inet => (&self.addr[..4], &gid.0[12..]),
            AddrFamily::Inet6 => (&self.addr[..], &gid.0[..]),
        };
        let full = usize::from(self.prefix_len / 8);
        let rest = self.prefix_len % 8;
        if ours[..full] != theirs[..full] {
            return false;
        }
        if rest == 0 {
            return true;
        }
        let mask = 0xFFu8 << (8 - rest);
        ours[full] & mask == theirs[full] & mask
    }
}

/// `NCCL_IB_PCI_RELAXED_ORDERING`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelaxedOrdering {
    /// 0: never.
    Off,
    /// 1: whenever the provider supports it.
    On,
    /// 2 (default): when supported, NCCL's automatic choice.
    Auto,
}

/// `IBNET_PROVIDER`: which RDMA provider the plugin uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// `verbs`: libibverbs only.
    Verbs,
    /// `soft`: the software provider only.
    Soft,
    /// `auto` (default): verbs devices if any, else none. Never the software provider,
    /// which serves one host only: it is used only when asked for by name.
    Auto,
}

/// Every variable the plugin stores, typed. `Default` gives the defaults the configuration
/// table declares ([`crate::config`]).
///
/// Fields are public for reading and for tests; [`Params::set`] is the validating way in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// `NCCL_IB_HCA` as written (default empty: every device). Grammar in [`crate::hca`].
    pub ib_hca: heapless::String<HCA_MAX_LEN>,
    /// `NCCL_IB_HCA` parsed, once, by [`Params::set`] (the value every user applies).
    pub hca: HcaFilter,
    /// `NCCL_IB_GID_INDEX`: `None` (-1, default) selects the GID automatically.
    pub ib_gid_index: Option<u8>,
    /// `NCCL_IB_ROCE_VERSION_NUM` (1 or 2, default 2) for GID auto-selection.
    pub ib_roce_version_num: u8,
    /// `NCCL_IB_ADDR_FAMILY` for GID auto-selection: `None` when the user did not set it
    /// ([`Params::addr_family`]: `AF_INET`, NCCL's default; auto-selection then falls back
    /// as NCCL does, `crate::policy::gid`).
    pub ib_addr_family: Option<AddrFamily>,
    /// `NCCL_IB_ADDR_RANGE` (default unset, i.e. `::/0`: any GID).
    pub ib_addr_range: Option<AddrRange>,
    /// `NCCL_IB_TIMEOUT`, 0..=31 (4.096 µs × 2^t). Default 20 (NCCL ≥ 2.23; the seed has 18).
    pub ib_timeout: u8,
    /// `NCCL_IB_RETRY_CNT`, 0..=7, default 7.
    pub ib_retry_cnt: u8,
    /// `NCCL_IB_PKEY`: partition key index, default 0.
    pub ib_pkey: u16,
    /// `NCCL_IB_USE_INLINE`: post FIFO elements inline (default off).
    pub ib_use_inline: bool,
    /// `NCCL_IB_SL`, 0..=15; `None` (-1, default): the comm config's traffic class, else 0.
    pub ib_sl: Option<u8>,
    /// `NCCL_IB_TC`, 0..=255; `None` (-1, default): the comm config's traffic class, else 0.
    pub ib_tc: Option<u8>,
    /// `NCCL_IB_FIFO_TC`, 0..=255: traffic class of the FIFO (CTS) writes on RoCE;
    /// `None` (-1, default): the data traffic class.
    pub ib_fifo_tc: Option<u8>,
    /// `NCCL_IB_AR_THRESHOLD`: sends of at least this many bytes write data and immediate
    /// separately when adaptive routing is on (default 8192).
    pub ib_ar_threshold: u64,
    /// `NCCL_IB_ADAPTIVE_ROUTING`: `None` (-2, default) is on for InfiniBand, off for RoCE.
    pub ib_adaptive_routing: Option<bool>,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (default 2, auto).
    pub ib_pci_relaxed_ordering: RelaxedOrdering,
    /// `NCCL_IB_QPS_PER_CONNECTION`, 1..=128 ([`crate::wire::MAX_QPS`]), default 1.
    pub ib_qps_per_connection: u8,
    /// `NCCL_IB_SPLIT_DATA_ON_QPS`: chunk each message over all QPs. Default off (NCCL ≥ 2.20;
    /// the seed has 1).
    pub ib_split_data_on_qps: bool,
    /// `NCCL_IB_DISABLE` (default off).
    pub ib_disable: bool,
    /// `NCCL_IB_MERGE_VFS`: merge virtual functions with their physical device (default on).
    pub ib_merge_vfs: bool,
    /// `NCCL_IB_MERGE_NICS`: `makeVDevice` may fuse several physical devices into one virtual
    /// NIC (default on, as NCCL 2.28; off: a vNIC of more than one device is refused).
    pub ib_merge_nics: bool,
    /// `NCCL_IB_WARN_RAIL_LOCAL`: one INFO line when a connection's accepting side finds the
    /// peer's physical device numbers are not its own, fused or not (default off, as NCCL 2.28).
    pub ib_warn_rail_local: bool,
    /// `NCCL_IB_SOCK_CLIENT_PORT_REUSE` (default off).
    pub ib_sock_client_port_reuse: bool,
    /// `NCCL_IB_SOCK_SERVER_PORT_REUSE` (default off): the listen comms of one thread share
    /// one listening port, connections routed by the nonce of the handle (`ffi`'s listen).
    pub ib_sock_server_port_reuse: bool,
    /// `NCCL_IB_RETURN_ASYNC_EVENTS`: fatal async events fail the comm (default on).
    pub ib_return_async_events: bool,
    /// `NCCL_IB_ECE_ENABLE` (default on).
    pub ib_ece_enable: bool,
    /// `NCCL_IB_MQP_RETRY_ALL`: retry every failed `ibv_modify_qp`, not only ETIMEDOUT
    /// (default off).
    pub ib_mqp_retry_all: bool,
    /// `NCCL_IB_MQP_RETRY_CNT` (default 34).
    pub ib_mqp_retry_cnt: u32,
    /// `NCCL_IB_MQP_RETRY_SLEEP_MSEC` (default 100).
    pub ib_mqp_retry_sleep_msec: u32,
    /// `NCCL_IB_ROUTABLE_FLID_GID_INDEX` (default 1): on InfiniBand, the GID index used when
    /// its GID carries a routable FLID, else index 0.
    pub ib_routable_flid_gid_index: u8,
    /// `NCCL_IB_SUBNET_AWARE_ROUTING` (default off): `listen` advertises its RoCE GIDs and
    /// `connect` may use another local device on their subnet (`crate::policy::subnet`).
    pub ib_subnet_aware_routing: bool,
    /// `NCCL_IB_SUBNET_PREFIX_LEN`, 1..=32 (default 24): the subnet bits of an IPv4-mapped GID.
    pub ib_subnet_prefix_len: u8,
    /// `NCCL_GDR_FLUSH_DISABLE` (default off).
    pub gdr_flush_disable: bool,
    /// `NCCL_DMABUF_ENABLE` (default on).
    pub dmabuf_enable: bool,
    /// `NCCL_SOCKET_IFNAME` (default empty: NCCL's interface preference order). Same grammar
    /// as `NCCL_IB_HCA`, without ports.
    pub socket_ifname: heapless::String<IFNAME_MAX_LEN>,
    /// `NCCL_SOCKET_IFNAME` parsed, once, by [`Params::set`].
    pub ifname: HcaFilter,
    /// `NCCL_SOCKET_FAMILY` (default unset: any).
    pub socket_family: Option<AddrFamily>,
    /// `IBNET_PROVIDER` (`verbs|soft|auto`, default `auto`).
    pub provider: ProviderKind,
    /// `NCCL_IB_DEVICE_PCI_ORDER` (NCCL 2.29, default on): number devices in PCI-path order.
    /// Read through [`Params::device_pci_order`] by verbs discovery.
    pub ib_device_pci_order: bool,
    /// `NCCL_IB_QUERY_PORT_SPEED` (NCCL 2.30, default on): take the port speed from
    /// `ibv_query_port_speed`. Read through [`Params::query_port_speed`] by verbs discovery.
    pub ib_query_port_speed: bool,
    /// `IBNET_HANDSHAKE_TIMEOUT`: seconds a started handshake may stall before connect/accept
    /// fail (default 60).
    pub handshake_timeout_s: u64,
    /// `IBNET_STALL_WARN`: seconds a data-path call may wait on a live peer before one WARN
    /// names it; 0: never (default 60). A stall is no error: the wait goes on.
    pub stall_warn_s: u64,
    /// `IBNET_FORCE_FLUSH` (test and diagnosis): receive comms flush with an RDMA READ even
    /// when no GPU-direct is in use, so `iflush` can be exercised on host memory.
    pub force_flush: bool,
    /// `IBNET_FAULT_RO_EINVAL` (tests only): act as if the driver refused a relaxed-ordering
    /// registration with EINVAL, exercising the fallback to a plain registration.
    pub fault_ro_einval: bool,
    /// `IBNET_FAULT_MQP_ETIMEDOUT=N` (tests only): the first `N` `ibv_modify_qp` calls of the
    /// process fail with ETIMEDOUT before reaching the driver, exercising the retry.
    pub fault_mqp_etimedout: u32,
    /// `IBNET_SOFT_DEVICES` (1..=8, default 1): with `IBNET_PROVIDER=soft`, open `soft0` ..
    /// `soft{N-1}`, each its own provider instance (fused-NIC tests on one host).
    pub soft_devices: u8,
    /// `IBNET_SOFT_FAULTS_DEV=N` (tests only): `IBNET_SOFT_FAULTS` arms only `softN` (unset:
    /// every soft device), so one rail of a fused NIC can fail.
    pub soft_faults_dev: Option<u8>,
    // --- resiliency (NCCL 2.29+ `p2p_resiliency*.cc`; one block, see `crate::fused`) ---
    /// `NCCL_IB_RESILIENCY_PORT_FAILOVER` (NCCL 2.29+): fail a fused NIC's failed rail over to
    /// its other rails. `None` (unset): on, ibnet's default (NCCL's is 0).
    pub ib_resiliency_port_failover: Option<bool>,
    /// `NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS` (NCCL 2.29+, its default 1): failed
    /// attempts at one message before the comm fails. `None` (unset): no limit.
    pub ib_resiliency_port_failover_max_attempts: Option<u32>,
    /// `NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY` (NCCL 2.29+, ms, its default 10): wait
    /// after a failure before the lost parts go again. `None` (unset): 0.
    pub ib_resiliency_port_failover_probe_delay: Option<u64>,
    /// `NCCL_IB_RESILIENCY_PORT_RECOVERY` (NCCL 2.30+, default off): failback of a failed
    /// rail once both ends see it healthy.
    pub ib_resiliency_port_recovery: bool,
    /// `NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY` (ms, default 200): from a rail's
    /// failure to its first recovery attempt.
    pub ib_resiliency_port_recovery_start_delay: u64,
    /// `NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX` (default 5): recovery attempts of one
    /// rail before it stays out for good.
    pub ib_resiliency_port_recovery_attempts_max: u32,
    /// `NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT` (ms, default 5000): how long one
    /// recovery attempt waits for the peer before it counts as failed.
    pub ib_resiliency_port_recovery_ack_timeout: u64,
}

impl Default for Params {
    /// The table's defaults: each plugin variable's declared default applied through
    /// [`Params::set`] over every field unset (a test checks that every one applies).
    fn default() -> Self {
        let mut p = Self::unset();
        for v in config::all().filter(|v| v.reader == Reader::Plugin && !v.default.is_empty()) {
            let _ = p.set(v.name, v.default);
        }
        p
    }
}

impl Params {
    /// Every field at its "unset" value (empty, `None`, false, 0); [`Params::default`] then
    /// applies the table's defaults.
    fn unset() -> Self {
        Self {
            ib_hca: heapless::String::new(),
            hca: HcaFilter::default(),
            ib_gid_index: None,
            ib_roce_version_num: 0,
            ib_addr_family: None,
            ib_addr_range: None,
            ib_timeout: 0,
            ib_retry_cnt: 0,
            ib_pkey: 0,
            ib_use_inline: false,
            ib_sl: None,
            ib_tc: None,
            ib_fifo_tc: None,
            ib_ar_threshold: 0,
            ib_adaptive_routing: None,
            ib_pci_relaxed_ordering: RelaxedOrdering::Off,
            ib_qps_per_connection: 0,
            ib_split_data_on_qps: false,
            ib_disable: false,
            ib_merge_vfs: false,
            ib_merge_nics: false,
            ib_warn_rail_local: false,
            ib_sock_client_port_reuse: false,
            ib_sock_server_port_reuse: false,
            ib_return_async_events: false,
            ib_ece_enable: false,
            ib_mqp_retry_all: false,
            ib_mqp_retry_cnt: 0,
            ib_mqp_retry_sleep_msec: 0,
            ib_routable_flid_gid_index: 0,
            ib_subnet_aware_routing: false,
            ib_subnet_prefix_len: 0,
            gdr_flush_disable: false,
            dmabuf_enable: false,
            socket_ifname: heapless::String::new(),
            ifname: HcaFilter::default(),
            socket_family: None,
            provider: ProviderKind::Auto,
            ib_device_pci_order: false,
            ib_query_port_speed: false,
            handshake_timeout_s: 0,
            stall_warn_s: 0,
            force_flush: false,
            fault_ro_einval: false,
            fault_mqp_etimedout: 0,
            soft_devices: 0,
            soft_faults_dev: None,
            ib_resiliency_port_failover: None,
            ib_resiliency_port_failover_max_attempts: None,
            ib_resiliency_port_failover_probe_delay: None,
            ib_resiliency_port_recovery: false,
            ib_resiliency_port_recovery_start_delay: 0,
            ib_resiliency_port_recovery_attempts_max: 0,
            ib_resiliency_port_recovery_ack_timeout: 0,
        }
    }

    /// Sets the variable `name` from its string `value`.
    ///
    /// Returns `Ok(true)` when set, `Ok(false)` when `name` is not a variable the plugin
    /// stores (not in [`crate::config`], or read by someone else: the params are unchanged),
    /// and [`Error::Param`] naming the variable when `value` is malformed: empty, not a
    /// number, trailing junk, out of the table's range, too long, or not one of the accepted
    /// words. On error the field keeps its previous value.
    ///
    /// NCCL treats an empty variable as unset; callers should skip empty values. `set`
    /// rejects them so that a caller which passes one learns about it.
    pub fn set(&mut self, name: &str, value: &str) -> Result<bool> {
        let Some(var) = config::find(name).filter(|v| v.reader == Reader::Plugin) else {
            return Ok(false);
        };
        let name = var.name;
        let err = |reason| Error::Param { name, reason };
        let v = var.kind.parse(value).map_err(err)?;
        let stored = self.store_ib(name, v).map_err(err)?
            || self.store_qp(name, v).map_err(err)?
            || self.store_resiliency(name, v).map_err(err)?
            || self.store_other(name, v).map_err(err)?;
        debug_assert!(
            stored,
            "{name} is read by the plugin but no store_* keeps it"
        );
        Ok(true)
    }

    /// The device-selection and addressing variables. `Ok(false)`: not one of them.
    fn store_ib(&mut self, name: &str, v: Value<'_>) -> core::result::Result<bool, &'static str> {
        let Some(int) = v.int() else {
            return self.store_ib_text(name, v);
        };
        match name {
            "NCCL_IB_GID_INDEX" => self.ib_gid_index = u8::try_from(int).ok(),
            "NCCL_IB_ROCE_VERSION_NUM" => self.ib_roce_version_num = int as u8,
            "NCCL_IB_PKEY" => self.ib_pkey = int as u16,
            "NCCL_IB_DISABLE" => self.ib_disable = int != 0,
            "NCCL_IB_MERGE_VFS" => self.ib_merge_vfs = int != 0,
            "NCCL_IB_MERGE_NICS" => self.ib_merge_nics = int != 0,
            "NCCL_IB_WARN_RAIL_LOCAL" => self.ib_warn_rail_local = int != 0,
            "NCCL_IB_DEVICE_PCI_ORDER" => self.ib_device_pci_order = int != 0,
            "NCCL_IB_QUERY_PORT_SPEED" => self.ib_query_port_speed = int != 0,
            "NCCL_IB_ROUTABLE_FLID_GID_INDEX" => self.ib_routable_flid_gid_index = int as u8,
            "NCCL_IB_SUBNET_AWARE_ROUTING" => self.ib_subnet_aware_routing = int != 0,
            "NCCL_IB_SUBNET_PREFIX_LEN" => self.ib_subnet_prefix_len = int as u8,
            "NCCL_IB_PCI_RELAXED_ORDERING" => {
                self.ib_pci_relaxed_ordering = match int {
                    0 => RelaxedOrdering::Off,
                    1 => RelaxedOrdering::On,
                    _ => RelaxedOrdering::Auto,
                };
            }
            "NCCL_DMABUF_ENABLE" => self.dmabuf_enable = int != 0,
            "NCCL_GDR_FLUSH_DISABLE" => self.gdr_flush_disable = int != 0,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The device-selection variables written as text. `Ok(false)`: not one of them.
    fn store_ib_text(
        &mut self,
        name: &str,
        v: Value<'_>,
    ) -> core::result::Result<bool, &'static str> {
        let text = || v.text().ok_or(KIND);
        match name {
            "NCCL_IB_HCA" => {
                // Never an error but for its length: entries that are not well formed are
                // `self.hca.malformed()`, each reported once by ffi, and the rest applies.
                let t = text()?;
                self.ib_hca = heapless::String::try_from(t).map_err(|_| "too long")?;
                self.hca = HcaFilter::parse(t);
            }
            "NCCL_IB_ADDR_FAMILY" => {
                self.ib_addr_family = Some(AddrFamily::parse(text()?).ok_or(KIND)?);
            }
            "NCCL_IB_ADDR_RANGE" => self.ib_addr_range = Some(AddrRange::parse(text()?)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The QP and data-path variables. `Ok(false)`: not one of them.
    fn store_qp(&mut self, name: &str, v: Value<'_>) -> core::result::Result<bool, &'static str> {
        let Some(int) = v.int() else {
            return Ok(false);
        };
        match name {
            "NCCL_IB_TIMEOUT" => self.ib_timeout = int as u8,
            "NCCL_IB_RETRY_CNT" => self.ib_retry_cnt = int as u8,
            "NCCL_IB_USE_INLINE" => self.ib_use_inline = int != 0,
            "NCCL_IB_SL" => self.ib_sl = u8::try_from(int).ok(),
            "NCCL_IB_TC" => self.ib_tc = u8::try_from(int).ok(),
            "NCCL_IB_FIFO_TC" => self.ib_fifo_tc = u8::try_from(int).ok(),
            "NCCL_IB_AR_THRESHOLD" => self.ib_ar_threshold = int as u64,
            "NCCL_IB_ADAPTIVE_ROUTING" => {
                self.ib_adaptive_routing = (int != -2).then_some(int != 0);
            }
            "NCCL_IB_QPS_PER_CONNECTION" => self.ib_qps_per_connection = int as u8,
            "NCCL_IB_SPLIT_DATA_ON_QPS" => self.ib_split_data_on_qps = int != 0,
            "NCCL_IB_SOCK_CLIENT_PORT_REUSE" => self.ib_sock_client_port_reuse = int != 0,
            "NCCL_IB_SOCK_SERVER_PORT_REUSE" => self.ib_sock_server_port_reuse = int != 0,
            "NCCL_IB_RETURN_ASYNC_EVENTS" => self.ib_return_async_events = int != 0,
            "NCCL_IB_ECE_ENABLE" => self.ib_ece_enable = int != 0,
            "NCCL_IB_MQP_RETRY_ALL" => self.ib_mqp_retry_all = int != 0,
            "NCCL_IB_MQP_RETRY_CNT" => self.ib_mqp_retry_cnt = int as u32,
            "NCCL_IB_MQP_RETRY_SLEEP_MSEC" => self.ib_mqp_retry_sleep_msec = int as u32,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// NCCL's port failover and failback (`crate::fused::Resilience` reads them). Failover's
    /// three are kept as "set or not": unset, ibnet's defaults apply (the table's doc lines).
    /// `Ok(false)`: not one of them.
    fn store_resiliency(
        &mut self,
        name: &str,
        v: Value<'_>,
    ) -> core::result::Result<bool, &'static str> {
        let Some(int) = v.int() else {
            return Ok(false);
        };
        match name {
            "NCCL_IB_RESILIENCY_PORT_FAILOVER" => self.ib_resiliency_port_failover = Some(int != 0),
            "NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS" => {
                self.ib_resiliency_port_failover_max_attempts = Some(int as u32);
            }
            "NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY" => {
                self.ib_resiliency_port_failover_probe_delay = Some(int as u64);
            }
            "NCCL_IB_RESILIENCY_PORT_RECOVERY" => self.ib_resiliency_port_recovery = int != 0,
            "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY" => {
                self.ib_resiliency_port_recovery_start_delay = int as u64;
            }
            "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX" => {
                self.ib_resiliency_port_recovery_attempts_max = int as u32;
            }
            "NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT" => {
                self.ib_resiliency_port_recovery_ack_timeout = int as u64;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The bootstrap's and ibnet's own variables. `Ok(false)`: not one of them.
    fn store_other(
        &mut self,
        name: &str,
        v: Value<'_>,
    ) -> core::result::Result<bool, &'static str> {
        let int = || v.int().ok_or(KIND);
        let text = || v.text().ok_or(KIND);
        match name {
            "NCCL_SOCKET_IFNAME" => {
                let t = text()?;
                let f = HcaFilter::parse_names(t).map_err(|e| match e {
                    Error::Param { reason, .. } => reason,
                    _ => "malformed",
                })?;
                self.socket_ifname = heapless::String::try_from(t).map_err(|_| "too long")?;
                self.ifname = f;
            }
            "NCCL_SOCKET_FAMILY" => {
                self.socket_family = Some(AddrFamily::parse(text()?).ok_or(KIND)?);
            }
            "IBNET_PROVIDER" => {
                self.provider = match text()? {
                    "verbs" => ProviderKind::Verbs,
                    "soft" => ProviderKind::Soft,
                    _ => ProviderKind::Auto,
                };
            }
            "IBNET_HANDSHAKE_TIMEOUT" => self.handshake_timeout_s = int()? as u64,
            "IBNET_STALL_WARN" => self.stall_warn_s = int()? as u64,
            "IBNET_FORCE_FLUSH" => self.force_flush = int()? != 0,
            "IBNET_FAULT_RO_EINVAL" => self.fault_ro_einval = int()? != 0,
            "IBNET_FAULT_MQP_ETIMEDOUT" => self.fault_mqp_etimedout = int()? as u32,
            "IBNET_SOFT_DEVICES" => self.soft_devices = int()? as u8,
            "IBNET_SOFT_FAULTS_DEV" => self.soft_faults_dev = Some(int()? as u8),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `NCCL_IB_DEVICE_PCI_ORDER`: whether verbs discovery numbers devices in PCI-path order
    /// (NCCL 2.29+), not libibverbs' order.
    pub fn device_pci_order(&self) -> bool {
        self.ib_device_pci_order
    }

    /// `NCCL_IB_QUERY_PORT_SPEED`: whether verbs discovery may take a port's speed from
    /// `ibv_query_port_speed` (NCCL 2.30+) rather than width × lane speed.
    pub fn query_port_speed(&self) -> bool {
        self.ib_query_port_speed
    }

    /// The parsed `NCCL_IB_HCA` filter (empty: every device).
    pub fn hca_filter(&self) -> &HcaFilter {
        &self.hca
    }

    /// The parsed `NCCL_SOCKET_IFNAME` filter (empty: any interface).
    pub fn socket_ifname_filter(&self) -> &HcaFilter {
        &self.ifname
    }

    /// Whether adaptive routing is on for a port with this link layer: the explicit setting,
    /// else on for InfiniBand and off for RoCE.
    pub fn adaptive_routing(&self, link_layer: LinkLayer) -> bool {
        self.ib_adaptive_routing
            .unwrap_or(link_layer == LinkLayer::Infiniband)
    }

    /// The service level a sender asks for, as NCCL 2.28 resolves it: `NCCL_IB_SL` when set,
    /// else the comm config's traffic class (see [`config_traffic_class`]), else 0. The
    /// config value is masked to the 4 bits an SL has, as the hardware does.
    pub fn sl(&self, config_tc: Option<u8>) -> u8 {
        self.ib_sl
            .unwrap_or_else(|| config_tc.map_or(0, |tc| tc & 0x0F))
    }

    /// The traffic class a sender asks for: `NCCL_IB_TC` when set, else the comm config's
    /// traffic class, else 0 (NCCL 2.28).
    pub fn tc(&self, config_tc: Option<u8>) -> u8 {
        self.ib_tc.unwrap_or_else(|| config_tc.unwrap_or(0))
    }

    /// The traffic class the receiver applies to its QPs (which carry the FIFO writes): on
    /// RoCE `NCCL_IB_FIFO_TC` when set, otherwise the sender's requested `remote_tc`.
    pub fn fifo_tc(&self, link_layer: LinkLayer, remote_tc: u8) -> u8 {
        fifo_qp_tc(link_layer, self.ib_fifo_tc, remote_tc)
    }

    /// The `NCCL_IB_ADDR_RANGE` that GID auto-selection applies: NCCL parses the range in the
    /// family of `NCCL_IB_ADDR_FAMILY` and ignores a range of the other family; `None` means
    /// "any GID".
    pub fn gid_addr_range(&self) -> Option<AddrRange> {
        self.ib_addr_range
            .filter(|r| r.family == self.addr_family())
    }

    /// The `NCCL_IB_ADDR_FAMILY` GID auto-selection looks for: the user's, else `AF_INET`
    /// (NCCL's default).
    pub fn addr_family(&self) -> AddrFamily {
        self.ib_addr_family.unwrap_or(AddrFamily::Inet)
    }
}

/// The traffic class of the receiver's QPs (they post the clear-to-send writes): on RoCE
/// `NCCL_IB_FIFO_TC` when set, else the sender's `tc`, as NCCL 2.28 sets the GRH of the
/// QPs that carry the FIFO writes. A traffic class is a per-QP attribute in verbs, so this is
/// the class of everything those QPs send (FIFO writes and their acks).
pub fn fifo_qp_tc(link_layer: LinkLayer, fifo_tc: Option<u8>, tc: u8) -> u8 {
    match (link_layer, fifo_tc) {
        (LinkLayer::Ethernet, Some(f)) => f,
        _ => tc,
    }
}

/// Converts the traffic class of an NCCL v10/v11 comm config (`int`, -1 undefined) for
/// [`Params::sl`] and [`Params::tc`]. Values outside -1..=255 are an [`Error::OutOfRange`].
pub fn config_traffic_class(raw: i32) -> Result<Option<u8>> {
    if raw == TRAFFIC_CLASS_UNDEF {
        return Ok(None);
    }
    u8::try_from(raw).map(Some).map_err(|_| Error::OutOfRange {
        what: "comm config trafficClass",
        value: raw.into(),
        min: -1,
        max: 255,
    })
}

#[cfg(test)]
mod tests;
