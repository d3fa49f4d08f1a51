//! Loads libibverbs at run time and resolves the calls ibnet uses.
//!
//! Search order: `IBNET_IBVERBS_PATH` alone when it is set (a library named by ibnet's own
//! variable is never replaced by the system's); else NCCL 2.30's `NCCL_IBVERBS_LIB` when set,
//! then the system's, as NCCL does (one INFO when the named one cannot be loaded and the
//! system's is used); else `libibverbs.so.1`, then `libibverbs.so`. Both variables are read
//! through `ibnet_nccl::env::ibverbs_lib`. Base calls
//! are pinned to `IBVERBS_1.1` with `dlvsym` (the library also exports legacy `IBVERBS_1.0`
//! versions with a different ABI). `ibv_reg_mr_iova2` (`IBVERBS_1.8`), `ibv_query_ece` /
//! `ibv_set_ece` (`IBVERBS_1.10`), `ibv_reg_dmabuf_mr` (`IBVERBS_1.12`) and
//! `ibv_query_port_speed` (`IBVERBS_1.16`) are optional: a missing one disables the feature,
//! never the load.
//!
//! The library is resolved once per process and never unloaded (a provider library may keep
//! threads or atexit handlers), so the function pointers stay valid for the process lifetime.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use super::sys::*;

/// The resolved libibverbs entry points.
#[allow(missing_docs)]
pub struct Verbs {
    pub fork_init: unsafe extern "C" fn() -> c_int,
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port_compat: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut c_void,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub query_qp:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    pub event_type_str: unsafe extern "C" fn(c_int) -> *const c_char,
    /// `IBVERBS_1.8`; `None` on older libraries.
    pub reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    /// `IBVERBS_1.10`; `None` on older libraries (ECE off).
    pub query_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    /// `IBVERBS_1.10`; `None` on older libraries (ECE off).
    pub set_ece: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_ece) -> c_int>,
    /// `IBVERBS_1.12`; `None` on older libraries.
    pub reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    /// `ibv_query_port_speed` (`IBVERBS_1.16`: a port's speed in units of 100 Mbps); `None`
    /// on older libraries (speed × width then, `NCCL_IB_QUERY_PORT_SPEED`).
    pub query_port_speed: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut u64) -> c_int>,
}

// SAFETY: the table holds plain function pointers into a library that is never unloaded.
unsafe impl Send for Verbs {}
// SAFETY: as above; the table is immutable after construction.
unsafe impl Sync for Verbs {}

/// The libibverbs the user named and the variable that named it (`IBNET_IBVERBS_PATH`, which
/// wins, or `NCCL_IBVERBS_LIB`; set to nothing or blanks counts as unset). A path named by
/// `IBNET_IBVERBS_PATH` is the only libibverbs tried: one that cannot be loaded is a
/// configuration error (the caller WARNs naming the variable). One named by `NCCL_IBVERBS_LIB`
/// falls back to the system's, as NCCL does ([`falls_back`]).
pub fn named_path() -> Option<(&'static str, std::ffi::OsString)> {
    ibnet_nccl::env::ibverbs_lib()
}

/// Whether a library named by `var` (from [`named_path`]) that cannot be loaded is replaced by
/// the system's: `NCCL_IBVERBS_LIB` yes (NCCL tries the named one, then `libibverbs.so`, then
/// `libibverbs.so.1`), `IBNET_IBVERBS_PATH` no.
pub fn falls_back(var: &str) -> bool {
    var == "NCCL_IBVERBS_LIB"
}

static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();

/// The process-wide libibverbs, loading it on first use. `Err` carries why it is unavailable
/// (the `dlopen`/`dlvsym` message), for the one INFO line that reports zero devices.
pub fn get() -> Result<&'static Verbs, &'static str> {
    VERBS.get_or_init(load).as_ref().map_err(|s| s.as_str())
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown dlerror".into();
    }
    // SAFETY: non-NULL, NUL-terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn open() -> Result<*mut c_void, String> {
    let system = [c"libibverbs.so.1", c"libibverbs.so"];
    let Some((var, p)) = named_path() else {
        return open_first(system.iter().copied());
    };
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_bytes()).map_err(|_| format!("{var} holds a NUL byte"));
    let named_err = match c.and_then(|c| open_first([c.as_c_str()].into_iter())) {
        Ok(h) => return Ok(h),
        Err(e) if !falls_back(var) => return Err(e),
        Err(e) => e,
    };
    let h = open_first(system.iter().copied()).map_err(|e| format!("{named_err}; {e}"))?;
    ibnet_nccl::info!(
        ibnet_nccl::log::INIT | ibnet_nccl::log::ENV,
        "{var}={}: cannot be loaded ({named_err}); using the system's libibverbs, as NCCL does",
        p.to_string_lossy()
    );
    Ok(h)
}

/// The first of `names` that `dlopen` loads, else every `dlerror` joined.
fn open_first<'a>(names: impl Iterator<Item = &'a CStr>) -> Result<*mut c_void, String> {
    let mut errs = Vec::new();
    for n in names {
        // SAFETY: `n` is a valid C string; RTLD_NOW resolves everything now, RTLD_LOCAL keeps
        // libibverbs' symbols out of the global namespace.
        let h = unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !h.is_null() {
            return Ok(h);
        }
        errs.push(dlerror_text());
    }
    Err(errs.join("; "))
}

fn sym(h: *mut c_void, name: &CStr, version: &CStr) -> Option<*mut c_void> {
    // SAFETY: `h` is a live dlopen handle, both strings are NUL-terminated.
    let p = unsafe { libc::dlvsym(h, name.as_ptr(), version.as_ptr()) };
    (!p.is_null()).then_some(p)
}

// The transmute targets are the field types of `Verbs`, inferred per symbol.
#[allow(clippy::missing_transmute_annotations)]
fn load() -> Result<Verbs, String> {
    let h = open()?;
    let v11 = c"IBVERBS_1.1";
    macro_rules! req {
        ($name:literal) => {{
            let p = sym(h, $name, v11).ok_or_else(|| {
                format!(
                    "{} not found in libibverbs ({})",
                    $name.to_string_lossy(),
                    dlerror_text()
                )
            })?;
            // SAFETY: the symbol is the libibverbs function of that name and version, whose C
            // signature the field type declares (verified against verbs.h by the layout test).
            unsafe { core::mem::transmute::<*mut c_void, _>(p) }
        }};
    }
    macro_rules! opt {
        ($name:literal, $ver:literal) => {
            // SAFETY: as for `req!`.
            sym(h, $name, $ver).map(|p| unsafe { core::mem::transmute::<*mut c_void, _>(p) })
        };
    }
    Ok(Verbs {
        fork_init: req!(c"ibv_fork_init"),
        get_device_list: req!(c"ibv_get_device_list"),
        free_device_list: req!(c"ibv_free_device_list"),
        get_device_name: req!(c"ibv_get_device_name"),
        open_device: req!(c"ibv_open_device"),
        close_device: req!(c"ibv_close_device"),
        query_device: req!(c"ibv_query_device"),
        query_port_compat: req!(c"ibv_query_port"),
        query_gid: req!(c"ibv_query_gid"),
        alloc_pd: req!(c"ibv_alloc_pd"),
        dealloc_pd: req!(c"ibv_dealloc_pd"),
        create_cq: req!(c"ibv_create_cq"),
        destroy_cq: req!(c"ibv_destroy_cq"),
        create_qp: req!(c"ibv_create_qp"),
        modify_qp: req!(c"ibv_modify_qp"),
        query_qp: req!(c"ibv_query_qp"),
        destroy_qp: req!(c"ibv_destroy_qp"),
        reg_mr: req!(c"ibv_reg_mr"),
        dereg_mr: req!(c"ibv_dereg_mr"),
        get_async_event: req!(c"ibv_get_async_event"),
        ack_async_event: req!(c"ibv_ack_async_event"),
        event_type_str: req!(c"ibv_event_type_str"),
        reg_mr_iova2: opt!(c"ibv_reg_mr_iova2", c"IBVERBS_1.8"),
        query_ece: opt!(c"ibv_query_ece", c"IBVERBS_1.10"),
        set_ece: opt!(c"ibv_set_ece", c"IBVERBS_1.10"),
        reg_dmabuf_mr: opt!(c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12"),
        query_port_speed: opt!(c"ibv_query_port_speed", c"IBVERBS_1.16"),
    })
}

impl Verbs {
    /// `ibv_query_port` as the inline in `verbs.h` does it: through `verbs_context->query_port`
    /// when the context is a `verbs_context` large enough to hold it, else the compat export.
    ///
    /// # Safety
    /// `ctx` must be a live context from `open_device`.
    pub unsafe fn query_port(&self, ctx: *mut ibv_context, port: u8) -> Result<ibv_port_attr, i32> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: `ctx` is live (caller); `abi_compat` is part of the stable prefix.
        let is_verbs_ctx = unsafe { (*ctx).abi_compat } as usize == usize::MAX;
        if is_verbs_ctx {
            let off = core::mem::offset_of!(verbs_context_tail, context);
            // SAFETY: when `abi_compat == UINTPTR_MAX` the context is the last member of a
            // `verbs_context`, whose `sz` and `query_port` fields sit at fixed negative offsets.
            let tail = unsafe { (ctx as *mut u8).sub(off) } as *const verbs_context_tail;
            // SAFETY: as above.
            let (sz, qp) = unsafe { ((*tail).sz, (*tail).query_port) };
            if sz >= core::mem::size_of::<verbs_context_tail>() {
                if let Some(q) = qp {
                    // SAFETY: `q` is the provider's query_port; `attr` is writable for its size.
                    let mut rc =
                        unsafe { q(ctx, port, &mut attr, core::mem::size_of::<ibv_port_attr>()) };
                    if rc != 0 {
                        // An older library may refuse the larger struct: ask for the v44 size.
                        attr = ibv_port_attr::default();
                        // SAFETY: as above, with a smaller length.
                        rc = unsafe { q(ctx, port, &mut attr, PORT_ATTR_SIZE_V44) };
                    }
                    return if rc == 0 { Ok(attr) } else { Err(errno_or(rc)) };
                }
            }
        }
        // SAFETY: the compat export writes the v44-sized prefix of `attr`.
        let rc = unsafe { (self.query_port_compat)(ctx, port, &mut attr) };
        if rc == 0 {
            Ok(attr)
        } else {
            Err(errno_or(rc))
        }
    }
}

/// The errno for a failed verbs call: verbs returns either -1 with errno set or a positive errno.
pub fn errno_or(rc: c_int) -> i32 {
    if rc > 0 {
        rc
    } else {
        last_errno()
    }
}

/// The calling thread's errno.
pub fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
