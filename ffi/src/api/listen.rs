//! `listen`, `accept` (the acceptor side of the bootstrap handshake) and `closeListen`.
#![allow(unsafe_code)]
// NCCL's handle buffer and the listen comm box; every block has a SAFETY comment.
// The C entry points' bodies: every pointer comes from NCCL and is NULL-checked before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::net::TcpListener;
use std::sync::Arc;

use ibnet_core::wire::ConnectHandle;
use ibnet_core::{Error, ErrorKind};

use super::accepting::Pending;
use super::comm::publish;
use super::common::{missing, out_ptr, plugin, random_u64, sys};
use super::entry::{entry, entry_at};
use super::shared_listen::SharedListener;
use crate::dev::AnyRecv;
use crate::handles::{self, Kind};
use crate::nic::Nic;
use crate::plugin::Plugin;
use crate::sock;
use ibnet_nccl::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};

/// What `listen` returns (NCCL holds its [`crate::handles`] token, whose slot also holds the
/// comm's lifecycle).
pub struct ListenComm {
    nic: Arc<Nic>,
    plugin: Arc<Plugin>,
    listener: Listener,
    nonce: u64,
    pending: Pending,
    /// `accept` failed (its peer died mid-handshake): later calls are refused, reported so.
    failed: Option<ErrorKind>,
}

/// Where a listen comm's connections arrive.
enum Listener {
    /// Its own port.
    Own(TcpListener),
    /// This thread's shared port (`NCCL_IB_SOCK_SERVER_PORT_REUSE`; see `shared_listen`).
    Shared(Arc<SharedListener>),
}

impl Drop for ListenComm {
    fn drop(&mut self) {
        if let Listener::Shared(s) = &self.listener {
            s.leave(self.nonce);
        }
    }
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
        let v = crate::vdev::lookup(p.devs.len(), dev)?;
        let nic = p.nics.resolve((&p.devs, &p.caches), dev, v)?;
        let d = nic.dev();
        let gids = crate::subnet::listen_gids(&p, &nic)?;
        let bind = p.bind.ok_or(Error::Provider {
            call: "listen (no bootstrap interface; see NCCL_SOCKET_IFNAME)",
            errno: libc::ENODEV,
        })?;
        let nonce = random_u64();
        let (l, addr) = if p.params.ib_sock_server_port_reuse {
            let s = SharedListener::join(bind, nonce).map_err(|e| sys("bind/listen", &e))?;
            let a = s.local_addr();
            (Listener::Shared(s), a)
        } else {
            let l = sock::listen(bind).map_err(|e| sys("bind/listen", &e))?;
            let a = l.local_addr();
            (Listener::Own(l), a)
        };
        let addr = addr.map_err(|e| sys("getsockname", &e))?;
        ConnectHandle {
            addr,
            nonce,
            provider: d.provider_tag(),
            gids,
        }
        .encode(hb)?;
        let lc = Box::new(ListenComm {
            nic,
            plugin: p,
            listener: l,
            nonce,
            pending: Pending::new(),
            failed: None,
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

/// `accept`: takes every queued connection and steps all handshakes in progress (see
/// `api::accepting`); returns the first comm completed. A junk connection that fails is
/// dropped with a WARN and never fails the call; a bad listen comm or argument does, and so
/// does the death of the connection carrying the listener's nonce (`api::accepting`'s rule:
/// one WARN naming its address; every later call is refused).
pub fn accept(listen: *mut c_void, recv_comm: *mut *mut c_void) -> ncclResult_t {
    entry_at("accept", listen, |at| {
        let out = out_ptr(recv_comm, "recvComm")?;
        *out = core::ptr::null_mut();
        let lc = listen_comm(listen)?;
        if let Some(cause) = lc.failed {
            return Err(Error::Poisoned {
                op: "accept",
                cause,
            });
        }
        let timeout = lc.plugin.params.handshake_timeout_s;
        match &lc.listener {
            Listener::Own(l) => {
                while lc.pending.has_room() {
                    match sock::try_accept_from(l) {
                        Ok(Some(c)) => lc.pending.add(c, &lc.nic, lc.nonce, timeout),
                        Ok(None) => break,
                        // ECONNABORTED, EMFILE, …: nothing to hand a handshake; serve the others.
                        Err(e) => {
                            lc.pending.accept_failed(&sys("accept", &e));
                            break;
                        }
                    }
                }
            }
            Listener::Shared(s) => {
                let wait = std::time::Duration::from_secs(timeout);
                let (conns, err) = s.take(lc.nonce, lc.pending.room(), wait);
                for c in conns {
                    lc.pending.add(c, &lc.nic, lc.nonce, timeout);
                }
                if let Some(e) = err {
                    lc.pending.accept_failed(&sys("accept", &e));
                }
            }
        }
        match lc.pending.step_all(&lc.nic, &lc.plugin, lc.nonce) {
            Ok(Some((recv, w))) => {
                *out = publish(Kind::Recv, &lc.nic, *recv, Some(w), AnyRecv::close)?;
            }
            Ok(None) => {}
            Err(d) => {
                let (e, w) = *d;
                lc.failed = Some(e.kind());
                *at = Some(w);
                return Err(e);
            }
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
        crate::plugin::idle();
        Ok(())
    })
}
