//! Page-aligned host buffers and the data pattern `-c` verifies.
//!
//! Message `seed` carries 64-bit words `w[j] = mix(seed) ^ j * K`, so each message of a sweep
//! (seeded by size, phase, iteration and tag) has its own content: a stale, misplaced or
//! truncated delivery shows up as a mismatch at a known offset.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Page size used for alignment.
pub const ALIGN: usize = 4096;

/// A zeroed, page-aligned heap buffer (registration-friendly).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    /// Allocates `len` (≥ 1) zeroed bytes; `None` when out of memory.
    pub fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(1), ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(Self {
            ptr,
            len: len.max(1),
        })
    }
    /// Base address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never empty (at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The bytes at `off..off+n` (panics when out of range: a tool bug, not input).
    pub fn slice(&self, off: usize, n: usize) -> &[u8] {
        assert!(off + n <= self.len);
        // SAFETY: in bounds (asserted); the memory is initialised (zeroed at allocation).
        // The plugin may write into it only while a receive is outstanding, and callers
        // read a slot only after that slot's request completed.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), n) }
    }
    /// Mutable bytes at `off..off+n`.
    pub fn slice_mut(&mut self, off: usize, n: usize) -> &mut [u8] {
        assert!(off + n <= self.len);
        // SAFETY: in bounds; exclusive through `&mut self`; callers write a slot only while
        // no request on it is outstanding.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), n) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN)) }
    }
}

fn mix(mut z: u64) -> u64 {
    // splitmix64 finaliser.
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn word(base: u64, j: usize) -> u64 {
    base ^ (j as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// The seed of one message.
pub fn seed(size: usize, phase: u8, iter: u64, tag: i32) -> u64 {
    mix((size as u64) ^ ((phase as u64) << 56) ^ (iter << 8) ^ tag as u64)
}

/// Writes message `seed`'s pattern into `b`.
pub fn fill(b: &mut [u8], seed: u64) {
    let base = mix(seed);
    let j = b.len() / 8;
    let mut chunks = b.chunks_exact_mut(8);
    for (j, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&word(base, j).to_le_bytes());
    }
    let tail = chunks.into_remainder();
    let w = word(base, j).to_le_bytes();
    tail.copy_from_slice(&w[..tail.len()]);
}

/// The first offset where `b` differs from message `seed`'s pattern, if any.
pub fn verify(b: &[u8], seed: u64) -> Option<usize> {
    let base = mix(seed);
    let chunks = b.chunks_exact(8);
    let tail = chunks.remainder();
    for (j, c) in chunks.enumerate() {
        let w = word(base, j).to_le_bytes();
        if c != w {
            let k = c
                .iter()
                .zip(w.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(j * 8 + k);
        }
    }
    let j = b.len() / 8;
    let w = word(base, j).to_le_bytes();
    tail.iter()
        .zip(w.iter())
        .position(|(a, b)| a != b)
        .map(|k| j * 8 + k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_roundtrip_and_detects_corruption() {
        for len in [0usize, 1, 7, 8, 9, 4096, 4099] {
            let mut b = vec![0u8; len];
            fill(&mut b, 42);
            assert_eq!(verify(&b, 42), None, "len {len}");
            if len > 0 {
                assert!(
                    verify(&b, 43).is_some(),
                    "other seed must differ, len {len}"
                );
                b[len - 1] ^= 0x40;
                assert_eq!(verify(&b, 42), Some(len - 1));
            }
        }
    }

    #[test]
    fn aligned_buffer() {
        let mut b = AlignedBuf::new(10_000).unwrap();
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.slice(0, 10_000).iter().all(|&x| x == 0));
        fill(b.slice_mut(100, 500), 7);
        assert_eq!(verify(b.slice(100, 500), 7), None);
    }
}
