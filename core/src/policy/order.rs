//! The order verbs devices are numbered in: with `NCCL_IB_DEVICE_PCI_ORDER` (NCCL 2.29,
//! default on) NCCL sorts its devices by PCI address so every node numbers its NICs alike,
//! whatever order libibverbs lists them in; `realPort` is counted after the sort.
//!
//! The key ([`pci_key`]) is the last component of the device's full sysfs path (not merged),
//! its hexadecimal digits read as one number (`0000:3b:00.1` → `0x3b001`); a device
//! without a path sorts after every device with one ([`pci_order`]).

use core::cmp::Ordering;

/// The sort key of a device whose full sysfs device path is `full` (`None`: no path).
pub fn pci_key(full: &str) -> Option<i64> {
    let trimmed = full.strip_suffix('/').unwrap_or(full);
    if trimmed.is_empty() {
        return None;
    }
    let last = trimmed.rsplit('/').next().unwrap_or(trimmed);
    // NCCL's busIdToInt64: skip '.' and ':', stop at the first other non-hex character, at
    // most 16 digits, read as strtol reads them (saturating at i64::MAX).
    let v = last
        .chars()
        .filter(|&c| c != '.' && c != ':')
        .map_while(|c| c.to_digit(16))
        .take(16)
        .fold(0u64, |v, d| (v << 4) | u64::from(d));
    Some(i64::try_from(v).unwrap_or(i64::MAX))
}

/// How two devices with keys `a` and `b` ([`pci_key`]) compare: by key, devices without one
/// last. Used with a stable sort, devices of equal key (ports of one function) keep their
/// listing order.
pub fn pci_order(a: Option<i64>, b: Option<i64>) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_last_components_hex_digits() {
        let p = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1";
        assert_eq!(pci_key(p), Some(0x3b001));
        assert_eq!(pci_key(&format!("{p}/")), Some(0x3b001), "trailing slash");
        assert_eq!(pci_key(""), None);
        assert_eq!(pci_key("/x/0000:5e:00.0-extra"), Some(0x5e000));
        assert_eq!(
            pci_key("/x/ffffffffffffffffff"),
            Some(i64::MAX),
            "saturates"
        );
    }

    #[test]
    fn devices_sort_by_pci_address_pathless_last_and_stable() {
        // Listed as libibverbs might: mlx5_0 on 5e, mlx5_1 without a path, mlx5_2 on 3b
        // port 1, mlx5_3 on 3b port 2 (same function: equal keys).
        let mut devs = [
            ("mlx5_0", pci_key("/p/0000:5e:00.0")),
            ("mlx5_1", None),
            ("mlx5_2", pci_key("/p/0000:3b:00.0")),
            ("mlx5_3", pci_key("/p/0000:3b:00.0")),
        ];
        devs.sort_by(|a, b| pci_order(a.1, b.1));
        let names: Vec<&str> = devs.iter().map(|d| d.0).collect();
        assert_eq!(names, ["mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"]);
    }
}
