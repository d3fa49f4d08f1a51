//! The connection map across processes (NCCL's PXN path, where the GPU's process is not the
//! proxy's): the descriptor of an exported bank ([`BankDesc`]) and the fixed-size message the
//! proxy hands to the GPU's process ([`XMap`]).
//!
//! ```text
//!  proxy process                                      GPU process
//!  connect: banks from the MemProvider
//!           MemProvider::export(bank) ─▶ BankDesc ┐
//!  export_map(conn) ─▶ XMap { dir, sizes, map     │   XMap::from_bytes (validated)
//!          (addresses zeroed, descs filled) } ────┴─▶ attach: MemProvider::import(desc) per
//!                                                     bank ─▶ DeviceView in this process
//!  free(conn): unmap + free banks                     detach: MemProvider::unimport per bank
//! ```
//! The message is plain bytes (`#[repr(C)]` integers only) and is checked in full on arrival:
//! every field the importer uses is bounded, every item lies inside its bank, and a bank's
//! descriptor names its own bank. The handle inside a descriptor is the provider's business (a
//! memfd of the proxy process, a cuMem shareable handle, a CUDA IPC handle); the provider
//! checks it again when it imports.

use super::export::{BankDesc, XMAP_VERSION};
use super::map::{ConnectMap, MapOffset, BANKS};
use super::{Dir, NUM_PROTOCOLS};
use ibnet_core::error::{Error, Result};

const XMAP_MAGIC: u32 = 0x4d58_4249; // "IBXM"

/// The connection map as the GPU's process receives it: the map with every address zeroed
/// and every bank's [`BankDesc`], plus what the GPU side needs besides (direction, buffer
/// sizes). Fixed size, plain integers; see [`XMap::from_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct XMap {
    magic: u32,
    version: u16,
    /// 0 send, 1 receive.
    dir: u8,
    /// Shared-buffer mode.
    shared: u8,
    /// The proxy's process identity ([`super::ProxyConfig::process_id`]).
    pub owner: u64,
    /// Each protocol's buffer size.
    pub buff_sizes: [u64; NUM_PROTOCOLS],
    /// Where items live.
    pub send_mem: MapOffset,
    /// The `RecvMem`.
    pub recv_mem: MapOffset,
    /// Each protocol's buffer.
    pub buffs: [MapOffset; NUM_PROTOCOLS],
    _pad: u32,
    /// Each bank's descriptor ([`BankDesc::NONE`] for an unused bank; never GDR copy).
    pub banks: [BankDesc; BANKS],
}

impl XMap {
    /// Bytes of the message.
    pub const BYTES: usize = core::mem::size_of::<Self>();

    /// The message for `map`, whose banks carry their descriptors.
    pub(crate) fn new(
        dir: Dir,
        shared: bool,
        owner: u64,
        map: &ConnectMap,
        buff_sizes: [u64; NUM_PROTOCOLS],
    ) -> Result<Self> {
        let x = Self {
            magic: XMAP_MAGIC,
            version: XMAP_VERSION,
            dir: (dir == Dir::Recv) as u8,
            shared: shared as u8,
            owner,
            buff_sizes,
            send_mem: map.send_mem,
            recv_mem: map.recv_mem,
            buffs: map.buffs,
            _pad: 0,
            banks: core::array::from_fn(|i| map.mems[i].desc),
        };
        x.check()?;
        Ok(x)
    }

    /// The direction.
    pub fn dir(&self) -> Dir {
        if self.dir == 1 {
            Dir::Recv
        } else {
            Dir::Send
        }
    }

    /// Shared-buffer mode.
    pub fn shared(&self) -> bool {
        self.shared != 0
    }

    /// The message's bytes (to send to the GPU's process).
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `XMap` is `repr(C)` of integers and byte arrays with explicit padding
        // (`_pad`; the compile-time check below proves there is no other padding), so all
        // `BYTES` bytes are initialised.
        #[allow(unsafe_code)]
        unsafe {
            core::slice::from_raw_parts((self as *const Self).cast::<u8>(), Self::BYTES)
        }
    }

    /// Reads and checks a message from another process.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != Self::BYTES {
            return Err(Error::OutOfRange {
                what: "cross-process connection map bytes",
                value: b.len() as i64,
                min: Self::BYTES as i64,
                max: Self::BYTES as i64,
            });
        }
        // SAFETY: `b` has `BYTES` readable bytes; every field of `XMap` (integers, byte arrays,
        // `MapOffset(u32)`) is valid for any bit pattern; the read is unaligned-safe.
        #[allow(unsafe_code)]
        let x = unsafe { core::ptr::read_unaligned(b.as_ptr().cast::<Self>()) };
        x.check()?;
        Ok(x)
    }

    /// Checks the whole message: header, every descriptor, and every item inside its bank.
    pub fn check(&self) -> Result<()> {
        if self.magic != XMAP_MAGIC || self.version != XMAP_VERSION || self._pad != 0 {
            return Err(Error::BadState {
                op: "import connection map",
                state: "not a connection map of this version",
            });
        }
        if self.dir > 1 || self.shared > 1 {
            return Err(Error::BadState {
                op: "import connection map",
                state: "bad direction or shared flag",
            });
        }
        for (i, d) in self.banks.iter().enumerate() {
            if d.is_none() {
                continue;
            }
            d.check()?;
            if d.bank()? != i {
                return Err(Error::BadState {
                    op: "import connection map",
                    state: "descriptor names another bank",
                });
            }
        }
        let fixed = core::mem::size_of::<super::shared::RecvMem>() as u64;
        for (item, len, what) in [
            (self.send_mem, fixed, "SendMem"),
            (self.recv_mem, fixed, "RecvMem"),
        ] {
            if item.is_null() {
                return Err(Error::Missing { what });
            }
            self.check_item(item, len)?;
        }
        for (i, &b) in self.buffs.iter().enumerate() {
            if b.is_null() {
                continue;
            }
            self.check_item(b, self.buff_sizes[i])?;
        }
        Ok(())
    }

    fn check_item(&self, item: MapOffset, len: u64) -> Result<()> {
        let d = &self.banks[item.bank() as usize];
        let end = item.offset().checked_add(len);
        if d.is_none() || end.is_none_or(|e| e > d.size) || len == 0 {
            return Err(Error::OutOfRange {
                what: "connection map item outside its bank",
                value: item.offset() as i64,
                min: 0,
                max: d.size as i64,
            });
        }
        Ok(())
    }

    /// The address of `item` in the importing process, given each bank's base there.
    pub fn pointer(&self, item: MapOffset, bases: &[u64; BANKS]) -> Option<u64> {
        if item.is_null() {
            return None;
        }
        let base = bases[item.bank() as usize];
        (base != 0).then(|| base + item.offset())
    }
}

// No implicit padding anywhere in XMap (as_bytes relies on it).
#[cfg(not(loom))]
const _: () = assert!(
    core::mem::size_of::<XMap>()
        == 4 + 2 + 1 + 1 + 8 + 8 * NUM_PROTOCOLS + 4 * (2 + NUM_PROTOCOLS) + 4 + 96 * BANKS
);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::export::HandleKind;
    use super::*;

    fn desc(bank: usize, size: u64) -> BankDesc {
        BankDesc::new(HandleKind::ProcessFd, size, 0, 42, &[7; 24])
            .unwrap()
            .with_bank(bank)
    }

    fn sample() -> XMap {
        let mut m = ConnectMap::default();
        let b = m.add(false, false, 8192).unwrap();
        m.send_mem = m.add(false, false, 4096).unwrap();
        m.recv_mem = m.add(false, false, 4096).unwrap();
        m.buffs[2] = b;
        m.mems[0].desc = desc(0, m.mems[0].size);
        XMap::new(Dir::Recv, false, 9, &m, [0, 0, 8192]).unwrap()
    }

    #[test]
    fn round_trips_and_resolves() {
        let x = sample();
        let y = XMap::from_bytes(x.as_bytes()).unwrap();
        assert_eq!(x, y);
        assert_eq!(y.dir(), Dir::Recv);
        let mut bases = [0; BANKS];
        bases[0] = 0x10000;
        assert_eq!(y.pointer(y.recv_mem, &bases), Some(0x10000 + 12288));
        assert_eq!(y.pointer(y.buffs[0], &bases), None);
    }

    #[test]
    fn rejects_bad_messages() {
        let x = sample();
        let b = x.as_bytes();
        assert!(matches!(
            XMap::from_bytes(&b[1..]),
            Err(Error::OutOfRange { .. })
        ));
        let mut bad = b.to_vec();
        bad[0] ^= 1;
        assert!(XMap::from_bytes(&bad).is_err(), "magic");
        // An item past its bank's end.
        let mut y = x;
        y.buff_sizes[2] = 1 << 20;
        assert!(matches!(y.check(), Err(Error::OutOfRange { .. })));
        // A descriptor under another bank's index.
        let mut y = x;
        y.banks[1] = y.banks[0];
        assert!(y.check().is_err());
        // A size of 0, an unknown kind, an unaligned offset.
        let mut y = x;
        y.banks[0].size = 0;
        assert!(y.check().is_err());
        let mut y = x;
        y.banks[0].offset = 100;
        assert!(y.check().is_err());
        // A missing RecvMem.
        let mut y = x;
        y.recv_mem = MapOffset::NULL;
        assert!(matches!(y.check(), Err(Error::Missing { .. })));
    }
}
