//! The proxy engine's C API (`ibnet_proxy_*` in `include/ibnet.h`): an engine over a plugin's
//! C table ([`ForeignNet`]), connections, operations and progress.
//!
//! ```text
//!  ibnet_proxy_create(path|NULL) ─▶ setup(recv) → handle ─▶ setup(send)
//!     connect_send(handle) / connect_recv(rank) until both say connected
//!     device_view(conn) ─▶ what the GPU side uses (head, tail, recvMem, buffers)
//!     op_create ─ op_add × nsubs ─ progress … until done ─ op_destroy
//!  free(conn) × n ─ destroy
//! ```
//! Handles are tagged heap objects (checked on every call; a stale or foreign pointer is an
//! `ncclInvalidArgument`-class error, never a crash when it still points to readable memory).
//! Every entry point catches panics. One thread drives a proxy and its ops. `create` and
//! `op_create` allocate; `progress` does not.

use core::ffi::{c_char, c_int, c_void};

use crate::{
    ConnId, Dir, NetHandle, Protocol, ProxyConfig, ProxyOp, ProxyState, SetupReq, SubArgs,
    NUM_PROTOCOLS,
};
use ibnet_core::{Error, Result};

use super::cprofiler::CProfiler;
use super::foreign_net::ForeignNet;
use super::mem::{CMemTable, ProxyMem};
use ibnet_nccl::boundary::call;
use ibnet_nccl::foreign::Table;
use ibnet_nccl::types::ncclResult_t;

/// Connections one C-API proxy holds.
pub const PROXY_CONNS: usize = 64;

const PROXY_TAG: u64 = 0x4942_4e45_5450_5859; // "IBNETPXY"
const OP_TAG: u64 = 0x4942_4e45_5450_4f50; // "IBNETPOP"
const DEAD: u64 = 0xdead_dead_dead_dead;

/// `ibnet_proxy_config_t`: zero fields take NCCL 2.28's defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CConfig {
    /// Dedicated buffer bytes per protocol (LL, LL128, SIMPLE).
    pub buff_sizes: [usize; NUM_PROTOCOLS],
    /// Shared-buffer slot bytes (`NCCL_P2P_NET_CHUNKSIZE`).
    pub p2p_chunk_size: usize,
    /// Channels a shared pool serves.
    pub p2p_nchannels: c_int,
    /// Shared comms: -1 or 0 default (on), 1 on, 2 off.
    pub shared_comms: c_int,
    /// Flush through a GDR-copy read (only with a memory provider offering GDR copy).
    pub gdr_copy_flush: c_int,
    /// Largest network piece of a registered buffer (default 1 GiB).
    pub max_net_size: usize,
}

/// `ibnet_proxy_setup_t` (NCCL's `setupReq`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct CSetup {
    pub tp_rank: u32,
    pub tp_local_rank: u32,
    pub tp_remote_rank: u32,
    pub net_dev: u32,
    pub channel: u32,
    pub conn_index: u32,
    pub shared: c_int,
    pub use_gdr: c_int,
    pub need_flush: c_int,
    /// The GPU process's [`ibnet_proxy_process_id`](super::entry_xproc::ibnet_proxy_process_id); 0: this process.
    pub gpu_process: u64,
}

/// `ibnet_proxy_device_view_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct CDeviceView {
    pub head: u64,
    pub tail: u64,
    pub recv_mem: u64,
    pub buffs: [u64; NUM_PROTOCOLS],
    pub buff_sizes: [usize; NUM_PROTOCOLS],
    pub dir: c_int,
    pub shared: c_int,
}

type Engine = ProxyState<ForeignNet, ProxyMem, PROXY_CONNS>;

/// `ibnet_proxy_t`.
pub struct CProxy {
    tag: u64,
    pub(crate) px: Engine,
    /// The caller's profiler (`ibnet_proxy_set_profiler`).
    pub(crate) prof: Option<CProfiler>,
}

/// `ibnet_proxy_op_t`.
pub struct COp {
    tag: u64,
    op: ProxyOp<ForeignNet>,
}

pub(crate) fn missing(what: &'static str) -> Error {
    Error::Missing { what }
}

pub(crate) fn proxy<'a>(p: *mut CProxy) -> Result<&'a mut CProxy> {
    // SAFETY: a non-NULL pointer from `ibnet_proxy_create`; the tag says it is live.
    match unsafe { p.as_mut() } {
        Some(x) if x.tag == PROXY_TAG => Ok(x),
        Some(_) => Err(Error::BadState {
            op: "ibnet_proxy",
            state: "not a live proxy",
        }),
        None => Err(missing("proxy")),
    }
}

fn op<'a>(p: *mut COp) -> Result<&'a mut COp> {
    // SAFETY: a non-NULL pointer from `ibnet_proxy_op_create`; the tag says it is live.
    match unsafe { p.as_mut() } {
        Some(x) if x.tag == OP_TAG => Ok(x),
        Some(_) => Err(Error::BadState {
            op: "ibnet_proxy_op",
            state: "not a live operation",
        }),
        None => Err(missing("op")),
    }
}

pub(crate) fn out<'a, T>(p: *mut T, what: &'static str) -> Result<&'a mut T> {
    // SAFETY: the caller passes a valid, writable pointer or NULL (rejected).
    unsafe { p.as_mut() }.ok_or(missing(what))
}

fn dir(d: c_int) -> Result<Dir> {
    match d {
        0 => Ok(Dir::Send),
        1 => Ok(Dir::Recv),
        _ => Err(Error::OutOfRange {
            what: "direction (0 send, 1 recv)",
            value: d as i64,
            min: 0,
            max: 1,
        }),
    }
}

/// This process's identity for [`CSetup::gpu_process`]: a hash of the host name and the pid
/// (NCCL's host hash and pid hash combined), never 0.
pub fn process_id() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a
    let mut eat = |b: u8| h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    let mut name = [0u8; 256];
    // SAFETY: a writable buffer of the given length; gethostname NUL-terminates or truncates.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    name.iter().take_while(|&&b| b != 0).for_each(|&b| eat(b));
    std::process::id().to_le_bytes().into_iter().for_each(eat);
    h.max(1)
}

fn config(c: Option<&CConfig>) -> ProxyConfig {
    let mut cfg = ProxyConfig {
        process_id: process_id(),
        ..ProxyConfig::default()
    };
    let Some(c) = c else { return cfg };
    for (o, &v) in cfg.buff_sizes.iter_mut().zip(&c.buff_sizes) {
        if v != 0 {
            *o = v;
        }
    }
    if c.p2p_chunk_size != 0 {
        cfg.p2p_chunk_size = c.p2p_chunk_size;
    }
    if c.p2p_nchannels > 0 {
        cfg.p2p_nchannels = c.p2p_nchannels as usize;
    }
    if c.shared_comms == 2 {
        cfg.shared_comms = false;
    }
    cfg.gdr_copy_flush = c.gdr_copy_flush != 0;
    if c.max_net_size != 0 {
        cfg.max_net_size = c.max_net_size;
    }
    cfg
}

/// `ibnet_proxy_create`, over `own` when `plugin_path` is NULL: ibnet-ffi exports it with its
/// own `ncclNetPlugin_v11` as `own` (`ffi/src/proxy.rs`; this crate cannot name that table).
///
/// # Safety
/// Pointers are valid or NULL; `plugin_path` is NUL-terminated; `mem` callbacks follow
/// [`CMemTable`]'s contract while the proxy lives; `own` is a plugin table whose entries may be
/// called.
pub unsafe fn create(
    own: Table,
    plugin_path: *const c_char,
    cfg: *const CConfig,
    mem: *const CMemTable,
    px: *mut *mut CProxy,
) -> ncclResult_t {
    call("ibnet_proxy_create", || {
        let o = out(px, "proxy out-pointer")?;
        *o = core::ptr::null_mut();
        let net = if plugin_path.is_null() {
            // SAFETY: the caller vouches for `own` (this function's contract).
            unsafe { ForeignNet::from_table(own) }?
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            let p = unsafe { core::ffi::CStr::from_ptr(plugin_path) };
            ForeignNet::load(p.to_str().map_err(|_| missing("UTF-8 plugin path"))?)?
        };
        // SAFETY: NULL or a valid table (the caller's contract).
        let mem = match unsafe { mem.as_ref() } {
            // SAFETY: the caller vouches for the callbacks.
            Some(t) => unsafe { ProxyMem::from_table(*t) }?,
            None => ProxyMem::host(),
        };
        // SAFETY: NULL or a valid config.
        let cfg = config(unsafe { cfg.as_ref() });
        let b = Box::new(CProxy {
            tag: PROXY_TAG,
            px: ProxyState::new(net, mem, cfg),
            prof: None,
        });
        *o = Box::into_raw(b);
        Ok(())
    })
}

/// `ibnet_proxy_setup`.
///
/// # Safety
/// Pointers are valid or NULL; `handle` (recv) has room for 128 bytes.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_setup(
    px: *mut CProxy,
    direction: c_int,
    req: *const CSetup,
    conn: *mut u32,
    handle: *mut c_void,
) -> ncclResult_t {
    call("ibnet_proxy_setup", || {
        let p = proxy(px)?;
        // SAFETY: valid or NULL.
        let r = unsafe { req.as_ref() }.ok_or(missing("setup request"))?;
        let c = out(conn, "conn out-pointer")?;
        let d = dir(direction)?;
        if d == Dir::Recv && handle.is_null() {
            return Err(missing("handle buffer (recv)"));
        }
        let (id, h) = p.px.setup(
            d,
            SetupReq {
                tp_rank: r.tp_rank,
                tp_local_rank: r.tp_local_rank,
                tp_remote_rank: r.tp_remote_rank,
                shared: r.shared != 0,
                net_dev: r.net_dev,
                use_gdr: r.use_gdr != 0,
                need_flush: r.need_flush != 0,
                channel: r.channel,
                conn_index: r.conn_index,
                gpu_process: match r.gpu_process {
                    0 => p.px.config().process_id,
                    g => g,
                },
            },
        )?;
        *c = id.to_bits();
        if let (Some(h), false) = (h, handle.is_null()) {
            // SAFETY: the caller gives 128 writable bytes.
            unsafe { core::ptr::copy_nonoverlapping(h.as_ptr(), handle.cast::<u8>(), h.len()) };
        }
        Ok(())
    })
}

/// `ibnet_proxy_connect_send`.
///
/// # Safety
/// Pointers are valid or NULL; `handle` has 128 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_connect_send(
    px: *mut CProxy,
    conn: u32,
    handle: *const c_void,
    connected: *mut c_int,
) -> ncclResult_t {
    call("ibnet_proxy_connect_send", || {
        let p = proxy(px)?;
        let done = out(connected, "connected out-pointer")?;
        *done = 0;
        if handle.is_null() {
            return Err(missing("handle"));
        }
        let mut h: NetHandle = [0; 128];
        // SAFETY: the caller gives 128 readable bytes.
        unsafe { core::ptr::copy_nonoverlapping(handle.cast::<u8>(), h.as_mut_ptr(), h.len()) };
        *done = p.px.connect_send(ConnId::from_bits(conn), &h)?.is_some() as c_int;
        Ok(())
    })
}

/// `ibnet_proxy_connect_recv`.
///
/// # Safety
/// Pointers are valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_connect_recv(
    px: *mut CProxy,
    conn: u32,
    remote_proxy_rank: u32,
    connected: *mut c_int,
) -> ncclResult_t {
    call("ibnet_proxy_connect_recv", || {
        let p = proxy(px)?;
        let done = out(connected, "connected out-pointer")?;
        *done = 0;
        *done =
            p.px.connect_recv(ConnId::from_bits(conn), remote_proxy_rank)?
                .is_some() as c_int;
        Ok(())
    })
}

/// `ibnet_proxy_device_view`.
///
/// # Safety
/// Pointers are valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_device_view(
    px: *mut CProxy,
    conn: u32,
    view: *mut CDeviceView,
) -> ncclResult_t {
    call("ibnet_proxy_device_view", || {
        let p = proxy(px)?;
        let o = out(view, "view out-pointer")?;
        let v = p.px.device_view(ConnId::from_bits(conn))?;
        *o = CDeviceView {
            head: v.head,
            tail: v.tail,
            recv_mem: v.recv_mem,
            buffs: v.buffs,
            buff_sizes: v.buff_sizes,
            dir: (v.dir == Dir::Recv) as c_int,
            shared: v.shared as c_int,
        };
        Ok(())
    })
}

/// `ibnet_proxy_free`.
///
/// # Safety
/// Pointers are valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_free(px: *mut CProxy, conn: u32) -> ncclResult_t {
    call("ibnet_proxy_free", || {
        proxy(px)?.px.free(ConnId::from_bits(conn))
    })
}

/// `ibnet_proxy_destroy`: frees the proxy (which finalizes the plugin context). Refused while
/// connections are open.
///
/// # Safety
/// `px` is NULL or from `ibnet_proxy_create`, destroyed once; no op of it is in progress.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_destroy(px: *mut CProxy) -> ncclResult_t {
    call("ibnet_proxy_destroy", || {
        let p = proxy(px)?;
        if p.px.live().0 != 0 {
            // Refused, not leaked: free the connections, then destroy again.
            return Err(Error::BadState {
                op: "ibnet_proxy_destroy",
                state: "connections still open",
            });
        }
        p.tag = DEAD;
        // SAFETY: a live CProxy we allocated; freed once (tag cleared above).
        drop(unsafe { Box::from_raw(p as *mut CProxy) });
        Ok(())
    })
}

/// `ibnet_proxy_op_create`.
///
/// # Safety
/// Pointers are valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_op_create(
    direction: c_int,
    protocol: c_int,
    slice_steps: u32,
    chunk_steps: u32,
    o: *mut *mut COp,
) -> ncclResult_t {
    call("ibnet_proxy_op_create", || {
        let o = out(o, "op out-pointer")?;
        *o = core::ptr::null_mut();
        let p = match protocol {
            0 => Protocol::Ll,
            1 => Protocol::Ll128,
            2 => Protocol::Simple,
            _ => {
                return Err(Error::OutOfRange {
                    what: "protocol (0 LL, 1 LL128, 2 SIMPLE)",
                    value: protocol as i64,
                    min: 0,
                    max: 2,
                })
            }
        };
        let op = ProxyOp::new(dir(direction)?, p, slice_steps as u64, chunk_steps as u64)?;
        *o = Box::into_raw(Box::new(COp { tag: OP_TAG, op }));
        Ok(())
    })
}

/// `ibnet_proxy_op_add`.
///
/// # Safety
/// Pointers are valid or NULL; `reg_buff` (when not NULL) stays valid until the op is done.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_op_add(
    o: *mut COp,
    conn: u32,
    nsteps: u64,
    nbytes: usize,
    reg_buff: *mut c_void,
) -> ncclResult_t {
    call("ibnet_proxy_op_add", || {
        let o = op(o)?;
        let c = ConnId::from_bits(conn);
        let a = if reg_buff.is_null() {
            SubArgs::new(c, nsteps, nbytes)
        } else {
            SubArgs::registered(c, reg_buff as u64, nbytes)
        };
        o.op.push(a)
    })
}

/// `ibnet_proxy_progress`.
///
/// # Safety
/// Pointers are valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_progress(
    px: *mut CProxy,
    o: *mut COp,
    done: *mut c_int,
    idle: *mut c_int,
) -> ncclResult_t {
    call("ibnet_proxy_progress", || {
        let p = proxy(px)?;
        let o = op(o)?;
        let d = out(done, "done out-pointer")?;
        let r = match p.prof {
            Some(mut c) => p.px.progress_with(&mut o.op, &mut c)?,
            None => p.px.progress(&mut o.op)?,
        };
        *d = r.done as c_int;
        if !idle.is_null() {
            // SAFETY: valid (checked non-NULL) and writable.
            unsafe { *idle = r.idle as c_int };
        }
        Ok(())
    })
}

/// `ibnet_proxy_op_bytes`: bytes sub `sub` moved on the network so far.
///
/// # Safety
/// Pointers are valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_op_bytes(
    o: *mut COp,
    sub: u32,
    bytes: *mut u64,
) -> ncclResult_t {
    call("ibnet_proxy_op_bytes", || {
        let o = op(o)?;
        let b = out(bytes, "bytes out-pointer")?;
        if sub as usize >= o.op.nsubs() {
            return Err(Error::OutOfRange {
                what: "sub index",
                value: sub as i64,
                min: 0,
                max: o.op.nsubs() as i64 - 1,
            });
        }
        *b = o.op.bytes(sub as usize);
        Ok(())
    })
}

/// `ibnet_proxy_op_abort`.
///
/// # Safety
/// Pointers are valid or NULL.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_op_abort(px: *mut CProxy, o: *mut COp) -> ncclResult_t {
    call("ibnet_proxy_op_abort", || {
        let p = proxy(px)?;
        let o = op(o)?;
        p.px.abort(&mut o.op)
    })
}

/// `ibnet_proxy_op_destroy`.
///
/// # Safety
/// `o` is NULL or from `ibnet_proxy_op_create`, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn ibnet_proxy_op_destroy(o: *mut COp) -> ncclResult_t {
    call("ibnet_proxy_op_destroy", || {
        let x = op(o)?;
        if x.op.holds_registrations() {
            // Refused, not leaked (as `ibnet_proxy_destroy`): abort it, then destroy again.
            return Err(Error::BadState {
                op: "ibnet_proxy_op_destroy",
                state: "the op is unfinished and holds registrations of user buffers: \
                        ibnet_proxy_op_abort it first",
            });
        }
        x.tag = DEAD;
        // SAFETY: a live COp we allocated; freed once (tag cleared above).
        drop(unsafe { Box::from_raw(x as *mut COp) });
        Ok(())
    })
}
