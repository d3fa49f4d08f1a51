//! The connection map: where a connection's structures and buffers live, in a form that can be
//! copied to another process (NCCL's `struct connectMap`).
//!
//! Memory comes in five banks. Each item (the `SendMem`, the `RecvMem`, one buffer per
//! protocol) is a 32-bit [`MapOffset`]: three flag bits and a 29-bit offset into its bank.
//!
//! ```text
//!  bit 31   30    29    28 ........................ 0
//!  shared  dev   used  offset inside the bank (≤ 512 MiB)
//!
//!  bank = bits 31..30: 0 host, 1 device, 2 shared host, 3 shared device
//!  used = 0          : the item does not exist (NULL)
//! ```
//! Dedicated items are appended to the host or device bank (their offsets add up); a shared
//! item points at offset 0 of the shared bank, which is the per-peer pool. The fifth bank,
//! GDR-copy memory, holds the separately mapped ring counter and is addressed directly.

use super::export::BankDesc;
use super::mem::Region;
use super::NUM_PROTOCOLS;
use ibnet_core::error::{Error, Result};

/// A memory bank of a [`ConnectMap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Bank {
    /// Host memory dedicated to the connection.
    Host = 0,
    /// Device memory dedicated to the connection.
    Device = 1,
    /// The shared host pool.
    SharedHost = 2,
    /// The shared device pool.
    SharedDevice = 3,
    /// GDR-copy mapped device words.
    Gdc = 4,
}

/// Banks in a map.
pub const BANKS: usize = 5;

/// Alignment of dedicated items inside a bank.
pub const ITEM_ALIGN: u64 = 4096;

const MASK_DEV: u32 = 0x4000_0000;
const MASK_SHARED: u32 = 0x8000_0000;
const MASK_USED: u32 = 0x2000_0000;
const MASK_OFFSET: u32 = 0x1fff_ffff;

/// An item's place: bank + offset, or unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct MapOffset(pub u32);

impl MapOffset {
    /// The "unused" marker (no item).
    pub const NULL: Self = Self(0);

    /// Encodes an item at `offset` in the bank chosen by `shared` and `dev`.
    pub fn new(shared: bool, dev: bool, offset: u64) -> Result<Self> {
        if offset > MASK_OFFSET as u64 {
            return Err(Error::OutOfRange {
                what: "connection map offset",
                value: offset as i64,
                min: 0,
                max: MASK_OFFSET as i64,
            });
        }
        let mut v = MASK_USED | offset as u32;
        if dev {
            v |= MASK_DEV;
        }
        if shared {
            v |= MASK_SHARED;
        }
        Ok(Self(v))
    }
    /// Whether the item is absent.
    #[inline]
    pub fn is_null(self) -> bool {
        self.0 & MASK_USED == 0
    }
    /// The item's bank (meaningless when null).
    #[inline]
    pub fn bank(self) -> Bank {
        match self.0 >> 30 {
            0 => Bank::Host,
            1 => Bank::Device,
            2 => Bank::SharedHost,
            _ => Bank::SharedDevice,
        }
    }
    /// Whether the item is in device memory.
    #[inline]
    pub fn is_dev(self) -> bool {
        self.0 & MASK_DEV != 0
    }
    /// The offset inside the bank.
    #[inline]
    pub fn offset(self) -> u64 {
        (self.0 & MASK_OFFSET) as u64
    }
}

/// One bank: its addresses (as the proxy and as the GPU see it), size and the memory
/// provider's handle (what another process imports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct MapMem {
    /// The proxy's address (0 when not mapped here).
    pub cpu: u64,
    /// The GPU's address (0 when not mapped here).
    pub gpu: u64,
    /// Bytes.
    pub size: u64,
    /// The memory provider's handle for the bank.
    pub handle: u64,
    /// How another process maps the bank ([`BankDesc::NONE`] in a same-process map).
    pub desc: BankDesc,
}

impl MapMem {
    /// Describes `r`.
    pub fn of(r: &Region) -> Self {
        Self {
            cpu: r.cpu(),
            gpu: r.gpu(),
            size: r.size() as u64,
            handle: r.handle(),
            desc: BankDesc::NONE,
        }
    }
}

/// Where a connection's items live. In a cross-process map (`same_process == 0`) every bank
/// in use carries its export descriptor; the GPU's process receives the map as an
/// [`XMap`](super::xmap::XMap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct ConnectMap {
    /// The GPU side runs in the proxy's process.
    pub same_process: u32,
    /// Shared-buffer mode.
    pub shared: u32,
    /// The banks, indexed by [`Bank`].
    pub mems: [MapMem; BANKS],
    /// The `SendMem`.
    pub send_mem: MapOffset,
    /// The `RecvMem`.
    pub recv_mem: MapOffset,
    /// The buffer of each protocol, indexed by [`super::Protocol::index`].
    pub buffs: [MapOffset; NUM_PROTOCOLS],
}

/// Which address of an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// As the proxy sees it.
    Cpu,
    /// As the GPU sees it.
    Gpu,
}

impl ConnectMap {
    /// Places an item of `size` bytes: dedicated items are appended to the host or device
    /// bank (each starting on a 4 KiB boundary); a shared item sits at the start of its shared
    /// bank.
    pub fn add(&mut self, shared: bool, dev: bool, size: u64) -> Result<MapOffset> {
        if shared {
            return MapOffset::new(true, dev, 0);
        }
        let bank = if dev { Bank::Device } else { Bank::Host };
        let m = &mut self.mems[bank as usize];
        // Items start on a 4 KiB boundary, so every structure keeps its alignment.
        m.size = super::round_up(m.size, ITEM_ALIGN);
        let off = MapOffset::new(false, dev, m.size)?;
        m.size = m.size.checked_add(size).ok_or(Error::OutOfRange {
            what: "connection map bank size",
            value: i64::MAX,
            min: 0,
            max: MASK_OFFSET as i64,
        })?;
        Ok(off)
    }

    /// The address of `item` as `side` sees it, or `None` for an unused item or an unmapped
    /// bank.
    pub fn pointer(&self, item: MapOffset, side: Side) -> Option<u64> {
        if item.is_null() {
            return None;
        }
        let m = &self.mems[item.bank() as usize];
        let base = match side {
            Side::Cpu => m.cpu,
            Side::Gpu => m.gpu,
        };
        (base != 0).then(|| base + item.offset())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn encoding_matches_ncc_bits() {
        assert!(MapOffset::NULL.is_null());
        let h = MapOffset::new(false, false, 0x40).unwrap();
        assert_eq!(h.0, 0x2000_0040);
        assert_eq!(
            (h.bank(), h.offset(), h.is_dev()),
            (Bank::Host, 0x40, false)
        );
        let d = MapOffset::new(false, true, 8).unwrap();
        assert_eq!((d.0 >> 29, d.bank()), (0b011, Bank::Device));
        let sh = MapOffset::new(true, false, 0).unwrap();
        assert_eq!((sh.0 >> 29, sh.bank()), (0b101, Bank::SharedHost));
        let sd = MapOffset::new(true, true, 0).unwrap();
        assert_eq!((sd.0 >> 29, sd.bank()), (0b111, Bank::SharedDevice));
        assert!(matches!(
            MapOffset::new(false, false, 1 << 29),
            Err(Error::OutOfRange { .. })
        ));
    }

    #[test]
    fn add_appends_dedicated_items_and_pointer_resolves() {
        let mut m = ConnectMap::default();
        let a = m.add(false, false, 4096).unwrap();
        let b = m.add(false, true, 100).unwrap();
        let b2 = m.add(false, true, 100).unwrap();
        let c = m.add(false, false, 4096).unwrap();
        let s = m.add(true, true, 1 << 20).unwrap();
        assert_eq!((a.offset(), c.offset(), b.offset()), (0, 4096, 0));
        assert_eq!(m.mems[Bank::Host as usize].size, 8192);
        assert_eq!(b2.offset(), 4096, "items start on 4 KiB boundaries");
        assert_eq!(m.mems[Bank::Device as usize].size, 4196);
        assert_eq!(m.mems[Bank::SharedDevice as usize].size, 0);
        m.mems[Bank::Host as usize].cpu = 0x10000;
        m.mems[Bank::Host as usize].gpu = 0x90000;
        assert_eq!(m.pointer(c, Side::Cpu), Some(0x11000));
        assert_eq!(m.pointer(c, Side::Gpu), Some(0x91000));
        assert_eq!(m.pointer(b, Side::Cpu), None, "device bank not mapped");
        assert_eq!(m.pointer(s, Side::Cpu), None);
        assert_eq!(m.pointer(MapOffset::NULL, Side::Cpu), None);
    }
}
