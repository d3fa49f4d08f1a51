//! `listen`, `accept` (the acceptor side of the bootstrap handshake) and `closeListen`.
#![allow(unsafe_code)]
// NCCL's handle buffer and the listen comm box; every block has a SAFETY comment.
// The C entry points' bodies: every pointer comes from NCCL and is NULL-checked before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibnet_core::handshake::{Acceptor, Event};
use ibnet_core::wire::ConnectHandle;
use ibnet_core::Error;

use super::comm::publish;
use super::common::{dev_cache, device, missing, out_ptr, plugin, random_u64, sys};
use super::entry::{entry, entry_on};
use crate::dev::{AnyRecv, Dev, MrCacheT};
use crate::handles::{self, Kind};
use crate::handshake_io::{pump, stalled};
use crate::nccl::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};
use crate::plugin::Plugin;
use crate::sock;

/// What `listen` returns (NCCL holds its [`crate::handles`] token, whose slot also holds the
/// comm's lifecycle).
pub struct ListenComm {
    dev: Dev,
    dev_index: u8,
    cache: Arc<MrCacheT>,
    plugin: Arc<Plugin>,
    listener: TcpListener,
    nonce: u64,
    pending: Option<Accepting>,
}

/// One accepted connection being handshaken.
struct Accepting {
    stream: TcpStream,
    machine: Box<Acceptor>,
    /// Created at the connector's `PeerInfo`; handed to NCCL at `Done`.
    recv: Option<Box<AnyRecv>>,
    deadline: Instant,
}

/// `listen`.
pub fn listen(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    entry("listen", || {
        let out = out_ptr(listen_comm, "listenComm")?;
        *out = core::ptr::null_mut();
        let _ = ctx;
        let hp = handle as *mut [u8; NCCL_NET_HANDLE_MAXSIZE];
        // SAFETY: NCCL passes a NCCL_NET_HANDLE_MAXSIZE buffer or NULL (rejected).
        let hb = unsafe { hp.as_mut() }.ok_or(missing("handle"))?;
        let p = plugin()?;
        let d = device(&p, dev)?;
        let bind = p.bind.ok_or(Error::Provider {
            call: "listen (no bootstrap interface; see NCCL_SOCKET_IFNAME)",
            errno: libc::ENODEV,
        })?;
        let l = sock::listen(bind).map_err(|e| sys("bind/listen", &e))?;
        let addr = l.local_addr().map_err(|e| sys("getsockname", &e))?;
        let nonce = random_u64();
        ConnectHandle {
            addr,
            nonce,
            provider: d.provider_tag(),
        }
        .encode(hb)?;
        let lc = Box::new(ListenComm {
            dev: d,
            dev_index: dev as u8,
            cache: dev_cache(&p, dev)?,
            plugin: p,
            listener: l,
            nonce,
            pending: None,
        });
        let raw = Box::into_raw(lc);
        match handles::insert(Kind::Listen, raw as *mut ()) {
            Ok(t) => *out = t as *mut c_void,
            Err(e) => {
                // SAFETY: `raw` was leaked just above and never published.
                drop(unsafe { Box::from_raw(raw) });
                return Err(e);
            }
        }
        Ok(())
    })
}

fn listen_comm(l: *mut c_void) -> Result<&'static mut ListenComm, Error> {
    if l.is_null() {
        return Err(missing("listenComm"));
    }
    let f = handles::lookup(l as usize, &[Kind::Listen], "listenComm")?;
    // SAFETY: a live Listen slot holds a ListenComm box we leaked; `accept` calls on one
    // listen comm are serialised by NCCL and nothing else borrows it (no shared path).
    let lc = unsafe { &mut *(f.ptr as *mut ListenComm) };
    f.life.check("accept")?;
    Ok(lc)
}

/// One step of an accept; `Ok(Some(comm))` when done.
fn accept_step(lc: &ListenComm, a: &mut Accepting) -> Result<Option<Box<AnyRecv>>, Error> {
    loop {
        match pump(&mut a.stream, &mut *a.machine)? {
            Some(Event::PeerInfo(info)) => {
                let cfg = lc.plugin.comm_config(&lc.dev, -1);
                let mut recv = Box::new(lc.dev.new_recv(cfg, &info)?);
                if let Ok(a) = a.stream.peer_addr() {
                    recv.set_peer_addr(a);
                }
                a.machine.handle_local_info(recv.local_info())?;
                a.recv = Some(recv);
            }
            Some(Event::Done) => {
                return a.recv.take().map(Some).ok_or(Error::BadState {
                    op: "accept",
                    state: "handshake done without a receive comm",
                })
            }
            None => break,
        }
    }
    stalled(a.deadline, a.machine.state_name())?;
    Ok(None)
}

/// `accept`. Any error drops the pending connection (socket and comm); the listener stays
/// usable for the next one.
pub fn accept(listen: *mut c_void, recv_comm: *mut *mut c_void) -> ncclResult_t {
    entry_on("accept", listen, || {
        let out = out_ptr(recv_comm, "recvComm")?;
        *out = core::ptr::null_mut();
        let lc = listen_comm(listen)?;
        if lc.pending.is_none() {
            match sock::try_accept(&lc.listener).map_err(|e| sys("accept", &e))? {
                Some(s) => {
                    let deadline =
                        Instant::now() + Duration::from_secs(lc.plugin.cfg.handshake_timeout_s);
                    lc.pending = Some(Accepting {
                        stream: s,
                        machine: Box::new(Acceptor::new(lc.nonce, &lc.dev.port_info())),
                        recv: None,
                        deadline,
                    });
                }
                None => return Ok(()),
            }
        }
        let mut a = lc.pending.take().ok_or(Error::BadState {
            op: "accept",
            state: "no pending connection",
        })?;
        match accept_step(lc, &mut a)? {
            Some(recv) => {
                let at = (lc.dev.clone(), lc.dev_index, lc.cache.clone());
                *out = publish(Kind::Recv, at, *recv, AnyRecv::close)?;
            }
            None => lc.pending = Some(a),
        }
        Ok(())
    })
}

/// `closeListen`. Works on a poisoned listen comm.
pub fn close_listen(listen: *mut c_void) -> ncclResult_t {
    entry("closeListen", || {
        if listen.is_null() {
            return Err(missing("listenComm"));
        }
        let p = handles::remove(listen as usize, Kind::Listen, "closeListen")?;
        // SAFETY: the slot held a ListenComm box we leaked; removing it from the table made
        // this the only owner, so it is freed once.
        drop(unsafe { Box::from_raw(p as *mut ListenComm) });
        Ok(())
    })
}
