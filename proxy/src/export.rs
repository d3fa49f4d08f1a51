//! The descriptor of a bank one process exports and another maps ([`BankDesc`]): what a
//! cross-process connection map carries per bank (NCCL's `ipcDesc` of a `connectMapMem`).
//!
//! Fixed size (96 bytes), plain integers, checked by [`BankDesc::check`] before any importer
//! uses it. The handle bytes are the memory provider's ([`HandleKind`]); the provider checks
//! them again when it imports.

use ibnet_core::error::{Error, Result};

const DESC_MAGIC: u32 = 0x4258_4249; // "IBXB"
/// Banks that can be exported: host, device, shared host, shared device (never GDR copy).
pub const EXPORTABLE_BANKS: usize = 4;
/// Version of [`BankDesc`] and the cross-process map; both sides must be the same build.
pub const XMAP_VERSION: u16 = 1;
/// The largest bank a descriptor may describe (64 GiB).
pub const MAX_BANK_SIZE: u64 = 1 << 36;
/// Bytes of a descriptor's opaque handle.
pub const HANDLE_BYTES: usize = 64;

/// What kind of handle a [`BankDesc`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HandleKind {
    /// A file descriptor of the exporting process (`owner`): POSIX shared memory (memfd) for
    /// host banks. Handle: fd (`i32` LE), then the file's inode and device (`u64` LE each),
    /// so the importer can check it opened the same object.
    ProcessFd = 1,
    /// A cuMem POSIX-fd shareable handle of the exporting process (handle as `ProcessFd`).
    CuMemFd = 2,
    /// A CUDA IPC memory handle (the 64 opaque bytes of `cudaIpcMemHandle_t`).
    CudaIpc = 3,
    /// A handle only the provider on both sides understands.
    Provider = 4,
}

impl HandleKind {
    /// The kind numbered `v` (as `IBNET_HANDLE_*` in `ibnet.h`).
    pub fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::ProcessFd,
            2 => Self::CuMemFd,
            3 => Self::CudaIpc,
            4 => Self::Provider,
            _ => return None,
        })
    }
}

/// How another process maps one bank: fixed size (96 bytes), plain integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct BankDesc {
    magic: u32,
    version: u16,
    bank: u8,
    kind: u8,
    /// Bytes of the bank.
    pub size: u64,
    /// Offset of the bank inside the exported object.
    pub offset: u64,
    /// The exporting process (its pid for fd-based handles).
    pub owner: u64,
    /// The provider's handle (see [`HandleKind`]).
    pub handle: [u8; HANDLE_BYTES],
}

impl Default for BankDesc {
    fn default() -> Self {
        Self::NONE
    }
}

impl BankDesc {
    /// No bank (all zeros).
    pub const NONE: Self = Self {
        magic: 0,
        version: 0,
        bank: 0,
        kind: 0,
        size: 0,
        offset: 0,
        owner: 0,
        handle: [0; HANDLE_BYTES],
    };

    /// A descriptor of `size` bytes at `offset` in the object `handle` of kind `kind` that
    /// process `owner` exported; the bank is filled in by the engine.
    pub fn new(
        kind: HandleKind,
        size: u64,
        offset: u64,
        owner: u64,
        handle: &[u8],
    ) -> Result<Self> {
        if handle.len() > HANDLE_BYTES {
            return Err(Error::OutOfRange {
                what: "bank export handle bytes",
                value: handle.len() as i64,
                min: 0,
                max: HANDLE_BYTES as i64,
            });
        }
        let mut h = [0u8; HANDLE_BYTES];
        h[..handle.len()].copy_from_slice(handle);
        let d = Self {
            magic: DESC_MAGIC,
            version: XMAP_VERSION,
            bank: 0,
            kind: kind as u8,
            size,
            offset,
            owner,
            handle: h,
        };
        d.check()?;
        Ok(d)
    }

    /// Bytes of a descriptor.
    pub const BYTES: usize = core::mem::size_of::<Self>();

    /// The descriptor's bytes (to hand to another process on its own).
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6] = self.bank;
        b[7] = self.kind;
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.owner.to_le_bytes());
        b[32..].copy_from_slice(&self.handle);
        b
    }

    /// Reads and checks ([`BankDesc::check`]) a descriptor from [`BankDesc::to_bytes`].
    pub fn from_bytes(b: &[u8; Self::BYTES]) -> Result<Self> {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let mut handle = [0u8; HANDLE_BYTES];
        handle.copy_from_slice(&b[32..]);
        let d = Self {
            magic: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            version: u16::from_le_bytes([b[4], b[5]]),
            bank: b[6],
            kind: b[7],
            size: u64_at(8),
            offset: u64_at(16),
            owner: u64_at(24),
            handle,
        };
        d.check()?;
        Ok(d)
    }

    /// Whether this is [`BankDesc::NONE`].
    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }

    /// The handle's kind (valid descriptors only).
    pub fn kind(&self) -> Result<HandleKind> {
        HandleKind::from_raw(self.kind).ok_or(Error::OutOfRange {
            what: "bank export handle kind",
            value: self.kind as i64,
            min: 1,
            max: 4,
        })
    }

    /// The index of the bank it describes (a [`Bank`](super::map::Bank) other than GDR copy).
    pub fn bank(&self) -> Result<usize> {
        if self.bank as usize >= EXPORTABLE_BANKS {
            return Err(Error::OutOfRange {
                what: "bank of an export descriptor",
                value: self.bank as i64,
                min: 0,
                max: EXPORTABLE_BANKS as i64 - 1,
            });
        }
        Ok(self.bank as usize)
    }

    /// The descriptor for bank index `b` (set by the engine).
    pub(crate) fn with_bank(mut self, b: usize) -> Self {
        self.bank = b as u8;
        self
    }

    /// Checks the fields every importer relies on: magic, version, kind, a size in
    /// `1..=MAX_BANK_SIZE` and an offset (a multiple of 256) that does not overflow with it.
    pub fn check(&self) -> Result<()> {
        if self.magic != DESC_MAGIC || self.version != XMAP_VERSION {
            return Err(Error::BadState {
                op: "import bank",
                state: "not a bank descriptor of this version",
            });
        }
        self.kind()?;
        self.bank()?;
        if self.size == 0 || self.size > MAX_BANK_SIZE {
            return Err(Error::OutOfRange {
                what: "exported bank size",
                value: self.size.min(i64::MAX as u64) as i64,
                min: 1,
                max: MAX_BANK_SIZE as i64,
            });
        }
        // 256: the CUDA allocation alignment (a 4 KiB-aligned bank inside a cuMemAlloc block).
        if self.offset > MAX_BANK_SIZE || !self.offset.is_multiple_of(256) {
            return Err(Error::OutOfRange {
                what: "exported bank offset (a multiple of 256)",
                value: self.offset.min(i64::MAX as u64) as i64,
                min: 0,
                max: MAX_BANK_SIZE as i64,
            });
        }
        Ok(())
    }
}

#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<BankDesc>() == 96);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn checks_every_field() {
        let d = BankDesc::new(HandleKind::ProcessFd, 4096, 0, 42, &[7; 24]).unwrap();
        assert_eq!(
            (d.bank().unwrap(), d.kind().unwrap()),
            (0, HandleKind::ProcessFd)
        );
        assert!(d.with_bank(4).bank().is_err());
        assert!(BankDesc::new(HandleKind::CudaIpc, 1, 0, 1, &[0; 65]).is_err());
        assert!(BankDesc::new(HandleKind::CudaIpc, 0, 0, 1, &[]).is_err());
        assert!(BankDesc::new(HandleKind::CudaIpc, 1, 5, 1, &[]).is_err());
        assert!(BankDesc::new(HandleKind::CudaIpc, MAX_BANK_SIZE + 1, 0, 1, &[]).is_err());
        let mut bad = d;
        bad.kind = 0;
        assert!(bad.check().is_err());
        assert!(BankDesc::NONE.check().is_err() && BankDesc::NONE.is_none());
        assert_eq!(BankDesc::from_bytes(&d.to_bytes()).unwrap(), d);
        let mut b = d.to_bytes();
        b[7] = 9;
        assert!(BankDesc::from_bytes(&b).is_err());
    }
}
