//! The comm, registration and data-path calls of a [`ForeignPlugin`], version-agnostic. Each
//! reads its entry from the copied table (a NULL one is [`CallError::Null`]) and, where
//! versions differ, adapts the arguments in one `by_version!` arm per signature.

use core::ffi::{c_int, c_void};

use super::{by_version, check, need, shared, CallError, CallResult, ForeignPlugin};
use crate::types::{
    ncclNetCommConfig_t, ncclNetDeviceHandle_t, NCCL_NET_HANDLE_MAXSIZE,
    NCCL_NET_TRAFFIC_CLASS_UNDEF,
};

/// Most buffers in one `irecv`/`iflush` (`NCCL_NET_IB_MAX_RECVS`).
pub const MAX_RECVS: usize = ibnet_core::fifo::MAX_RECVS;

type V = *mut c_void;

/// A connect handle (`NCCL_NET_HANDLE_MAXSIZE` bytes).
pub type Handle = [u8; NCCL_NET_HANDLE_MAXSIZE];

/// One buffer of a (multi-)receive or flush.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    /// Address.
    pub data: *mut c_void,
    /// Posted size.
    pub size: usize,
    /// Tag (ignored by `iflush`).
    pub tag: c_int,
    /// Its registration (`mhandle`).
    pub mh: *mut c_void,
}

/// `n` as a receive count for one call (1..=[`MAX_RECVS`]).
#[inline]
pub fn count(n: usize) -> CallResult<c_int> {
    if n == 0 || n > MAX_RECVS {
        return Err(CallError::Arg(ibnet_core::Error::OutOfRange {
            what: "buffers in one irecv/iflush",
            value: n as i64,
            min: 1,
            max: MAX_RECVS as i64,
        }));
    }
    Ok(n as c_int)
}

/// A size for an entry taking `int` (regMr v6–v7, isend/irecv v6–v8).
#[inline]
fn int_size(n: usize) -> CallResult<c_int> {
    c_int::try_from(n).map_err(|_| {
        CallError::Arg(ibnet_core::Error::OutOfRange {
            what: "size for a plugin with int sizes (ncclNet_v6..v8)",
            value: n.min(i64::MAX as usize) as i64,
            min: 0,
            max: c_int::MAX as i64,
        })
    })
}

/// Buffer arrays laid out as `irecv`/`iflush` take them.
struct Arrays {
    n: c_int,
    data: [V; MAX_RECVS],
    mhs: [V; MAX_RECVS],
    tags: [c_int; MAX_RECVS],
    sizes: [usize; MAX_RECVS],
    phandles: [V; MAX_RECVS],
}

impl Arrays {
    #[inline] // the data path, called across crates (ibnet-tools)
    fn new(bufs: &[Buf]) -> CallResult<Self> {
        let mut a = Arrays {
            n: count(bufs.len())?,
            data: [core::ptr::null_mut(); MAX_RECVS],
            mhs: [core::ptr::null_mut(); MAX_RECVS],
            tags: [0; MAX_RECVS],
            sizes: [0; MAX_RECVS],
            phandles: [core::ptr::null_mut(); MAX_RECVS],
        };
        for (i, b) in bufs.iter().enumerate() {
            a.data[i] = b.data;
            a.mhs[i] = b.mh;
            a.tags[i] = b.tag;
            a.sizes[i] = b.size;
        }
        Ok(a)
    }

    /// The sizes as `int`: checked for irecv (`strict`: a larger receive cannot be posted),
    /// clamped for iflush (a flush reads back at most what arrived).
    #[inline] // the data path, called across crates (ibnet-tools)
    fn int_sizes(&self, strict: bool) -> CallResult<[c_int; MAX_RECVS]> {
        let mut out = [0 as c_int; MAX_RECVS];
        for (o, &s) in out.iter_mut().zip(&self.sizes) {
            *o = match strict {
                true => int_size(s)?,
                false => c_int::try_from(s).unwrap_or(c_int::MAX),
            };
        }
        Ok(out)
    }
}

// Comms, registrations and requests are the plugin's opaque values, handed back to it as NCCL
// hands them (see the module doc of `foreign`): this code never dereferences them, the plugin
// does, under its contract. Memory of the caller's is passed only by the `unsafe fn`s.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
impl ForeignPlugin {
    /// `listen(dev)`: writes the connect handle, returns the listen comm (NULL if the plugin
    /// gave none).
    pub fn listen(&self, dev: c_int, handle: &mut Handle) -> CallResult<V> {
        let call = "ncclNet listen";
        let mut l: V = core::ptr::null_mut();
        let h: V = handle.as_mut_ptr().cast();
        // SAFETY (every arm): `handle` has NCCL_NET_HANDLE_MAXSIZE bytes; valid out-pointer.
        let rc = by_version!(self.table, {
            [V12, V11] t => unsafe { need(t.listen, call)?(self.ctx, dev, h, &mut l) },
            [V10, V9, V8, V7, V6] t => unsafe { need(t.listen, call)?(dev, h, &mut l) },
        });
        check(call, rc)?;
        Ok(l)
    }

    /// One `connect` attempt with `handle` (kept by the caller between attempts, as NCCL
    /// does): `Ok(None)` means "call again".
    pub fn connect(&self, dev: c_int, handle: &mut Handle) -> CallResult<Option<V>> {
        let call = "ncclNet connect";
        let mut s: V = core::ptr::null_mut();
        let mut dh: *mut ncclNetDeviceHandle_t = core::ptr::null_mut();
        let mut cfg = ncclNetCommConfig_t {
            traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
        };
        let h: V = handle.as_mut_ptr().cast();
        // SAFETY (every arm): a 128-byte handle and out-pointers that outlive the call.
        let rc = by_version!(self.table, {
            [V12, V11] t => unsafe { need(t.connect, call)?(self.ctx, dev, h, &mut s, &mut dh) },
            [V10] t => unsafe { need(t.connect, call)?(dev, &mut cfg, h, &mut s, &mut dh) },
            [V9, V8, V7] t => unsafe { need(t.connect, call)?(dev, h, &mut s, &mut dh) },
            [V6] t => unsafe { need(t.connect, call)?(dev, h, &mut s) },
        });
        check(call, rc)?;
        Ok((!s.is_null()).then_some(s))
    }

    /// One `accept` attempt on `listen`: `Ok(None)` means "call again".
    pub fn accept(&self, listen: V) -> CallResult<Option<V>> {
        let call = "ncclNet accept";
        let mut r: V = core::ptr::null_mut();
        let mut dh: *mut ncclNetDeviceHandle_t = core::ptr::null_mut();
        // SAFETY (every arm): a listen comm of this plugin; out-pointers outlive the call.
        let rc = by_version!(self.table, {
            [V12, V11, V10, V9, V8, V7] t => unsafe {
                need(t.accept, call)?(listen, &mut r, &mut dh)
            },
            [V6] t => unsafe { need(t.accept, call)?(listen, &mut r) },
        });
        check(call, rc)?;
        Ok((!r.is_null()).then_some(r))
    }

    /// `regMr` of `data..data+size` (`ty`: `NCCL_PTR_*`) on `comm`.
    ///
    /// # Safety
    /// The memory must stay allocated until [`ForeignPlugin::dereg_mr`].
    pub unsafe fn reg_mr(&self, comm: V, data: V, size: usize, ty: c_int) -> CallResult<V> {
        let call = "ncclNet regMr";
        let mut mh: V = core::ptr::null_mut();
        // SAFETY (every arm): a comm of this plugin; the caller keeps the memory; valid
        // out-pointer.
        let rc = by_version!(self.table, {
            [V12, V11, V10, V9, V8] t => unsafe {
                need(t.reg_mr, call)?(comm, data, size, ty, &mut mh)
            },
            [V7, V6] t => unsafe { need(t.reg_mr, call)?(comm, data, int_size(size)?, ty, &mut mh) },
        });
        check(call, rc)?;
        Ok(mh)
    }

    /// `regMrDmaBuf` of `data..data+size`, backed by dma-buf `fd` at `offset`.
    ///
    /// # Safety
    /// As [`ForeignPlugin::reg_mr`], and `fd` is a dma-buf of that memory.
    pub unsafe fn reg_mr_dma_buf(
        &self,
        comm: V,
        data: V,
        size: usize,
        ty: c_int,
        offset: u64,
        fd: c_int,
    ) -> CallResult<V> {
        let call = "ncclNet regMrDmaBuf";
        let f = need(shared!(self.table, reg_mr_dma_buf), call)?;
        let mut mh: V = core::ptr::null_mut();
        // SAFETY: as for reg_mr.
        check(call, unsafe {
            f(comm, data, size, ty, offset, fd, &mut mh)
        })?;
        Ok(mh)
    }

    /// `deregMr` of a registration of `comm`, once.
    pub fn dereg_mr(&self, comm: V, mh: V) -> CallResult<()> {
        let f = need(shared!(self.table, dereg_mr), "ncclNet deregMr")?;
        // SAFETY: a registration of this comm, deregistered once.
        check("ncclNet deregMr", unsafe { f(comm, mh) })
    }

    /// One `isend` attempt: `Ok(None)` means "the receiver is not ready; call again".
    ///
    /// # Safety
    /// `data..data+size` lies inside registration `mh` and stays untouched until the request
    /// completes.
    #[inline] // the data path, called across crates (ibnet-tools)
    pub unsafe fn isend(
        &self,
        comm: V,
        data: V,
        size: usize,
        tag: c_int,
        mh: V,
    ) -> CallResult<Option<V>> {
        let call = "ncclNet isend";
        let mut r: V = core::ptr::null_mut();
        let ph: V = core::ptr::null_mut();
        // SAFETY (every arm): a send comm of this plugin; the buffer contract is the caller's;
        // valid out-pointer.
        let rc = by_version!(self.table, {
            [V12, V11, V10] t => unsafe {
                need(t.isend, call)?(comm, data, size, tag, mh, ph, &mut r)
            },
            [V9] t => unsafe { need(t.isend, call)?(comm, data, size, tag, mh, &mut r) },
            [V8, V7, V6] t => unsafe {
                need(t.isend, call)?(comm, data, int_size(size)?, tag, mh, &mut r)
            },
        });
        check(call, rc)?;
        Ok((!r.is_null()).then_some(r))
    }

    /// One `irecv` attempt over `bufs` (1..=[`MAX_RECVS`]): `Ok(None)` means "call again".
    ///
    /// # Safety
    /// Every buffer lies inside its registration and stays untouched until completion.
    #[inline] // the data path, called across crates (ibnet-tools)
    pub unsafe fn irecv(&self, comm: V, bufs: &[Buf]) -> CallResult<Option<V>> {
        let call = "ncclNet irecv";
        let mut a = Arrays::new(bufs)?;
        let mut r: V = core::ptr::null_mut();
        let (d, tg, m) = (a.data.as_mut_ptr(), a.tags.as_mut_ptr(), a.mhs.as_mut_ptr());
        let (sz, ph) = (a.sizes.as_mut_ptr(), a.phandles.as_mut_ptr());
        // SAFETY (every arm): arrays of `n` entries that outlive the call (the plugin copies
        // what it needs); a recv comm and registrations of this plugin; the buffer contract is
        // the caller's.
        let rc = by_version!(self.table, {
            [V12, V11, V10] t => unsafe {
                need(t.irecv, call)?(comm, a.n, d, sz, tg, m, ph, &mut r)
            },
            [V9] t => unsafe { need(t.irecv, call)?(comm, a.n, d, sz, tg, m, &mut r) },
            [V8, V7, V6] t => {
                let mut isz = a.int_sizes(true)?;
                // SAFETY: as above, with `isz` of `n` entries.
                unsafe { need(t.irecv, call)?(comm, a.n, d, isz.as_mut_ptr(), tg, m, &mut r) }
            }
        });
        check(call, rc)?;
        Ok((!r.is_null()).then_some(r))
    }

    /// `iflush` of received `bufs`: `Ok(None)` when the plugin has nothing to flush.
    ///
    /// # Safety
    /// As [`ForeignPlugin::irecv`].
    #[inline] // the data path, called across crates (ibnet-tools)
    pub unsafe fn iflush(&self, comm: V, bufs: &[Buf]) -> CallResult<Option<V>> {
        let call = "ncclNet iflush";
        let f = need(shared!(self.table, iflush), call)?;
        let mut a = Arrays::new(bufs)?;
        let mut sizes = a.int_sizes(false)?;
        let mut r: V = core::ptr::null_mut();
        // SAFETY: as for irecv.
        check(call, unsafe {
            f(
                comm,
                a.n,
                a.data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                a.mhs.as_mut_ptr(),
                &mut r,
            )
        })?;
        Ok((!r.is_null()).then_some(r))
    }

    /// `test(req)`: `Some(sizes)` once done (the plugin then frees the request).
    #[inline] // the data path, called across crates (ibnet-tools)
    pub fn test(&self, req: V) -> CallResult<Option<[c_int; MAX_RECVS]>> {
        let f = need(shared!(self.table, test), "ncclNet test")?;
        let mut done: c_int = 0;
        let mut sizes = [0 as c_int; MAX_RECVS];
        // SAFETY: a live request of this plugin; room for MAX_RECVS sizes.
        check("ncclNet test", unsafe {
            f(req, &mut done, sizes.as_mut_ptr())
        })?;
        Ok((done != 0).then_some(sizes))
    }

    /// `irecvConsumed` of a completed multi-receive; a no-op where the plugin has none (v6,
    /// or a NULL entry).
    #[inline] // the data path, called across crates (ibnet-tools)
    pub fn irecv_consumed(&self, comm: V, n: usize, req: V) -> CallResult<()> {
        let f = by_version!(self.table, {
            [V12, V11, V10, V9, V8, V7] t => t.irecv_consumed,
            [V6] _t => None,
        });
        let Some(f) = f else {
            return Ok(());
        };
        // SAFETY: a completed multi-receive of this comm, reported once.
        check("ncclNet irecvConsumed", unsafe { f(comm, count(n)?, req) })
    }

    /// `closeSend`.
    pub fn close_send(&self, comm: V) -> CallResult<()> {
        let f = need(shared!(self.table, close_send), "ncclNet closeSend")?;
        // SAFETY: a send comm of this plugin, closed once.
        check("ncclNet closeSend", unsafe { f(comm) })
    }

    /// `closeRecv`.
    pub fn close_recv(&self, comm: V) -> CallResult<()> {
        let f = need(shared!(self.table, close_recv), "ncclNet closeRecv")?;
        // SAFETY: a recv comm of this plugin, closed once.
        check("ncclNet closeRecv", unsafe { f(comm) })
    }

    /// `closeListen`.
    pub fn close_listen(&self, listen: V) -> CallResult<()> {
        let f = need(shared!(self.table, close_listen), "ncclNet closeListen")?;
        // SAFETY: a listen comm of this plugin, closed once.
        check("ncclNet closeListen", unsafe { f(listen) })
    }
}
