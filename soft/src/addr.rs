//! The soft provider's opaque address, carried in the core's handshake as a `ProviderAddr`.
//!
//! ```text
//!  0..4   "ISFT"           4  version     5..8 reserved
//!  8..16  host id          (hash of /proc/sys/kernel/random/boot_id)
//!  16..20 pid              20..24 memfd number of the segment (in the owner)
//!  24..32 nonce            (random identity of the provider instance)
//!  32..40 segment base     (virtual address of the magic word in the owner)
//! ```

use ibnet_core::provider::ProviderAddr;

const MAGIC: [u8; 4] = *b"ISFT";
const LEN: usize = 40;

/// A decoded provider address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftAddr {
    /// Host identity (same boot of the same kernel).
    pub host: u64,
    /// The owner's pid.
    pub pid: i32,
    /// The owner's segment memfd number.
    pub fd: i32,
    /// The owner provider's nonce.
    pub nonce: u64,
    /// Address of the segment magic in the owner.
    pub magic_addr: u64,
}

impl SoftAddr {
    /// Encodes.
    pub fn encode(&self) -> ProviderAddr {
        let mut b = [0u8; LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = crate::segment::VERSION as u8;
        b[8..16].copy_from_slice(&self.host.to_le_bytes());
        b[16..20].copy_from_slice(&self.pid.to_le_bytes());
        b[20..24].copy_from_slice(&self.fd.to_le_bytes());
        b[24..32].copy_from_slice(&self.nonce.to_le_bytes());
        b[32..40].copy_from_slice(&self.magic_addr.to_le_bytes());
        ProviderAddr::new(&b).unwrap_or(ProviderAddr::EMPTY)
    }

    /// Decodes; `None` for anything that is not a version-1 soft address.
    pub fn decode(a: &ProviderAddr) -> Option<Self> {
        let b = a.as_bytes();
        if b.len() != LEN || b[0..4] != MAGIC || b[4] != crate::segment::VERSION as u8 {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let i32_at = |o: usize| i32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let s = Self {
            host: u64_at(8),
            pid: i32_at(16),
            fd: i32_at(20),
            nonce: u64_at(24),
            magic_addr: u64_at(32),
        };
        (s.pid > 0 && s.fd >= 0).then_some(s)
    }
}

/// This host's identity: a hash of the kernel's boot id (same value in every process and
/// container sharing the kernel), or of the hostname when the boot id is unreadable.
pub fn host_id() -> u64 {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    // FNV-1a: stable across builds and processes (std's hasher is randomly keyed).
    s.trim().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        (h ^ c as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let a = SoftAddr {
            host: 7,
            pid: 1234,
            fd: 9,
            nonce: 0xdead_beef,
            magic_addr: 0x7f00_0000,
        };
        assert_eq!(SoftAddr::decode(&a.encode()), Some(a));
        assert_eq!(SoftAddr::decode(&ProviderAddr::EMPTY), None);
        assert_eq!(
            SoftAddr::decode(&ProviderAddr::new(&[0u8; 40]).unwrap()),
            None
        );
        assert_eq!(host_id(), host_id());
    }
}
