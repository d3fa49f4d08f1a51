//! `connect`: the connector side of the bootstrap handshake, one non-blocking step per call,
//! its progress parked in [`crate::connect_registry`] between calls.
#![allow(unsafe_code)]
// NCCL's handle buffer; every block has a SAFETY comment.
// The C entry point's body: every pointer comes from NCCL and is NULL-checked before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ibnet_core::comm::CommConfig;
use ibnet_core::error::PeerId;
use ibnet_core::handshake::{Connector, Event};
use ibnet_core::wire::{ConnectHandle, QpInfo};
use ibnet_core::Error;

use super::comm::publish;
use super::common::{missing, out_ptr, plugin, random_u64, sys};
use super::entry::entry_at;
use super::init::ctx_tc;
use crate::connect_registry::{self as registry, ConnectStage, Connecting};
use crate::dev::AnySend;
use crate::handles::Kind;
use crate::handshake_io::{pump, stalled, Where};
use crate::nic::Nic;
use crate::sock;
use crate::watch::Watch;
use ibnet_nccl::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};

/// A finished connect: the comm, its bootstrap socket (kept to watch the peer) and the peer.
type Connected = (Box<AnySend>, TcpStream, PeerId);

/// One step of a connect; `Ok(Some(..))` when done.
/// `state` follows the machine (the state an error happened in, for its message).
fn connect_step(
    c: &mut Connecting,
    nic: &Nic,
    cfg: CommConfig,
    state: &mut &'static str,
) -> Result<Option<Connected>, Error> {
    let stage = c.stage.take().ok_or(Error::BadState {
        op: "connect",
        state: "failed earlier",
    })?;
    let (mut stream, mut send, mut machine, mut remote, mut peers) = match stage {
        ConnectStage::Tcp(s) => {
            if !sock::connect_done(&s).map_err(|e| sys("connect", &e))? {
                stalled(c.deadline, "TcpConnect")?;
                c.stage = Some(ConnectStage::Tcp(s));
                return Ok(None);
            }
            let mut send = Box::new(nic.new_send(cfg)?);
            send.set_resilience(ibnet_core::rails::Resilience::from_params(
                &plugin()?.params,
            ));
            if let Ok(a) = s.peer_addr() {
                send.set_peer_addr(a);
            }
            let (infos, rails) = send.rail_infos(&nic.rail_devs());
            let machine = Box::new(Connector::with_rails(c.nonce, &infos, &rails)?);
            *state = machine.state_name();
            (s, send, machine, PeerId::default(), Box::default())
        }
        ConnectStage::Shake {
            stream,
            send,
            machine,
            remote,
            peers,
        } => {
            *state = machine.state_name();
            (stream, send, machine, remote, peers)
        }
    };
    loop {
        match pump(&mut stream, &mut *machine)? {
            Some(Event::PeerInfo(info)) => {
                *state = machine.state_name();
                nic.check_peer(core::slice::from_ref(&info))?;
                if peers.is_empty() {
                    remote = peer_id(&info, stream.peer_addr().ok());
                }
                // Cannot fail: the machine reports one info per rail, at most MAX_RAILS.
                let _ = peers.push(info);
                if peers.len() == machine.rails() {
                    send.connect_rails(&peers, machine.peer_rails())?;
                    machine.handle_qps_connected()?;
                }
            }
            Some(Event::Done) => return Ok(Some((send, stream, remote))),
            None => break,
        }
        *state = machine.state_name();
    }
    stalled(c.deadline, machine.state_name())?;
    c.stage = Some(ConnectStage::Shake {
        stream,
        send,
        machine,
        remote,
        peers,
    });
    Ok(None)
}

/// The peer's identity in error messages (socket address, GID, LID, first QP number).
pub(super) fn peer_id(info: &QpInfo, addr: Option<std::net::SocketAddr>) -> PeerId {
    PeerId {
        gid: info.gid,
        lid: info.lid,
        qpn: info.qpn.first().copied().unwrap_or(0),
        addr,
    }
}

/// `connect`. `tc` is the traffic class from the v10 config or the v11 ctx (-1: undefined).
///
/// NCCL calls it with the same handle until it returns a comm; the progress is parked in the
/// registry under a token written into the handle's scratch area (an unknown token is a
/// corrupt or reused handle). Any error drops the connect (its socket and comm).
pub fn connect(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    tc: Option<i32>,
) -> ncclResult_t {
    entry_at("connect", core::ptr::null_mut(), |at| {
        let out = out_ptr(send_comm, "sendComm")?;
        *out = core::ptr::null_mut();
        let hp = handle as *mut [u8; NCCL_NET_HANDLE_MAXSIZE];
        // SAFETY: NCCL passes its NCCL_NET_HANDLE_MAXSIZE handle buffer or NULL (rejected).
        let hb = unsafe { hp.as_mut() }.ok_or(missing("handle"))?;
        let h = ConnectHandle::decode(&hb[..])?;
        *at = Some(Where {
            peer: h.addr,
            state: "TcpConnect",
        });
        let p = plugin()?;
        let dev = crate::subnet::route(&p, dev, &h, hb);
        let v = crate::vdev::lookup(p.devs.len(), dev)?;
        let nic = p.nics.resolve((&p.devs, &p.caches), dev, v)?;
        let d = nic.dev();
        if h.provider != d.provider_tag() {
            return Err(Error::Wire {
                what: "handle provider (the listener runs another IBNET_PROVIDER)",
                value: h.provider as u64,
            });
        }
        let tc = tc.unwrap_or_else(|| ctx_tc(ctx));
        let cfg = p.comm_config(d, tc);
        let mut token = registry::token(hb);
        let now = Instant::now();
        let timeout = Duration::from_secs(p.params.handshake_timeout_s);
        let mut c = if token == 0 {
            let reuse = p.bind.filter(|_| p.params.ib_sock_client_port_reuse);
            let s = sock::connect_start_from(&h.addr, reuse).map_err(|e| sys("connect", &e))?;
            token = random_u64();
            Connecting {
                stage: Some(ConnectStage::Tcp(s)),
                nonce: h.nonce,
                deadline: now + timeout,
            }
        } else {
            registry::take(token)?
        };
        // Connects NCCL gave up on (never called again) are dropped a timeout past their
        // deadline; one still called reports its own timeout (naming its peer) first.
        if let Some(before) = now.checked_sub(timeout) {
            registry::prune(before);
        }
        registry::set_token(hb, 0);
        let mut state = if matches!(c.stage, Some(ConnectStage::Tcp(_))) {
            "TcpConnect"
        } else {
            "SendInfo"
        };
        let step = connect_step(&mut c, &nic, cfg, &mut state);
        *at = Some(Where {
            peer: h.addr,
            state,
        });
        match step? {
            Some((send, stream, remote)) => {
                let w = Watch::new(stream, h.addr, remote, p.params.stall_warn_s);
                *out = publish(Kind::Send, &nic, *send, Some(w), AnySend::close)?;
            }
            None => {
                registry::park(token, c);
                registry::set_token(hb, token);
            }
        }
        Ok(())
    })
}
