//! The one loader of NCCL net plugins from a `.so`, shared by the proxy engine's
//! `ForeignNet` (ibnet-proxy's `capi` feature) and `ibnet-perf`/`ibnet-info` (ibnet-tools).
//! "Foreign" means reached only through the plugin's C table, whoever wrote it (ibnet's own
//! library included).
//!
//! ```text
//!  ForeignPlugin::open(path) ─ dlopen(RTLD_NOW | RTLD_LOCAL)   (never dlclose'd: a plugin
//!       │                                                        may own threads)
//!       └─ dlsym ncclNetPlugin_v12, v11, … v6 (newest first, as NCCL 2.30+)
//!            └─ the table is copied out once ([`Table`]); calls read the copy, never the
//!               library's memory again
//!  init(logger, commId) ─ v11/v12: init(&ctx, commId, {trafficClass = -1}, logger, NULL)
//!                       ─ v10: init(logger, NULL)      ─ v6–v9: init(logger)
//!  listen/connect/accept/regMr/isend/irecv/iflush/test/close* ──▶ the version's entry
//!  finalize (v11/v12; idempotent)
//! ```
//! Version differences handled in [`calls`]: the ctx argument (v11, v12), the comm config on
//! `connect` (v10), device handles (v7+), `int` sizes (regMr v6–v7, isend/irecv v6–v8: a
//! larger size is an `OutOfRange` error, not a truncation), profiler handles (v10+).
//!
//! Every entry is an `Option`: a NULL entry is [`CallError::Null`], never called. A result
//! other than `ncclSuccess` is [`CallError::Failed`]. Comms, registrations and requests passed
//! back must be ones this plugin returned and has not closed (as NCCL's contract with a
//! plugin): the plugin cannot check them all, and a stale one is its undefined behaviour.
#![allow(unsafe_code)] // dlopen/dlsym and the calls into the plugin; every block has a SAFETY comment.

pub mod calls;

use core::ffi::{c_int, c_void, CStr};
use std::ffi::CString;
use std::path::Path;

use crate::props::{Props, VersionProps};
use crate::tables::*;
use crate::types::{
    ncclDebugLogger_t, ncclNetCommConfig_t, ncclResult_t, VDevProps, NCCL_NET_MAX_DEVS_PER_NIC,
    NCCL_NET_MAX_DEVS_PER_NIC_V12, NCCL_NET_TRAFFIC_CLASS_UNDEF,
};

/// The ABI versions the loader speaks, newest first (the order it looks for them in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `ncclNetPlugin_v12` (NCCL 2.30+).
    V12,
    /// `ncclNetPlugin_v11` (NCCL 2.28).
    V11,
    /// `ncclNetPlugin_v10` (NCCL 2.26–2.27).
    V10,
    /// `ncclNetPlugin_v9` (NCCL 2.24–2.25).
    V9,
    /// `ncclNetPlugin_v8` (NCCL 2.19–2.23).
    V8,
    /// `ncclNetPlugin_v7` (NCCL 2.14–2.18).
    V7,
    /// `ncclNetPlugin_v6` (NCCL 2.12–2.13).
    V6,
}

impl Version {
    /// Every version, newest first.
    pub const ALL: [Version; 7] = [
        Version::V12,
        Version::V11,
        Version::V10,
        Version::V9,
        Version::V8,
        Version::V7,
        Version::V6,
    ];

    /// The exported symbol.
    pub fn symbol(self) -> &'static str {
        self.csymbol().to_str().unwrap_or("")
    }

    fn csymbol(self) -> &'static CStr {
        match self {
            Version::V12 => c"ncclNetPlugin_v12",
            Version::V11 => c"ncclNetPlugin_v11",
            Version::V10 => c"ncclNetPlugin_v10",
            Version::V9 => c"ncclNetPlugin_v9",
            Version::V8 => c"ncclNetPlugin_v8",
            Version::V7 => c"ncclNetPlugin_v7",
            Version::V6 => c"ncclNetPlugin_v6",
        }
    }
}

/// A plugin's table, copied out of the library once.
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub enum Table {
    V12(ncclNet_v12_t),
    V11(ncclNet_v11_t),
    V10(ncclNet_v10_t),
    V9(ncclNet_v9_t),
    V8(ncclNet_v8_t),
    V7(ncclNet_v7_t),
    V6(ncclNet_v6_t),
}

/// `match` over the loaded table (by reference: no copy per call) with one body for a group of
/// versions: the body is expanded per version, so `$t` has that version's table type in each.
macro_rules! by_version {
    ($table:expr, { $([$($v:ident),+] $t:ident => $body:expr),+ $(,)? }) => {
        match &$table { $($($crate::foreign::Table::$v($t) => $body,)+)+ }
    };
}
pub(crate) use by_version;

/// An entry every version has with one signature, as an `Option`.
macro_rules! shared {
    ($table:expr, $f:ident) => {
        $crate::foreign::by_version!($table, { [V12, V11, V10, V9, V8, V7, V6] t => t.$f })
    };
}
pub(crate) use shared;

/// Why a plugin could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The path has a NUL byte.
    Path,
    /// `dlopen` failed (`dlerror`'s text).
    Dlopen(String),
    /// The library exports none of the tables asked for.
    NoTable,
}

impl From<LoadError> for ibnet_core::Error {
    fn from(e: LoadError) -> Self {
        let what = match e {
            LoadError::Path => "plugin path without NUL bytes",
            LoadError::Dlopen(_) => "loadable plugin library (dlopen failed)",
            LoadError::NoTable => "plugin table",
        };
        ibnet_core::Error::Missing { what }
    }
}

/// A plugin call that did not succeed. `call` is `"ncclNet <entry>"` (NCCL's entry name).
#[derive(Debug, Clone)]
pub enum CallError {
    /// The entry returned something other than `ncclSuccess`.
    Failed {
        /// `"ncclNet <entry>"`.
        call: &'static str,
        /// What it returned.
        rc: ncclResult_t,
    },
    /// The entry is NULL in the plugin's table.
    Null {
        /// `"ncclNet <entry>"`.
        call: &'static str,
    },
    /// An argument this version cannot carry (an `int` size, a receive count).
    Arg(ibnet_core::Error),
}

impl core::fmt::Display for CallError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let short = |c: &'static str| c.strip_prefix("ncclNet ").unwrap_or(c);
        match self {
            CallError::Failed { call, rc } => {
                write!(f, "plugin {} failed: {} ({})", short(call), rc.name(), rc.0)
            }
            CallError::Null { call } => {
                write!(f, "plugin has no {} (NULL in its table)", short(call))
            }
            CallError::Arg(e) => write!(f, "{e}"),
        }
    }
}

/// As `ForeignNet` reports them: `Provider { call, errno: <ncclResult_t> }` and
/// `Missing { what: call }`.
impl From<CallError> for ibnet_core::Error {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Failed { call, rc } => ibnet_core::Error::Provider { call, errno: rc.0 },
            CallError::Null { call } => ibnet_core::Error::Missing { what: call },
            CallError::Arg(e) => e,
        }
    }
}

/// The result of plugin calls.
pub type CallResult<T> = core::result::Result<T, CallError>;

/// `Ok` for `ncclSuccess`, else [`CallError::Failed`].
#[inline]
fn check(call: &'static str, rc: ncclResult_t) -> CallResult<()> {
    if rc == ncclResult_t::Success {
        Ok(())
    } else {
        Err(CallError::Failed { call, rc })
    }
}

/// The entry, or [`CallError::Null`].
#[inline]
fn need<F>(f: Option<F>, call: &'static str) -> CallResult<F> {
    f.ok_or(CallError::Null { call })
}

/// A loaded plugin: its table (copied) and, after [`ForeignPlugin::init`], its context.
pub struct ForeignPlugin {
    table: Table,
    ctx: *mut c_void,
    inited: bool,
}

impl ForeignPlugin {
    /// Opens `path` as NCCL does and takes its newest table (v12 … v6).
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        Self::open_any(path, &Version::ALL)
    }

    /// Opens `path` and takes its table of version `v` only.
    pub fn open_version(path: &Path, v: Version) -> Result<Self, LoadError> {
        Self::open_any(path, &[v])
    }

    fn open_any(path: &Path, versions: &[Version]) -> Result<Self, LoadError> {
        use std::os::unix::ffi::OsStrExt;
        let p = CString::new(path.as_os_str().as_bytes()).map_err(|_| LoadError::Path)?;
        // SAFETY: a NUL-terminated path; dlopen runs the library's constructors, which is what
        // loading a plugin means (NCCL does the same with the same file).
        let lib = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next
            // dl* call on this thread; it is copied at once.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                String::from("dlopen failed")
            } else {
                // SAFETY: as above.
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(LoadError::Dlopen(why));
        }
        for &v in versions {
            // SAFETY: `lib` is a live handle (never closed); the name is NUL-terminated.
            let sym = unsafe { libc::dlsym(lib, v.csymbol().as_ptr()) };
            if !sym.is_null() {
                // SAFETY: the symbol is the plugin's table of that version (the ABI NCCL itself
                // relies on); it is read once, here, by value.
                return Ok(unsafe { Self::from_table(Self::read(sym, v)) });
            }
        }
        Err(LoadError::NoTable)
    }

    /// Copies the table of version `v` at `sym`.
    ///
    /// # Safety
    /// `sym` points to a readable table of version `v`.
    unsafe fn read(sym: *mut c_void, v: Version) -> Table {
        // SAFETY (every arm): the caller's contract; the table types are `Copy` plain data
        // whose entries are nullable, so any bit pattern a C table holds is valid.
        unsafe {
            match v {
                Version::V12 => Table::V12(*(sym as *const ncclNet_v12_t)),
                Version::V11 => Table::V11(*(sym as *const ncclNet_v11_t)),
                Version::V10 => Table::V10(*(sym as *const ncclNet_v10_t)),
                Version::V9 => Table::V9(*(sym as *const ncclNet_v9_t)),
                Version::V8 => Table::V8(*(sym as *const ncclNet_v8_t)),
                Version::V7 => Table::V7(*(sym as *const ncclNet_v7_t)),
                Version::V6 => Table::V6(*(sym as *const ncclNet_v6_t)),
            }
        }
    }

    /// A plugin over `table` (e.g. a copy of this library's own `ncclNetPlugin_v11`).
    ///
    /// # Safety
    /// The table's functions must follow NCCL's plugin contract and stay loaded for the rest
    /// of the process; its `name` must be NULL or a static NUL-terminated string.
    pub unsafe fn from_table(table: Table) -> Self {
        Self {
            table,
            ctx: core::ptr::null_mut(),
            inited: false,
        }
    }

    /// The ABI version of the table.
    pub fn version(&self) -> Version {
        by_version!(self.table, {
            [V12] _t => Version::V12, [V11] _t => Version::V11, [V10] _t => Version::V10,
            [V9] _t => Version::V9, [V8] _t => Version::V8, [V7] _t => Version::V7,
            [V6] _t => Version::V6,
        })
    }

    /// The table's `name`, if not NULL.
    pub fn name(&self) -> Option<&CStr> {
        let name = shared!(self.table, name);
        // SAFETY: a non-NULL name is a static NUL-terminated string of the plugin (which is
        // never unloaded).
        (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) })
    }

    /// `init`, with `logger` (NULL allowed) and, for v11/v12, `comm_id` and an undefined traffic
    /// class.
    pub fn init(&mut self, logger: ncclDebugLogger_t, comm_id: u64) -> CallResult<()> {
        let call = "ncclNet init";
        let mut cfg = ncclNetCommConfig_t {
            traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
        };
        let ctx = &mut self.ctx;
        // SAFETY (every arm): the plugin's init with valid out-pointer and config that outlive
        // the call; a NULL profiler callback is allowed by the ABI.
        let rc = by_version!(self.table, {
            [V12, V11] t => unsafe { need(t.init, call)?(ctx, comm_id, &mut cfg, logger, None) },
            [V10] t => unsafe { need(t.init, call)?(logger, None) },
            [V9, V8, V7, V6] t => unsafe { need(t.init, call)?(logger) },
        });
        check(call, rc)?;
        self.inited = true;
        Ok(())
    }

    /// `finalize(ctx)` (v11, v12; older versions have none). Idempotent.
    pub fn finalize(&mut self) -> CallResult<()> {
        if !core::mem::take(&mut self.inited) {
            return Ok(());
        }
        let ctx = core::mem::replace(&mut self.ctx, core::ptr::null_mut());
        let f = by_version!(self.table, {
            [V12, V11] t => t.finalize,
            [V10, V9, V8, V7, V6] _t => None,
        });
        if let Some(f) = f {
            // SAFETY: `ctx` came from this table's init and is finalized once.
            check("ncclNet finalize", unsafe { f(ctx) })?;
        }
        Ok(())
    }

    /// The number of devices.
    pub fn devices(&self) -> CallResult<c_int> {
        let f = need(shared!(self.table, devices), "ncclNet devices")?;
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        check("ncclNet devices", unsafe { f(&mut n) })?;
        Ok(n)
    }

    /// `makeVDevice` (v9+): the device number of the virtual NIC fusing the devices `devs`
    /// (1 to `NCCL_NET_MAX_DEVS_PER_NIC` of them: 4 for v9–v11, 8 for v12).
    /// [`CallError::Null`] when the table has none (v6–v8, or a NULL entry).
    pub fn make_vdevice(&self, devs: &[c_int]) -> CallResult<c_int> {
        by_version!(self.table, {
            [V12] t => make_vdev::<NCCL_NET_MAX_DEVS_PER_NIC_V12>(t.make_vdevice, devs),
            [V11, V10, V9] t => make_vdev::<NCCL_NET_MAX_DEVS_PER_NIC>(t.make_vdevice, devs),
            [V8, V7, V6] _t => make_vdev::<NCCL_NET_MAX_DEVS_PER_NIC>(None, devs),
        })
    }

    /// `getProperties(dev)`. The strings it points to are the plugin's, valid at least until
    /// the next call.
    pub fn properties(&self, dev: c_int) -> CallResult<Props> {
        // Expanded per version: `get_props` reads that version's struct.
        by_version!(self.table, {
            [V12, V11, V10, V9, V8, V7, V6] t => get_props(t.get_properties, dev)
        })
    }
}

/// Calls a `makeVDevice` entry whose struct holds `N` devices.
fn make_vdev<const N: usize>(
    f: Option<unsafe extern "C" fn(*mut c_int, *mut VDevProps<N>) -> ncclResult_t>,
    devs: &[c_int],
) -> CallResult<c_int> {
    const CALL: &str = "ncclNet makeVDevice";
    {
        let f = need(f, CALL)?;
        let mut props = VDevProps::<N> {
            ndevs: devs.len() as c_int,
            devs: [0; N],
        };
        if devs.is_empty() || devs.len() > props.devs.len() {
            return Err(CallError::Arg(ibnet_core::Error::OutOfRange {
                what: "devices of a virtual NIC",
                value: devs.len() as i64,
                min: 1,
                max: props.devs.len() as i64,
            }));
        }
        props.devs[..devs.len()].copy_from_slice(devs);
        let mut d: c_int = -1;
        // SAFETY: valid out-pointers; the plugin reads `props` and writes `d` during the call.
        check(CALL, unsafe { f(&mut d, &mut props) })?;
        Ok(d)
    }
}

/// Calls a `getProperties` entry for its version's struct `P`.
fn get_props<P: VersionProps>(
    f: Option<unsafe extern "C" fn(c_int, *mut P) -> ncclResult_t>,
    dev: c_int,
) -> CallResult<Props> {
    let f = need(f, "ncclNet getProperties")?;
    let mut p = core::mem::MaybeUninit::<P>::zeroed();
    // SAFETY: a valid out-pointer to a struct of the entry's version.
    check("ncclNet getProperties", unsafe { f(dev, p.as_mut_ptr()) })?;
    // SAFETY: the props structs are plain data (pointers, integers, floats) for which all-zero
    // is a valid value; the plugin wrote the rest.
    Ok(unsafe { p.assume_init() }.to_props())
}

impl Drop for ForeignPlugin {
    fn drop(&mut self) {
        let _ = self.finalize();
    }
}
