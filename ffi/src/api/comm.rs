//! The send and receive comms handed to NCCL: boxes behind [`crate::handles`] tokens, their
//! lookups by token (kind and lifecycle checked), and `closeSend` / `closeRecv`.
#![allow(unsafe_code)]
// the leaked boxes behind tokens; every block has a SAFETY comment.
// The C entry points' bodies: tokens are looked up, never dereferenced unchecked.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::c_void;
use std::cell::UnsafeCell;
use std::net::SocketAddr;
use std::sync::Arc;

use ibnet_core::rails::RailStats;
use ibnet_core::request::ReqId;
use ibnet_core::Error;

use super::common::missing;
use super::entry::entry;
use crate::dev::{AnyRecv, AnySend};
use crate::handles::{self, Kind};
use crate::handshake_io::{Where, CONNECTED};
use crate::nic::Nic;
use crate::watch::Watch;
use ibnet_nccl::types::ncclResult_t;

/// A send or receive comm handed to NCCL (as a [`crate::handles`] token, whose slot also
/// holds the comm's lifecycle).
///
/// `nic` is written at creation and never mutated: `regMr`/`deregMr` read them
/// through a shared reference from NCCL's proxy service thread while the progress thread has
/// `comm` borrowed mutably (it lives in an `UnsafeCell` for that reason).
pub struct CommBox<C> {
    /// The comm's NIC: its rails and the registrations its comms use (device number,
    /// carried by its mhandles).
    pub(crate) nic: Arc<Nic>,
    /// The peer's bootstrap socket address (None: a comm made without a handshake, in tests).
    pub(crate) addr: Option<SocketAddr>,
    comm: UnsafeCell<C>,
    /// The peer's liveness (data-path state, borrowed like `comm`).
    watch: UnsafeCell<Option<Watch>>,
    /// The comm's open profiler events (with a profiler only). Declared after `comm`: it is
    /// dropped after the comm, whose teardown stops the events still open.
    _events: Option<Box<crate::profiler::EventTable>>,
}

/// A send comm.
pub type SendCommBox = CommBox<AnySend>;
/// A receive comm.
pub type RecvCommBox = CommBox<AnyRecv>;

impl<C> CommBox<C> {
    fn new(
        nic: &Arc<Nic>,
        comm: C,
        watch: Option<Watch>,
        events: Option<Box<crate::profiler::EventTable>>,
    ) -> Box<Self> {
        Box::new(Self {
            nic: nic.clone(),
            addr: watch.as_ref().map(|w| w.addr),
            comm: UnsafeCell::new(comm),
            watch: UnsafeCell::new(watch),
            _events: events,
        })
    }

    /// The provider comm and its peer watch, for a data-path call.
    ///
    /// # Safety
    /// As [`Self::comm_mut`].
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn parts_mut(&self) -> (&mut C, Option<&mut Watch>) {
        // SAFETY: exclusive by the caller's contract (see `comm_mut`); the two cells are
        // distinct, so the two references do not alias.
        unsafe { (&mut *self.comm.get(), (*self.watch.get()).as_mut()) }
    }

    /// Where this comm's peer is, for a data-path error message.
    pub(crate) fn at(&self) -> Option<Where> {
        self.addr.map(|peer| Where {
            peer,
            state: CONNECTED,
        })
    }

    /// Logs the comm's first truncated send (its only such WARN: later ones are silent): a
    /// send larger than the receive the peer posted was cut to the receive's size, as NCCL
    /// does; a size mismatch is almost always a bug of the application.
    #[cold]
    pub(crate) fn warn_truncated(&self, t: ibnet_core::comm::Truncation) {
        let peer = self.addr.map_or("?".into(), |a| a.to_string());
        ibnet_nccl::warn!(
            "isend: send of {} bytes (tag {:#x}) to {peer} truncated to the {} bytes its \
             receive posted (a size mismatch between the two ranks; later truncations on this \
             comm are not logged)",
            t.send,
            t.tag,
            t.recv
        );
    }

    /// Logs what the comm's rails did since the last call (`side`: "send" or "receive").
    #[cold]
    pub(crate) fn log_rail_news(&self, side: &str, news: ibnet_core::rails::RailNews) {
        crate::rail_log::news(&self.nic, self.addr, side, news);
    }

    /// The provider comm, for a data-path call.
    ///
    /// # Safety
    /// NCCL serialises the data-path calls (`isend`/`irecv`/`iflush`/`test`, close) of one
    /// comm on one thread, so no other `&mut` to `comm` exists while the result lives; shared
    /// users (`regMr`/`deregMr`) never touch `comm`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn comm_mut(&self) -> &mut C {
        // SAFETY: exclusive by the caller's contract above.
        unsafe { &mut *self.comm.get() }
    }
}

/// A provider comm that can send profiler events.
pub(crate) trait Profiled {
    /// See `SendComm::set_events`.
    fn set_events(&mut self, sink: Option<ibnet_core::comm::Sink>);
}

impl Profiled for crate::dev::AnySend {
    fn set_events(&mut self, sink: Option<ibnet_core::comm::Sink>) {
        crate::dev::AnySend::set_events(self, sink)
    }
}

impl Profiled for crate::dev::AnyRecv {
    fn set_events(&mut self, sink: Option<ibnet_core::comm::Sink>) {
        crate::dev::AnyRecv::set_events(self, sink)
    }
}

/// Boxes a new comm of `kind` (`CommBox<AnySend>` for Send, `<AnyRecv>` for Recv) of the
/// NIC `at` and returns its token; a full table closes the comm. The comm sends profiler
/// events when NCCL gave `init` a profiler callback ([`crate::profiler`]; a comm of several
/// rails sends none).
pub(crate) fn publish<C: Profiled>(
    kind: Kind,
    at: &Arc<Nic>,
    mut comm: C,
    watch: Option<Watch>,
    close: impl FnOnce(C) -> Result<(), Error>,
) -> Result<*mut c_void, Error> {
    let (table, sink) = crate::profiler::EventTable::for_comm(at.index).unzip();
    comm.set_events(sink);
    let raw = Box::into_raw(CommBox::new(at, comm, watch, table));
    match handles::insert(kind, raw as *mut ()) {
        Ok(t) => Ok(t as *mut c_void),
        Err(e) => {
            // SAFETY: `raw` was leaked just above and never published.
            let b = unsafe { Box::from_raw(raw) };
            let _ = close(b.comm.into_inner());
            Err(e)
        }
    }
}

/// A shared reference to a live send or receive comm.
pub(crate) enum CommRef {
    Send(&'static SendCommBox),
    Recv(&'static RecvCommBox),
}

/// The box behind a found Send or Recv slot. The `'static` is NCCL's: the box lives until
/// close, which NCCL never runs concurrently with another call on the same comm.
fn deref(f: handles::Found) -> CommRef {
    match f.kind {
        // SAFETY: a live Send slot holds a SendCommBox we leaked; only shared references to
        // the box are ever made while it is in the table.
        Kind::Send => CommRef::Send(unsafe { &*(f.ptr as *const SendCommBox) }),
        // SAFETY: as above, for a Recv slot (lookups here ask for Send or Recv only).
        _ => CommRef::Recv(unsafe { &*(f.ptr as *const RecvCommBox) }),
    }
}

/// The send or receive comm behind a token (`what` names it in errors), refused if
/// poisoned (`Poisoned { op }`).
pub(crate) fn comm_ref(
    c: *mut c_void,
    what: &'static str,
    op: &'static str,
) -> Result<CommRef, Error> {
    if c.is_null() {
        return Err(missing(what));
    }
    let f = handles::lookup(c as usize, &[Kind::Send, Kind::Recv], what)?;
    let r = deref(f);
    f.life.check(op)?;
    Ok(r)
}

/// The comm of one kind behind a token (`what` names it), for call `op`: `pick` refuses the
/// other kind; a poisoned comm is refused after that.
fn typed<C>(
    c: *mut c_void,
    what: &'static str,
    op: &'static str,
    pick: impl FnOnce(CommRef) -> Result<&'static C, Error>,
) -> Result<&'static C, Error> {
    if c.is_null() {
        return Err(missing(what));
    }
    let f = handles::lookup(c as usize, &[Kind::Send, Kind::Recv], what)?;
    let comm = pick(deref(f))?;
    f.life.check(op)?;
    Ok(comm)
}

/// The send comm behind a token, for call `op`.
pub(crate) fn send_comm(c: *mut c_void, op: &'static str) -> Result<&'static SendCommBox, Error> {
    typed(c, "sendComm", op, |r| match r {
        CommRef::Send(s) => Ok(s),
        CommRef::Recv(_) => Err(Error::BadState {
            op: "send call",
            state: "comm is a receive comm",
        }),
    })
}

/// The receive comm behind a token, for call `op`.
pub(crate) fn recv_comm(c: *mut c_void, op: &'static str) -> Result<&'static RecvCommBox, Error> {
    typed(c, "recvComm", op, |r| match r {
        CommRef::Recv(r) => Ok(r),
        CommRef::Send(_) => Err(Error::BadState {
            op: "receive call",
            state: "comm is a send comm",
        }),
    })
}

/// The comm and request id behind a request token, for call `op`.
pub(crate) fn request(req: *mut c_void, op: &'static str) -> Result<(CommRef, ReqId), Error> {
    let (f, id) = handles::lookup_request(req as usize)?;
    let r = deref(f);
    f.life.check(op)?;
    Ok((r, id))
}

/// Closes the comm of `kind` (boxes of `CommBox<C>`) behind a token: the token is stale from
/// here on (a second close is an error). Works on a poisoned comm.
fn close<C>(
    comm: *mut c_void,
    name: &'static str,
    what: &'static str,
    kind: Kind,
    stats: impl FnOnce(&C) -> Option<RailStats>,
    close: impl FnOnce(C) -> Result<(), Error>,
) -> ncclResult_t {
    entry(name, || {
        if comm.is_null() {
            return Err(missing(what));
        }
        let p = handles::remove(comm as usize, kind, name)?;
        // SAFETY: a slot of `kind` holds a `CommBox<C>` we leaked (the callers below pair
        // Send with AnySend and Recv with AnyRecv); removing it made this the only owner.
        let b = unsafe { Box::from_raw(p as *mut CommBox<C>) };
        // SAFETY: `b` is the only owner now (above); a shared reference for the counters.
        let st = stats(unsafe { &*b.comm.get() });
        crate::rail_log::closed(&b.nic, b.addr, kind == Kind::Send, st);
        let r = close(b.comm.into_inner());
        // The last comm closed: stop the plugin's threads (v6–v10 have no finalize).
        crate::plugin::idle();
        r
    })
}

/// `closeSend`.
pub fn close_send(comm: *mut c_void) -> ncclResult_t {
    let stats = AnySend::stats;
    close(
        comm,
        "closeSend",
        "sendComm",
        Kind::Send,
        stats,
        AnySend::close,
    )
}

/// `closeRecv`.
pub fn close_recv(comm: *mut c_void) -> ncclResult_t {
    let stats = AnyRecv::stats;
    close(
        comm,
        "closeRecv",
        "recvComm",
        Kind::Recv,
        stats,
        AnyRecv::close,
    )
}

/// The rails' counters of a send or receive comm of several rails (tests and tools; `None`:
/// one rail, or not a comm). Control path: call it between data-path calls of the comm,
/// never concurrently with them.
pub fn rail_stats(comm: *mut c_void) -> Option<RailStats> {
    match comm_ref(comm, "comm", "rail_stats").ok()? {
        // SAFETY: as a data-path call (`CommBox::comm_mut`): the caller does not run one on
        // this comm meanwhile, and only a shared reference is made.
        CommRef::Send(s) => unsafe { s.comm_mut() }.stats(),
        // SAFETY: as above.
        CommRef::Recv(r) => unsafe { r.comm_mut() }.stats(),
    }
}
