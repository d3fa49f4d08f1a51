//! [`ForeignNet`]: the proxy engine's [`Net`] over any NCCL net plugin's C table, loaded from
//! a path or given as a table (this library's own `ncclNetPlugin_v11` for the C API's NULL
//! path). Named "foreign" because it reaches the plugin only through its C ABI, unlike the
//! testkit's `InProcessNet` over ibnet's comms; loading and calling are [`ibnet_nccl::foreign`]'s,
//! this file only adapts the engine's types.
//!
//! ```text
//!  ForeignNet::load("libnccl-net-foo.so") ─ ForeignPlugin::open (newest of v12 … v6)
//!        └─ init(NULL logger, commId 0)   (v11: ctx with trafficClass = -1)
//!  engine ── listen/connect/accept/regMr/isend/irecv/iflush/test/close* ──▶ ForeignPlugin
//!  drop ──▶ finalize(ctx) (v11)     (the library stays loaded: a plugin may own threads)
//! ```
//!
//! The engine's handles become the plugin's `void*` comms, registrations and requests
//! ([`Ptr`]). Errors: a call returning anything but `ncclSuccess` becomes
//! `Error::Provider { call: "ncclNet <entry>", errno: <ncclResult_t> }`, a NULL entry
//! `Error::Missing { what: "ncclNet <entry>" }`; a size an `int`-sized version cannot carry is
//! `OutOfRange`. `connect`/`accept` leaving the comm NULL, and `isend`/`irecv` leaving the
//! request NULL, mean "not yet" (`Ok(None)`), as NCCL reads them.
//!
//! Multi-receive sizes: the plugin's `test` may report bytes per buffer (ibnet, NCCL's IB
//! plugin since 2.19) or 0/1 per buffer (NCCL's IB plugin before 2.19);
//! [`ForeignNet::with_sizes`] says which. The default is [`SizeReport::Bytes`] for ibnet's own
//! table (name "IBNet") and [`SizeReport::Flags`] otherwise, which is correct, if coarse, for
//! both kinds of plugin.

use core::ffi::{c_int, c_void};
use std::path::Path;

use crate::{CommRef, Net, NetBuf, NetHandle, NetProps, PtrType, SizeReport};
use ibnet_core::{Error, Result};

use ibnet_nccl::foreign::calls::{Buf, MAX_RECVS};
use ibnet_nccl::foreign::{ForeignPlugin, Table, Version};
use ibnet_nccl::types::{NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};

/// A plugin's opaque pointer (listen comm, send/recv comm, `mhandle` or request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr(pub *mut c_void);

/// [`Net`] over a plugin's `ncclNet_vN_t`.
pub struct ForeignNet {
    plugin: ForeignPlugin,
    sizes: SizeReport,
    /// Connects in progress: (handle as the engine passes it, the plugin's working copy). A
    /// plugin keeps its connect state in the handle (NCCL passes it mutable and calls again
    /// with the same buffer), so each retry must see what the previous call wrote.
    connecting: Vec<(NetHandle, NetHandle)>,
}

fn tag(t: u32) -> Result<c_int> {
    c_int::try_from(t).map_err(|_| Error::OutOfRange {
        what: "tag",
        value: t as i64,
        min: 0,
        max: c_int::MAX as i64,
    })
}

impl ForeignNet {
    /// Loads the plugin at `path` (`dlopen`, `RTLD_NOW | RTLD_LOCAL`) and initialises its newest
    /// table (`ncclNetPlugin_v12` … `_v6`). The library is never unloaded.
    pub fn load(path: &str) -> Result<Self> {
        Self::init(ForeignPlugin::open(Path::new(path))?)
    }

    /// Loads the plugin at `path` and initialises its table of version `v`.
    pub fn load_version(path: &str, v: Version) -> Result<Self> {
        Self::init(ForeignPlugin::open_version(Path::new(path), v)?)
    }

    /// Initialises the plugin whose table is `t`.
    ///
    /// # Safety
    /// As [`ForeignPlugin::from_table`].
    pub unsafe fn from_table(t: Table) -> Result<Self> {
        // SAFETY: the caller's contract.
        Self::init(unsafe { ForeignPlugin::from_table(t) })
    }

    fn init(mut plugin: ForeignPlugin) -> Result<Self> {
        plugin.init(None, 0)?;
        let sizes = if plugin.name().and_then(|n| n.to_str().ok()) == Some("IBNet") {
            SizeReport::Bytes
        } else {
            SizeReport::Flags
        };
        Ok(Self {
            plugin,
            sizes,
            connecting: Vec::new(),
        })
    }

    /// The ABI version in use.
    pub fn version(&self) -> Version {
        self.plugin.version()
    }

    /// Says how the plugin reports multi-receive sizes (see the module doc).
    pub fn with_sizes(mut self, sizes: SizeReport) -> Self {
        self.sizes = sizes;
        self
    }

    /// The plugin's name ("" if NULL or not UTF-8).
    pub fn name(&self) -> &str {
        self.plugin
            .name()
            .and_then(|n| n.to_str().ok())
            .unwrap_or("")
    }

    /// The number of devices.
    pub fn devices(&self) -> Result<usize> {
        Ok(self.plugin.devices()?.max(0) as usize)
    }

    fn comm_ptr(c: CommRef<Ptr, Ptr>) -> *mut c_void {
        match c {
            CommRef::Send(p) | CommRef::Recv(p) => p.0,
        }
    }

    /// The engine's buffers as the plugin's; tags are converted for `irecv` only (`iflush`
    /// has none).
    fn bufs(bufs: &[NetBuf<Ptr>], tags: bool, out: &mut [Buf; MAX_RECVS]) -> Result<usize> {
        ibnet_nccl::foreign::calls::count(bufs.len())?;
        for (o, b) in out.iter_mut().zip(bufs) {
            *o = Buf {
                data: b.addr as *mut c_void,
                size: b.size,
                tag: if tags { tag(b.tag)? } else { 0 },
                mh: b.mr.0,
            };
        }
        Ok(bufs.len())
    }
}

const NO_BUF: Buf = Buf {
    data: core::ptr::null_mut(),
    size: 0,
    tag: 0,
    mh: core::ptr::null_mut(),
};

impl Net for ForeignNet {
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
        let p = self.plugin.properties(d)?;
        Ok(NetProps {
            max_recvs: (p.max_recvs.max(1) as usize).min(MAX_RECVS),
            dmabuf: p.ptr_support & NCCL_PTR_DMABUF != 0,
            sizes: self.sizes,
        })
    }

    fn listen(&mut self, dev: u32, handle: &mut NetHandle) -> Result<Ptr> {
        let l = self.plugin.listen(dev as c_int, handle)?;
        if l.is_null() {
            return Err(Error::Missing {
                what: "listen comm from the plugin",
            });
        }
        Ok(Ptr(l))
    }

    fn connect(&mut self, dev: u32, handle: &NetHandle) -> Result<Option<Ptr>> {
        let i = match self.connecting.iter().position(|c| c.0 == *handle) {
            Some(i) => i,
            None => {
                self.connecting.push((*handle, *handle));
                self.connecting.len() - 1
            }
        };
        let r = self.plugin.connect(dev as c_int, &mut self.connecting[i].1);
        if !matches!(r, Ok(None)) {
            self.connecting.swap_remove(i);
        }
        Ok(r?.map(Ptr))
    }

    fn accept(&mut self, listen: Ptr) -> Result<Option<Ptr>> {
        Ok(self.plugin.accept(listen.0)?.map(Ptr))
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
        let (c, data) = (Self::comm_ptr(comm), addr as *mut c_void);
        // SAFETY: a comm of this plugin; the engine owns the memory until deregMr.
        let mh = unsafe {
            match dmabuf {
                Some((fd, off)) => self.plugin.reg_mr_dma_buf(c, data, size, ty, off, fd),
                None => self.plugin.reg_mr(c, data, size, ty),
            }
        }?;
        Ok(Ptr(mh))
    }

    fn dereg_mr(&mut self, comm: CommRef<Ptr, Ptr>, mr: Ptr) -> Result<()> {
        Ok(self.plugin.dereg_mr(Self::comm_ptr(comm), mr.0)?)
    }

    fn isend(&mut self, comm: Ptr, addr: u64, size: usize, t: u32, mr: Ptr) -> Result<Option<Ptr>> {
        let tg = tag(t)?;
        // SAFETY: a send comm and registration of this plugin covering the engine's buffer,
        // untouched until the request completes (the engine's contract).
        let r = unsafe {
            self.plugin
                .isend(comm.0, addr as *mut c_void, size, tg, mr.0)
        }?;
        Ok(r.map(Ptr))
    }

    fn irecv(&mut self, comm: Ptr, bufs: &[NetBuf<Ptr>]) -> Result<Option<Ptr>> {
        let mut b = [NO_BUF; MAX_RECVS];
        let n = Self::bufs(bufs, true, &mut b)?;
        // SAFETY: a recv comm and registrations of this plugin covering the engine's buffers.
        Ok(unsafe { self.plugin.irecv(comm.0, &b[..n]) }?.map(Ptr))
    }

    fn iflush(&mut self, comm: Ptr, bufs: &[NetBuf<Ptr>]) -> Result<Option<Ptr>> {
        let mut b = [NO_BUF; MAX_RECVS];
        let n = Self::bufs(bufs, false, &mut b)?;
        // SAFETY: as for irecv.
        Ok(unsafe { self.plugin.iflush(comm.0, &b[..n]) }?.map(Ptr))
    }

    fn test(
        &mut self,
        _comm: CommRef<Ptr, Ptr>,
        req: Ptr,
        sizes: &mut [usize; MAX_RECVS],
    ) -> Result<bool> {
        let Some(s) = self.plugin.test(req.0)? else {
            return Ok(false);
        };
        for (o, v) in sizes.iter_mut().zip(s) {
            *o = v.max(0) as usize;
        }
        Ok(true)
    }

    fn irecv_consumed(&mut self, comm: Ptr, n: usize, req: Ptr) -> Result<()> {
        Ok(self.plugin.irecv_consumed(comm.0, n, req.0)?)
    }

    fn close_send(&mut self, comm: Ptr) -> Result<()> {
        Ok(self.plugin.close_send(comm.0)?)
    }

    fn close_recv(&mut self, comm: Ptr) -> Result<()> {
        Ok(self.plugin.close_recv(comm.0)?)
    }

    fn close_listen(&mut self, listen: Ptr) -> Result<()> {
        Ok(self.plugin.close_listen(listen.0)?)
    }
}
