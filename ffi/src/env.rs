//! Reads NCCL's variables (and ibnet's `IBNET_*`) once, with NCCL 2.28's defaults.
//!
//! A malformed value produces one WARN naming the variable and the default stands.
//! (When `ibnet_core::params::Params` lands, the numeric IB parameters move there; this module
//! keeps the environment access, which the core never does.)

use std::net::IpAddr;

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

/// The configuration the plugin runs with.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct Config {
    pub provider: ProviderChoice,
    pub ib_disable: bool,
    pub ib_hca: Option<String>,
    pub gid_index: i64,
    pub roce_version: i64,
    pub addr_family: i32,
    pub addr_range: Option<(IpAddr, u8)>,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub qps_per_conn: u8,
    pub split_data: bool,
    pub ar_threshold: u64,
    pub adaptive_routing: i64,
    pub relaxed_ordering: i64,
    pub use_inline: bool,
    pub sl: i64,
    pub tc: i64,
    pub pkey: u16,
    pub merge_vfs: bool,
    pub gdr_flush_disable: bool,
    pub dmabuf_enable: bool,
    pub socket_ifname: Option<String>,
    pub socket_family: Option<i32>,
    /// Seconds a started handshake may stall before connect/accept fail
    /// (`IBNET_HANDSHAKE_TIMEOUT`, default 60).
    pub handshake_timeout_s: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            provider: ProviderChoice::Auto,
            ib_disable: false,
            ib_hca: None,
            gid_index: -1,
            roce_version: 2,
            addr_family: libc::AF_INET,
            addr_range: None,
            timeout: 20,
            retry_cnt: 7,
            qps_per_conn: 1,
            split_data: false,
            ar_threshold: 8192,
            adaptive_routing: -2,
            relaxed_ordering: 2,
            use_inline: false,
            sl: -1,
            tc: -1,
            pkey: 0,
            merge_vfs: true,
            gdr_flush_disable: false,
            dmabuf_enable: true,
            socket_ifname: None,
            socket_family: None,
            handshake_timeout_s: 60,
        }
    }
}

/// The variables [`Config`] reads.
pub const NAMES: &[&str] = &[
    "IBNET_PROVIDER",
    "IBNET_HANDSHAKE_TIMEOUT",
    "NCCL_IB_DISABLE",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_IB_AR_THRESHOLD",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_PCI_RELAXED_ORDERING",
    "NCCL_IB_USE_INLINE",
    "NCCL_IB_SL",
    "NCCL_IB_TC",
    "NCCL_IB_PKEY",
    "NCCL_IB_MERGE_VFS",
    "NCCL_GDR_FLUSH_DISABLE",
    "NCCL_DMABUF_ENABLE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY",
];

fn int(v: &str, min: i64, max: i64) -> Result<i64, &'static str> {
    let v = v.trim();
    let n = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        i64::from_str_radix(h, 16)
    } else {
        v.parse::<i64>()
    }
    .map_err(|_| "not an integer")?;
    if n < min || n > max {
        return Err("out of range");
    }
    Ok(n)
}

/// Parses `NCCL_IB_ADDR_RANGE` (`a.b.c.d/n` or an IPv6 prefix).
pub fn parse_range(v: &str) -> Option<(IpAddr, u8)> {
    let (ip, len) = v.trim().split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((ip, len))
}

impl Config {
    /// Applies one variable. `Ok(false)`: not a name this config reads. `Err(reason)`: malformed;
    /// the field keeps its value.
    pub fn set(&mut self, name: &str, v: &str) -> Result<bool, &'static str> {
        match name {
            "IBNET_PROVIDER" => {
                self.provider = match v.trim().to_ascii_lowercase().as_str() {
                    "auto" | "" => ProviderChoice::Auto,
                    "verbs" => ProviderChoice::Verbs,
                    "soft" => ProviderChoice::Soft,
                    _ => return Err("expected verbs, soft or auto"),
                }
            }
            "IBNET_HANDSHAKE_TIMEOUT" => self.handshake_timeout_s = int(v, 1, 86_400)? as u64,
            "NCCL_IB_DISABLE" => self.ib_disable = int(v, 0, 1)? == 1,
            "NCCL_IB_HCA" => self.ib_hca = Some(v.to_string()).filter(|s| !s.trim().is_empty()),
            "NCCL_IB_GID_INDEX" => self.gid_index = int(v, -1, 65535)?,
            "NCCL_IB_ROCE_VERSION_NUM" => self.roce_version = int(v, 1, 2)?,
            "NCCL_IB_ADDR_FAMILY" => {
                self.addr_family =
                    crate::ifaddr::parse_family(v).ok_or("expected AF_INET or AF_INET6")?
            }
            "NCCL_IB_ADDR_RANGE" => {
                self.addr_range = Some(parse_range(v).ok_or("expected ADDR/PREFIXLEN")?)
            }
            "NCCL_IB_TIMEOUT" => self.timeout = int(v, 1, 31)? as u8,
            "NCCL_IB_RETRY_CNT" => self.retry_cnt = int(v, 0, 7)? as u8,
            "NCCL_IB_QPS_PER_CONNECTION" => self.qps_per_conn = int(v, 1, 128)? as u8,
            "NCCL_IB_SPLIT_DATA_ON_QPS" => self.split_data = int(v, 0, 1)? == 1,
            "NCCL_IB_AR_THRESHOLD" => self.ar_threshold = int(v, 0, i64::MAX)? as u64,
            "NCCL_IB_ADAPTIVE_ROUTING" => self.adaptive_routing = int(v, -2, 1)?,
            "NCCL_IB_PCI_RELAXED_ORDERING" => self.relaxed_ordering = int(v, 0, 2)?,
            "NCCL_IB_USE_INLINE" => self.use_inline = int(v, 0, 1)? == 1,
            "NCCL_IB_SL" => self.sl = int(v, -1, 15)?,
            "NCCL_IB_TC" => self.tc = int(v, -1, 255)?,
            "NCCL_IB_PKEY" => self.pkey = int(v, 0, 0xffff)? as u16,
            "NCCL_IB_MERGE_VFS" => self.merge_vfs = int(v, 0, 1)? == 1,
            "NCCL_GDR_FLUSH_DISABLE" => self.gdr_flush_disable = int(v, 0, 1)? == 1,
            "NCCL_DMABUF_ENABLE" => self.dmabuf_enable = int(v, 0, 1)? == 1,
            "NCCL_SOCKET_IFNAME" => self.socket_ifname = Some(v.to_string()),
            "NCCL_SOCKET_FAMILY" => {
                self.socket_family =
                    Some(crate::ifaddr::parse_family(v).ok_or("expected AF_INET or AF_INET6")?)
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads every variable in [`NAMES`] and in `ibnet_core::params::Params::NAMES` from the
    /// process environment into this config and into the core's `Params` (which drives the
    /// comms). A malformed variable is one WARN; its default stands in both.
    pub fn from_env() -> (Self, ibnet_core::params::Params) {
        let mut c = Self::default();
        let mut p = ibnet_core::params::Params::default();
        let core_names = ibnet_core::params::Params::NAMES;
        let mut names: Vec<&str> = NAMES.to_vec();
        names.extend(core_names.iter().copied().filter(|n| !NAMES.contains(n)));
        for n in names {
            let Some(v) = std::env::var_os(n) else {
                continue;
            };
            let v = v.to_string_lossy();
            let mine = c.set(n, &v).err();
            let core = if core_names.contains(&n) {
                p.set(n, &v).err().map(|e| e.to_string())
            } else {
                None
            };
            match (mine, core) {
                (None, None) => crate::info!(crate::log::ENV, "{n} set to {v}"),
                (Some(why), _) => crate::warn!("ignoring {n}={v:?}: {why}; the default stands"),
                (None, Some(why)) => crate::warn!("ignoring {n}={v:?}: {why}; the default stands"),
            }
        }
        (c, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_keeps_default() {
        let mut c = Config::default();
        assert!(c.set("NCCL_IB_TIMEOUT", "abc").is_err());
        assert_eq!(c.timeout, 20);
        assert!(c.set("NCCL_IB_TIMEOUT", "99").is_err());
        assert_eq!(c.set("NCCL_IB_TIMEOUT", "14"), Ok(true));
        assert_eq!(c.timeout, 14);
        assert_eq!(c.set("NCCL_IB_PKEY", "0x8001"), Ok(true));
        assert_eq!(c.pkey, 0x8001);
        assert_eq!(c.set("NCCL_UNKNOWN", "1"), Ok(false));
        assert!(c.set("IBNET_PROVIDER", "magic").is_err());
        assert_eq!(c.provider, ProviderChoice::Auto);
        assert_eq!(c.set("IBNET_PROVIDER", "SOFT"), Ok(true));
        assert_eq!(c.provider, ProviderChoice::Soft);
        assert_eq!(
            parse_range("10.0.0.0/8"),
            Some(("10.0.0.0".parse().unwrap(), 8))
        );
        assert_eq!(parse_range("10.0.0.0/33"), None);
    }
}
