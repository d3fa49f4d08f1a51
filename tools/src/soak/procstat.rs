//! This process's resident memory and open file descriptors, read from `/proc/self`.

/// A snapshot of the process's resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcStat {
    /// Resident set size in KiB (`VmRSS`), 0 if unreadable.
    pub rss_kib: u64,
    /// Open file descriptors (entries of `/proc/self/fd`, less the one reading it).
    pub fds: u64,
    /// Threads (`Threads` of `/proc/self/status`).
    pub threads: u64,
}

/// The value of `key` (e.g. `VmRSS:`) in a `/proc/*/status` text, first number only.
fn field(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Reads this process's figures now.
pub fn now() -> ProcStat {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(0);
    ProcStat {
        rss_kib: field(&status, "VmRSS:"),
        fds,
        threads: field(&status, "Threads:"),
    }
}

impl std::fmt::Display for ProcStat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB, {} fds, {} threads",
            self.rss_kib as f64 / 1024.0,
            self.fds,
            self.threads
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let s = now();
        assert!(s.rss_kib > 0 && s.threads >= 1);
        assert_eq!(field("VmRSS:\t  1234 kB\nThreads: 3\n", "Threads:"), 3);
    }
}
