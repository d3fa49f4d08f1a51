//! The data path: `isend`, `irecv`, `iflush`, `test`. Lock-free and allocation-free: tokens
//! are looked up in [`crate::handles`], registrations in the comm's NIC (`Nic::keys`: the
//! buffer's keys on every rail). One path per call, whatever the NIC's rail count.
#![allow(unsafe_code)]
// NCCL's arrays and out-pointers; every block has a SAFETY comment.
// The C entry points' bodies: every pointer comes from NCCL and is NULL-checked before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};

use ibnet_core::comm::Done;
use ibnet_core::fifo::MAX_RECVS;
use ibnet_core::Error;

use super::comm::CommBox;
use super::comm::{recv_comm, request, send_comm, CommRef};
use super::common::{missing, out_ptr};
use super::entry::entry_at;
use super::mr::{covers, mr_get};
use crate::dev::{AnyRecv, AnySend};
use crate::handles;
use crate::nic::Nic;
use crate::watch::Watch;
use ibnet_core::rails::{RailBuf, RailNews};
use ibnet_core::request::ReqId;
use ibnet_nccl::types::ncclResult_t;

/// `isend`. While the receiver has posted no matching receive (no clear-to-send yet) it
/// returns no request; that wait is watched ([`crate::watch`]): a dead receiver is an error.
/// `phandle` is NCCL's profiler parent for this send (v10/v11; NULL: none). The buffer's
/// keys on every rail of the comm's NIC go to the core, which stripes the message over
/// several rails.
pub fn isend(
    comm: *mut c_void,
    data: *mut c_void,
    size: u64,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry_at("isend", comm, |at| {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let s = send_comm(comm, "isend")?;
        *at = s.at();
        let m = mr_get(&s.nic, mhandle)?;
        if data.is_null() && size > 0 {
            return Err(missing("data"));
        }
        covers(&m, data as u64, size)?;
        let keys = &m.keys[..s.nic.rails()];
        let (addr, tag, parent) = (data as u64, tag as u32, phandle as usize);
        // SAFETY: a data-path call; see `CommBox::comm_mut`.
        let (c, w) = unsafe { s.parts_mut() };
        let r = c.isend(addr, size, tag, keys, parent);
        rail_news(s, "send", c);
        let id = match (r?, w) {
            (Some(id), w) => {
                w.map(Watch::progress);
                if let Some(t) = c.take_truncation() {
                    s.warn_truncated(t);
                }
                Some(id)
            }
            (None, None) => None,
            (None, Some(w)) => {
                w.tag = tag;
                match w.waiting("clear-to-send (a matching irecv)", comm as usize) {
                    Ok(()) => None,
                    // Dead: one more try, in case the last message raced the close.
                    Err(e) => match c.isend(addr, size, tag, keys, parent)? {
                        Some(id) => Some(id),
                        None => {
                            c.fail(&e);
                            return Err(e);
                        }
                    },
                }
            }
        };
        if let Some(id) = id {
            *out = handles::request_token(comm as usize, id) as *mut c_void;
        }
        Ok(())
    })
}

/// Sizes of an `irecv`/`iflush`: `int` (v6–v8, iflush) or `size_t` (v9+).
#[derive(Clone, Copy)]
pub enum Sizes {
    /// `int*`.
    Int(*const c_int),
    /// `size_t*`.
    Size(*const usize),
}

/// Entry `i` of a sizes array (`Missing` for NULL).
fn size_at(sizes: Sizes, i: usize) -> Result<u64, Error> {
    match sizes {
        Sizes::Int(p) if !p.is_null() => {
            // SAFETY: NCCL passes arrays of `n` entries; the caller's `i < n`.
            let s = unsafe { *p.add(i) };
            u64::try_from(s).map_err(|_| Error::OutOfRange {
                what: "size",
                value: s as i64,
                min: 0,
                max: i32::MAX as i64,
            })
        }
        // SAFETY: as above.
        Sizes::Size(p) if !p.is_null() => Ok((unsafe { *p.add(i) }) as u64),
        _ => Err(missing("sizes")),
    }
}

/// NCCL's `n` buffers as the core's, each checked against its registration among `nic`'s
/// (found from the buffer's `mhandle`: its keys on every rail and the range it covers).
/// They are pushed onto `bufs` (the caller's, empty: so that nothing is copied on return,
/// and only the `n` buffers NCCL passed are ever written).
fn gather(
    bufs: &mut Bufs,
    nic: &Nic,
    n: c_int,
    data: *mut *mut c_void,
    sizes: Sizes,
    tags: *const c_int,
    mhandles: *mut *mut c_void,
) -> Result<(), Error> {
    if n < 1 || n as usize > MAX_RECVS {
        return Err(Error::OutOfRange {
            what: "n (receives in one irecv)",
            value: n as i64,
            min: 1,
            max: MAX_RECVS as i64,
        });
    }
    let n = n as usize;
    if data.is_null() || mhandles.is_null() {
        return Err(missing(if data.is_null() { "data" } else { "mhandles" }));
    }
    for i in 0..n {
        // SAFETY: NCCL passes arrays of `n` entries; `i < n`.
        let (d, mh) = unsafe { (*data.add(i), *mhandles.add(i)) };
        let size = size_at(sizes, i)?;
        // SAFETY: as above.
        let tag = if tags.is_null() {
            0
        } else {
            unsafe { *tags.add(i) }
        };
        let m = mr_get(nic, mh)?;
        if d.is_null() && size > 0 {
            return Err(missing("data[i]"));
        }
        covers(&m, d as u64, size)?;
        // Cannot fail: `n` ≤ MAX_RECVS, checked above, and `bufs` came empty.
        let _ = bufs.push(RailBuf {
            addr: d as u64,
            size,
            tag: tag as u32,
            mrs: m.keys,
        });
    }
    Ok(())
}

/// The buffers of one `irecv`/`iflush`, as the core takes them.
type Bufs = heapless::Vec<RailBuf, MAX_RECVS>;

/// `irecv`. On entry `*request` may hold NCCL's optional-completion hint (0x1); it is always
/// overwritten. `phandles` (v10/v11; NULL: none) holds NCCL's profiler parent per buffer.
#[allow(clippy::too_many_arguments)] // the C signature, plus the profiler handles
pub fn irecv(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: Sizes,
    tags: *const c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry_at("irecv", comm, |at| {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let r = recv_comm(comm, "irecv")?;
        *at = r.at();
        if tags.is_null() {
            return Err(missing("tags"));
        }
        let mut bufs = Bufs::new();
        gather(&mut bufs, &r.nic, n, data, sizes, tags, mhandles)?;
        let n = bufs.len();
        // SAFETY: a data-path call; see `CommBox::comm_mut`.
        let (c, w) = unsafe { r.parts_mut() };
        if let Some(w) = w {
            w.tag = bufs[0].tag;
        }
        let mut parents = [0usize; MAX_RECVS];
        if !phandles.is_null() {
            for (i, p) in parents.iter_mut().enumerate().take(n) {
                // SAFETY: NCCL passes `n` profiler handles when it passes the array.
                *p = unsafe { *phandles.add(i) } as usize;
            }
        }
        let res = c.irecv(&bufs[..n], &parents[..n]);
        rail_news(r, "receive", c);
        if let Some(id) = res? {
            *out = handles::request_token(comm as usize, id) as *mut c_void;
        }
        Ok(())
    })
}

/// `iflush`. Leaves `*request` NULL when there is nothing to flush.
pub fn iflush(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *const c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry_at("iflush", comm, |at| {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let r = recv_comm(comm, "iflush")?;
        *at = r.at();
        let no_tags = core::ptr::null();
        let mut bufs = Bufs::new();
        let sz = Sizes::Int(sizes);
        gather(&mut bufs, &r.nic, n, data, sz, no_tags, mhandles)?;
        // SAFETY: a data-path call; see `CommBox::comm_mut`.
        let c = unsafe { r.comm_mut() };
        let res = c.iflush(&bufs);
        rail_news(r, "receive", c);
        if let Some(id) = res? {
            *out = handles::request_token(comm as usize, id) as *mut c_void;
        }
        Ok(())
    })
}

/// `test`. `sizes` may be NULL. The request token names its comm's slot and the core's
/// request id: nothing is dereferenced for a stale or foreign token. A request not done yet
/// is a wait on the peer, watched ([`crate::watch`]): a dead peer is an error.
pub fn test(req: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t {
    entry_at("test", req, |at| {
        // SAFETY: valid or NULL (rejected).
        let done = unsafe { done.as_mut() }.ok_or(missing("done"))?;
        *done = 0;
        if req.is_null() {
            return Err(missing("request"));
        }
        let res = match request(req, "test")? {
            (CommRef::Send(b), id) => {
                *at = b.at();
                // SAFETY: a data-path call; see `CommBox::comm_mut`.
                let (c, w) = unsafe { b.parts_mut() };
                let r = watched(c, id, w, "the send's completion", req);
                rail_news(b, "send", c);
                r
            }
            (CommRef::Recv(b), id) => {
                *at = b.at();
                // SAFETY: as above.
                let (c, w) = unsafe { b.parts_mut() };
                let r = watched(c, id, w, "data (a matching isend)", req);
                rail_news(b, "receive", c);
                r
            }
        };
        let Some(d) = res? else {
            return Ok(());
        };
        *done = 1;
        if !sizes.is_null() {
            for (i, &sz) in d.sizes.iter().enumerate().take(d.n as usize) {
                // SAFETY: NCCL passes room for one size per receive of the request.
                unsafe { *sizes.add(i) = sz.min(i32::MAX as u64) as c_int };
            }
        }
        Ok(())
    })
}

/// A comm whose requests `test` polls.
trait Tested {
    fn test(&mut self, id: ReqId) -> Result<Option<Done>, Error>;
    fn fail(&mut self, e: &Error);
    /// See `AnySend::has_rail_news`.
    fn has_rail_news(&self) -> bool;
    /// Rails taken out of use and returned since the last call.
    fn take_news(&mut self) -> RailNews;
}

/// After a data call: the comm's rails taken out of use (one WARN each) and returned (one INFO
/// each) since the last call, logged. One flag test when nothing happened; always nothing for
/// a comm of one rail.
#[inline(always)]
fn rail_news<C: Tested>(b: &CommBox<C>, side: &str, c: &mut C) {
    if c.has_rail_news() {
        b.log_rail_news(side, c.take_news());
    }
}

impl Tested for AnySend {
    #[inline(always)]
    fn test(&mut self, id: ReqId) -> Result<Option<Done>, Error> {
        AnySend::test(self, id)
    }
    fn fail(&mut self, e: &Error) {
        AnySend::fail(self, e)
    }
    #[inline]
    fn has_rail_news(&self) -> bool {
        AnySend::has_rail_news(self)
    }
    #[cold]
    fn take_news(&mut self) -> RailNews {
        AnySend::take_news(self)
    }
}

impl Tested for AnyRecv {
    #[inline(always)]
    fn test(&mut self, id: ReqId) -> Result<Option<Done>, Error> {
        AnyRecv::test(self, id)
    }
    fn fail(&mut self, e: &Error) {
        AnyRecv::fail(self, e)
    }
    #[inline]
    fn has_rail_news(&self) -> bool {
        AnyRecv::has_rail_news(self)
    }
    #[cold]
    fn take_news(&mut self) -> RailNews {
        AnyRecv::take_news(self)
    }
}

/// `test` of request `id` of `c`, its wait watched by `w`: a dead peer is an error unless one
/// more test finds the request done (its last completion raced the close), and it fails the
/// comm (every later call on it is refused, reported as this one).
fn watched(
    c: &mut impl Tested,
    id: ReqId,
    w: Option<&mut Watch>,
    what: &str,
    req: *mut c_void,
) -> Result<Option<Done>, Error> {
    let r = c.test(id)?;
    let Some(w) = w else { return Ok(r) };
    if r.is_some() {
        w.progress();
        return Ok(r);
    }
    match w.waiting(what, req as usize) {
        Ok(()) => Ok(None),
        Err(e) => match c.test(id)? {
            Some(d) => Ok(Some(d)),
            None => {
                c.fail(&e);
                Err(e)
            }
        },
    }
}
