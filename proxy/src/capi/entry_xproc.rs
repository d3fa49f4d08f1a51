//! The C API beyond one process's connections: cross-process connection maps
//! (`ibnet_proxy_process_id`, `ibnet_proxy_export_map`, `ibnet_proxy_attach`/`detach` in the
//! GPU's process), the logger (`ibnet_proxy_set_logger`) and the profiler
//! (`ibnet_proxy_set_profiler`: the engine's op and step events).
//!
//! ```text
//!  GPU process                              proxy process
//!  ibnet_proxy_process_id(&id) ── id ─────▶ setup(req.gpuProcess = id) → connect
//!                              ◀── bytes ── ibnet_proxy_export_map(conn, buf)
//!  ibnet_proxy_attach(mem, buf) → view      progress …
//!  … kernel on view …                       free(conn)
//!  ibnet_proxy_detach(att)
//! ```

use core::ffi::{c_int, c_void};

use crate::attach::Attached;
use crate::xmap::XMap;
use crate::{ConnId, Dir};
use ibnet_core::Error;

pub use super::cprofiler::{CEvent, CProfiler};
use super::entry::{missing, out, proxy, CDeviceView, CProxy};
use super::mem::{CMemTable, ProxyMem};
use ibnet_nccl::boundary::call;
use ibnet_nccl::types::{ncclResult_t, DebugLogFn};

const ATTACH_TAG: u64 = 0x4942_4e45_5441_5443; // "IBNETATC"
const DEAD: u64 = 0xdead_dead_dead_dead;

/// `ibnet_proxy_attach_t`: a cross-process connection's banks mapped in the GPU's process.
pub struct CAttach {
    tag: u64,
    mem: ProxyMem,
    att: Option<Attached>,
}

/// `ibnet_proxy_set_profiler`: `prof` receives the engine's events from now on (NULL: none).
///
/// # Safety
/// Pointers are valid or NULL; the callback follows [`CProfiler`]'s contract while set.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_set_profiler(
    px: *mut CProxy,
    prof: *const CProfiler,
) -> ncclResult_t {
    call("ibnet_proxy_set_profiler", || {
        let p = proxy(px)?;
        // SAFETY: valid or NULL.
        p.prof = unsafe { prof.as_ref() }.copied();
        Ok(())
    })
}

/// `ibnet_proxy_set_logger`: the library's log lines (WARN, INFO, TRACE with NCCL's
/// subsystem flags, each starting `NET/IBNET`) go to `logger` (NCCL's `ncclDebugLogger_t`).
///
/// # Safety
/// `logger` is NULL (refused) or a function valid for the rest of the process.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_set_logger(logger: Option<DebugLogFn>) -> ncclResult_t {
    call("ibnet_proxy_set_logger", || {
        let l = logger.ok_or(missing("logger"))?;
        ibnet_nccl::log::set_logger(Some(l));
        Ok(())
    })
}

/// `ibnet_proxy_process_id`: this process's identity for `ibnet_proxy_setup_t.gpuProcess`.
///
/// # Safety
/// `id` is valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_process_id(id: *mut u64) -> ncclResult_t {
    call("ibnet_proxy_process_id", || {
        *out(id, "id out-pointer")? = super::entry::process_id();
        Ok(())
    })
}

/// `ibnet_proxy_export_map`: the `IBNET_PROXY_MAP_BYTES` bytes the GPU's process attaches a
/// cross-process connection with.
///
/// # Safety
/// Pointers are valid or NULL; `buf` has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_export_map(
    px: *mut CProxy,
    conn: u32,
    buf: *mut c_void,
    len: usize,
) -> ncclResult_t {
    call("ibnet_proxy_export_map", || {
        let p = proxy(px)?;
        if buf.is_null() || len < XMap::BYTES {
            return Err(Error::OutOfRange {
                what: "connection map buffer bytes",
                value: if buf.is_null() { 0 } else { len as i64 },
                min: XMap::BYTES as i64,
                max: i64::MAX,
            });
        }
        let x = p.px.export_map(ConnId::from_bits(conn))?;
        let b = x.as_bytes();
        // SAFETY: `buf` has at least `b.len()` writable bytes (checked above).
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), buf.cast::<u8>(), b.len()) };
        Ok(())
    })
}

/// `ibnet_proxy_attach`: maps a connection map from `ibnet_proxy_export_map` (checked in full)
/// in this process through `mem` (NULL: the library's shared memory, for banks a proxy with
/// `mem == NULL` allocated), and writes the view the kernel uses.
///
/// # Safety
/// Pointers are valid or NULL; `map` has `len` readable bytes; `mem`'s callbacks follow
/// [`CMemTable`]'s contract until `ibnet_proxy_detach`.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_attach(
    mem: *const CMemTable,
    map: *const c_void,
    len: usize,
    att: *mut *mut CAttach,
    view: *mut CDeviceView,
) -> ncclResult_t {
    call("ibnet_proxy_attach", || {
        let o = out(att, "attach out-pointer")?;
        *o = core::ptr::null_mut();
        let v = out(view, "view out-pointer")?;
        if map.is_null() {
            return Err(missing("connection map"));
        }
        // A map is exactly `XMap::BYTES` long: any other `len` is refused before a slice is made
        // of it (a `len` above `isize::MAX` would break `from_raw_parts`' contract).
        if len != XMap::BYTES {
            return Err(Error::OutOfRange {
                what: "cross-process connection map bytes",
                value: i64::try_from(len).unwrap_or(i64::MAX),
                min: XMap::BYTES as i64,
                max: XMap::BYTES as i64,
            });
        }
        // SAFETY: `len` readable bytes (the caller's contract), `len` == XMap::BYTES.
        let b = unsafe { core::slice::from_raw_parts(map.cast::<u8>(), len) };
        let x = XMap::from_bytes(b)?;
        // SAFETY: NULL or a valid table.
        let mut m = match unsafe { mem.as_ref() } {
            // SAFETY: the caller vouches for the callbacks.
            Some(t) => unsafe { ProxyMem::from_table(*t) }?,
            None => ProxyMem::host(),
        };
        let a = Attached::attach(&mut m, &x)?;
        let d = a.view();
        *v = CDeviceView {
            head: d.head,
            tail: d.tail,
            recv_mem: d.recv_mem,
            buffs: d.buffs,
            buff_sizes: d.buff_sizes,
            dir: (d.dir == Dir::Recv) as c_int,
            shared: d.shared as c_int,
        };
        *o = Box::into_raw(Box::new(CAttach {
            tag: ATTACH_TAG,
            mem: m,
            att: Some(a),
        }));
        Ok(())
    })
}

/// `ibnet_proxy_detach`: unmaps what `ibnet_proxy_attach` mapped and frees `att`.
///
/// # Safety
/// `att` is NULL or from `ibnet_proxy_attach`, detached once, no longer used by kernels.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_detach(att: *mut CAttach) -> ncclResult_t {
    call("ibnet_proxy_detach", || {
        // SAFETY: NULL or from `ibnet_proxy_attach`; the tag says it is live.
        let a = match unsafe { att.as_mut() } {
            Some(a) if a.tag == ATTACH_TAG => a,
            Some(_) => {
                return Err(Error::BadState {
                    op: "ibnet_proxy_detach",
                    state: "not a live attachment",
                })
            }
            None => return Err(missing("attachment")),
        };
        a.tag = DEAD;
        let r = a.att.take().map_or(Ok(()), |x| x.detach(&mut a.mem));
        // SAFETY: a live CAttach we allocated; freed once (tag cleared above).
        drop(unsafe { Box::from_raw(a as *mut CAttach) });
        r
    })
}
