//! What a plugin device number names: a NIC of 1..=8 rails, each rail a physical device
//! ([`Dev`]). A physical device number is a NIC of one rail; a virtual NIC that `makeVDevice`
//! made ([`crate::vdev`]) has one rail per device it merged. A NIC makes the comms
//! (`ibnet_core::rails`: one comm type per direction, whatever the rail count) and holds the
//! registrations its comms use.
//!
//! Registrations: a NIC of one rail registers through its device's cache, so its `mhandle`s
//! are the device's (as before virtual NICs existed). A NIC of several rails registers once
//! per rail, each in that rail's device cache (a buffer a comm of the same device registered
//! is shared), behind one entry of the NIC's own cache ([`NicCacheT`]), whose registration
//! handle (one per `regMr`) is the `mhandle` NCCL gets:
//! ```text
//!  regMr(comm of NIC n, addr, len)
//!    1 rail:    rail 0's cache: acquire_or_contained → mhandle (handle, n)
//!    n rails:   the NIC's cache: acquire_or_contained ── miss ─▶ for each rail i:
//!                                   rail i's cache: acquire_or_contained → keys[i], handle[i]
//!               mhandle = (this registration's record in the NIC's cache, n)
//!  isend/irecv: keys(mhandle) → the keys on every rail  (lock-free, no allocation)
//!  deregMr: ends the record (a second deregMr is refused); an entry's last reference
//!           ─▶ release handle[i] in each rail's cache
//! ```
//! Everything here but [`Nic::keys`] runs on the control path.

use std::sync::{Arc, Mutex};

use ibnet_core::comm::CommConfig;
use ibnet_core::fused::{VNic, Weights, MAX_DEVS_PER_NIC};
use ibnet_core::mr_cache::{MrCache, MrHandle};
use ibnet_core::provider::{MrKeys, PortInfo, RegKind};
use ibnet_core::rails::{speed_units, RailKeys};
use ibnet_core::wire::{QpInfo, RailList};
use ibnet_core::{Error, Result};

use crate::dev::{AnyMr, AnyRecv, AnySend, CachedMr, Dev, MrCacheT, MR_CACHE_CAPACITY};
use crate::dev_cache::DevCache;

/// One registration of a NIC of several rails: the keys and rail-cache handle on each rail.
#[derive(Debug, Clone, Copy)]
pub struct NicMr {
    /// Keys on each rail (rail order).
    pub keys: RailKeys,
    /// The rail caches' handles (as bits), released with the last reference.
    rails: [u64; MAX_DEVS_PER_NIC],
    /// How many rails.
    n: u8,
    /// The registered range.
    pub base: u64,
    /// Its length.
    pub len: u64,
}

/// The registration cache of a NIC of several rails (as big as a device's: `regIsGlobal`
/// promises every registration of the device is usable on all its comms).
pub type NicCacheT = MrCache<NicMr, MR_CACHE_CAPACITY>;

/// What the data path needs of a registration: its keys on every rail and its range.
#[derive(Debug, Clone, Copy)]
pub struct MrInfo {
    /// The keys, rail order.
    pub keys: RailKeys,
    /// The registered range.
    pub base: u64,
    /// Its length.
    pub len: u64,
}

/// A NIC: its plugin device number, its rails' devices and caches, and (several rails) its
/// own registrations.
pub struct Nic {
    /// The physical devices, rail order.
    pub vnic: VNic,
    /// The plugin device number (carried by its mhandles).
    pub index: u8,
    /// The rails' devices, rail order.
    pub devs: Vec<Dev>,
    /// The rails' registration caches, rail order.
    caches: Vec<Arc<DevCache>>,
    /// Several rails: the NIC's own registrations (one rail registers in its device's).
    own: Option<Arc<NicCacheT>>,
}

/// The NICs a plugin instance has set up (made on first use, control path only).
#[derive(Default)]
pub struct Nics(Mutex<Vec<Arc<Nic>>>);

/// A plugin's physical devices and their caches (same index).
pub type Phys<'a> = (&'a [Dev], &'a [Arc<DevCache>]);

impl Nics {
    /// The NIC device number `dev` names, the vNIC `v` (see `crate::vdev::lookup`), over the
    /// physical devices `phys`: the one set up before, or a new one.
    pub fn resolve(&self, phys: Phys<'_>, dev: core::ffi::c_int, v: VNic) -> Result<Arc<Nic>> {
        let index = u8::try_from(dev).map_err(|_| Error::OutOfRange {
            what: "dev",
            value: dev as i64,
            min: 0,
            max: i64::from(u8::MAX),
        })?;
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = t.iter().find(|n| n.index == index) {
            return Ok(n.clone());
        }
        let n = Arc::new(Nic::new(phys, index, v)?);
        t.push(n.clone());
        Ok(n)
    }
}

impl Nic {
    fn new((devs, caches): Phys<'_>, index: u8, vnic: VNic) -> Result<Self> {
        // A vNIC made over an earlier plugin instance with more devices names none here.
        let gone = |d: &u16| Error::OutOfRange {
            what: "physical device of the NIC (devices changed since makeVDevice)",
            value: i64::from(*d),
            min: 0,
            max: devs.len() as i64 - 1,
        };
        let pick = |d: &u16| devs.get(usize::from(*d)).ok_or_else(|| gone(d));
        let rails: Result<Vec<Dev>> = vnic.devs().iter().map(|d| pick(d).cloned()).collect();
        let caches: Result<Vec<Arc<DevCache>>> = vnic
            .devs()
            .iter()
            .map(|d| caches.get(usize::from(*d)).cloned().ok_or_else(|| gone(d)))
            .collect();
        Ok(Self {
            vnic,
            index,
            devs: rails?,
            caches: caches?,
            own: vnic.is_fused().then(|| Arc::from(crate::boxed::mr_cache())),
        })
    }

    /// How many rails.
    pub fn rails(&self) -> usize {
        self.devs.len()
    }

    /// Rail 0's device.
    pub fn dev(&self) -> &Dev {
        &self.devs[0]
    }

    /// Rail `i`'s device name, for logs (`?` past the rails).
    pub fn rail_name(&self, i: u8) -> String {
        self.devs
            .get(usize::from(i))
            .map_or("?".into(), |d| d.name().to_string_lossy().into_owned())
    }

    /// The rails' physical device numbers, rail order.
    pub fn rail_devs(&self) -> heapless::Vec<u16, MAX_DEVS_PER_NIC> {
        self.vnic.devs().iter().copied().collect()
    }

    /// The rails' ports, rail order (for the accepting handshake).
    pub fn ports(&self) -> heapless::Vec<PortInfo, MAX_DEVS_PER_NIC> {
        self.devs.iter().map(Dev::port_info).collect()
    }

    /// Refuses peer infos that cannot name a provider we may reach (each rail's device).
    pub fn check_peer(&self, infos: &[QpInfo]) -> Result<()> {
        if self.rails() == 1 {
            return infos.iter().try_for_each(|i| self.devs[0].check_peer(i));
        }
        self.devs
            .iter()
            .zip(infos)
            .try_for_each(|(d, i)| d.check_peer(i))
    }

    /// This side's stripe weights (rail order): each rail's speed.
    fn weights(devs: &[Dev]) -> Weights {
        let mut w = [0; MAX_DEVS_PER_NIC];
        for (d, s) in w.iter_mut().zip(devs) {
            *d = speed_units(s.speed_mbps());
        }
        w
    }

    /// The rails' devices for one new comm, each with the GID chosen for it now
    /// ([`Dev::choose_gid`]; control path).
    fn choose_gids(&self) -> Result<Vec<Dev>> {
        self.devs.iter().map(Dev::choose_gid).collect()
    }

    /// A send comm over the rails.
    pub fn new_send(&self, cfg: CommConfig) -> Result<AnySend> {
        let devs = self.choose_gids()?;
        let mut s = AnySend::new(&devs, cfg)?;
        s.set_rail_weights(&Self::weights(&devs));
        Ok(s)
    }

    /// A receive comm over the rails, connected to the sender's `infos` (rail order) whose
    /// rail list is `peer`.
    pub fn new_recv(&self, cfg: CommConfig, infos: &[QpInfo], peer: &RailList) -> Result<AnyRecv> {
        let devs = self.choose_gids()?;
        let mut r = AnyRecv::new(&devs, cfg, infos)?;
        r.join(peer, &Self::weights(&devs))?;
        Ok(r)
    }

    /// The registration `h` (from an mhandle of this NIC): its keys on every rail and its
    /// range. Lock-free, no allocation: the data path's lookup.
    #[inline]
    pub fn keys(&self, h: MrHandle) -> Option<MrInfo> {
        match &self.own {
            None => self.caches[0].get(h).map(|v| {
                let mut keys = [MrKeys::default(); MAX_DEVS_PER_NIC];
                keys[0] = v.keys;
                MrInfo {
                    keys,
                    base: v.base,
                    len: v.len,
                }
            }),
            Some(c) => c.get(h).map(|v| MrInfo {
                keys: v.keys,
                base: v.base,
                len: v.len,
            }),
        }
    }

    /// Registers `[addr, addr + len)` (page-aligned by the cache, as NCCL's IB plugin does) on
    /// every rail; a range the NIC holds already, or one containing it, is a hit. Returns
    /// the registration's handle.
    pub fn reg(&self, addr: u64, len: u64, page: u64, kind: RegKind) -> Result<MrHandle> {
        let Some(own) = &self.own else {
            return Ok(rail_reg(&self.devs[0], &self.caches[0], addr, len, page, kind)?.0);
        };
        let r = own.acquire_or_contained(addr, len, page, |base, len| {
            let mut m = NicMr {
                keys: [MrKeys::default(); MAX_DEVS_PER_NIC],
                rails: [0; MAX_DEVS_PER_NIC],
                n: 0,
                base,
                len,
            };
            for (i, (d, c)) in self.devs.iter().zip(&self.caches).enumerate() {
                match rail_reg(d, c, base, len, page, kind) {
                    Ok((h, keys)) => {
                        m.keys[i] = keys;
                        m.rails[i] = h.to_bits();
                        m.n += 1;
                    }
                    Err(e) => {
                        // Give back the rails registered so far.
                        let _ = self.release_rails(&m);
                        return Err(e);
                    }
                }
            }
            Ok(m)
        })?;
        Ok(r.handle)
    }

    /// Drops one reference to the registration `h`; the last one deregisters (on every rail).
    pub fn dereg(&self, h: MrHandle) -> Result<()> {
        match &self.own {
            None => self.caches[0].release(h, release_rail),
            Some(own) => own.release(h, |m| self.release_rails(&m)),
        }
    }

    fn release_rails(&self, m: &NicMr) -> Result<()> {
        let mut first = Ok(());
        for (c, &bits) in self.caches.iter().zip(&m.rails).take(m.n as usize) {
            let r = c.release(MrHandle::from_bits(bits), release_rail);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Registers `[addr, addr + len)` on device `d` through its cache `c`: the handle and keys.
fn rail_reg(
    d: &Dev,
    c: &MrCacheT,
    addr: u64,
    len: u64,
    page: u64,
    kind: RegKind,
) -> Result<(MrHandle, MrKeys)> {
    let r = c.acquire_or_contained(addr, len, page, |b, l| {
        let (mr, keys) = d.reg(b, l, kind)?;
        Ok(CachedMr {
            keys,
            raw: Box::into_raw(Box::new(mr)) as usize,
            base: b,
            len: l,
        })
    })?;
    Ok((r.handle, r.value.keys))
}

/// A device cache's last reference to a registration: deregisters it.
fn release_rail(v: CachedMr) -> Result<()> {
    // SAFETY: `raw` is the Box<AnyMr> leaked by `rail_reg`'s registration closure; the cache
    // calls this once, for the last reference, so it is reclaimed once.
    #[allow(unsafe_code)]
    let mr = unsafe { Box::from_raw(v.raw as *mut AnyMr) };
    mr.dereg()
}
