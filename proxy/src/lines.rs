//! Readiness of LL and LL128 data, checked by the proxy before it sends a slot.
//!
//! ```text
//!  LL line (16 B):    | data1 u32 | flag1 u32 | data2 u32 | flag2 u32 |
//!                     word 0 = data1 | flag1 << 32, word 1 = data2 | flag2 << 32
//!  LL128 line (128 B): | 15 × u64 data ........................ | flag u64 |
//! ```
//! The producer writes each LL word (data and flag together) with one Release store, and each
//! LL128 line's flag word last with a Release store. A line is ready when its flags equal the
//! step's flag: `step + 1` (truncated to 32 bits for LL), so a stale line from an earlier lap
//! never matches. `size` is the byte count the GPU put in `connFifo` (lines, flags included).

use super::shared::BufView;

/// Bytes in an LL line.
pub const LL_LINE: usize = 16;
/// Bytes in an LL128 line.
pub const LL128_LINE: usize = 128;
/// 8-byte words per LL128 line (`NCCL_LL128_LINEELEMS`).
pub const LL128_LINE_ELEMS: usize = 16;
/// Data words per LL128 line (`NCCL_LL128_DATAELEMS`); the last word is the flag.
pub const LL128_DATA_ELEMS: usize = 15;

/// The LL flag of the data for ring step `step` (0-based): `NCCL_LL_FLAG(step + 1)`.
#[inline]
pub fn ll_flag(step: u64) -> u32 {
    (step + 1) as u32
}

/// The LL128 flag of the data for ring step `step`.
#[inline]
pub fn ll128_flag(step: u64) -> u64 {
    step + 1
}

/// Whether every LL line in the first `size` bytes of `buf` carries `step`'s flag twice.
pub fn ll_ready(buf: &BufView, size: usize, step: u64) -> bool {
    let flag = ll_flag(step);
    let lines = size.div_ceil(LL_LINE);
    (0..lines).all(|i| {
        let ok = |w: Option<u64>| w.is_some_and(|w| (w >> 32) as u32 == flag);
        ok(buf.load(2 * i)) && ok(buf.load(2 * i + 1))
    })
}

/// Whether every LL128 line in the first `size` bytes of `buf` carries `step`'s flag.
pub fn ll128_ready(buf: &BufView, size: usize, step: u64) -> bool {
    let flag = ll128_flag(step);
    let lines = size.div_ceil(LL128_LINE);
    (0..lines).all(|i| buf.load(i * LL128_LINE_ELEMS + LL128_DATA_ELEMS) == Some(flag))
}
