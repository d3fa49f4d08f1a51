//! # ibnet-tools
//!
//! `ibnet-perf` measures any NCCL net plugin through its C API (dlopen, `ncclNetPlugin_vN`);
//! `ibnet-info` shows what ibnet's plugin sees on this host. This library is their shared core,
//! also used by the `perf_loopback` bench.
//!
//! ```text
//!  driver (ibnet-perf / --client)                 responder (hidden --peer / --server)
//!   Plugin::open(.so) → init → devices → listen     same
//!   ── ctrl TCP: Hello{config} ──────────────────▶
//!   ◀─ Handle ─────────────── Handle ─────────────▶ (128-byte connect handles)
//!   connect(peer handle) + accept(own listen), both non-blocking, until both comms exist
//!   per size:  Step ─────────────────────────────▶ register buffers
//!              ◀──────────────────────────── Ready
//!     latency:  isend(ping) ════plugin════▶ irecv; isend(pong) ═══▶ irecv   (RTT/2 samples)
//!     bandwidth: `window` requests × `multirecv` messages in flight ════▶ irecv, then an ack
//!              ◀───────────────────── Done{bad messages}
//!   Bye ────────────────────────────────────────▶
//! ```
//! Only plugin calls carry data; the control socket carries configuration and results.
//!
//! `ibnet-soak` (module [`soak`]) runs a long, byte-verified two-process load through the same
//! loader.
//!
//! `unsafe` code is denied here and allowed only in five named modules, each for one reason:
//! [`buf`] (its own aligned allocation), [`log`] (the C logger sink `extern "C"` and its C
//! strings), [`net`] (plugin strings and the `unsafe fn`s that pass memory to the plugin),
//! [`sweep`] and [`soak::lane`] (call those with the buffers they own). Loading and calling a plugin is
//! ibnet-nccl's `foreign` loader. Every block has a `SAFETY` comment.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod buf;
pub mod ctrl;
pub mod jsonlink;
pub mod locate;
#[allow(unsafe_code)]
pub mod log;
#[allow(unsafe_code)]
pub mod net;
pub mod out;
pub mod plot;
pub mod report;
pub mod soak;
pub mod stats;
#[allow(unsafe_code)]
pub mod sweep;

/// A tool error: one line for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(e.to_string())
    }
}
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error(format!("control message: {e}"))
    }
}

/// Parses a byte count: `8`, `4K`, `1M`, `256MiB`, `1G` (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a byte count (e.g. 8, 64K, 1M, 256M, 1G)"))?;
    let mul: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M or G)")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// Formats a byte count compactly (`8B`, `64KiB`, `256MiB`).
pub fn fmt_bytes(n: u64) -> String {
    const U: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, m) in U {
        if n >= m && n.is_multiple_of(m) {
            return format!("{}{u}", n / m);
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("8"), Ok(8));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("1M"), Ok(1 << 20));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert!(parse_bytes("x").is_err());
        assert!(parse_bytes("3T").is_err());
        assert!(parse_bytes("99999999999999999999G").is_err());
        assert_eq!(fmt_bytes(8), "8B");
        assert_eq!(fmt_bytes(4096), "4KiB");
        assert_eq!(fmt_bytes(256 << 20), "256MiB");
        assert_eq!(fmt_bytes(1000), "1000B");
    }
}
