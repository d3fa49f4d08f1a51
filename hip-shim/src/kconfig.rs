//! Kernel configuration check for AMD DMA-BUF, as RCCL's `rocmLibraryInit` does it.
//!
//! RCCL enables DMA-BUF only when the running kernel was built with both
//! `CONFIG_DMABUF_MOVE_NOTIFY=y` and `CONFIG_PCI_P2PDMA=y`. The configuration is looked up in:
//!
//! ```text
//! /boot/config-$(uname -r)   plain text            (what RCCL 2.21+ reads)
//! /proc/config.gz            gzip, CONFIG_IKCONFIG_PROC (newer RCCL's fallback)
//! neither readable           the check is skipped, and the decision says so
//! ```
//!
//! Lines are parsed as `KEY=value`; comments (`# CONFIG_X is not set`) and blanks are ignored,
//! so `# CONFIG_PCI_P2PDMA=y` does not count (RCCL's `strstr` would accept it; we are stricter).

use std::io::Read;

use crate::host::Host;

/// The two options RCCL requires for DMA-BUF.
pub const REQUIRED: [&str; 2] = ["CONFIG_DMABUF_MOVE_NOTIFY", "CONFIG_PCI_P2PDMA"];

/// Cap on a decompressed `/proc/config.gz`, so a hostile or corrupt file cannot exhaust memory.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Outcome of the kernel-configuration check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCheck {
    /// Both options are `=y` in `source`.
    Supported {
        /// The file that was read.
        source: String,
    },
    /// `source` was read but lacks some options (listed in `missing`).
    Missing {
        /// The file that was read.
        source: String,
        /// Required options not set to `y`.
        missing: Vec<&'static str>,
    },
    /// No configuration could be read; the check is skipped. `tried` lists what was attempted.
    Unknown {
        /// Each attempted source with the reason it failed.
        tried: Vec<String>,
    },
}

impl KernelCheck {
    /// Whether DMA-BUF may go ahead: supported, or unknown (skipped).
    pub fn allows_dmabuf(&self) -> bool {
        !matches!(self, Self::Missing { .. })
    }

    /// One line for the decision reason.
    pub fn describe(&self) -> String {
        match self {
            Self::Supported { source } => format!("{} =y in {source}", REQUIRED.join(" and ")),
            Self::Missing { source, missing } => {
                format!("{} not =y in {source}", missing.join(" and "))
            }
            Self::Unknown { tried } => {
                format!(
                    "kernel config not readable ({}); check skipped",
                    tried.join("; ")
                )
            }
        }
    }
}

/// The required options that `text` (a kernel `.config`) does not set to `y`.
pub fn missing_options(text: &str) -> Vec<&'static str> {
    REQUIRED
        .iter()
        .copied()
        .filter(|opt| !is_yes(text, opt))
        .collect()
}

fn is_yes(text: &str, option: &str) -> bool {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .any(|l| {
            l.split_once('=')
                .is_some_and(|(k, v)| k.trim() == option && v.trim() == "y")
        })
}

fn classify(source: String, text: &str) -> KernelCheck {
    let missing = missing_options(text);
    if missing.is_empty() {
        KernelCheck::Supported { source }
    } else {
        KernelCheck::Missing { source, missing }
    }
}

/// Runs the check against `host`: `/boot/config-<release>`, then `/proc/config.gz`.
pub fn check(host: &Host) -> KernelCheck {
    let mut tried = Vec::new();
    match host.kernel_release() {
        Some(rel) => {
            let path = format!("/boot/config-{rel}");
            match host.read_text(&path) {
                Ok(text) => return classify(path, &text),
                Err(e) => tried.push(format!("{path}: {e}")),
            }
        }
        None => tried.push("/proc/sys/kernel/osrelease unreadable".to_owned()),
    }
    let gz = "/proc/config.gz";
    match host.read_bytes(gz) {
        Ok(bytes) => match gunzip(&bytes) {
            Ok(text) => return classify(gz.to_owned(), &text),
            Err(e) => tried.push(format!("{gz}: {e}")),
        },
        Err(e) => tried.push(format!("{gz}: {e}")),
    }
    KernelCheck::Unknown { tried }
}

fn gunzip(bytes: &[u8]) -> std::io::Result<String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_CONFIG_BYTES)
        .read_to_end(&mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::testutil::TempTree;
    use std::io::Write;

    const GOOD: &str = "#\n# DMABUF options\n#\nCONFIG_SYNC_FILE=y\nCONFIG_DMABUF_MOVE_NOTIFY=y\n\
                        CONFIG_PCI_P2PDMA=y\n";

    fn gzip(text: &str) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn parses_options() {
        assert!(missing_options(GOOD).is_empty());
        assert_eq!(
            missing_options("CONFIG_DMABUF_MOVE_NOTIFY=y\n# CONFIG_PCI_P2PDMA is not set\n"),
            vec!["CONFIG_PCI_P2PDMA"]
        );
        // Commented-out, module-valued, and prefix-sharing options do not count.
        assert_eq!(
            missing_options(
                "# CONFIG_PCI_P2PDMA=y\nCONFIG_DMABUF_MOVE_NOTIFY=m\nCONFIG_PCI_P2PDMA_X=y"
            ),
            REQUIRED.to_vec()
        );
        assert_eq!(missing_options(""), REQUIRED.to_vec());
        // Whitespace and CRLF are tolerated.
        assert!(
            missing_options("  CONFIG_DMABUF_MOVE_NOTIFY=y\r\nCONFIG_PCI_P2PDMA = y\r\n")
                .is_empty()
        );
    }

    #[test]
    fn prefers_boot_config() {
        let t = TempTree::new("kc-boot");
        t.file("/proc/sys/kernel/osrelease", b"6.8.0-1\n")
            .file("/boot/config-6.8.0-1", b"CONFIG_PCI_P2PDMA=y\n")
            .file("/proc/config.gz", &gzip(GOOD));
        let c = check(&Host::with_root(t.root()));
        assert_eq!(
            c,
            KernelCheck::Missing {
                source: "/boot/config-6.8.0-1".into(),
                missing: vec!["CONFIG_DMABUF_MOVE_NOTIFY"]
            }
        );
        assert!(!c.allows_dmabuf());
        assert!(
            c.describe().contains("CONFIG_DMABUF_MOVE_NOTIFY not =y"),
            "{}",
            c.describe()
        );
    }

    #[test]
    fn falls_back_to_proc_config_gz() {
        let t = TempTree::new("kc-gz");
        t.file("/proc/sys/kernel/osrelease", b"6.8.0-1\n")
            .file("/proc/config.gz", &gzip(GOOD));
        let c = check(&Host::with_root(t.root()));
        assert_eq!(
            c,
            KernelCheck::Supported {
                source: "/proc/config.gz".into()
            }
        );
        assert!(c.allows_dmabuf());
    }

    #[test]
    fn corrupt_gz_and_nothing_readable_skip() {
        let t = TempTree::new("kc-bad");
        t.file("/proc/config.gz", b"not gzip at all");
        let c = check(&Host::with_root(t.root()));
        match &c {
            KernelCheck::Unknown { tried } => {
                assert_eq!(tried.len(), 2, "{tried:?}");
                assert!(tried[0].contains("osrelease"));
                assert!(tried[1].starts_with("/proc/config.gz"));
            }
            other => panic!("expected Unknown, got {other:?}"),
        }
        assert!(c.allows_dmabuf());
        assert!(c.describe().contains("check skipped"));

        let empty = TempTree::new("kc-empty");
        empty.file("/proc/sys/kernel/osrelease", b"5.15.0\n");
        match check(&Host::with_root(empty.root())) {
            KernelCheck::Unknown { tried } => assert!(tried[0].contains("/boot/config-5.15.0")),
            other => panic!("expected Unknown, got {other:?}"),
        }
    }
}
