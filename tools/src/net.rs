//! Loads an NCCL net plugin `.so` and drives it through its C API, whatever its version
//! (v11, v10, v9 or v8, preferred in that order as NCCL 2.28 does).
//!
//! All `unsafe` of the tools lives here, in `buf.rs` and in `log.rs`. Every pointer handed to
//! the plugin is either one it gave us (comm, mhandle, request) or memory we own that outlives
//! the call; every result is checked; a NULL member of the table is an error, not a call.

use core::ffi::{c_int, c_void, CStr};
use std::path::{Path, PathBuf};

use crate::abi::*;
use crate::Error;

/// The ABI versions ibnet-perf can drive, in NCCL's preference order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `ncclNetPlugin_v11` (NCCL 2.28).
    V11,
    /// `ncclNetPlugin_v10` (NCCL 2.26–2.27).
    V10,
    /// `ncclNetPlugin_v9` (NCCL 2.24–2.25).
    V9,
    /// `ncclNetPlugin_v8` (NCCL 2.19–2.23).
    V8,
}

impl Version {
    /// The exported symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            Version::V11 => "ncclNetPlugin_v11",
            Version::V10 => "ncclNetPlugin_v10",
            Version::V9 => "ncclNetPlugin_v9",
            Version::V8 => "ncclNetPlugin_v8",
        }
    }
}

#[derive(Clone, Copy)]
enum Table {
    V11(*const Net11),
    V10(*const Net10),
    V9(*const Net9),
    V8(*const Net8),
}

/// Calls table member `$f` of whichever version is loaded, with per-version argument lists.
macro_rules! member {
    ($t:expr, $f:ident) => {
        match $t {
            // SAFETY: the table pointer came from dlsym on the library we keep open.
            Table::V11(t) => unsafe { (*t).head.$f }.map(|_| ()),
            // SAFETY: as above.
            Table::V10(t) => unsafe { (*t).$f }.map(|_| ()),
            // SAFETY: as above.
            Table::V9(t) => unsafe { (*t).$f }.map(|_| ()),
            // SAFETY: as above.
            Table::V8(t) => unsafe { (*t).$f }.map(|_| ()),
        }
    };
}

/// One device's properties, version-independent.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DevProps {
    /// Device name.
    pub name: String,
    /// PCI path (None for virtual devices).
    pub pci_path: Option<String>,
    /// GUID.
    pub guid: u64,
    /// `NCCL_PTR_*` mask.
    pub ptr_support: i32,
    /// Port speed, Mbps.
    pub speed_mbps: i32,
    /// Port number.
    pub port: i32,
    /// Max comms.
    pub max_comms: i32,
    /// Max receives in one multi-receive.
    pub max_recvs: i32,
    /// `regIsGlobal`.
    pub reg_is_global: bool,
}

/// A comm or listen comm handed out by the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comm(pub *mut c_void);
/// A memory registration handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr(pub *mut c_void);
/// An outstanding request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req(pub *mut c_void);

/// One receive buffer of a (multi-)receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvSpec {
    /// Address.
    pub data: *mut u8,
    /// Posted size.
    pub size: usize,
    /// Tag.
    pub tag: i32,
    /// Registration.
    pub mr: Mr,
}

/// Most receives in one `irecv` (`NCCL_NET_IB_MAX_RECVS`).
pub const MAX_RECVS: usize = 8;

/// A loaded plugin.
pub struct Plugin {
    table: Table,
    version: Version,
    path: PathBuf,
    name: String,
    ctx: *mut c_void,
    inited: bool,
    // Dropped last: every pointer above points into it.
    _lib: libloading::os::unix::Library,
}

fn check(call: &str, rc: c_int) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error(format!(
            "plugin {call} failed: {} ({rc})",
            result_name(rc)
        )))
    }
}

fn missing(call: &str) -> Error {
    Error(format!("plugin has no {call} (NULL in its table)"))
}

impl Plugin {
    /// Opens `path` as NCCL does (`RTLD_NOW | RTLD_LOCAL`) and finds the newest table it exports.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
        // SAFETY: loading a library runs its constructors; that is the point of the tool and
        // what NCCL does with the same file.
        let lib = unsafe { libloading::os::unix::Library::open(Some(path), flags) }
            .map_err(|e| Error(format!("cannot load plugin {}: {e}", path.display())))?;
        let versions = [Version::V11, Version::V10, Version::V9, Version::V8];
        let mut found = None;
        for v in versions {
            // SAFETY: we only take the symbol's address; it is read below as the table type
            // its name promises (the ABI contract of ncclNetPlugin_vN).
            let sym = unsafe { lib.get::<*const c_void>(v.symbol().as_bytes()) };
            if let Ok(s) = sym {
                let p = s.into_raw() as *const c_void;
                if !p.is_null() {
                    found = Some((v, p));
                    break;
                }
            }
        }
        let Some((version, p)) = found else {
            return Err(Error(format!(
                "{} exports none of ncclNetPlugin_v11/v10/v9/v8: not an NCCL net plugin ibnet-perf can drive",
                path.display()
            )));
        };
        let table = match version {
            Version::V11 => Table::V11(p.cast()),
            Version::V10 => Table::V10(p.cast()),
            Version::V9 => Table::V9(p.cast()),
            Version::V8 => Table::V8(p.cast()),
        };
        // SAFETY: every table starts with `const char* name`.
        let name_ptr = unsafe { *(p as *const *const core::ffi::c_char) };
        let name = if name_ptr.is_null() {
            "(unnamed)".to_string()
        } else {
            // SAFETY: a NUL-terminated static string of the plugin.
            unsafe { CStr::from_ptr(name_ptr) }
                .to_string_lossy()
                .into_owned()
        };
        Ok(Self {
            table,
            version,
            path: path.to_path_buf(),
            name,
            ctx: core::ptr::null_mut(),
            inited: false,
            _lib: lib,
        })
    }

    /// The table's `name` (e.g. `IBNet`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The ABI version found.
    pub fn version(&self) -> Version {
        self.version
    }
    /// The file loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Whether this is ibnet's own plugin.
    pub fn is_ibnet(&self) -> bool {
        self.name.eq_ignore_ascii_case("IBNet")
    }

    /// `init` with the stderr logger.
    pub fn init(&mut self) -> Result<(), Error> {
        // SAFETY: the shim is a C-variadic function of exactly ncclDebugLogger_t's signature;
        // the table types carry it as an opaque function pointer.
        let logger: Logger = Some(unsafe {
            core::mem::transmute::<
                unsafe extern "C" fn(
                    c_int,
                    core::ffi::c_ulong,
                    *const core::ffi::c_char,
                    c_int,
                    *const core::ffi::c_char,
                    ...
                ),
                unsafe extern "C" fn(),
            >(crate::log::ibnet_tools_logger)
        });
        let rc = match self.table {
            Table::V11(t) => {
                let mut cfg = ncclNetCommConfig_t { traffic_class: -1 };
                // SAFETY: table from dlsym; ctx and cfg outlive the call.
                let f = unsafe { (*t).head.init }.ok_or_else(|| missing("init"))?;
                // SAFETY: arguments as ncclNet_v11_t.init expects; the profiler callback is NULL.
                unsafe { f(&mut self.ctx, 0x1b4e_7065_7266, &mut cfg, logger, None) }
            }
            Table::V10(t) => {
                // SAFETY: as above.
                let f = unsafe { (*t).init }.ok_or_else(|| missing("init"))?;
                // SAFETY: as above.
                unsafe { f(logger, None) }
            }
            Table::V9(t) => {
                // SAFETY: as above.
                let f = unsafe { (*t).init }.ok_or_else(|| missing("init"))?;
                // SAFETY: as above.
                unsafe { f(logger) }
            }
            Table::V8(t) => {
                // SAFETY: as above.
                let f = unsafe { (*t).init }.ok_or_else(|| missing("init"))?;
                // SAFETY: as above.
                unsafe { f(logger) }
            }
        };
        check("init", rc)?;
        self.inited = true;
        Ok(())
    }

    /// `finalize` (v11; older versions have none). NULL-safe, idempotent.
    pub fn finalize(&mut self) -> Result<(), Error> {
        if !self.inited {
            return Ok(());
        }
        self.inited = false;
        if let Table::V11(t) = self.table {
            // SAFETY: table from dlsym.
            if let Some(f) = unsafe { (*t).finalize } {
                // SAFETY: the ctx init gave us.
                check("finalize", unsafe { f(self.ctx) })?;
            }
        }
        self.ctx = core::ptr::null_mut();
        Ok(())
    }

    /// `devices`.
    pub fn devices(&self) -> Result<i32, Error> {
        member!(self.table, devices).ok_or_else(|| missing("devices"))?;
        let mut n: c_int = 0;
        let rc = match self.table {
            // SAFETY: present (checked above); `n` outlives the call.
            Table::V11(t) => unsafe { ((*t).head.devices.unwrap_unchecked())(&mut n) },
            // SAFETY: as above.
            Table::V10(t) => unsafe { ((*t).devices.unwrap_unchecked())(&mut n) },
            // SAFETY: as above.
            Table::V9(t) => unsafe { ((*t).devices.unwrap_unchecked())(&mut n) },
            // SAFETY: as above.
            Table::V8(t) => unsafe { ((*t).devices.unwrap_unchecked())(&mut n) },
        };
        check("devices", rc)?;
        Ok(n)
    }

    /// `getProperties(dev)`.
    pub fn properties(&self, dev: i32) -> Result<DevProps, Error> {
        member!(self.table, get_properties).ok_or_else(|| missing("getProperties"))?;
        let cs = |p: *mut core::ffi::c_char| -> Option<String> {
            // SAFETY: a non-NULL string pointer in the props is a NUL-terminated string owned
            // by the plugin, valid at least until the next call; it is copied out at once.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // The props structs of every version share these field names.
        macro_rules! dev_props {
            ($p:expr) => {
                DevProps {
                    name: cs($p.name).unwrap_or_default(),
                    pci_path: cs($p.pci_path),
                    guid: $p.guid,
                    ptr_support: $p.ptr_support,
                    speed_mbps: $p.speed,
                    port: $p.port,
                    max_comms: $p.max_comms,
                    max_recvs: $p.max_recvs,
                    reg_is_global: $p.reg_is_global != 0,
                }
            };
        }
        match self.table {
            Table::V11(t) => {
                // SAFETY: the props struct is plain C data for which all-zero is a valid value.
                let mut p: Props11 = unsafe { core::mem::zeroed() };
                // SAFETY: `t` is the plugin's live table; `member!` checked the entry is
                // non-NULL; `p` is a valid, writable props struct of this version's layout.
                let rc = unsafe { ((*t).head.get_properties.unwrap_unchecked())(dev, &mut p) };
                check("getProperties", rc)?;
                Ok(dev_props!(p))
            }
            Table::V10(_) | Table::V9(_) => {
                // SAFETY: as for v11: plain C data, all-zero is valid.
                let mut p: Props9 = unsafe { core::mem::zeroed() };
                let f = match self.table {
                    // SAFETY: the live table's entry, checked non-NULL by `member!`.
                    Table::V10(t) => unsafe { (*t).get_properties.unwrap_unchecked() },
                    // SAFETY: as above.
                    Table::V9(t) => unsafe { (*t).get_properties.unwrap_unchecked() },
                    _ => unreachable!(),
                };
                // SAFETY: `f` is the plugin's getProperties; `p` has the v9/v10 layout.
                let rc = unsafe { f(dev, &mut p) };
                check("getProperties", rc)?;
                Ok(dev_props!(p))
            }
            Table::V8(t) => {
                // SAFETY: as for v11: plain C data, all-zero is valid.
                let mut p: Props8 = unsafe { core::mem::zeroed() };
                // SAFETY: the live table's entry, checked non-NULL; `p` has the v8 layout.
                let rc = unsafe { ((*t).get_properties.unwrap_unchecked())(dev, &mut p) };
                check("getProperties", rc)?;
                Ok(dev_props!(p))
            }
        }
    }

    /// `listen(dev)`: the connect handle and the listen comm.
    pub fn listen(&self, dev: i32) -> Result<([u8; NCCL_NET_HANDLE_MAXSIZE], Comm), Error> {
        member!(self.table, listen).ok_or_else(|| missing("listen"))?;
        let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        let mut l: *mut c_void = core::ptr::null_mut();
        let hp = h.as_mut_ptr().cast::<c_void>();
        // SAFETY (every arm below): member present; the handle buffer is NCCL_NET_HANDLE_MAXSIZE bytes
        // and `l` outlives the call.
        let rc = match self.table {
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V11(t) => unsafe {
                ((*t).head.listen.unwrap_unchecked())(self.ctx, dev, hp, &mut l)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe { ((*t).listen.unwrap_unchecked())(dev, hp, &mut l) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe { ((*t).listen.unwrap_unchecked())(dev, hp, &mut l) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V8(t) => unsafe { ((*t).listen.unwrap_unchecked())(dev, hp, &mut l) },
        };
        check("listen", rc)?;
        if l.is_null() {
            return Err(Error("plugin listen returned a NULL listen comm".into()));
        }
        Ok((h, Comm(l)))
    }

    /// One `connect` attempt: `Ok(None)` means "call again".
    pub fn connect(
        &self,
        dev: i32,
        handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE],
    ) -> Result<Option<Comm>, Error> {
        member!(self.table, connect).ok_or_else(|| missing("connect"))?;
        let mut s: *mut c_void = core::ptr::null_mut();
        let mut dh: *mut ncclNetDeviceHandle_t = core::ptr::null_mut();
        let hp = handle.as_mut_ptr().cast::<c_void>();
        let mut cfg = ncclNetCommConfig_t { traffic_class: -1 };
        // SAFETY (every arm below): member present; the handle (kept by the caller between attempts,
        // as NCCL does), `s`, `dh` and `cfg` outlive the call.
        let rc = match self.table {
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V11(t) => unsafe {
                ((*t).head.connect.unwrap_unchecked())(self.ctx, dev, hp, &mut s, &mut dh)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe {
                ((*t).connect.unwrap_unchecked())(dev, &mut cfg, hp, &mut s, &mut dh)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe { ((*t).connect.unwrap_unchecked())(dev, hp, &mut s, &mut dh) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V8(t) => unsafe { ((*t).connect.unwrap_unchecked())(dev, hp, &mut s, &mut dh) },
        };
        check("connect", rc)?;
        Ok((!s.is_null()).then_some(Comm(s)))
    }

    /// One `accept` attempt: `Ok(None)` means "call again".
    pub fn accept(&self, listen: Comm) -> Result<Option<Comm>, Error> {
        member!(self.table, accept).ok_or_else(|| missing("accept"))?;
        let mut r: *mut c_void = core::ptr::null_mut();
        let mut dh: *mut ncclNetDeviceHandle_t = core::ptr::null_mut();
        // SAFETY (every arm below): member present; `listen` came from listen(); outputs outlive the call.
        let rc = match self.table {
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V11(t) => unsafe {
                ((*t).head.accept.unwrap_unchecked())(listen.0, &mut r, &mut dh)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe { ((*t).accept.unwrap_unchecked())(listen.0, &mut r, &mut dh) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe { ((*t).accept.unwrap_unchecked())(listen.0, &mut r, &mut dh) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V8(t) => unsafe { ((*t).accept.unwrap_unchecked())(listen.0, &mut r, &mut dh) },
        };
        check("accept", rc)?;
        Ok((!r.is_null()).then_some(Comm(r)))
    }

    /// `regMr` of host memory.
    ///
    /// # Safety
    /// `data..data+size` must stay allocated until [`Plugin::dereg_mr`].
    pub unsafe fn reg_mr(&self, comm: Comm, data: *mut u8, size: usize) -> Result<Mr, Error> {
        member!(self.table, reg_mr).ok_or_else(|| missing("regMr"))?;
        let mut m: *mut c_void = core::ptr::null_mut();
        let d = data.cast::<c_void>();
        // SAFETY (every arm below): member present; the caller keeps the memory alive.
        let rc = match self.table {
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V11(t) => unsafe {
                ((*t).head.reg_mr.unwrap_unchecked())(comm.0, d, size, NCCL_PTR_HOST, &mut m)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe {
                ((*t).reg_mr.unwrap_unchecked())(comm.0, d, size, NCCL_PTR_HOST, &mut m)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe {
                ((*t).reg_mr.unwrap_unchecked())(comm.0, d, size, NCCL_PTR_HOST, &mut m)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V8(t) => unsafe {
                ((*t).reg_mr.unwrap_unchecked())(comm.0, d, size, NCCL_PTR_HOST, &mut m)
            },
        };
        check("regMr", rc)?;
        Ok(Mr(m))
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: Comm, mr: Mr) -> Result<(), Error> {
        member!(self.table, dereg_mr).ok_or_else(|| missing("deregMr"))?;
        // SAFETY (every arm below): member present; `mr` came from reg_mr on `comm`.
        let rc = match self.table {
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V11(t) => unsafe { ((*t).head.dereg_mr.unwrap_unchecked())(comm.0, mr.0) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe { ((*t).dereg_mr.unwrap_unchecked())(comm.0, mr.0) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe { ((*t).dereg_mr.unwrap_unchecked())(comm.0, mr.0) },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V8(t) => unsafe { ((*t).dereg_mr.unwrap_unchecked())(comm.0, mr.0) },
        };
        check("deregMr", rc)
    }

    /// One `isend` attempt: `Ok(None)` means "the receiver is not ready; call again".
    ///
    /// # Safety
    /// `data..data+size` must lie inside the registration `mr` and stay untouched until the
    /// request completes.
    pub unsafe fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Mr,
    ) -> Result<Option<Req>, Error> {
        member!(self.table, isend).ok_or_else(|| missing("isend"))?;
        let mut r: *mut c_void = core::ptr::null_mut();
        let d = data.cast::<c_void>();
        let null = core::ptr::null_mut();
        // SAFETY (every arm below): member present; buffer contract is the caller's.
        let rc = match self.table {
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V11(t) => unsafe {
                ((*t).head.isend.unwrap_unchecked())(comm.0, d, size, tag, mr.0, null, &mut r)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe {
                ((*t).isend.unwrap_unchecked())(comm.0, d, size, tag, mr.0, null, &mut r)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe {
                ((*t).isend.unwrap_unchecked())(comm.0, d, size, tag, mr.0, &mut r)
            },
            Table::V8(t) => {
                let s = c_int::try_from(size)
                    .map_err(|_| Error(format!("size {size} exceeds a v8 plugin's int")))?;
                // SAFETY: see the comment above this match (it holds for every arm).
                unsafe { ((*t).isend.unwrap_unchecked())(comm.0, d, s, tag, mr.0, &mut r) }
            }
        };
        check("isend", rc)?;
        Ok((!r.is_null()).then_some(Req(r)))
    }

    /// One `irecv` attempt over `bufs` (1..=[`MAX_RECVS`]): `Ok(None)` means "call again".
    ///
    /// # Safety
    /// Every buffer must lie inside its registration and stay untouched until completion.
    pub unsafe fn irecv(&self, comm: Comm, bufs: &[RecvSpec]) -> Result<Option<Req>, Error> {
        member!(self.table, irecv).ok_or_else(|| missing("irecv"))?;
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error(format!("irecv of {n} buffers (1..={MAX_RECVS})")));
        }
        let mut data = [core::ptr::null_mut::<c_void>(); MAX_RECVS];
        let mut sizes = [0usize; MAX_RECVS];
        let mut isizes = [0 as c_int; MAX_RECVS];
        let mut tags = [0 as c_int; MAX_RECVS];
        let mut mhs = [core::ptr::null_mut::<c_void>(); MAX_RECVS];
        let mut phs = [core::ptr::null_mut::<c_void>(); MAX_RECVS];
        for (i, b) in bufs.iter().enumerate() {
            data[i] = b.data.cast();
            sizes[i] = b.size;
            isizes[i] = c_int::try_from(b.size).unwrap_or(c_int::MAX);
            tags[i] = b.tag;
            mhs[i] = b.mr.0;
        }
        let mut r: *mut c_void = core::ptr::null_mut();
        let (dp, tp, mp, pp) = (
            data.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            phs.as_mut_ptr(),
        );
        let nn = n as c_int;
        // SAFETY (every arm below): member present; the arrays hold `n` entries and outlive the call
        // (the plugin copies what it needs); buffer contract is the caller's.
        let rc = match self.table {
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V11(t) => unsafe {
                ((*t).head.irecv.unwrap_unchecked())(
                    comm.0,
                    nn,
                    dp,
                    sizes.as_mut_ptr(),
                    tp,
                    mp,
                    pp,
                    &mut r,
                )
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe {
                ((*t).irecv.unwrap_unchecked())(
                    comm.0,
                    nn,
                    dp,
                    sizes.as_mut_ptr(),
                    tp,
                    mp,
                    pp,
                    &mut r,
                )
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe {
                ((*t).irecv.unwrap_unchecked())(comm.0, nn, dp, sizes.as_mut_ptr(), tp, mp, &mut r)
            },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V8(t) => unsafe {
                ((*t).irecv.unwrap_unchecked())(comm.0, nn, dp, isizes.as_mut_ptr(), tp, mp, &mut r)
            },
        };
        check("irecv", rc)?;
        Ok((!r.is_null()).then_some(Req(r)))
    }

    /// `test`: `Ok(Some(sizes))` once done (the request is then freed by the plugin).
    pub fn test(&self, req: Req) -> Result<Option<[i32; MAX_RECVS]>, Error> {
        member!(self.table, test).ok_or_else(|| missing("test"))?;
        let mut done: c_int = 0;
        let mut sizes = [0 as c_int; MAX_RECVS];
        let f = match self.table {
            // SAFETY (every arm below): member present.
            Table::V11(t) => unsafe { (*t).head.test.unwrap_unchecked() },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V10(t) => unsafe { (*t).test.unwrap_unchecked() },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V9(t) => unsafe { (*t).test.unwrap_unchecked() },
            // SAFETY: see the comment above this match (it holds for every arm).
            Table::V8(t) => unsafe { (*t).test.unwrap_unchecked() },
        };
        // SAFETY: `req` is an outstanding request; `sizes` has room for MAX_RECVS entries.
        check("test", unsafe { f(req.0, &mut done, sizes.as_mut_ptr()) })?;
        Ok((done != 0).then_some(sizes))
    }

    fn close(&self, which: &str, c: Comm) -> Result<(), Error> {
        let f = match (self.table, which) {
            // SAFETY (every arm below): table from dlsym.
            (Table::V11(t), "closeSend") => unsafe { (*t).head.close_send },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V11(t), "closeRecv") => unsafe { (*t).head.close_recv },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V11(t), _) => unsafe { (*t).head.close_listen },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V10(t), "closeSend") => unsafe { (*t).close_send },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V10(t), "closeRecv") => unsafe { (*t).close_recv },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V10(t), _) => unsafe { (*t).close_listen },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V9(t), "closeSend") => unsafe { (*t).close_send },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V9(t), "closeRecv") => unsafe { (*t).close_recv },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V9(t), _) => unsafe { (*t).close_listen },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V8(t), "closeSend") => unsafe { (*t).close_send },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V8(t), "closeRecv") => unsafe { (*t).close_recv },
            // SAFETY: `t` is the live table from dlsym; reading one of its fields.
            (Table::V8(t), _) => unsafe { (*t).close_listen },
        };
        let f = f.ok_or_else(|| missing(which))?;
        // SAFETY: `c` is a live comm of the right kind, closed once.
        check(which, unsafe { f(c.0) })
    }
    /// `closeSend`.
    pub fn close_send(&self, c: Comm) -> Result<(), Error> {
        self.close("closeSend", c)
    }
    /// `closeRecv`.
    pub fn close_recv(&self, c: Comm) -> Result<(), Error> {
        self.close("closeRecv", c)
    }
    /// `closeListen`.
    pub fn close_listen(&self, c: Comm) -> Result<(), Error> {
        self.close("closeListen", c)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.finalize();
    }
}
