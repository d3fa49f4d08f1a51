//! What a plugin device number names for comm setup: a physical device ([`Nic::Plain`]) or a
//! fused virtual NIC ([`Nic::Fused`], made by `makeVDevice`; see [`crate::vdev`]), and a fused
//! NIC's registrations.
//!
//! A fused NIC's comms hold one core comm per rail (`ibnet_core::fused`); its registrations
//! hold one registration per rail, each taken from that rail's device cache (so a buffer a
//! plain comm of the same device registered is shared), behind one entry of the vNIC's own
//! cache ([`FusedCacheT`]), whose registration handle (one per `regMr`) is the `mhandle` NCCL
//! gets:
//! ```text
//!  regMr(fused comm, addr, len)
//!    fused cache: acquire_or_contained(addr, len) ── miss ─▶ for each rail i:
//!                                                     rail i's cache: acquire_or_contained
//!                                                     → keys[i], handle[i]
//!    mhandle = (this registration's record in the fused cache, device number of the vNIC)
//!  isend/irecv: fused cache get(mhandle) → keys[0..n]  (lock-free, no allocation)
//!  deregMr: ends the record (a second deregMr is refused); the fused entry's last reference
//!           ─▶ release handle[i] in each rail's cache
//! ```
//! Everything here but the cache lookups runs on the control path.

use std::sync::{Arc, Mutex};

use ibnet_core::comm::CommConfig;
use ibnet_core::fused::{VNic, MAX_DEVS_PER_NIC};
use ibnet_core::mr_cache::{MrCache, MrHandle};
use ibnet_core::provider::{MrKeys, PortInfo, RegKind};
use ibnet_core::wire::{QpInfo, RailList};
use ibnet_core::{Error, Result};

use crate::dev::{AnyMr, AnyRecv, AnySend, CachedMr, Dev, MrCacheT, MR_CACHE_CAPACITY};

/// One registration of a fused NIC: the keys and rail-cache handle on each rail.
#[derive(Debug, Clone, Copy)]
pub struct FusedMr {
    /// Keys on each rail (rail order).
    pub keys: [MrKeys; MAX_DEVS_PER_NIC],
    /// The rail caches' handles (as bits), released with the last reference.
    rails: [u64; MAX_DEVS_PER_NIC],
    /// How many rails.
    n: u8,
    /// The registered range.
    pub base: u64,
    /// Its length.
    pub len: u64,
}

/// A fused NIC's registration cache (as big as a device's: `regIsGlobal` promises every
/// registration of the device is usable on all its comms).
pub type FusedCacheT = MrCache<FusedMr, MR_CACHE_CAPACITY>;

/// A fused NIC of the current plugin: its rails' devices and caches, and its own cache.
pub struct FusedNic {
    /// The rails' physical devices.
    pub vnic: VNic,
    /// The vNIC's plugin device number (carried by its mhandles).
    pub index: u8,
    /// The rails' devices, rail order.
    pub devs: Vec<Dev>,
    /// The rails' registration caches, rail order.
    pub caches: Vec<Arc<MrCacheT>>,
    /// The fused registrations.
    pub cache: Arc<FusedCacheT>,
}

/// The fused NICs a plugin instance has set up (made on first use, control path only).
#[derive(Default)]
pub struct FusedNics(Mutex<Vec<Arc<FusedNic>>>);

impl FusedNics {
    fn get(&self, (devs, caches): Phys<'_>, index: u8, vnic: VNic) -> Result<Arc<FusedNic>> {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = t.iter().find(|f| f.index == index) {
            return Ok(f.clone());
        }
        // A vNIC made over an earlier plugin instance with more devices names none here.
        fn gone<T>(_: &u16) -> Result<T> {
            Err(Error::Missing {
                what: "physical device of the virtual NIC (devices changed since makeVDevice)",
            })
        }
        let devs: Result<Vec<Dev>> = vnic
            .devs()
            .iter()
            .map(|d| devs.get(*d as usize).cloned().map_or_else(|| gone(d), Ok))
            .collect();
        let caches: Result<Vec<Arc<MrCacheT>>> = vnic
            .devs()
            .iter()
            .map(|d| caches.get(*d as usize).cloned().map_or_else(|| gone(d), Ok))
            .collect();
        let f = Arc::new(FusedNic {
            vnic,
            index,
            devs: devs?,
            caches: caches?,
            cache: crate::boxed::mr_cache(),
        });
        t.push(f.clone());
        Ok(f)
    }
}

/// A plugin's physical devices and their caches (same index).
pub type Phys<'a> = (&'a [Dev], &'a [Arc<MrCacheT>]);

/// A device number resolved for comm setup.
#[derive(Clone)]
pub enum Nic {
    /// A physical device, its number and registration cache.
    Plain(Dev, u8, Arc<MrCacheT>),
    /// A fused NIC.
    Fused(Arc<FusedNic>),
}

impl Nic {
    /// What device number `dev`, naming the vNIC `v` (see `crate::vdev::lookup`), is over the
    /// physical devices `phys`, whose fused NICs set up so far are `fused`.
    pub fn resolve(
        phys: Phys<'_>,
        fused: &FusedNics,
        dev: core::ffi::c_int,
        v: VNic,
    ) -> Result<Self> {
        let bad = Error::OutOfRange {
            what: "dev",
            value: dev as i64,
            min: 0,
            max: i64::from(u8::MAX),
        };
        let index = u8::try_from(dev).map_err(|_| bad)?;
        let d = v.devs()[0] as usize;
        match (v.is_fused(), phys.0.get(d), phys.1.get(d)) {
            (false, Some(dv), Some(c)) => Ok(Self::Plain(dv.clone(), index, c.clone())),
            (false, ..) => Err(bad),
            (true, ..) => Ok(Self::Fused(fused.get(phys, index, v)?)),
        }
    }

    /// Rail 0's device (the one a plain comm uses).
    pub fn dev(&self) -> &Dev {
        match self {
            Self::Plain(d, ..) => d,
            Self::Fused(f) => &f.devs[0],
        }
    }

    /// The plugin device number.
    pub fn index(&self) -> u8 {
        match self {
            Self::Plain(_, i, _) => *i,
            Self::Fused(f) => f.index,
        }
    }

    /// Rail 0's registration cache (a plain comm's).
    pub fn cache(&self) -> Arc<MrCacheT> {
        match self {
            Self::Plain(_, _, c) => c.clone(),
            Self::Fused(f) => f.caches[0].clone(),
        }
    }

    /// The fused NIC, if this is one.
    pub fn fused(&self) -> Option<Arc<FusedNic>> {
        match self {
            Self::Plain(..) => None,
            Self::Fused(f) => Some(f.clone()),
        }
    }

    /// The rails' physical device numbers, rail order.
    pub fn rail_devs(&self) -> heapless::Vec<u16, MAX_DEVS_PER_NIC> {
        match self {
            // A plain device's number is its physical index.
            Self::Plain(_, i, _) => core::iter::once(u16::from(*i)).collect(),
            Self::Fused(f) => f.vnic.devs().iter().copied().collect(),
        }
    }

    /// The rails' ports, rail order (for the accepting handshake).
    pub fn ports(&self) -> heapless::Vec<PortInfo, MAX_DEVS_PER_NIC> {
        match self {
            Self::Plain(d, ..) => core::iter::once(d.port_info()).collect(),
            Self::Fused(f) => f.devs.iter().map(Dev::port_info).collect(),
        }
    }

    /// Refuses peer infos that cannot name a provider we may reach (each rail's device).
    pub fn check_peer(&self, infos: &[QpInfo]) -> Result<()> {
        match self {
            Self::Plain(d, ..) => infos.iter().try_for_each(|i| d.check_peer(i)),
            Self::Fused(f) => f
                .devs
                .iter()
                .zip(infos)
                .try_for_each(|(d, i)| d.check_peer(i)),
        }
    }

    /// The rails' devices for one new comm, each with the GID chosen for it now
    /// ([`Dev::choose_gid`]; control path).
    fn choose_gids(f: &FusedNic) -> Result<Vec<Dev>> {
        f.devs.iter().map(Dev::choose_gid).collect()
    }

    /// A send comm over the rails.
    pub fn new_send(&self, cfg: CommConfig) -> Result<AnySend> {
        match self {
            Self::Plain(d, ..) => d.choose_gid()?.new_send(cfg),
            Self::Fused(f) => crate::dev::fused_send(&Self::choose_gids(f)?, cfg),
        }
    }

    /// A receive comm over the rails, connected to the sender's `infos` (rail order) whose
    /// rail list is `peer`.
    pub fn new_recv(&self, cfg: CommConfig, infos: &[QpInfo], peer: &RailList) -> Result<AnyRecv> {
        match self {
            Self::Plain(d, ..) => {
                let first = infos.first().ok_or(Error::Missing {
                    what: "the peer's QP info",
                })?;
                d.choose_gid()?.new_recv(cfg, first)
            }
            Self::Fused(f) => crate::dev::fused_recv(&Self::choose_gids(f)?, cfg, infos, peer),
        }
    }
}

impl FusedNic {
    /// Registers `[addr, addr + len)` on every rail through the fused cache (a range it
    /// already holds, or one containing it, is a hit); returns the fused entry's handle.
    pub fn reg(&self, addr: u64, len: u64, page: u64, kind: RegKind) -> Result<MrHandle> {
        let r = self
            .cache
            .acquire_or_contained(addr, len, page, |base, len| {
                let mut m = FusedMr {
                    keys: [MrKeys::default(); MAX_DEVS_PER_NIC],
                    rails: [0; MAX_DEVS_PER_NIC],
                    n: 0,
                    base,
                    len,
                };
                for (i, (d, c)) in self.devs.iter().zip(&self.caches).enumerate() {
                    let got = c.acquire_or_contained(base, len, page, |b, l| {
                        let (mr, keys) = d.reg(b, l, kind)?;
                        Ok(CachedMr {
                            keys,
                            raw: Box::into_raw(Box::new(mr)) as usize,
                            base: b,
                            len: l,
                        })
                    });
                    match got {
                        Ok(r) => {
                            m.keys[i] = r.value.keys;
                            m.rails[i] = r.handle.to_bits();
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

    /// Drops one reference to the fused entry `h`; the last one releases every rail's.
    pub fn dereg(&self, h: MrHandle) -> Result<()> {
        self.cache.release(h, |m| self.release_rails(&m))
    }

    fn release_rails(&self, m: &FusedMr) -> Result<()> {
        let mut first = Ok(());
        for (c, &bits) in self.caches.iter().zip(&m.rails).take(m.n as usize) {
            let r = c.release(MrHandle::from_bits(bits), |v| {
                // SAFETY: `raw` is the Box<AnyMr> leaked by a registration closure (here or
                // in `api::mr`); the cache calls this once, for the last reference.
                #[allow(unsafe_code)]
                let mr = unsafe { Box::from_raw(v.raw as *mut AnyMr) };
                mr.dereg()
            });
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}
