//! [`Net`] over any plugin's C table (`ncclNet_v11_t`, or `ncclNet_v8_t` for older plugins),
//! loaded from a path or given by address.
//!
//! The engine's handles become the plugin's `void*` comms, registrations and requests
//! ([`Ptr`]). Every table entry is read as an `Option` of a function pointer, so a plugin that
//! leaves a required entry NULL is reported ([`Error::Missing`]) instead of called.
//!
//! ```text
//!  CNet::load("libnccl-net-foo.so") ─ dlopen(RTLD_NOW|RTLD_LOCAL)
//!        ├─ dlsym("ncclNetPlugin_v11") ─ init(&ctx, commId, {trafficClass = -1}, NULL, NULL)
//!        └─ else dlsym("ncclNetPlugin_v8") ─ init(NULL logger)
//!  engine ── listen/connect/accept/regMr/isend/irecv/iflush/test/close* ──▶ table(…)
//!  drop ──▶ finalize(ctx) (v11)     (the library stays loaded: a plugin may own threads)
//! ```
//!
//! v8 differences handled here: no context argument, `int` sizes in `isend`/`irecv` (a larger
//! size is an `OutOfRange` error), no profiler handles, no `finalize`.
//!
//! Errors: a call returning anything but `ncclSuccess` becomes
//! `Error::Provider { call: "ncclNet <entry>", errno: <ncclResult_t> }`. `connect`/`accept`
//! leaving the comm NULL, and `isend`/`irecv` leaving the request NULL, mean "not yet"
//! (`Ok(None)`), as NCCL reads them.
//!
//! Multi-receive sizes: the plugin's `test` may report bytes per buffer or, as NCCL's IB
//! plugin and ibnet do, 0/1 per buffer; [`CNet::with_sizes`] says which (default
//! [`SizeReport::Flags`], correct for both IB-style plugins and single receives).

use core::ffi::{c_int, c_void};
use std::ffi::CString;

use ibnet_core::proxy::{CommRef, Net, NetBuf, NetHandle, NetProps, PtrType, SizeReport};
use ibnet_core::{Error, Result};

use super::tables::{TableV11, TableV8, R, V};
use crate::abi::types::{
    ncclNetCommConfig_t, ncclNetDeviceHandle_t, ncclResult_t, NCCL_NET_TRAFFIC_CLASS_UNDEF,
    NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST,
};
use crate::abi::v11::Props11;
use crate::abi::v8::Props8;

const MAX_RECVS: usize = ibnet_core::proxy::MAX_RECVS;

/// A plugin's opaque pointer (listen comm, send/recv comm, `mhandle` or request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr(pub *mut c_void);

/// The plugin ABI version a [`CNet`] drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `ncclNet_v11_t` (NCCL 2.28).
    V11,
    /// `ncclNet_v8_t` (NCCL 2.19–2.22).
    V8,
}

#[derive(Clone, Copy)]
enum Abi {
    V11(&'static TableV11),
    V8(&'static TableV8),
}

/// An entry both versions share with the same signature.
macro_rules! entry {
    ($s:expr, $f:ident) => {
        match $s.abi {
            Abi::V11(t) => t.$f,
            Abi::V8(t) => t.$f,
        }
    };
}

/// [`Net`] over a plugin's `ncclNet_v11_t` or `ncclNet_v8_t`.
pub struct CNet {
    abi: Abi,
    ctx: V,
    sizes: SizeReport,
    /// Connects in progress: (handle as the engine passes it, the plugin's working copy). A
    /// plugin keeps its connect state in the handle (NCCL passes it mutable and calls again
    /// with the same buffer), so each retry must see what the previous call wrote.
    connecting: Vec<(NetHandle, NetHandle)>,
}

fn check(call: &'static str, r: R) -> Result<()> {
    if r == ncclResult_t::Success {
        Ok(())
    } else {
        Err(Error::Provider {
            call,
            errno: r as i32,
        })
    }
}

fn need<F>(f: Option<F>, what: &'static str) -> Result<F> {
    f.ok_or(Error::Missing { what })
}

fn count(n: usize) -> Result<c_int> {
    if n == 0 || n > MAX_RECVS {
        return Err(Error::OutOfRange {
            what: "buffers in one irecv/iflush",
            value: n as i64,
            min: 1,
            max: MAX_RECVS as i64,
        });
    }
    Ok(n as c_int)
}

fn tag(t: u32) -> Result<c_int> {
    c_int::try_from(t).map_err(|_| Error::OutOfRange {
        what: "tag",
        value: t as i64,
        min: 0,
        max: c_int::MAX as i64,
    })
}

/// A size for a v8 entry (`int`).
fn int_size(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::OutOfRange {
        what: "size for an ncclNet_v8 plugin",
        value: n.min(i64::MAX as usize) as i64,
        min: 0,
        max: c_int::MAX as i64,
    })
}

impl CNet {
    /// Loads the plugin at `path` (`dlopen`, `RTLD_NOW | RTLD_LOCAL`) and initialises its newest
    /// table this engine speaks: `ncclNetPlugin_v11`, else `ncclNetPlugin_v8`. The library is
    /// never unloaded.
    pub fn load(path: &str) -> Result<Self> {
        match Self::load_version(path, Version::V11) {
            Err(Error::Missing {
                what: "plugin table",
            }) => Self::load_version(path, Version::V8),
            r => r,
        }
    }

    /// Loads the plugin at `path` and initialises its table of version `v`.
    pub fn load_version(path: &str, v: Version) -> Result<Self> {
        let p = CString::new(path).map_err(|_| Error::Missing {
            what: "plugin path without NUL bytes",
        })?;
        // SAFETY: a NUL-terminated path; dlopen runs the library's constructors, which is what
        // loading a plugin means.
        let lib = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(Error::Missing {
                what: "loadable plugin library (dlopen failed)",
            });
        }
        let name = match v {
            Version::V11 => c"ncclNetPlugin_v11",
            Version::V8 => c"ncclNetPlugin_v8",
        };
        // SAFETY: `lib` is a live handle; the symbol name is NUL-terminated.
        let sym = unsafe { libc::dlsym(lib, name.as_ptr()) };
        if sym.is_null() {
            return Err(Error::Missing {
                what: "plugin table",
            });
        }
        // SAFETY: the symbol is the plugin's table of that version (the ABI NCCL itself relies
        // on); the library is never closed, so the table lives for the rest of the process.
        unsafe {
            match v {
                Version::V11 => Self::from_table(sym as *const TableV11),
                Version::V8 => Self::from_table_v8(sym as *const TableV8),
            }
        }
    }

    /// Initialises the plugin whose v11 table is at `t`.
    ///
    /// # Safety
    /// `t` must point to an `ncclNet_v11_t` that stays valid (and whose functions follow
    /// NCCL's contract) for the rest of the process.
    pub unsafe fn from_table(t: *const TableV11) -> Result<Self> {
        // SAFETY: the caller's contract.
        let t: &'static TableV11 = unsafe { t.as_ref() }.ok_or(Error::Missing {
            what: "ncclNet_v11 table",
        })?;
        let init = need(t.init, "ncclNet init")?;
        let mut ctx: V = core::ptr::null_mut();
        let mut cfg = ncclNetCommConfig_t {
            traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
        };
        // SAFETY: valid out-pointer and config; NULL logger/profiler are allowed by the ABI.
        check("ncclNet init", unsafe {
            init(&mut ctx, 0, &mut cfg, None, None)
        })?;
        Ok(Self::new(Abi::V11(t), ctx))
    }

    /// Initialises the plugin whose v8 table is at `t`.
    ///
    /// # Safety
    /// As [`CNet::from_table`], for an `ncclNet_v8_t`.
    pub unsafe fn from_table_v8(t: *const TableV8) -> Result<Self> {
        // SAFETY: the caller's contract.
        let t: &'static TableV8 = unsafe { t.as_ref() }.ok_or(Error::Missing {
            what: "ncclNet_v8 table",
        })?;
        let init = need(t.init, "ncclNet init")?;
        // SAFETY: a NULL logger is allowed by the ABI.
        check("ncclNet init", unsafe { init(None) })?;
        Ok(Self::new(Abi::V8(t), core::ptr::null_mut()))
    }

    fn new(abi: Abi, ctx: V) -> Self {
        Self {
            abi,
            ctx,
            sizes: SizeReport::Flags,
            connecting: Vec::new(),
        }
    }

    /// The ABI version in use.
    pub fn version(&self) -> Version {
        match self.abi {
            Abi::V11(_) => Version::V11,
            Abi::V8(_) => Version::V8,
        }
    }

    /// Says how the plugin reports multi-receive sizes (see the module doc).
    pub fn with_sizes(mut self, sizes: SizeReport) -> Self {
        self.sizes = sizes;
        self
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        let name = entry!(self, name);
        if name.is_null() {
            return "";
        }
        // SAFETY: a non-NULL name is a NUL-terminated static string of the plugin.
        unsafe { core::ffi::CStr::from_ptr(name) }
            .to_str()
            .unwrap_or("")
    }

    /// The number of devices.
    pub fn devices(&self) -> Result<usize> {
        let f = need(entry!(self, devices), "ncclNet devices")?;
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        check("ncclNet devices", unsafe { f(&mut n) })?;
        Ok(n.max(0) as usize)
    }

    fn comm_ptr(c: CommRef<Ptr, Ptr>) -> V {
        match c {
            CommRef::Send(p) | CommRef::Recv(p) => p.0,
        }
    }

    fn gather(
        bufs: &[NetBuf<Ptr>],
        data: &mut [V; MAX_RECVS],
        mhs: &mut [V; MAX_RECVS],
    ) -> Result<c_int> {
        let n = count(bufs.len())?;
        for (i, b) in bufs.iter().enumerate() {
            data[i] = b.addr as V;
            mhs[i] = b.mr.0;
        }
        Ok(n)
    }
}

impl Drop for CNet {
    fn drop(&mut self) {
        if let Abi::V11(TableV11 {
            finalize: Some(f), ..
        }) = self.abi
        {
            // SAFETY: `ctx` came from this table's init and is finalized once.
            let _ = unsafe { f(self.ctx) };
        }
    }
}

impl Net for CNet {
    type Listen = Ptr;
    type Send = Ptr;
    type Recv = Ptr;
    type Mr = Ptr;
    type Req = Ptr;

    fn properties(&mut self, dev: u32) -> Result<NetProps> {
        let d = c_int::try_from(dev).map_err(|_| Error::OutOfRange {
            what: "net device",
            value: dev as i64,
            min: 0,
            max: c_int::MAX as i64,
        })?;
        let (max_recvs, ptr_support) = match self.abi {
            Abi::V11(t) => {
                let f = need(t.get_properties, "ncclNet getProperties")?;
                // SAFETY: Props11 is plain data (pointers, integers); all-zero is valid.
                let mut p: Props11 = unsafe { core::mem::zeroed() };
                // SAFETY: valid out-pointer to a v11 properties struct.
                check("ncclNet getProperties", unsafe { f(d, &mut p) })?;
                (p.max_recvs, p.ptr_support)
            }
            Abi::V8(t) => {
                let f = need(t.get_properties, "ncclNet getProperties")?;
                // SAFETY: Props8 is plain data; all-zero is valid.
                let mut p: Props8 = unsafe { core::mem::zeroed() };
                // SAFETY: valid out-pointer to a v8 properties struct.
                check("ncclNet getProperties", unsafe { f(d, &mut p) })?;
                (p.max_recvs, p.ptr_support)
            }
        };
        Ok(NetProps {
            max_recvs: (max_recvs.max(1) as usize).min(MAX_RECVS),
            dmabuf: ptr_support & NCCL_PTR_DMABUF != 0,
            sizes: self.sizes,
        })
    }

    fn listen(&mut self, dev: u32, handle: &mut NetHandle) -> Result<Ptr> {
        let mut l: V = core::ptr::null_mut();
        let h: V = handle.as_mut_ptr().cast();
        let r = match self.abi {
            // SAFETY: `handle` has NCCL_NET_HANDLE_MAXSIZE bytes; valid out-pointer.
            Abi::V11(t) => unsafe {
                need(t.listen, "ncclNet listen")?(self.ctx, dev as c_int, h, &mut l)
            },
            // SAFETY: as above.
            Abi::V8(t) => unsafe { need(t.listen, "ncclNet listen")?(dev as c_int, h, &mut l) },
        };
        check("ncclNet listen", r)?;
        if l.is_null() {
            return Err(Error::Missing {
                what: "listen comm from the plugin",
            });
        }
        Ok(Ptr(l))
    }

    fn connect(&mut self, dev: u32, handle: &NetHandle) -> Result<Option<Ptr>> {
        let mut s: V = core::ptr::null_mut();
        let mut dh: *mut ncclNetDeviceHandle_t = core::ptr::null_mut();
        let i = match self.connecting.iter().position(|c| c.0 == *handle) {
            Some(i) => i,
            None => {
                self.connecting.push((*handle, *handle));
                self.connecting.len() - 1
            }
        };
        let h: V = self.connecting[i].1.as_mut_ptr().cast();
        let r = match self.abi {
            // SAFETY: 128-byte handle (the plugin's working copy), valid out-pointers.
            Abi::V11(t) => unsafe {
                need(t.connect, "ncclNet connect")?(self.ctx, dev as c_int, h, &mut s, &mut dh)
            },
            // SAFETY: as above.
            Abi::V8(t) => unsafe {
                need(t.connect, "ncclNet connect")?(dev as c_int, h, &mut s, &mut dh)
            },
        };
        if r != ncclResult_t::Success || !s.is_null() {
            self.connecting.swap_remove(i);
        }
        check("ncclNet connect", r)?;
        Ok((!s.is_null()).then_some(Ptr(s)))
    }

    fn accept(&mut self, listen: Ptr) -> Result<Option<Ptr>> {
        let f = need(entry!(self, accept), "ncclNet accept")?;
        let mut r: V = core::ptr::null_mut();
        let mut dh: *mut ncclNetDeviceHandle_t = core::ptr::null_mut();
        // SAFETY: a listen comm of this plugin; valid out-pointers.
        check("ncclNet accept", unsafe { f(listen.0, &mut r, &mut dh) })?;
        Ok((!r.is_null()).then_some(Ptr(r)))
    }

    fn reg_mr(
        &mut self,
        comm: CommRef<Ptr, Ptr>,
        addr: u64,
        size: usize,
        ptr: PtrType,
        dmabuf: Option<(i32, u64)>,
    ) -> Result<Ptr> {
        let ty = match ptr {
            PtrType::Host => NCCL_PTR_HOST,
            PtrType::Device => NCCL_PTR_CUDA,
        };
        let c = Self::comm_ptr(comm);
        let mut mh: V = core::ptr::null_mut();
        match dmabuf {
            Some((fd, off)) => {
                let f = need(entry!(self, reg_mr_dma_buf), "ncclNet regMrDmaBuf")?;
                // SAFETY: a comm of this plugin; the engine owns the memory; valid out-pointer.
                check("ncclNet regMrDmaBuf", unsafe {
                    f(c, addr as V, size, ty, off, fd, &mut mh)
                })?;
            }
            None => {
                let f = need(entry!(self, reg_mr), "ncclNet regMr")?;
                // SAFETY: as above.
                check("ncclNet regMr", unsafe {
                    f(c, addr as V, size, ty, &mut mh)
                })?;
            }
        }
        Ok(Ptr(mh))
    }

    fn dereg_mr(&mut self, comm: CommRef<Ptr, Ptr>, mr: Ptr) -> Result<()> {
        let f = need(entry!(self, dereg_mr), "ncclNet deregMr")?;
        // SAFETY: a registration of this comm, deregistered once.
        check("ncclNet deregMr", unsafe { f(Self::comm_ptr(comm), mr.0) })
    }

    fn isend(&mut self, comm: Ptr, addr: u64, size: usize, t: u32, mr: Ptr) -> Result<Option<Ptr>> {
        let mut req: V = core::ptr::null_mut();
        let (data, tg) = (addr as V, tag(t)?);
        let r = match self.abi {
            // SAFETY: a send comm and registration of this plugin covering the buffer.
            Abi::V11(t) => unsafe {
                need(t.isend, "ncclNet isend")?(
                    comm.0,
                    data,
                    size,
                    tg,
                    mr.0,
                    core::ptr::null_mut(),
                    &mut req,
                )
            },
            // SAFETY: as above.
            Abi::V8(t) => unsafe {
                need(t.isend, "ncclNet isend")?(comm.0, data, int_size(size)?, tg, mr.0, &mut req)
            },
        };
        check("ncclNet isend", r)?;
        Ok((!req.is_null()).then_some(Ptr(req)))
    }

    fn irecv(&mut self, comm: Ptr, bufs: &[NetBuf<Ptr>]) -> Result<Option<Ptr>> {
        let mut data = [core::ptr::null_mut(); MAX_RECVS];
        let mut mhs = [core::ptr::null_mut(); MAX_RECVS];
        let mut phs = [core::ptr::null_mut(); MAX_RECVS];
        let mut tags = [0 as c_int; MAX_RECVS];
        let n = Self::gather(bufs, &mut data, &mut mhs)?;
        for (i, b) in bufs.iter().enumerate() {
            tags[i] = tag(b.tag)?;
        }
        let mut req: V = core::ptr::null_mut();
        let r = match self.abi {
            Abi::V11(t) => {
                let mut sizes = [0usize; MAX_RECVS];
                for (o, b) in sizes.iter_mut().zip(bufs) {
                    *o = b.size;
                }
                // SAFETY: arrays of `n` entries; a recv comm and registrations of this plugin.
                unsafe {
                    need(t.irecv, "ncclNet irecv")?(
                        comm.0,
                        n,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        phs.as_mut_ptr(),
                        &mut req,
                    )
                }
            }
            Abi::V8(t) => {
                let mut sizes = [0 as c_int; MAX_RECVS];
                for (o, b) in sizes.iter_mut().zip(bufs) {
                    *o = int_size(b.size)?;
                }
                // SAFETY: as above.
                unsafe {
                    need(t.irecv, "ncclNet irecv")?(
                        comm.0,
                        n,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        &mut req,
                    )
                }
            }
        };
        check("ncclNet irecv", r)?;
        Ok((!req.is_null()).then_some(Ptr(req)))
    }

    fn iflush(&mut self, comm: Ptr, bufs: &[NetBuf<Ptr>]) -> Result<Option<Ptr>> {
        let f = need(entry!(self, iflush), "ncclNet iflush")?;
        let mut data = [core::ptr::null_mut(); MAX_RECVS];
        let mut mhs = [core::ptr::null_mut(); MAX_RECVS];
        let mut sizes = [0 as c_int; MAX_RECVS];
        let n = Self::gather(bufs, &mut data, &mut mhs)?;
        for (i, b) in bufs.iter().enumerate() {
            sizes[i] = c_int::try_from(b.size).unwrap_or(c_int::MAX);
        }
        let mut req: V = core::ptr::null_mut();
        // SAFETY: as for irecv.
        check("ncclNet iflush", unsafe {
            f(
                comm.0,
                n,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(Ptr(req)))
    }

    fn test(
        &mut self,
        _comm: CommRef<Ptr, Ptr>,
        req: Ptr,
        sizes: &mut [usize; MAX_RECVS],
    ) -> Result<bool> {
        let f = need(entry!(self, test), "ncclNet test")?;
        let mut done: c_int = 0;
        let mut s = [0 as c_int; MAX_RECVS];
        // SAFETY: a live request of this plugin; room for MAX_RECVS sizes.
        check("ncclNet test", unsafe {
            f(req.0, &mut done, s.as_mut_ptr())
        })?;
        if done == 0 {
            return Ok(false);
        }
        for (o, v) in sizes.iter_mut().zip(s) {
            *o = v.max(0) as usize;
        }
        Ok(true)
    }

    fn irecv_consumed(&mut self, comm: Ptr, n: usize, req: Ptr) -> Result<()> {
        let Some(f) = entry!(self, irecv_consumed) else {
            return Ok(());
        };
        // SAFETY: a completed multi-receive of this comm, reported once.
        check("ncclNet irecvConsumed", unsafe {
            f(comm.0, count(n)?, req.0)
        })
    }

    fn close_send(&mut self, comm: Ptr) -> Result<()> {
        let f = need(entry!(self, close_send), "ncclNet closeSend")?;
        // SAFETY: a send comm of this plugin, closed once.
        check("ncclNet closeSend", unsafe { f(comm.0) })
    }

    fn close_recv(&mut self, comm: Ptr) -> Result<()> {
        let f = need(entry!(self, close_recv), "ncclNet closeRecv")?;
        // SAFETY: a recv comm of this plugin, closed once.
        check("ncclNet closeRecv", unsafe { f(comm.0) })
    }

    fn close_listen(&mut self, listen: Ptr) -> Result<()> {
        let f = need(entry!(self, close_listen), "ncclNet closeListen")?;
        // SAFETY: a listen comm of this plugin, closed once.
        check("ncclNet closeListen", unsafe { f(listen.0) })
    }
}
