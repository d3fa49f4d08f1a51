//! The version-agnostic plugin API every `ncclNetPlugin_vN` shim calls.
//!
//! Every entry point runs inside [`entry`]: it catches panics (none may cross `extern "C"`),
//! logs one WARN with the call's name and the error, and maps the error's kind to the
//! `ncclResult_t` of NCCL's plugin README (system/network → SystemError, misuse →
//! InternalError, configuration → InvalidUsage, completion errors → RemoteError).
//!
//! Objects handed to NCCL are boxes whose first field is a type tag, so a comm of the wrong kind
//! (or a freed one whose tag was cleared) is rejected instead of misused. Requests are slots in
//! a fixed array inside their comm: `isend`/`irecv`/`test` never allocate.
//!
//! Connection setup (never blocks; NCCL calls connect/accept until they return a comm). The
//! handle is the core's [`ConnectHandle`] (listener address, nonce, provider tag); the talking
//! is the core's [`Connector`]/[`Acceptor`] machines, driven over the socket by
//! [`crate::shake::pump`]:
//! ```text
//!  connect (handle from listen)                  accept (listenComm)
//!  TCP connect ──────────────────────────────▶   accept queued TCP connection
//!  SendComm::new; Connector::new(nonce, info)    Acceptor::new(nonce, port)
//!      Hello{nonce} · QpInfo{qpns, fifo} ────▶   PeerInfo: RecvComm::new(info) (QPs to RTS);
//!                                                handle_local_info(recv.local_info())
//!      ◀────────────────────────────────────── QpInfo{qpns, mtu = min}
//!  PeerInfo: SendComm::connect(info);
//!  handle_qps_connected
//!      Ready ────────────────────────────────▶   Done → recvComm
//!  Done → sendComm
//! ```
//! The connector's in-progress state is kept in a registry keyed by a token it writes into the
//! scratch area of the handle (bytes 64..72; NCCL keeps the handle between calls); an unknown
//! token is a corrupt handle. A peer that closes mid-handshake is an error (`PeerGone`); one that
//! stalls past `IBNET_HANDSHAKE_TIMEOUT` seconds is an error. Either drops the half-built comm.

// These functions are the C entry points' bodies: every pointer comes from NCCL under the plugin
// contract and is NULL-checked (and tag-checked for our own objects) before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ibnet_core::comm::{CommConfig, RecvBuf};
use ibnet_core::fifo::{MAX_RECVS, MAX_REQUESTS};
use ibnet_core::handshake::{Acceptor, Connector, Event};
use ibnet_core::mr_cache::MrHandle;
use ibnet_core::provider::{MrKeys, RegKind};
use ibnet_core::request::ReqId;
use ibnet_core::wire::{ConnectHandle, HANDLE_SCRATCH_LEN, HANDLE_SCRATCH_OFFSET};
use ibnet_core::{Error, ErrorKind};

use crate::abi::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};
use crate::plugin::{self, AnyMr, AnyRecv, AnySend, CachedMr, Dev, MrCacheT, Plugin, Props};
use crate::sock;
use crate::warn;

/// Maps an error kind to `ncclResult_t`.
pub fn to_nccl(k: ErrorKind) -> ncclResult_t {
    match k {
        ErrorKind::System => ncclResult_t::SystemError,
        ErrorKind::Internal => ncclResult_t::InternalError,
        ErrorKind::InvalidUsage => ncclResult_t::InvalidUsage,
        ErrorKind::InvalidArgument => ncclResult_t::InvalidArgument,
        ErrorKind::Remote => ncclResult_t::RemoteError,
    }
}

/// Runs `f`, catching panics and mapping errors; one WARN per failure.
pub fn entry(name: &str, f: impl FnOnce() -> Result<(), Error>) -> ncclResult_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::Success,
        Ok(Err(e)) => {
            warn!("{name}: {e}");
            to_nccl(e.kind())
        }
        Err(_) => {
            warn!("{name}: internal panic caught at the plugin boundary");
            ncclResult_t::InternalError
        }
    }
}

fn missing(what: &'static str) -> Error {
    Error::Missing { what }
}

fn sys(call: &'static str, e: &std::io::Error) -> Error {
    Error::Provider {
        call,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}

#[allow(clippy::mut_from_ref)] // the lifetime is NCCL's: the pointer outlives the call
fn out_ptr<T>(p: *mut *mut T, what: &'static str) -> Result<&'static mut *mut T, Error> {
    // SAFETY: NCCL passes a valid, writable pointer or NULL; NULL is rejected.
    unsafe { p.as_mut() }.ok_or(missing(what))
}

fn plugin() -> Result<Arc<Plugin>, Error> {
    plugin::current().ok_or(Error::BadState {
        op: "plugin call",
        state: "not initialised (init was not called or finalize already ran)",
    })
}

fn device(p: &Plugin, dev: c_int) -> Result<Dev, Error> {
    usize::try_from(dev)
        .ok()
        .and_then(|d| p.devs.get(d).cloned())
        .ok_or(Error::OutOfRange {
            what: "dev",
            value: dev as i64,
            min: 0,
            max: p.devs.len() as i64 - 1,
        })
}

fn dev_cache(p: &Plugin, dev: c_int) -> Result<Arc<MrCacheT>, Error> {
    usize::try_from(dev)
        .ok()
        .and_then(|d| p.caches.get(d).cloned())
        .ok_or(Error::OutOfRange {
            what: "dev",
            value: dev as i64,
            min: 0,
            max: p.caches.len() as i64 - 1,
        })
}

// ---------------------------------------------------------------------------------------------
// init / devices / properties / finalize

/// Per-`init` context (v11): the communicator's traffic class.
#[repr(C)] // the tag must be the first field: `comm_ref` reads it before knowing the type
pub struct NetCtx {
    tag: u64,
    /// `ncclNetCommConfig_t::trafficClass` (-1: undefined).
    pub traffic_class: i32,
}

const CTX_TAG: u64 = 0x4942_4e45_5443_5458; // "IBNETCTX"
const LISTEN_TAG: u64 = 0x4942_4e45_544c_5354;
const SEND_TAG: u64 = 0x4942_4e45_5453_4e44;
const RECV_TAG: u64 = 0x4942_4e45_5452_4356;
const REQ_TAG: u64 = 0x4942_4e45_5452_4551;
const DEAD: u64 = 0xdead_dead_dead_dead;

/// `init`: installs the logger, takes a plugin reference, and (v11) returns a context.
pub fn init(
    ctx: Option<*mut *mut c_void>,
    traffic_class: i32,
    logger: crate::abi::types::ncclDebugLogger_t,
) -> ncclResult_t {
    crate::log::set_logger(logger);
    entry("init", || {
        let out = match ctx {
            Some(c) => Some(out_ptr(c, "ctx")?),
            None => None,
        };
        let p = plugin::acquire();
        crate::info!(
            crate::log::INIT | crate::log::NET,
            "ibnet {} initialised: {} device(s), provider {:?}",
            env!("CARGO_PKG_VERSION"),
            p.devs.len(),
            p.cfg.provider
        );
        if let Some(out) = out {
            let c = Box::into_raw(Box::new(NetCtx {
                tag: CTX_TAG,
                traffic_class,
            })) as *mut c_void;
            // Registered so that `finalize(ctx)` releases this init's plugin reference and
            // `connect`/`listen` find the communicator's traffic class.
            LIVE_CTX
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(c as usize);
            *out = c;
        }
        Ok(())
    })
}

/// Contexts returned by `init` and not yet finalized (control path only). A pointer not in
/// this list (NULL, stale, already finalized) is never dereferenced.
static LIVE_CTX: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// `finalize(ctx)`: NULL-safe and idempotent per context.
pub fn finalize(ctx: *mut c_void) -> ncclResult_t {
    entry("finalize", || {
        let mut live = LIVE_CTX.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pos) = live.iter().position(|&c| c == ctx as usize) else {
            return Ok(());
        };
        live.swap_remove(pos);
        drop(live);
        // SAFETY: the pointer was live in LIVE_CTX, so it is a NetCtx box we allocated; it was
        // removed from the list above, so it is freed exactly once.
        drop(unsafe { Box::from_raw(ctx as *mut NetCtx) });
        plugin::release();
        Ok(())
    })
}

fn ctx_tc(ctx: *mut c_void) -> i32 {
    if ctx.is_null() {
        return -1;
    }
    if !LIVE_CTX
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(ctx as usize))
    {
        return -1;
    }
    let c = ctx as *const NetCtx;
    // SAFETY: a live ctx (checked above) is a NetCtx we allocated.
    if unsafe { (*c).tag } == CTX_TAG {
        // SAFETY: as above.
        unsafe { (*c).traffic_class }
    } else {
        -1
    }
}

/// `devices`.
pub fn devices(ndev: *mut c_int) -> ncclResult_t {
    entry("devices", || {
        // SAFETY: valid or NULL (rejected).
        let n = unsafe { ndev.as_mut() }.ok_or(missing("ndev"))?;
        *n = plugin::current().map_or(0, |p| p.devs.len() as c_int);
        Ok(())
    })
}

/// `getProperties`, version-agnostic; each shim copies into its struct.
pub fn properties(dev: c_int) -> Result<Props, Error> {
    let p = plugin()?;
    Ok(device(&p, dev)?.props())
}

// ---------------------------------------------------------------------------------------------
// handle and bootstrap

/// Offset of the connector's private progress token: the first 8 bytes of the handle's scratch
/// area, which [`ConnectHandle`] leaves to the connecting side.
const TOKEN_OFF: usize = HANDLE_SCRATCH_OFFSET;
const _: () = assert!(TOKEN_OFF + 8 <= HANDLE_SCRATCH_OFFSET + HANDLE_SCRATCH_LEN);
const _: () = assert!(HANDLE_SCRATCH_OFFSET + HANDLE_SCRATCH_LEN <= NCCL_NET_HANDLE_MAXSIZE);

fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut c_void, 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        v = t ^ ((std::process::id() as u64) << 32) ^ (&v as *const u64 as u64);
    }
    v | 1
}

fn stalled(deadline: Instant, state: &'static str) -> Result<(), Error> {
    if Instant::now() > deadline {
        warn!("handshake timed out in state {state} (IBNET_HANDSHAKE_TIMEOUT)");
        return Err(Error::Provider {
            call: "bootstrap handshake (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
            errno: libc::ETIMEDOUT,
        });
    }
    Ok(())
}

/// What `listen` returns.
#[repr(C)] // the tag must be the first field: `comm_ref` reads it before knowing the type
pub struct ListenComm {
    tag: u64,
    dev: Dev,
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
            tag: LISTEN_TAG,
            dev: d,
            cache: dev_cache(&p, dev)?,
            plugin: p,
            listener: l,
            nonce,
            pending: None,
        });
        *out = Box::into_raw(lc) as *mut c_void;
        Ok(())
    })
}

/// A send comm handed to NCCL.
#[repr(C)] // the tag must be the first field: `comm_ref` reads it before knowing the type
pub struct SendCommBox {
    tag: u64,
    dev: Dev,
    cache: Arc<MrCacheT>,
    comm: AnySend,
    reqs: [ReqSlot; MAX_REQUESTS],
}

/// A receive comm handed to NCCL.
#[repr(C)] // the tag must be the first field: `comm_ref` reads it before knowing the type
pub struct RecvCommBox {
    tag: u64,
    dev: Dev,
    cache: Arc<MrCacheT>,
    comm: AnyRecv,
    reqs: [ReqSlot; MAX_REQUESTS],
}

/// One request handed to NCCL: a slot inside its comm.
#[repr(C)]
pub struct ReqSlot {
    tag: u64,
    comm: *mut c_void,
    send: bool,
    bits: u32,
}

impl ReqSlot {
    const FREE: Self = Self {
        tag: 0,
        comm: core::ptr::null_mut(),
        send: false,
        bits: 0,
    };
}

enum ConnectStage {
    /// The TCP connect is in progress.
    Tcp(TcpStream),
    /// The comm exists; the handshake machine runs over the socket.
    Shake {
        stream: TcpStream,
        send: Box<AnySend>,
        machine: Box<Connector>,
    },
}

/// A connect in progress between NCCL's `connect` calls.
struct Connecting {
    stage: Option<ConnectStage>,
    nonce: u64,
    deadline: Instant,
}

/// Connects in progress, keyed by the token each wrote into its handle's scratch area.
static CONNECTING: Mutex<Option<HashMap<u64, Connecting>>> = Mutex::new(None);

/// Drops every connect in progress (the last `finalize`), closing their comms and sockets.
pub fn drop_pending_connects() {
    let old = CONNECTING.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(old);
}

fn new_send_box(dev: Dev, cache: Arc<MrCacheT>, comm: AnySend) -> *mut c_void {
    Box::into_raw(Box::new(SendCommBox {
        tag: SEND_TAG,
        dev,
        cache,
        comm,
        reqs: [const { ReqSlot::FREE }; MAX_REQUESTS],
    })) as *mut c_void
}

fn new_recv_box(dev: Dev, cache: Arc<MrCacheT>, comm: AnyRecv) -> *mut c_void {
    Box::into_raw(Box::new(RecvCommBox {
        tag: RECV_TAG,
        dev,
        cache,
        comm,
        reqs: [const { ReqSlot::FREE }; MAX_REQUESTS],
    })) as *mut c_void
}

/// One step of a connect; `Ok(Some(comm))` when done.
fn connect_step(
    c: &mut Connecting,
    d: &Dev,
    cfg: CommConfig,
) -> Result<Option<Box<AnySend>>, Error> {
    let stage = c.stage.take().ok_or(Error::BadState {
        op: "connect",
        state: "failed earlier",
    })?;
    let (mut stream, mut send, mut machine) = match stage {
        ConnectStage::Tcp(s) => {
            if !sock::connect_done(&s).map_err(|e| sys("connect", &e))? {
                stalled(c.deadline, "TcpConnect")?;
                c.stage = Some(ConnectStage::Tcp(s));
                return Ok(None);
            }
            let send = Box::new(d.new_send(cfg)?);
            let machine = Box::new(Connector::new(c.nonce, &send.local_info())?);
            (s, send, machine)
        }
        ConnectStage::Shake {
            stream,
            send,
            machine,
        } => (stream, send, machine),
    };
    loop {
        match crate::shake::pump(&mut stream, &mut *machine)? {
            Some(Event::PeerInfo(info)) => {
                send.connect(&info)?;
                machine.handle_qps_connected()?;
            }
            Some(Event::Done) => return Ok(Some(send)),
            None => break,
        }
    }
    stalled(c.deadline, machine.state_name())?;
    c.stage = Some(ConnectStage::Shake {
        stream,
        send,
        machine,
    });
    Ok(None)
}

/// `connect`. `tc` is the traffic class from the v10 config or the v11 ctx (-1: undefined).
///
/// NCCL calls it with the same handle until it returns a comm; the progress is kept in
/// [`CONNECTING`] under a token written into the handle's scratch area (an unknown token is a
/// corrupt or reused handle). Any error drops the connect (its socket and comm).
pub fn connect(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    tc: Option<i32>,
) -> ncclResult_t {
    entry("connect", || {
        let out = out_ptr(send_comm, "sendComm")?;
        *out = core::ptr::null_mut();
        let hp = handle as *mut [u8; NCCL_NET_HANDLE_MAXSIZE];
        // SAFETY: NCCL passes its NCCL_NET_HANDLE_MAXSIZE handle buffer or NULL (rejected).
        let hb = unsafe { hp.as_mut() }.ok_or(missing("handle"))?;
        let h = ConnectHandle::decode(&hb[..])?;
        let p = plugin()?;
        let d = device(&p, dev)?;
        if h.provider != d.provider_tag() {
            return Err(Error::Wire {
                what: "handle provider (the listener runs another IBNET_PROVIDER)",
                value: h.provider as u64,
            });
        }
        let tc = tc.unwrap_or_else(|| ctx_tc(ctx));
        let cfg = p.comm_config(&d, tc);
        let mut tok = [0u8; 8];
        tok.copy_from_slice(&hb[TOKEN_OFF..TOKEN_OFF + 8]);
        let mut token = u64::from_le_bytes(tok);
        let now = Instant::now();
        let mut reg = CONNECTING.lock().unwrap_or_else(|e| e.into_inner());
        let map = reg.get_or_insert_with(HashMap::new);
        // Connects NCCL gave up on (never called again) are dropped once past their deadline.
        map.retain(|_, c| c.deadline >= now);
        let mut c = if token == 0 {
            let s = sock::connect_start(&h.addr).map_err(|e| sys("connect", &e))?;
            token = random_u64();
            Connecting {
                stage: Some(ConnectStage::Tcp(s)),
                nonce: h.nonce,
                deadline: now + Duration::from_secs(p.cfg.handshake_timeout_s),
            }
        } else {
            map.remove(&token).ok_or(Error::Wire {
                what: "connect handle progress token (corrupt, reused or timed-out handle)",
                value: token,
            })?
        };
        drop(reg);
        hb[TOKEN_OFF..TOKEN_OFF + 8].fill(0);
        match connect_step(&mut c, &d, cfg)? {
            Some(send) => {
                *out = new_send_box(d, dev_cache(&p, dev)?, *send);
            }
            None => {
                let mut reg = CONNECTING.lock().unwrap_or_else(|e| e.into_inner());
                reg.get_or_insert_with(HashMap::new).insert(token, c);
                hb[TOKEN_OFF..TOKEN_OFF + 8].copy_from_slice(&token.to_le_bytes());
            }
        }
        Ok(())
    })
}

fn listen_comm(l: *mut c_void) -> Result<&'static mut ListenComm, Error> {
    let l = l as *mut ListenComm;
    // SAFETY: a non-NULL listenComm is one we returned; the tag rejects other objects.
    let lc = unsafe { l.as_mut() }.ok_or(missing("listenComm"))?;
    if lc.tag != LISTEN_TAG {
        return Err(Error::BadState {
            op: "accept",
            state: "listenComm is not a live ibnet listen comm",
        });
    }
    Ok(lc)
}

/// One step of an accept; `Ok(Some(comm))` when done.
fn accept_step(lc: &ListenComm, a: &mut Accepting) -> Result<Option<Box<AnyRecv>>, Error> {
    loop {
        match crate::shake::pump(&mut a.stream, &mut *a.machine)? {
            Some(Event::PeerInfo(info)) => {
                let cfg = lc.plugin.comm_config(&lc.dev, -1);
                let recv = Box::new(lc.dev.new_recv(cfg, &info)?);
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
    entry("accept", || {
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
            Some(recv) => *out = new_recv_box(lc.dev.clone(), lc.cache.clone(), *recv),
            None => lc.pending = Some(a),
        }
        Ok(())
    })
}

/// `closeListen`.
pub fn close_listen(listen: *mut c_void) -> ncclResult_t {
    entry("closeListen", || {
        let lc = listen_comm(listen)?;
        lc.tag = DEAD;
        // SAFETY: a live listen comm we boxed; freed once (tag cleared above).
        drop(unsafe { Box::from_raw(lc as *mut ListenComm) });
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// comms, registrations, requests

enum CommRef {
    Send(&'static mut SendCommBox),
    Recv(&'static mut RecvCommBox),
}

fn comm_ref(c: *mut c_void, what: &'static str) -> Result<CommRef, Error> {
    if c.is_null() {
        return Err(missing(what));
    }
    // SAFETY: non-NULL comms are ours; both box types start with the tag.
    let tag = unsafe { *(c as *const u64) };
    match tag {
        // SAFETY: tag says this is a live SendCommBox.
        SEND_TAG => Ok(CommRef::Send(unsafe { &mut *(c as *mut SendCommBox) })),
        // SAFETY: tag says this is a live RecvCommBox.
        RECV_TAG => Ok(CommRef::Recv(unsafe { &mut *(c as *mut RecvCommBox) })),
        _ => Err(Error::BadState {
            op: what,
            state: "not a live ibnet send/recv comm",
        }),
    }
}

fn send_comm(c: *mut c_void) -> Result<&'static mut SendCommBox, Error> {
    match comm_ref(c, "sendComm")? {
        CommRef::Send(s) => Ok(s),
        CommRef::Recv(_) => Err(Error::BadState {
            op: "send call",
            state: "comm is a receive comm",
        }),
    }
}

fn recv_comm(c: *mut c_void) -> Result<&'static mut RecvCommBox, Error> {
    match comm_ref(c, "recvComm")? {
        CommRef::Recv(r) => Ok(r),
        CommRef::Send(_) => Err(Error::BadState {
            op: "receive call",
            state: "comm is a send comm",
        }),
    }
}

/// `mhandle`s are not pointers: they encode the device cache's [`MrHandle`] (slot index below
/// 2^12, generation) under a marker, so a registration hit allocates nothing. A value without
/// the marker, or whose entry is gone (stale), is rejected.
const MH_MARK: u64 = 0x1b3;
const MH_MARK_SHIFT: u32 = 52;
const MH_IDX_BITS: u32 = 12;
const _: () = assert!(plugin::MR_CACHE_CAPACITY <= 1 << MH_IDX_BITS);
const _: () = assert!(MH_IDX_BITS + 32 <= MH_MARK_SHIFT);

fn mh_encode(h: MrHandle) -> *mut c_void {
    let b = h.to_bits();
    let (gen, idx) = (b >> 32, b & 0xffff_ffff);
    ((MH_MARK << MH_MARK_SHIFT) | (gen << MH_IDX_BITS) | idx) as usize as *mut c_void
}

fn mh_decode(m: *mut c_void) -> Result<MrHandle, Error> {
    let v = m as usize as u64;
    if m.is_null() {
        return Err(missing("mhandle"));
    }
    if v >> MH_MARK_SHIFT != MH_MARK {
        return Err(Error::BadState {
            op: "memory handle",
            state: "not an ibnet registration",
        });
    }
    let idx = v & ((1 << MH_IDX_BITS) - 1);
    let gen = (v >> MH_IDX_BITS) & 0xffff_ffff;
    Ok(MrHandle::from_bits((gen << 32) | idx))
}

/// The registration of `mhandle` in the comm's device cache (lock-free, no allocation).
fn mr_get(cache: &MrCacheT, m: *mut c_void) -> Result<MrInfo, Error> {
    let h = mh_decode(m)?;
    let v = cache.get(h).ok_or(Error::BadState {
        op: "memory handle",
        state: "not a live ibnet registration of this device (stale or deregistered)",
    })?;
    Ok(MrInfo {
        keys: v.keys,
        base: v.base,
        len: v.len,
    })
}

/// What the data path needs of a registration.
struct MrInfo {
    keys: MrKeys,
    base: u64,
    len: u64,
}

/// A buffer must lie inside the registration NCCL passed with it.
fn covers(m: &MrInfo, addr: u64, size: u64) -> Result<(), Error> {
    if size == 0 {
        return Ok(());
    }
    if addr < m.base || addr.saturating_add(size) > m.base + m.len {
        return Err(Error::OutOfRange {
            what: "buffer outside its registration",
            value: addr as i64,
            min: m.base as i64,
            max: (m.base + m.len) as i64,
        });
    }
    Ok(())
}

fn comm_dev(c: *mut c_void) -> Result<(Dev, Arc<MrCacheT>), Error> {
    Ok(match comm_ref(c, "comm")? {
        CommRef::Send(s) => (s.dev.clone(), s.cache.clone()),
        CommRef::Recv(r) => (r.dev.clone(), r.cache.clone()),
    })
}

/// `regMr` / `regMrDmaBuf` (`dmabuf` = Some((offset, fd))): through the device's registration
/// cache, so registering a range again (any comm of the device) is a lock-free hit.
pub fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: u64,
    ty: c_int,
    dmabuf: Option<(u64, c_int)>,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    entry("regMr", || {
        let out = out_ptr(mhandle, "mhandle")?;
        *out = core::ptr::null_mut();
        let (d, cache) = comm_dev(comm)?;
        if data.is_null() && size > 0 {
            return Err(missing("data"));
        }
        let _ = ty;
        let kind = match dmabuf {
            Some((offset, fd)) => RegKind::DmaBuf { fd, offset },
            None => RegKind::Plain,
        };
        // The cache page-aligns the range as NCCL's IB plugin does; an empty registration
        // covers one page.
        let r = cache.acquire(data as u64, size.max(1), page_size(), |base, len| {
            let (mr, keys) = d.reg(base, len, kind)?;
            Ok(CachedMr {
                keys,
                raw: Box::into_raw(Box::new(mr)) as usize,
                base,
                len,
            })
        })?;
        *out = mh_encode(r.handle);
        Ok(())
    })
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// `deregMr`: drops one reference; the last one deregisters.
pub fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    entry("deregMr", || {
        let (_, cache) = comm_dev(comm)?;
        let h = mh_decode(mhandle)?;
        cache.release(h, |v| {
            // SAFETY: `raw` is the Box<AnyMr> leaked by reg_mr's register closure; the cache
            // calls this closure once, for the last reference, so it is reclaimed once.
            let mr = unsafe { Box::from_raw(v.raw as *mut AnyMr) };
            mr.dereg()
        })
    })
}

fn publish(
    reqs: &mut [ReqSlot; MAX_REQUESTS],
    comm: *mut c_void,
    send: bool,
    id: ReqId,
) -> *mut c_void {
    let s = &mut reqs[id.index() as usize % MAX_REQUESTS];
    *s = ReqSlot {
        tag: REQ_TAG,
        comm,
        send,
        bits: id.to_bits(),
    };
    s as *mut ReqSlot as *mut c_void
}

/// `isend`.
pub fn isend(
    comm: *mut c_void,
    data: *mut c_void,
    size: u64,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry("isend", || {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let s = send_comm(comm)?;
        let m = mr_get(&s.cache, mhandle)?;
        if data.is_null() && size > 0 {
            return Err(missing("data"));
        }
        covers(&m, data as u64, size)?;
        if let Some(id) = s.comm.isend(data as u64, size, tag as u32, m.keys)? {
            *out = publish(&mut s.reqs, comm, true, id);
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

fn gather(
    cache: &MrCacheT,
    n: c_int,
    data: *mut *mut c_void,
    sizes: Sizes,
    tags: *const c_int,
    mhandles: *mut *mut c_void,
) -> Result<([RecvBuf; MAX_RECVS], usize), Error> {
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
    let mut bufs = [RecvBuf::default(); MAX_RECVS];
    for (i, b) in bufs.iter_mut().enumerate().take(n) {
        // SAFETY: NCCL passes arrays of `n` entries; `i < n`.
        let (d, mh) = unsafe { (*data.add(i), *mhandles.add(i)) };
        let size = match sizes {
            Sizes::Int(p) if !p.is_null() => {
                // SAFETY: as above.
                let s = unsafe { *p.add(i) };
                u64::try_from(s).map_err(|_| Error::OutOfRange {
                    what: "size",
                    value: s as i64,
                    min: 0,
                    max: i32::MAX as i64,
                })?
            }
            // SAFETY: as above.
            Sizes::Size(p) if !p.is_null() => (unsafe { *p.add(i) }) as u64,
            _ => return Err(missing("sizes")),
        };
        // SAFETY: as above.
        let tag = if tags.is_null() {
            0
        } else {
            unsafe { *tags.add(i) }
        };
        let m = mr_get(cache, mh)?;
        if d.is_null() && size > 0 {
            return Err(missing("data[i]"));
        }
        covers(&m, d as u64, size)?;
        *b = RecvBuf {
            addr: d as u64,
            size,
            tag: tag as u32,
            mr: m.keys,
        };
    }
    Ok((bufs, n))
}

/// `irecv`. On entry `*request` may hold NCCL's optional-completion hint (0x1); it is always
/// overwritten.
pub fn irecv(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: Sizes,
    tags: *const c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry("irecv", || {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let r = recv_comm(comm)?;
        if tags.is_null() {
            return Err(missing("tags"));
        }
        let (bufs, n) = gather(&r.cache, n, data, sizes, tags, mhandles)?;
        if let Some(id) = r.comm.irecv(&bufs[..n])? {
            *out = publish(&mut r.reqs, comm, false, id);
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
    entry("iflush", || {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let r = recv_comm(comm)?;
        let (bufs, n) = gather(
            &r.cache,
            n,
            data,
            Sizes::Int(sizes),
            core::ptr::null(),
            mhandles,
        )?;
        if let Some(id) = r.comm.iflush(&bufs[..n])? {
            *out = publish(&mut r.reqs, comm, false, id);
        }
        Ok(())
    })
}

/// `test`. `sizes` may be NULL.
pub fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t {
    entry("test", || {
        // SAFETY: valid or NULL (rejected).
        let done = unsafe { done.as_mut() }.ok_or(missing("done"))?;
        *done = 0;
        let rp = request as *mut ReqSlot;
        // SAFETY: a non-NULL request is a slot inside one of our comms; the tag says it is live.
        let slot = unsafe { rp.as_mut() }.ok_or(missing("request"))?;
        if slot.tag != REQ_TAG {
            return Err(Error::BadState {
                op: "test",
                state: "request is not live (already completed or never issued)",
            });
        }
        let id = ReqId::from_bits(slot.bits);
        let res = if slot.send {
            send_comm(slot.comm)?.comm.test(id)
        } else {
            recv_comm(slot.comm)?.comm.test(id)
        };
        let d = match res {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(()),
            Err(e) => {
                slot.tag = DEAD;
                return Err(e);
            }
        };
        slot.tag = DEAD;
        *done = 1;
        if !sizes.is_null() {
            for i in 0..d.n as usize {
                // SAFETY: NCCL passes room for one size per receive of the request.
                unsafe { *sizes.add(i) = d.sizes[i].min(i32::MAX as u64) as c_int };
            }
        }
        Ok(())
    })
}

/// `closeSend`.
pub fn close_send(comm: *mut c_void) -> ncclResult_t {
    entry("closeSend", || {
        let s = send_comm(comm)?;
        s.tag = DEAD;
        // SAFETY: a live SendCommBox we allocated; freed once (tag cleared above).
        let b = unsafe { Box::from_raw(s as *mut SendCommBox) };
        b.comm.close()
    })
}

/// `closeRecv`.
pub fn close_recv(comm: *mut c_void) -> ncclResult_t {
    entry("closeRecv", || {
        let r = recv_comm(comm)?;
        r.tag = DEAD;
        // SAFETY: a live RecvCommBox we allocated; freed once (tag cleared above).
        let b = unsafe { Box::from_raw(r as *mut RecvCommBox) };
        b.comm.close()
    })
}

/// `makeVDevice` for single-device vNICs (what NCCL 2.28 asks when it does not fuse NICs):
/// the physical device itself. Fusing several devices is not supported.
pub fn make_vdevice(
    d: *mut c_int,
    props: *const crate::abi::types::ncclNetVDeviceProps_t,
) -> ncclResult_t {
    entry("makeVDevice", || {
        // SAFETY: valid or NULL (rejected).
        let d = unsafe { d.as_mut() }.ok_or(missing("d"))?;
        // SAFETY: valid or NULL (rejected).
        let pr = unsafe { props.as_ref() }.ok_or(missing("props"))?;
        let p = plugin()?;
        if pr.ndevs != 1 {
            return Err(Error::OutOfRange {
                what: "vNIC ndevs (ibnet does not fuse NICs)",
                value: pr.ndevs as i64,
                min: 1,
                max: 1,
            });
        }
        device(&p, pr.devs[0])?;
        *d = pr.devs[0];
        Ok(())
    })
}

/// `setNetAttr`: accepted and ignored (as NCCL's IB plugin).
pub fn set_net_attr(
    _ctx: *mut c_void,
    _attr: *mut crate::abi::types::ncclNetAttr_t,
) -> ncclResult_t {
    ncclResult_t::Success
}

#[cfg(test)]
mod lifecycle_tests {
    use super::*;

    /// v11: every `init` context is live until its `finalize`, which releases the plugin
    /// reference it took; the last one tears the plugin down; finalize is idempotent.
    #[test]
    fn finalize_releases_what_init_took() {
        let mut a: *mut c_void = core::ptr::null_mut();
        let mut b: *mut c_void = core::ptr::null_mut();
        assert_eq!(init(Some(&mut a), 106, None), ncclResult_t::Success);
        assert_eq!(init(Some(&mut b), -1, None), ncclResult_t::Success);
        assert!(!a.is_null() && !b.is_null());
        assert_eq!(ctx_tc(a), 106);
        assert_eq!(ctx_tc(b), -1);
        assert_eq!(finalize(a), ncclResult_t::Success);
        assert_eq!(ctx_tc(a), -1, "finalized ctx is no longer live");
        assert!(plugin::current().is_some(), "b still holds the plugin");
        assert_eq!(finalize(b), ncclResult_t::Success);
        assert!(
            plugin::current().is_none(),
            "last finalize releases the plugin"
        );
        assert_eq!(finalize(b), ncclResult_t::Success, "idempotent");
        assert_eq!(
            finalize(core::ptr::null_mut()),
            ncclResult_t::Success,
            "NULL-safe"
        );
    }
}
