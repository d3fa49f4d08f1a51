//! NCCL's IB variables (and ibnet's own `IBNET_*`), typed, with NCCL 2.28 defaults.
//!
//! The core reads no environment. `ibnet-ffi` reads each name in [`Params::NAMES`] once and
//! feeds the non-empty values to [`Params::set`]; a value that `set` rejects is logged as a WARN
//! naming the variable, and the default stands (so an existing job's settings carry over, and a
//! typo never aborts a job).
//!
//! ```text
//!  ffi:  for name in Params::NAMES { if let Some(v) = getenv(name) { p.set(name, v) -> WARN on Err } }
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

use crate::error::{Error, Result};
use crate::hca::HcaFilter;
use crate::provider::{Gid, LinkLayer};
use crate::wire::MAX_QPS;

/// Longest accepted `NCCL_IB_HCA` value, in bytes.
pub const HCA_MAX_LEN: usize = 512;
/// Longest accepted `NCCL_SOCKET_IFNAME` value, in bytes.
pub const IFNAME_MAX_LEN: usize = 256;
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

/// Every tunable ibnet reads, typed. `Default` gives NCCL 2.28's defaults.
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
    /// `NCCL_IB_ADDR_FAMILY` (default `AF_INET`) for GID auto-selection.
    pub ib_addr_family: AddrFamily,
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
    /// `NCCL_IB_QPS_PER_CONNECTION`, 1..=128 ([`MAX_QPS`]), default 1.
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
    /// Which of [`RECOVERY_ALIVE_MSG`] are set (bit `i`: entry `i`, a valid integer): they
    /// have no counterpart in ibnet (its probe is one RDMA READ over the returning rail), so
    /// `ffi` refuses each with one WARN.
    pub ib_resiliency_port_recovery_alive_msg: u8,
}

/// NCCL 2.30's `NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_*`: the batches of alive messages
/// NCCL sends over a recovering port. ibnet proves a returning rail with one RDMA READ over it
/// instead (`crate::fused::heal`): read, and refused.
pub const RECOVERY_ALIVE_MSG: [&str; 4] = [
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_INTERVAL",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_SEQUENCE_SIZE",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT",
];

impl Default for Params {
    fn default() -> Self {
        Self {
            ib_hca: heapless::String::new(),
            hca: HcaFilter::default(),
            ib_gid_index: None,
            ib_roce_version_num: 2,
            ib_addr_family: AddrFamily::Inet,
            ib_addr_range: None,
            ib_timeout: 20,
            ib_retry_cnt: 7,
            ib_pkey: 0,
            ib_use_inline: false,
            ib_sl: None,
            ib_tc: None,
            ib_fifo_tc: None,
            ib_ar_threshold: 8192,
            ib_adaptive_routing: None,
            ib_pci_relaxed_ordering: RelaxedOrdering::Auto,
            ib_qps_per_connection: 1,
            ib_split_data_on_qps: false,
            ib_disable: false,
            ib_merge_vfs: true,
            ib_merge_nics: true,
            ib_warn_rail_local: false,
            ib_sock_client_port_reuse: false,
            ib_sock_server_port_reuse: false,
            ib_return_async_events: true,
            ib_ece_enable: true,
            ib_mqp_retry_all: false,
            ib_mqp_retry_cnt: 34,
            ib_mqp_retry_sleep_msec: 100,
            ib_routable_flid_gid_index: 1,
            gdr_flush_disable: false,
            dmabuf_enable: true,
            socket_ifname: heapless::String::new(),
            ifname: HcaFilter::default(),
            socket_family: None,
            provider: ProviderKind::Auto,
            ib_resiliency_port_failover: None,
            ib_resiliency_port_failover_max_attempts: None,
            ib_resiliency_port_failover_probe_delay: None,
            ib_resiliency_port_recovery: false,
            ib_resiliency_port_recovery_start_delay: 200,
            ib_resiliency_port_recovery_attempts_max: 5,
            ib_resiliency_port_recovery_ack_timeout: 5000,
            ib_resiliency_port_recovery_alive_msg: 0,
        }
    }
}

/// Which field a name sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    IbHca,
    IbGidIndex,
    IbRoceVersionNum,
    IbAddrFamily,
    IbAddrRange,
    IbTimeout,
    IbRetryCnt,
    IbPkey,
    IbUseInline,
    IbSl,
    IbTc,
    IbFifoTc,
    IbArThreshold,
    IbAdaptiveRouting,
    IbPciRelaxedOrdering,
    IbQpsPerConnection,
    IbSplitDataOnQps,
    IbDisable,
    IbMergeVfs,
    IbMergeNics,
    IbWarnRailLocal,
    IbSockClientPortReuse,
    IbSockServerPortReuse,
    IbReturnAsyncEvents,
    IbEceEnable,
    IbMqpRetryAll,
    IbMqpRetryCnt,
    IbMqpRetrySleepMsec,
    IbRoutableFlidGidIndex,
    GdrFlushDisable,
    DmabufEnable,
    SocketIfname,
    SocketFamily,
    Provider,
    IbResiliencyPortFailover,
    IbResiliencyPortFailoverMaxAttempts,
    IbResiliencyPortFailoverProbeDelay,
    IbResiliencyPortRecovery,
    IbResiliencyPortRecoveryStartDelay,
    IbResiliencyPortRecoveryAttemptsMax,
    IbResiliencyPortRecoveryAckTimeout,
    IbResiliencyPortRecoveryAliveMsg(u8),
}

/// The one table of names: [`Params::NAMES`] and [`Params::set`] both come from it.
const FIELDS: [(&str, Field); 45] = [
    ("NCCL_IB_HCA", Field::IbHca),
    ("NCCL_IB_GID_INDEX", Field::IbGidIndex),
    ("NCCL_IB_ROCE_VERSION_NUM", Field::IbRoceVersionNum),
    ("NCCL_IB_ADDR_FAMILY", Field::IbAddrFamily),
    ("NCCL_IB_ADDR_RANGE", Field::IbAddrRange),
    ("NCCL_IB_TIMEOUT", Field::IbTimeout),
    ("NCCL_IB_RETRY_CNT", Field::IbRetryCnt),
    ("NCCL_IB_PKEY", Field::IbPkey),
    ("NCCL_IB_USE_INLINE", Field::IbUseInline),
    ("NCCL_IB_SL", Field::IbSl),
    ("NCCL_IB_TC", Field::IbTc),
    ("NCCL_IB_FIFO_TC", Field::IbFifoTc),
    ("NCCL_IB_AR_THRESHOLD", Field::IbArThreshold),
    ("NCCL_IB_ADAPTIVE_ROUTING", Field::IbAdaptiveRouting),
    ("NCCL_IB_PCI_RELAXED_ORDERING", Field::IbPciRelaxedOrdering),
    ("NCCL_IB_QPS_PER_CONNECTION", Field::IbQpsPerConnection),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", Field::IbSplitDataOnQps),
    ("NCCL_IB_DISABLE", Field::IbDisable),
    ("NCCL_IB_MERGE_VFS", Field::IbMergeVfs),
    ("NCCL_IB_MERGE_NICS", Field::IbMergeNics),
    ("NCCL_IB_WARN_RAIL_LOCAL", Field::IbWarnRailLocal),
    (
        "NCCL_IB_SOCK_CLIENT_PORT_REUSE",
        Field::IbSockClientPortReuse,
    ),
    (
        "NCCL_IB_SOCK_SERVER_PORT_REUSE",
        Field::IbSockServerPortReuse,
    ),
    ("NCCL_IB_RETURN_ASYNC_EVENTS", Field::IbReturnAsyncEvents),
    ("NCCL_IB_ECE_ENABLE", Field::IbEceEnable),
    ("NCCL_IB_MQP_RETRY_ALL", Field::IbMqpRetryAll),
    ("NCCL_IB_MQP_RETRY_CNT", Field::IbMqpRetryCnt),
    ("NCCL_IB_MQP_RETRY_SLEEP_MSEC", Field::IbMqpRetrySleepMsec),
    (
        "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
        Field::IbRoutableFlidGidIndex,
    ),
    ("NCCL_GDR_FLUSH_DISABLE", Field::GdrFlushDisable),
    ("NCCL_DMABUF_ENABLE", Field::DmabufEnable),
    ("NCCL_SOCKET_IFNAME", Field::SocketIfname),
    ("NCCL_SOCKET_FAMILY", Field::SocketFamily),
    ("IBNET_PROVIDER", Field::Provider),
    (
        "NCCL_IB_RESILIENCY_PORT_FAILOVER",
        Field::IbResiliencyPortFailover,
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS",
        Field::IbResiliencyPortFailoverMaxAttempts,
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY",
        Field::IbResiliencyPortFailoverProbeDelay,
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY",
        Field::IbResiliencyPortRecovery,
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY",
        Field::IbResiliencyPortRecoveryStartDelay,
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX",
        Field::IbResiliencyPortRecoveryAttemptsMax,
    ),
    (
        "NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT",
        Field::IbResiliencyPortRecoveryAckTimeout,
    ),
    (
        RECOVERY_ALIVE_MSG[0],
        Field::IbResiliencyPortRecoveryAliveMsg(0),
    ),
    (
        RECOVERY_ALIVE_MSG[1],
        Field::IbResiliencyPortRecoveryAliveMsg(1),
    ),
    (
        RECOVERY_ALIVE_MSG[2],
        Field::IbResiliencyPortRecoveryAliveMsg(2),
    ),
    (
        RECOVERY_ALIVE_MSG[3],
        Field::IbResiliencyPortRecoveryAliveMsg(3),
    ),
];

const fn names() -> [&'static str; FIELDS.len()] {
    let mut out = [""; FIELDS.len()];
    let mut i = 0;
    while i < FIELDS.len() {
        out[i] = FIELDS[i].0;
        i += 1;
    }
    out
}

impl Params {
    /// Every variable [`Params::set`] knows, so `ffi` can read each one exactly once.
    pub const NAMES: [&'static str; FIELDS.len()] = names();

    /// Sets the variable `name` from its string `value`.
    ///
    /// Returns `Ok(true)` when set, `Ok(false)` when `name` is not a variable ibnet knows (the
    /// params are unchanged), and [`Error::Param`] naming the variable when `value` is
    /// malformed: empty, not a number, trailing junk, out of range, too long, or not one of
    /// the accepted words. On error the field keeps its previous value.
    ///
    /// NCCL treats an empty variable as unset; callers should skip empty values. `set`
    /// rejects them so that a caller which passes one learns about it.
    pub fn set(&mut self, name: &str, value: &str) -> Result<bool> {
        let Some(&(name, field)) = FIELDS.iter().find(|(n, _)| *n == name) else {
            return Ok(false);
        };
        let err = |reason| Error::Param { name, reason };
        let v = value.trim_matches(|c: char| c.is_ascii_whitespace());
        if v.is_empty() {
            return Err(err("empty value"));
        }
        let int = |min: i64, max: i64, range: &'static str| -> Result<i64> {
            let x = parse_int(v).map_err(err)?;
            if x < min || x > max {
                return Err(err(range));
            }
            Ok(x)
        };
        let flag = || -> Result<bool> { Ok(parse_int(v).map_err(err)? != 0) };
        // "auto" sentinel -1, else 0..=max.
        let auto = |max: i64, range: &'static str| -> Result<Option<u8>> {
            let x = int(-1, max, range)?;
            Ok(u8::try_from(x).ok())
        };
        match field {
            Field::IbHca => {
                // Never an error but for its length: entries that are not well formed are
                // `self.hca.malformed()`, each reported once by ffi, and the rest applies.
                self.ib_hca =
                    heapless::String::try_from(v).map_err(|_| err("longer than 512 bytes"))?;
                self.hca = HcaFilter::parse(v);
            }
            Field::IbGidIndex => self.ib_gid_index = auto(255, "must be -1 (auto) or 0..=255")?,
            Field::IbRoceVersionNum => {
                self.ib_roce_version_num = int(1, 2, "must be 1 or 2")? as u8;
            }
            Field::IbAddrFamily => {
                self.ib_addr_family =
                    AddrFamily::parse(v).ok_or(err("must be AF_INET or AF_INET6"))?;
            }
            Field::IbAddrRange => self.ib_addr_range = Some(AddrRange::parse(v).map_err(err)?),
            Field::IbTimeout => self.ib_timeout = int(0, 31, "must be in 0..=31")? as u8,
            Field::IbRetryCnt => self.ib_retry_cnt = int(0, 7, "must be in 0..=7")? as u8,
            Field::IbPkey => self.ib_pkey = int(0, 0xFFFF, "must be in 0..=65535")? as u16,
            Field::IbUseInline => self.ib_use_inline = flag()?,
            Field::IbSl => self.ib_sl = auto(15, "must be -1 (auto) or 0..=15")?,
            Field::IbTc => self.ib_tc = auto(255, "must be -1 (auto) or 0..=255")?,
            Field::IbFifoTc => self.ib_fifo_tc = auto(255, "must be -1 (auto) or 0..=255")?,
            Field::IbArThreshold => {
                self.ib_ar_threshold = int(0, i64::MAX, "must not be negative")? as u64;
            }
            Field::IbAdaptiveRouting => {
                self.ib_adaptive_routing = match parse_int(v).map_err(err)? {
                    -2 => None,
                    x => Some(x != 0),
                };
            }
            Field::IbPciRelaxedOrdering => {
                self.ib_pci_relaxed_ordering = match int(0, 2, "must be 0, 1 or 2")? {
                    0 => RelaxedOrdering::Off,
                    1 => RelaxedOrdering::On,
                    _ => RelaxedOrdering::Auto,
                };
            }
            Field::IbQpsPerConnection => {
                self.ib_qps_per_connection = int(1, MAX_QPS as i64, "must be in 1..=128")? as u8;
            }
            Field::IbSplitDataOnQps => self.ib_split_data_on_qps = flag()?,
            Field::IbDisable => self.ib_disable = flag()?,
            Field::IbMergeVfs => self.ib_merge_vfs = flag()?,
            Field::IbMergeNics => self.ib_merge_nics = flag()?,
            Field::IbWarnRailLocal => self.ib_warn_rail_local = flag()?,
            Field::IbSockClientPortReuse => self.ib_sock_client_port_reuse = flag()?,
            Field::IbSockServerPortReuse => self.ib_sock_server_port_reuse = flag()?,
            Field::IbReturnAsyncEvents => self.ib_return_async_events = flag()?,
            Field::IbEceEnable => self.ib_ece_enable = flag()?,
            Field::IbMqpRetryAll => self.ib_mqp_retry_all = flag()?,
            Field::IbMqpRetryCnt => {
                self.ib_mqp_retry_cnt =
                    int(0, u32::MAX.into(), "must be in 0..=4294967295")? as u32;
            }
            Field::IbMqpRetrySleepMsec => {
                self.ib_mqp_retry_sleep_msec =
                    int(0, u32::MAX.into(), "must be in 0..=4294967295")? as u32;
            }
            Field::IbRoutableFlidGidIndex => {
                self.ib_routable_flid_gid_index = int(0, 255, "must be in 0..=255")? as u8;
            }
            Field::GdrFlushDisable => self.gdr_flush_disable = flag()?,
            Field::DmabufEnable => self.dmabuf_enable = flag()?,
            Field::SocketIfname => {
                let f = HcaFilter::parse_names(v)?;
                self.socket_ifname =
                    heapless::String::try_from(v).map_err(|_| err("longer than 256 bytes"))?;
                self.ifname = f;
            }
            Field::SocketFamily => {
                self.socket_family =
                    Some(AddrFamily::parse(v).ok_or(err("must be AF_INET or AF_INET6"))?);
            }
            Field::Provider => {
                self.provider = match v {
                    "verbs" => ProviderKind::Verbs,
                    "soft" => ProviderKind::Soft,
                    "auto" => ProviderKind::Auto,
                    _ => return Err(err("must be verbs, soft or auto")),
                };
            }
            _ => self.set_resiliency(field, int)?,
        }
        Ok(true)
    }

    /// The resiliency block of [`Params::set`] (`int(min, max, reason)` parses the value).
    fn set_resiliency(
        &mut self,
        field: Field,
        int: impl Fn(i64, i64, &'static str) -> Result<i64>,
    ) -> Result<()> {
        const MS: &str = "must be in 0..=3600000 (ms)";
        const COUNT: &str = "must be in 0..=1000000";
        match field {
            Field::IbResiliencyPortFailover => {
                self.ib_resiliency_port_failover = Some(int(i64::MIN, i64::MAX, "")? != 0);
            }
            Field::IbResiliencyPortFailoverMaxAttempts => {
                self.ib_resiliency_port_failover_max_attempts =
                    Some(int(0, 1_000_000, COUNT)? as u32);
            }
            Field::IbResiliencyPortFailoverProbeDelay => {
                self.ib_resiliency_port_failover_probe_delay = Some(int(0, 3_600_000, MS)? as u64);
            }
            Field::IbResiliencyPortRecovery => {
                self.ib_resiliency_port_recovery = int(i64::MIN, i64::MAX, "")? != 0;
            }
            Field::IbResiliencyPortRecoveryStartDelay => {
                self.ib_resiliency_port_recovery_start_delay = int(0, 3_600_000, MS)? as u64;
            }
            Field::IbResiliencyPortRecoveryAttemptsMax => {
                self.ib_resiliency_port_recovery_attempts_max = int(0, 1_000_000, COUNT)? as u32;
            }
            Field::IbResiliencyPortRecoveryAckTimeout => {
                self.ib_resiliency_port_recovery_ack_timeout = int(0, 3_600_000, MS)? as u64;
            }
            Field::IbResiliencyPortRecoveryAliveMsg(i) => {
                int(i64::MIN, i64::MAX, "")?;
                self.ib_resiliency_port_recovery_alive_msg |= 1 << i;
            }
            _ => {}
        }
        Ok(())
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
            .filter(|r| r.family == self.ib_addr_family)
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

/// Parses an integer the way NCCL's `strtoll(s, .., 0)` reads it (an optional sign, then
/// decimal, `0x`/`0X` hexadecimal or leading-`0` octal), but rejecting trailing junk and
/// overflow. `s` must already be trimmed. The one parser of NCCL-style integers: [`Params`],
/// `ibnet-ffi`'s and `ibnet-soft`'s variables and `ibnet-hip`'s parameters all read through it.
pub fn parse_int(s: &str) -> core::result::Result<i64, &'static str> {
    let b = s.as_bytes();
    let (neg, b) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    let (radix, digits) = match b {
        [b'0', b'x' | b'X', rest @ ..] => (16, rest),
        [b'0', rest @ ..] if !rest.is_empty() => (8, rest),
        _ => (10, b),
    };
    if digits.is_empty() {
        return Err("not a number");
    }
    let mut mag: u64 = 0;
    for (i, &c) in digits.iter().enumerate() {
        let Some(d) = (c as char).to_digit(radix) else {
            return Err(if i == 0 && radix == 10 {
                "not a number"
            } else {
                "trailing characters after the number"
            });
        };
        mag = mag
            .checked_mul(u64::from(radix))
            .and_then(|m| m.checked_add(u64::from(d)))
            .ok_or("number does not fit in 64 bits")?;
    }
    if neg {
        if mag > i64::MIN.unsigned_abs() {
            return Err("number does not fit in 64 bits");
        }
        Ok((mag as i64).wrapping_neg())
    } else {
        i64::try_from(mag).map_err(|_| "number does not fit in 64 bits")
    }
}

#[cfg(test)]
mod tests;
