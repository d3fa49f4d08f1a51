//! The version-agnostic plugin API every `ncclNetPlugin_vN` shim calls.
//!
//! Every entry point runs inside [`entry`]: it catches panics (none may cross `extern "C"`),
//! logs one WARN with the call's name and the error, and maps the error's kind to the
//! `ncclResult_t` of NCCL's plugin README (system/network → SystemError, misuse →
//! InternalError, configuration → InvalidUsage, completion errors → RemoteError).
//!
//! Comms and requests handed to NCCL are not pointers but tokens of [`crate::handles`]: an
//! index and generation into a fixed table of comm slots (a request token adds the core's
//! [`ReqId`](ibnet_core::request::ReqId)). A stale token (its comm closed), a token of the wrong kind, or any other value is
//! rejected without dereferencing anything; `isend`/`irecv`/`test` never allocate nor lock.
//!
//! Sharing: NCCL calls `regMr`/`deregMr` from its proxy service thread while its progress
//! thread runs `isend`/`irecv`/`test` on the same comm. A comm box therefore keeps what both
//! need (`dev`, `cache`, written once at creation, never mutated) outside an `UnsafeCell`
//! that holds the provider comm; only the data-path calls (serialised by NCCL on one thread)
//! borrow the cell mutably, and registrations take only a shared reference to the box. A
//! panic caught in a call on a comm poisons it (later calls fail with `Poisoned`).
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
#![allow(unsafe_code)]
// This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

// These functions are the C entry points' bodies: every pointer comes from NCCL under the plugin
// contract and is NULL-checked (comms and requests are looked up as tokens) before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ibnet_core::comm::{CommConfig, RecvBuf};
use ibnet_core::fifo::MAX_RECVS;
use ibnet_core::handshake::{Acceptor, Connector, Event};
use ibnet_core::mr_cache::MrHandle;
use ibnet_core::provider::{MrKeys, RegKind};

use ibnet_core::wire::{ConnectHandle, HANDLE_SCRATCH_LEN, HANDLE_SCRATCH_OFFSET};
use ibnet_core::{Error, ErrorKind};

use crate::abi::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};
use crate::handles::{self, Kind};
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
    entry_on(name, core::ptr::null_mut(), f)
}

/// [`entry`] for a call on the comm (or request) `on`: a panic caught there poisons that comm,
/// since its state may be half-updated; later calls on it fail with `Poisoned`.
pub fn entry_on(
    name: &str,
    on: *mut c_void,
    f: impl FnOnce() -> Result<(), Error>,
) -> ncclResult_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::Success,
        Ok(Err(e)) => {
            warn!("{name}: {e}");
            to_nccl(e.kind())
        }
        Err(_) => {
            if !on.is_null() {
                poison(on);
            }
            warn!("{name}: internal panic caught at the plugin boundary (comm poisoned)");
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
#[repr(C)]
pub struct NetCtx {
    tag: u64,
    /// `ncclNetCommConfig_t::trafficClass` (-1: undefined).
    pub traffic_class: i32,
}

const CTX_TAG: u64 = 0x4942_4e45_5443_5458; // "IBNETCTX"

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
        if p.bind.is_none() {
            plugin::release();
            // ncclInternalError, as the seed's "No IP interface found".
            return Err(Error::BadState {
                op: "init",
                state: "no IP interface found (see NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY)",
            });
        }
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
    // Held while reading: `finalize` frees a ctx only after removing it under this lock.
    let live = LIVE_CTX.lock().unwrap_or_else(|e| e.into_inner());
    if !live.contains(&(ctx as usize)) {
        return -1;
    }
    let c = ctx as *const NetCtx;
    // SAFETY: a live ctx (checked above, lock still held, so not freed meanwhile) is a NetCtx
    // we allocated.
    let (tag, tc) = unsafe { ((*c).tag, (*c).traffic_class) };
    drop(live);
    if tag == CTX_TAG {
        tc
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

/// The error of a handshake stalled past its deadline, naming the state it stalled in (the
/// one WARN is `entry`'s).
fn stalled(deadline: Instant, state: &'static str) -> Result<(), Error> {
    if Instant::now() > deadline {
        return Err(Error::Provider {
            call: timeout_call(state),
            errno: libc::ETIMEDOUT,
        });
    }
    Ok(())
}

/// `Error::Provider::call` for a timeout in `state` (a static string per handshake state).
fn timeout_call(state: &str) -> &'static str {
    match state {
        "TcpConnect" => "bootstrap handshake timed out in state TcpConnect (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "SendInfo" => "bootstrap handshake timed out in state SendInfo (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "RecvInfo" => "bootstrap handshake timed out in state RecvInfo (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Connect" => "bootstrap handshake timed out in state Connect (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "SendReady" => "bootstrap handshake timed out in state SendReady (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "RecvHello" => "bootstrap handshake timed out in state RecvHello (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Setup" => "bootstrap handshake timed out in state Setup (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "RecvReady" => "bootstrap handshake timed out in state RecvReady (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Done" => "bootstrap handshake timed out in state Done (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        "Failed" => "bootstrap handshake timed out in state Failed (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
        _ => "bootstrap handshake timed out (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
    }
}

/// What `listen` returns (NCCL holds its [`crate::handles`] token).
pub struct ListenComm {
    /// Set when a panic was caught in a call on this comm.
    poisoned: AtomicBool,
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
            poisoned: AtomicBool::new(false),
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

/// A send or receive comm handed to NCCL (as a [`crate::handles`] token).
///
/// `dev` and `cache` are written at creation and never mutated: `regMr`/`deregMr` read them
/// through a shared reference from NCCL's proxy service thread while the progress thread has
/// `comm` borrowed mutably (it lives in an `UnsafeCell` for that reason).
pub struct CommBox<C> {
    /// Set when a panic was caught in a call on this comm; later calls fail.
    poisoned: AtomicBool,
    dev: Dev,
    /// The plugin device index (low 8 bits), carried by this device's mhandles.
    dev_index: u8,
    cache: Arc<MrCacheT>,
    comm: UnsafeCell<C>,
}

/// A send comm.
pub type SendCommBox = CommBox<AnySend>;
/// A receive comm.
pub type RecvCommBox = CommBox<AnyRecv>;

impl<C> CommBox<C> {
    fn new(dev: Dev, dev_index: u8, cache: Arc<MrCacheT>, comm: C) -> Box<Self> {
        Box::new(Self {
            poisoned: AtomicBool::new(false),
            dev,
            dev_index,
            cache,
            comm: UnsafeCell::new(comm),
        })
    }

    fn check_live(&self, op: &'static str) -> Result<(), Error> {
        // Acquire pairs with the Release store in `poison`.
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned { op });
        }
        Ok(())
    }

    /// The provider comm, for a data-path call.
    ///
    /// # Safety
    /// NCCL serialises the data-path calls (`isend`/`irecv`/`iflush`/`test`, close) of one
    /// comm on one thread, so no other `&mut` to `comm` exists while the result lives; shared
    /// users (`regMr`/`deregMr`) never touch `comm`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn comm_mut(&self) -> &mut C {
        // SAFETY: exclusive by the caller's contract above.
        unsafe { &mut *self.comm.get() }
    }
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

/// Boxes a new comm and returns its token; a full table closes the comm.
fn publish_comm<C>(
    kind: Kind,
    b: Box<CommBox<C>>,
    close: impl FnOnce(C) -> Result<(), Error>,
) -> Result<*mut c_void, Error> {
    let raw = Box::into_raw(b);
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

fn new_send_box(
    dev: Dev,
    dev_index: u8,
    cache: Arc<MrCacheT>,
    comm: AnySend,
) -> Result<*mut c_void, Error> {
    let b = CommBox::new(dev, dev_index, cache, comm);
    publish_comm(Kind::Send, b, AnySend::close)
}

fn new_recv_box(
    dev: Dev,
    dev_index: u8,
    cache: Arc<MrCacheT>,
    comm: AnyRecv,
) -> Result<*mut c_void, Error> {
    let b = CommBox::new(dev, dev_index, cache, comm);
    publish_comm(Kind::Recv, b, AnyRecv::close)
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
            let mut send = Box::new(d.new_send(cfg)?);
            if let Ok(a) = s.peer_addr() {
                send.set_peer_addr(a);
            }
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
/// `CONNECTING` under a token written into the handle's scratch area (an unknown token is a
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
            let reuse = p.bind.filter(|_| p.cfg.sock_client_port_reuse);
            let s = sock::connect_start_from(&h.addr, reuse).map_err(|e| sys("connect", &e))?;
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
                *out = new_send_box(d, dev as u8, dev_cache(&p, dev)?, *send)?;
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
    if l.is_null() {
        return Err(missing("listenComm"));
    }
    let (p, _) = handles::lookup(l as usize, &[Kind::Listen], "listenComm")?;
    // SAFETY: a live Listen slot holds a ListenComm box we leaked; `accept` calls on one
    // listen comm are serialised by NCCL and nothing else borrows it (no shared path).
    let lc = unsafe { &mut *(p as *mut ListenComm) };
    // Acquire pairs with the Release store in `poison`.
    if lc.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned { op: "accept" });
    }
    Ok(lc)
}

/// One step of an accept; `Ok(Some(comm))` when done.
fn accept_step(lc: &ListenComm, a: &mut Accepting) -> Result<Option<Box<AnyRecv>>, Error> {
    loop {
        match crate::shake::pump(&mut a.stream, &mut *a.machine)? {
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
                *out = new_recv_box(lc.dev.clone(), lc.dev_index, lc.cache.clone(), *recv)?
            }
            None => lc.pending = Some(a),
        }
        Ok(())
    })
}

/// `closeListen`.
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

// ---------------------------------------------------------------------------------------------
// comms, registrations, requests

/// A shared reference to a live send or receive comm.
enum CommRef {
    Send(&'static SendCommBox),
    Recv(&'static RecvCommBox),
}

/// The comm behind a token, shared. The `'static` is NCCL's: the box lives until close, which
/// NCCL never runs concurrently with another call on the same comm.
fn comm_ref(c: *mut c_void, what: &'static str) -> Result<CommRef, Error> {
    if c.is_null() {
        return Err(missing(what));
    }
    let (p, kind) = handles::lookup(c as usize, &[Kind::Send, Kind::Recv], what)?;
    Ok(match kind {
        // SAFETY: a live Send slot holds a SendCommBox we leaked; only shared references to
        // the box are ever made while it is in the table.
        Kind::Send => CommRef::Send(unsafe { &*(p as *const SendCommBox) }),
        // SAFETY: as above, for a Recv slot.
        _ => CommRef::Recv(unsafe { &*(p as *const RecvCommBox) }),
    })
}

fn send_comm(c: *mut c_void) -> Result<&'static SendCommBox, Error> {
    match comm_ref(c, "sendComm")? {
        CommRef::Send(s) => Ok(s),
        CommRef::Recv(_) => Err(Error::BadState {
            op: "send call",
            state: "comm is a receive comm",
        }),
    }
}

fn recv_comm(c: *mut c_void) -> Result<&'static RecvCommBox, Error> {
    match comm_ref(c, "recvComm")? {
        CommRef::Recv(r) => Ok(r),
        CommRef::Send(_) => Err(Error::BadState {
            op: "receive call",
            state: "comm is a send comm",
        }),
    }
}

/// Marks the comm a comm or request token names as poisoned (after a caught panic).
fn poison(token: *mut c_void) {
    let Some((p, kind)) = handles::lookup_any(token as usize) else {
        return;
    };
    let flag = match kind {
        // SAFETY: a live slot of kind Listen holds a ListenComm box; only its atomic flag is
        // touched, through a shared reference.
        Kind::Listen => unsafe { &(*(p as *const ListenComm)).poisoned },
        // SAFETY: as above, for a SendCommBox.
        Kind::Send => unsafe { &(*(p as *const SendCommBox)).poisoned },
        // SAFETY: as above, for a RecvCommBox.
        Kind::Recv => unsafe { &(*(p as *const RecvCommBox)).poisoned },
    };
    // Release pairs with the Acquire loads in `check_live`/`listen_comm`.
    flag.store(true, Ordering::Release);
}

/// `mhandle`s are not pointers: they encode the device cache's [`MrHandle`] (slot index below
/// 2^12, generation) and the plugin device index (low 8 bits) under a marker, so a
/// registration hit allocates nothing:
/// ```text
///  [63..52] MH_MARK  [51..44] device index  [43..12] generation  [11..0] cache slot
/// ```
/// A value without the marker, of another device (NCCL passed a handle registered on another
/// device's comm), or whose entry is gone (stale) is rejected.
const MH_MARK: u64 = 0x1b3;
const MH_MARK_SHIFT: u32 = 52;
const MH_IDX_BITS: u32 = 12;
const MH_DEV_SHIFT: u32 = 44;
const _: () = assert!(plugin::MR_CACHE_CAPACITY <= 1 << MH_IDX_BITS);
const _: () = assert!(MH_IDX_BITS + 32 <= MH_DEV_SHIFT && MH_DEV_SHIFT + 8 <= MH_MARK_SHIFT);

fn mh_encode(h: MrHandle, dev_index: u8) -> *mut c_void {
    let b = h.to_bits();
    let (gen, idx) = (b >> 32, b & 0xffff_ffff);
    ((MH_MARK << MH_MARK_SHIFT) | ((dev_index as u64) << MH_DEV_SHIFT) | (gen << MH_IDX_BITS) | idx)
        as usize as *mut c_void
}

fn mh_decode(m: *mut c_void, dev_index: u8) -> Result<MrHandle, Error> {
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
    if (v >> MH_DEV_SHIFT) & 0xff != dev_index as u64 {
        return Err(Error::BadState {
            op: "memory handle",
            state: "registered on another device than this comm's",
        });
    }
    let idx = v & ((1 << MH_IDX_BITS) - 1);
    let gen = (v >> MH_IDX_BITS) & 0xffff_ffff;
    Ok(MrHandle::from_bits((gen << 32) | idx))
}

/// The registration of `mhandle` in the comm's device cache (lock-free, no allocation).
fn mr_get(cache: &MrCacheT, dev_index: u8, m: *mut c_void) -> Result<MrInfo, Error> {
    let h = mh_decode(m, dev_index)?;
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

/// The device and registration cache of a comm: shared fields only (the proxy service
/// thread calls `regMr`/`deregMr` while the progress thread runs the comm's data path).
fn comm_dev(c: *mut c_void) -> Result<(&'static Dev, u8, &'static MrCacheT), Error> {
    Ok(match comm_ref(c, "comm")? {
        CommRef::Send(s) => {
            s.check_live("regMr/deregMr")?;
            (&s.dev, s.dev_index, &*s.cache)
        }
        CommRef::Recv(r) => {
            r.check_live("regMr/deregMr")?;
            (&r.dev, r.dev_index, &*r.cache)
        }
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
    entry_on("regMr", comm, || {
        let out = out_ptr(mhandle, "mhandle")?;
        *out = core::ptr::null_mut();
        let (d, dev_index, cache) = comm_dev(comm)?;
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
        let r =
            cache.acquire_or_contained(data as u64, size.max(1), page_size(), |base, len| {
                let (mr, keys) = d.reg(base, len, kind)?;
                Ok(CachedMr {
                    keys,
                    raw: Box::into_raw(Box::new(mr)) as usize,
                    base,
                    len,
                })
            })?;
        *out = mh_encode(r.handle, dev_index);
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
    entry_on("deregMr", comm, || {
        let (_, dev_index, cache) = comm_dev(comm)?;
        let h = mh_decode(mhandle, dev_index)?;
        cache.release(h, |v| {
            // SAFETY: `raw` is the Box<AnyMr> leaked by reg_mr's register closure; the cache
            // calls this closure once, for the last reference, so it is reclaimed once.
            let mr = unsafe { Box::from_raw(v.raw as *mut AnyMr) };
            mr.dereg()
        })
    })
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
    entry_on("isend", comm, || {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let s = send_comm(comm)?;
        s.check_live("isend")?;
        let m = mr_get(&s.cache, s.dev_index, mhandle)?;
        if data.is_null() && size > 0 {
            return Err(missing("data"));
        }
        covers(&m, data as u64, size)?;
        // SAFETY: a data-path call; see `CommBox::comm_mut`.
        let c = unsafe { s.comm_mut() };
        if let Some(id) = c.isend(data as u64, size, tag as u32, m.keys)? {
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

fn gather(
    cache: &MrCacheT,
    dev_index: u8,
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
        let m = mr_get(cache, dev_index, mh)?;
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
    entry_on("irecv", comm, || {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let r = recv_comm(comm)?;
        r.check_live("irecv")?;
        if tags.is_null() {
            return Err(missing("tags"));
        }
        let (bufs, n) = gather(&r.cache, r.dev_index, n, data, sizes, tags, mhandles)?;
        // SAFETY: a data-path call; see `CommBox::comm_mut`.
        if let Some(id) = unsafe { r.comm_mut() }.irecv(&bufs[..n])? {
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
    entry_on("iflush", comm, || {
        let out = out_ptr(request, "request")?;
        *out = core::ptr::null_mut();
        let r = recv_comm(comm)?;
        r.check_live("iflush")?;
        let (bufs, n) = gather(
            &r.cache,
            r.dev_index,
            n,
            data,
            Sizes::Int(sizes),
            core::ptr::null(),
            mhandles,
        )?;
        // SAFETY: a data-path call; see `CommBox::comm_mut`.
        if let Some(id) = unsafe { r.comm_mut() }.iflush(&bufs[..n])? {
            *out = handles::request_token(comm as usize, id) as *mut c_void;
        }
        Ok(())
    })
}

/// `test`. `sizes` may be NULL. The request token names its comm's slot and the core's
/// request id: nothing is dereferenced for a stale or foreign token.
pub fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> ncclResult_t {
    entry_on("test", request, || {
        // SAFETY: valid or NULL (rejected).
        let done = unsafe { done.as_mut() }.ok_or(missing("done"))?;
        *done = 0;
        if request.is_null() {
            return Err(missing("request"));
        }
        let (p, kind, id) = handles::lookup_request(request as usize)?;
        let res = match kind {
            Kind::Send => {
                // SAFETY: a live Send slot holds a SendCommBox; shared reference only.
                let b = unsafe { &*(p as *const SendCommBox) };
                b.check_live("test")?;
                // SAFETY: a data-path call; see `CommBox::comm_mut`.
                unsafe { b.comm_mut() }.test(id)
            }
            _ => {
                // SAFETY: a live Recv slot holds a RecvCommBox; shared reference only.
                let b = unsafe { &*(p as *const RecvCommBox) };
                b.check_live("test")?;
                // SAFETY: a data-path call; see `CommBox::comm_mut`.
                unsafe { b.comm_mut() }.test(id)
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

/// `closeSend`. The token is stale from here on (a second close is an error).
pub fn close_send(comm: *mut c_void) -> ncclResult_t {
    entry("closeSend", || {
        if comm.is_null() {
            return Err(missing("sendComm"));
        }
        let p = handles::remove(comm as usize, Kind::Send, "closeSend")?;
        // SAFETY: the slot held a SendCommBox we leaked; removing it made this the only owner.
        let b = unsafe { Box::from_raw(p as *mut SendCommBox) };
        b.comm.into_inner().close()
    })
}

/// `closeRecv`. The token is stale from here on (a second close is an error).
pub fn close_recv(comm: *mut c_void) -> ncclResult_t {
    entry("closeRecv", || {
        if comm.is_null() {
            return Err(missing("recvComm"));
        }
        let p = handles::remove(comm as usize, Kind::Recv, "closeRecv")?;
        // SAFETY: the slot held a RecvCommBox we leaked; removing it made this the only owner.
        let b = unsafe { Box::from_raw(p as *mut RecvCommBox) };
        b.comm.into_inner().close()
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

    /// A stalled handshake is one error naming its state (the caller's WARN is the only one).
    #[test]
    fn handshake_timeout_names_the_state() {
        let past = Instant::now() - Duration::from_secs(1);
        let e = stalled(past, "RecvReady").unwrap_err();
        assert!(matches!(
            e,
            Error::Provider {
                errno: libc::ETIMEDOUT,
                ..
            }
        ));
        assert!(e.to_string().contains("in state RecvReady"), "{e}");
        let future = Instant::now() + Duration::from_secs(60);
        assert!(stalled(future, "RecvReady").is_ok());
    }

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

#[cfg(test)]
mod token_tests {
    use super::*;
    use ibnet_core::params::Params;
    use ibnet_core::provider::LinkLayer;

    /// A soft send comm published as a token (no peer needed), or None where the host refuses
    /// cross-memory attach (the soft provider cannot open).
    fn soft_send() -> Option<(ibnet_soft::SoftProvider, *mut c_void)> {
        ibnet_soft::probe_with(false).ok()?;
        let sp = ibnet_soft::SoftProvider::open_with(ibnet_soft::Config::default()).ok()?;
        let d = Dev::Soft(sp.clone());
        let cfg = CommConfig::from_params(&Params::default(), LinkLayer::Ethernet, None, false);
        let s = d.new_send(cfg).unwrap();
        let tok = new_send_box(d, 0, Arc::new(MrCacheT::new()), s).unwrap();
        Some((sp, tok))
    }

    #[test]
    fn stale_and_foreign_tokens_are_errors_not_dereferenced() {
        let mut done = 0;
        let mut buf = [0u8; 64];
        let mut req: *mut c_void = core::ptr::null_mut();
        let garbage = buf.as_mut_ptr() as *mut c_void;
        // Values that were never ours: rejected without reading them.
        assert_eq!(close_send(garbage), ncclResult_t::InternalError);
        assert_eq!(close_recv(0x10 as *mut c_void), ncclResult_t::InternalError);
        assert_eq!(
            test(garbage, &mut done, core::ptr::null_mut()),
            ncclResult_t::InternalError
        );
        let Some((sp, tok)) = soft_send() else {
            eprintln!("SKIP: soft provider unavailable (cross-memory attach refused)");
            return;
        };
        let mut mh: *mut c_void = core::ptr::null_mut();
        let data = buf.as_mut_ptr() as *mut c_void;
        assert_eq!(
            reg_mr(tok, data, 64, 0, None, &mut mh),
            ncclResult_t::Success
        );
        // A request token of this comm (never issued): the core rejects the request id.
        let rq = handles::request_token(tok as usize, ibnet_core::request::ReqId::from_bits(7))
            as *mut c_void;
        assert_ne!(
            test(rq, &mut done, core::ptr::null_mut()),
            ncclResult_t::Success
        );
        assert_eq!(dereg_mr(tok, mh), ncclResult_t::Success);
        assert_eq!(close_send(tok), ncclResult_t::Success);
        // Stale: the comm and its requests are gone; nothing is dereferenced.
        assert_eq!(close_send(tok), ncclResult_t::InternalError);
        assert_eq!(
            isend(tok, data, 8, 0, mh, &mut req),
            ncclResult_t::InternalError
        );
        assert_eq!(
            test(rq, &mut done, core::ptr::null_mut()),
            ncclResult_t::InternalError
        );
        assert_eq!(done, 0);
        sp.shutdown();
    }

    /// An mhandle carries its device: one from device 0 used on device 1's comm is an error.
    #[test]
    fn mhandles_are_tied_to_their_device() {
        let h = MrHandle::from_bits((5u64 << 32) | 17);
        let m0 = mh_encode(h, 0);
        let m1 = mh_encode(h, 1);
        assert_ne!(m0, m1);
        assert_eq!(mh_decode(m0, 0).unwrap(), h);
        assert_eq!(mh_decode(m1, 1).unwrap(), h);
        assert!(matches!(
            mh_decode(m0, 1),
            Err(Error::BadState {
                state: "registered on another device than this comm's",
                ..
            })
        ));
        assert!(mh_decode(mh_encode(h, 255), 255).is_ok());
        assert!(mh_decode(0x1234 as *mut c_void, 0).is_err(), "no marker");
        let cache = MrCacheT::new();
        assert!(mr_get(&cache, 1, m0).is_err());
    }

    #[test]
    fn a_caught_panic_poisons_its_comm() {
        let Some((sp, tok)) = soft_send() else {
            eprintln!("SKIP: soft provider unavailable (cross-memory attach refused)");
            return;
        };
        let r = entry_on("isend", tok, || panic!("injected"));
        assert_eq!(r, ncclResult_t::InternalError);
        let s = send_comm(tok).unwrap();
        assert!(matches!(
            s.check_live("isend"),
            Err(Error::Poisoned { op: "isend" })
        ));
        let mut buf = [0u8; 8];
        let mut mh: *mut c_void = core::ptr::null_mut();
        let data = buf.as_mut_ptr() as *mut c_void;
        assert_eq!(
            reg_mr(tok, data, 8, 0, None, &mut mh),
            ncclResult_t::SystemError,
            "poisoned comm refuses work"
        );
        let mut req: *mut c_void = core::ptr::null_mut();
        assert_eq!(
            isend(tok, data, 8, 0, mh, &mut req),
            ncclResult_t::SystemError
        );
        assert!(req.is_null());
        assert_eq!(close_send(tok), ncclResult_t::Success, "close still works");
        sp.shutdown();
    }
}
