//! The GPU process's side of a cross-process connection: map the banks an [`XMap`] describes
//! through this process's [`MemProvider`], hand out the [`DeviceView`] in this process's
//! addresses, and unmap them again.
//!
//! ```text
//!  XMap::from_bytes(msg)?  ─▶  Attached::attach(&mut mem, &x)?  ─▶  .view()  (the kernel's)
//!                                ▲ import every bank in use; on a failure, unimport those
//!                                  already mapped
//!  Attached::detach(&mut mem)  ─▶ unimport every bank (the proxy frees its side itself)
//! ```
//! The GPU-side protocol over the view is unchanged ([`super::device`]): the same words, the
//! same writers, only mapped at other addresses (so the loom model `loom_proxy` covers it).

use super::lifecycle::DeviceView;
use super::map::BANKS;
use super::mem::{MemProvider, Region};
use super::xmap::XMap;
use super::NUM_PROTOCOLS;
use ibnet_core::error::{Error, Result};

/// A cross-process connection's banks, mapped in the GPU's process.
#[derive(Debug)]
#[must_use = "detach it, or the banks stay mapped"]
pub struct Attached {
    regions: [Option<Region>; BANKS],
    view: DeviceView,
}

impl Attached {
    /// Maps every bank of `x` (already checked by [`XMap::from_bytes`] / [`XMap::check`])
    /// through `mem`. On failure nothing stays mapped.
    pub fn attach<M: MemProvider>(mem: &mut M, x: &XMap) -> Result<Self> {
        x.check()?;
        let mut regions = [None; BANKS];
        match Self::import_all(mem, x, &mut regions) {
            Ok(view) => Ok(Self { regions, view }),
            Err(e) => {
                for r in regions.iter_mut().filter_map(Option::take) {
                    let _ = mem.unimport(r);
                }
                Err(e)
            }
        }
    }

    fn import_all<M: MemProvider>(
        mem: &mut M,
        x: &XMap,
        regions: &mut [Option<Region>; BANKS],
    ) -> Result<DeviceView> {
        let mut bases = [0u64; BANKS];
        for (i, d) in x.banks.iter().enumerate() {
            if d.is_none() {
                continue;
            }
            let r = mem.import(d)?;
            regions[i] = Some(r);
            if (r.size() as u64) < d.size || r.gpu() == 0 {
                return Err(Error::OutOfRange {
                    what: "imported bank size",
                    value: r.size() as i64,
                    min: d.size as i64,
                    max: i64::MAX,
                });
            }
            bases[i] = r.gpu();
        }
        let at = |o| {
            x.pointer(o, &bases).ok_or(Error::Missing {
                what: "bank mapping",
            })
        };
        let send_mem = at(x.send_mem)?;
        let recv_mem = at(x.recv_mem)?;
        let mut buffs = [0; NUM_PROTOCOLS];
        let mut buff_sizes = [0; NUM_PROTOCOLS];
        for i in 0..NUM_PROTOCOLS {
            if !x.buffs[i].is_null() {
                buffs[i] = at(x.buffs[i])?;
                buff_sizes[i] = x.buff_sizes[i] as usize;
            }
        }
        // Across processes there are no GDR-copy words: head is in the SendMem, tail in the
        // RecvMem, as the proxy's own view of a same-process connection without GDR copy.
        Ok(DeviceView {
            dir: x.dir(),
            head: send_mem,
            tail: recv_mem,
            recv_mem,
            buffs,
            buff_sizes,
            shared: x.shared(),
        })
    }

    /// What the GPU side uses, in this process's addresses.
    pub fn view(&self) -> DeviceView {
        self.view
    }

    /// Unmaps every bank; returns the first error (all are unmapped regardless).
    pub fn detach<M: MemProvider>(mut self, mem: &mut M) -> Result<()> {
        let mut first = Ok(());
        for r in self.regions.iter_mut().filter_map(Option::take) {
            let e = mem.unimport(r);
            if first.is_ok() {
                first = e;
            }
        }
        first
    }
}
