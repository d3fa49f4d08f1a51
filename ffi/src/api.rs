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
//! Connection setup (never blocks; NCCL calls connect/accept until they return a comm):
//! ```text
//!  connect (handle from listen)                 accept (listenComm)
//!  TCP connect ─────────────────────────────▶   accept queued TCP connection
//!  SendComm::new; send HELLO{magic,nonce,info}─▶ check magic+nonce; RecvComm::new(info)
//!                     ◀───────────────────────── REPLY{magic,info}
//!  SendComm::connect(info); send READY ──────▶   READY → recvComm
//! ```
//! The connector's in-progress state is kept in a registry keyed by a token it writes into
//! the handle (NCCL keeps the handle between calls); an unknown token is a corrupt handle.
//! A peer that closes mid-handshake is an error; one that stalls past
//! `IBNET_HANDSHAKE_TIMEOUT` seconds is an error.

// These functions are the C entry points' bodies: every pointer comes from NCCL under the plugin
// contract and is NULL-checked (and tag-checked for our own objects) before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ibnet_core::comm::{CommConfig, RecvBuf};
use ibnet_core::fifo::{MAX_RECVS, MAX_REQUESTS};
use ibnet_core::provider::{MrKeys, RegKind};
use ibnet_core::request::ReqId;
use ibnet_core::{Error, ErrorKind};

use crate::abi::types::{ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};
use crate::plugin::{self, AnyMr, AnyRecv, AnySend, Dev, Plugin, Props};
use crate::sock::{self, Pipe};
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

// ---------------------------------------------------------------------------------------------
// init / devices / properties / finalize

/// Per-`init` context (v11): the communicator's traffic class.
pub struct NetCtx {
    tag: u64,
    /// `ncclNetCommConfig_t::trafficClass` (-1: undefined).
    pub traffic_class: i32,
}

const CTX_TAG: u64 = 0x4942_4e45_5443_5458; // "IBNETCTX"
const LISTEN_TAG: u64 = 0x4942_4e45_544c_5354;
const SEND_TAG: u64 = 0x4942_4e45_5453_4e44;
const RECV_TAG: u64 = 0x4942_4e45_5452_4356;
const MR_TAG: u64 = 0x4942_4e45_544d_5248;
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
            *out = Box::into_raw(Box::new(NetCtx {
                tag: CTX_TAG,
                traffic_class,
            })) as *mut c_void;
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

const HANDLE_MAGIC: u32 = 0x4942_4e54; // "IBNT"
const HANDLE_VERSION: u16 = 1;
/// Offset of the connector's private progress token inside the handle.
const TOKEN_OFF: usize = 64;

/// The connect handle (fits `NCCL_NET_HANDLE_MAXSIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handle {
    addr: SocketAddr,
    nonce: u64,
}

const _: () = assert!(TOKEN_OFF + 8 <= NCCL_NET_HANDLE_MAXSIZE);

impl Handle {
    fn write(&self, b: &mut [u8; NCCL_NET_HANDLE_MAXSIZE]) {
        *b = [0; NCCL_NET_HANDLE_MAXSIZE];
        b[0..4].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&HANDLE_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..18].copy_from_slice(&self.addr.port().to_le_bytes());
        match self.addr {
            SocketAddr::V4(a) => {
                b[6] = 4;
                b[20..24].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[6] = 6;
                b[20..36].copy_from_slice(&a.ip().octets());
                b[36..40].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
    }

    fn read(b: &[u8; NCCL_NET_HANDLE_MAXSIZE]) -> Result<Self, Error> {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if magic != HANDLE_MAGIC {
            return Err(Error::Wire {
                what: "connect handle magic (not an ibnet handle)",
                value: magic as u64,
            });
        }
        let ver = u16::from_le_bytes([b[4], b[5]]);
        if ver != HANDLE_VERSION {
            return Err(Error::Wire {
                what: "connect handle version",
                value: ver as u64,
            });
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[8..16]);
        let port = u16::from_le_bytes([b[16], b[17]]);
        let ip = match b[6] {
            4 => IpAddr::V4(Ipv4Addr::new(b[20], b[21], b[22], b[23])),
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[20..36]);
                let scope = u32::from_le_bytes([b[36], b[37], b[38], b[39]]);
                return Ok(Self {
                    addr: SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(o), port, 0, scope)),
                    nonce: u64::from_le_bytes(n),
                });
            }
            f => {
                return Err(Error::Wire {
                    what: "connect handle address family",
                    value: f as u64,
                })
            }
        };
        if port == 0 {
            return Err(Error::Wire {
                what: "connect handle port",
                value: 0,
            });
        }
        Ok(Self {
            addr: SocketAddr::new(ip, port),
            nonce: u64::from_le_bytes(n),
        })
    }
}

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

const HELLO_MAGIC: u32 = 0x4942_4e48; // "IBNH"
const REPLY_MAGIC: u32 = 0x4942_4e52; // "IBNR"
const READY: u8 = 0x5a;

fn stalled(deadline: Instant) -> Result<(), Error> {
    if Instant::now() > deadline {
        return Err(Error::Provider {
            call: "bootstrap handshake (peer stalled; IBNET_HANDSHAKE_TIMEOUT)",
            errno: libc::ETIMEDOUT,
        });
    }
    Ok(())
}

/// What `listen` returns.
pub struct ListenComm {
    tag: u64,
    dev: Dev,
    plugin: Arc<Plugin>,
    listener: TcpListener,
    nonce: u64,
    pending: Option<Accepting>,
}

enum AcceptStage {
    Hello,
    Reply(Box<AnyRecv>),
    Ready(Box<AnyRecv>),
}

struct Accepting {
    pipe: Pipe,
    stage: AcceptStage,
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
        Handle { addr, nonce }.write(hb);
        let lc = Box::new(ListenComm {
            tag: LISTEN_TAG,
            dev: d,
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
pub struct SendCommBox {
    tag: u64,
    dev: Dev,
    comm: AnySend,
    reqs: [ReqSlot; MAX_REQUESTS],
}

/// A receive comm handed to NCCL.
pub struct RecvCommBox {
    tag: u64,
    dev: Dev,
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
    Tcp(std::net::TcpStream),
    Hello(Pipe, Box<AnySend>),
    Reply(Pipe, Box<AnySend>),
    Ready(Pipe, Box<AnySend>),
}

struct Connecting {
    stage: Option<ConnectStage>,
    nonce: u64,
    deadline: Instant,
}

static CONNECTING: Mutex<Option<HashMap<u64, Connecting>>> = Mutex::new(None);

fn new_send_box(dev: Dev, comm: AnySend) -> *mut c_void {
    Box::into_raw(Box::new(SendCommBox {
        tag: SEND_TAG,
        dev,
        comm,
        reqs: [const { ReqSlot::FREE }; MAX_REQUESTS],
    })) as *mut c_void
}

fn new_recv_box(dev: Dev, comm: AnyRecv) -> *mut c_void {
    Box::into_raw(Box::new(RecvCommBox {
        tag: RECV_TAG,
        dev,
        comm,
        reqs: [const { ReqSlot::FREE }; MAX_REQUESTS],
    })) as *mut c_void
}

fn hello(nonce: u64, info: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + info.len());
    b.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    b.extend_from_slice(&nonce.to_le_bytes());
    b.extend_from_slice(&(info.len() as u32).to_le_bytes());
    b.extend_from_slice(info);
    b
}

/// One step of a connect; `Ok(Some(comm))` when done.
fn connect_step(
    c: &mut Connecting,
    p: &Plugin,
    d: &Dev,
    cfg: CommConfig,
) -> Result<Option<Box<AnySend>>, Error> {
    stalled(c.deadline)?;
    let stage = c.stage.take().ok_or(Error::BadState {
        op: "connect",
        state: "failed earlier",
    })?;
    let _ = p;
    let next = match stage {
        ConnectStage::Tcp(s) => {
            if !sock::connect_done(&s).map_err(|e| sys("connect", &e))? {
                ConnectStage::Tcp(s)
            } else {
                let send = Box::new(d.new_send(cfg)?);
                let mut pipe = Pipe::new(s);
                pipe.queue(&hello(c.nonce, &crate::codec::encode(&send.local_info())));
                ConnectStage::Hello(pipe, send)
            }
        }
        ConnectStage::Hello(mut pipe, send) => {
            if pipe.flush().map_err(|e| sys("send (handshake)", &e))? {
                ConnectStage::Reply(pipe, send)
            } else {
                ConnectStage::Hello(pipe, send)
            }
        }
        ConnectStage::Reply(mut pipe, mut send) => {
            if !pipe
                .fill(8)
                .map_err(|e| sys("recv (handshake reply)", &e))?
            {
                ConnectStage::Reply(pipe, send)
            } else {
                let h = pipe.input();
                let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
                if magic != REPLY_MAGIC {
                    return Err(Error::Wire {
                        what: "handshake reply magic",
                        value: magic as u64,
                    });
                }
                if len > crate::codec::MAX_LEN {
                    return Err(Error::Wire {
                        what: "handshake reply length",
                        value: len as u64,
                    });
                }
                if !pipe
                    .fill(8 + len)
                    .map_err(|e| sys("recv (handshake reply)", &e))?
                {
                    ConnectStage::Reply(pipe, send)
                } else {
                    let info = crate::codec::decode(&pipe.input()[8..8 + len])?;
                    pipe.consume(8 + len);
                    send.connect(&info)?;
                    pipe.queue(&[READY]);
                    ConnectStage::Ready(pipe, send)
                }
            }
        }
        ConnectStage::Ready(mut pipe, send) => {
            if pipe
                .flush()
                .map_err(|e| sys("send (handshake ready)", &e))?
            {
                return Ok(Some(send));
            }
            ConnectStage::Ready(pipe, send)
        }
    };
    c.stage = Some(next);
    Ok(None)
}

/// `connect`. `tc` is the traffic class from the v10 config or the v11 ctx (-1: undefined).
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
        let h = Handle::read(hb)?;
        let p = plugin()?;
        let d = device(&p, dev)?;
        let tc = tc.unwrap_or_else(|| ctx_tc(ctx));
        let cfg = p.comm_config(&d, tc);
        let mut tok = [0u8; 8];
        tok.copy_from_slice(&hb[TOKEN_OFF..TOKEN_OFF + 8]);
        let mut token = u64::from_le_bytes(tok);
        let mut reg = CONNECTING.lock().unwrap_or_else(|e| e.into_inner());
        let map = reg.get_or_insert_with(HashMap::new);
        let mut c = if token == 0 {
            let s = sock::connect_start(&h.addr).map_err(|e| sys("connect", &e))?;
            token = random_u64();
            Connecting {
                stage: Some(ConnectStage::Tcp(s)),
                nonce: h.nonce,
                deadline: Instant::now() + Duration::from_secs(p.cfg.handshake_timeout_s),
            }
        } else {
            map.remove(&token).ok_or(Error::Wire {
                what: "connect handle progress token (corrupt or reused handle)",
                value: token,
            })?
        };
        drop(reg);
        hb[TOKEN_OFF..TOKEN_OFF + 8].fill(0);
        match connect_step(&mut c, &p, &d, cfg)? {
            Some(send) => {
                *out = new_send_box(d, *send);
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

fn accept_step(lc: &mut ListenComm, a: &mut Accepting) -> Result<Option<Box<AnyRecv>>, Error> {
    stalled(a.deadline)?;
    let stage = core::mem::replace(&mut a.stage, AcceptStage::Hello);
    let next = match stage {
        AcceptStage::Hello => {
            if !a
                .pipe
                .fill(16)
                .map_err(|e| sys("recv (handshake hello)", &e))?
            {
                AcceptStage::Hello
            } else {
                let h = a.pipe.input();
                let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                let mut n = [0u8; 8];
                n.copy_from_slice(&h[4..12]);
                let len = u32::from_le_bytes([h[12], h[13], h[14], h[15]]) as usize;
                if magic != HELLO_MAGIC {
                    return Err(Error::Wire {
                        what: "handshake hello magic",
                        value: magic as u64,
                    });
                }
                if u64::from_le_bytes(n) != lc.nonce {
                    return Err(Error::Wire {
                        what: "handshake nonce (connection for another listen comm)",
                        value: u64::from_le_bytes(n),
                    });
                }
                if len > crate::codec::MAX_LEN {
                    return Err(Error::Wire {
                        what: "handshake hello length",
                        value: len as u64,
                    });
                }
                if !a
                    .pipe
                    .fill(16 + len)
                    .map_err(|e| sys("recv (handshake hello)", &e))?
                {
                    AcceptStage::Hello
                } else {
                    let info = crate::codec::decode(&a.pipe.input()[16..16 + len])?;
                    a.pipe.consume(16 + len);
                    let cfg = lc.plugin.comm_config(&lc.dev, -1);
                    let recv = Box::new(lc.dev.new_recv(cfg, &info)?);
                    let mine = crate::codec::encode(&recv.local_info());
                    a.pipe.queue(&REPLY_MAGIC.to_le_bytes());
                    a.pipe.queue(&(mine.len() as u32).to_le_bytes());
                    a.pipe.queue(&mine);
                    AcceptStage::Reply(recv)
                }
            }
        }
        AcceptStage::Reply(recv) => {
            if a.pipe
                .flush()
                .map_err(|e| sys("send (handshake reply)", &e))?
            {
                AcceptStage::Ready(recv)
            } else {
                AcceptStage::Reply(recv)
            }
        }
        AcceptStage::Ready(recv) => {
            if a.pipe
                .fill(1)
                .map_err(|e| sys("recv (handshake ready)", &e))?
            {
                if a.pipe.input()[0] != READY {
                    return Err(Error::Wire {
                        what: "handshake ready byte",
                        value: a.pipe.input()[0] as u64,
                    });
                }
                return Ok(Some(recv));
            }
            AcceptStage::Ready(recv)
        }
    };
    a.stage = next;
    Ok(None)
}

/// `accept`.
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
                        pipe: Pipe::new(s),
                        stage: AcceptStage::Hello,
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
            Some(recv) => *out = new_recv_box(lc.dev.clone(), *recv),
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

/// A memory handle handed to NCCL.
pub struct MrBox {
    tag: u64,
    mr: Option<AnyMr>,
    keys: MrKeys,
    addr: u64,
    len: u64,
}

fn comm_dev(c: *mut c_void) -> Result<Dev, Error> {
    Ok(match comm_ref(c, "comm")? {
        CommRef::Send(s) => s.dev.clone(),
        CommRef::Recv(r) => r.dev.clone(),
    })
}

/// `regMr` / `regMrDmaBuf` (`dmabuf` = Some((offset, fd))).
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
        let d = comm_dev(comm)?;
        if data.is_null() && size > 0 {
            return Err(missing("data"));
        }
        let _ = ty;
        let addr = data as u64;
        let kind = match dmabuf {
            Some((offset, fd)) => RegKind::DmaBuf { fd, offset },
            None => RegKind::Plain,
        };
        // Page-align plain registrations as NCCL's IB plugin does.
        let (ra, rl) = match kind {
            RegKind::Plain => {
                let pg = 4096u64;
                let a = addr & !(pg - 1);
                let end = addr.checked_add(size.max(1)).ok_or(Error::OutOfRange {
                    what: "size",
                    value: size as i64,
                    min: 0,
                    max: i64::MAX,
                })?;
                (a, end.div_ceil(pg) * pg - a)
            }
            RegKind::DmaBuf { .. } => (addr, size),
        };
        let (mr, keys) = d.reg(ra, rl, kind)?;
        *out = Box::into_raw(Box::new(MrBox {
            tag: MR_TAG,
            mr: Some(mr),
            keys,
            addr: ra,
            len: rl,
        })) as *mut c_void;
        Ok(())
    })
}

fn mr_ref(m: *mut c_void) -> Result<&'static mut MrBox, Error> {
    let m = m as *mut MrBox;
    // SAFETY: a non-NULL mhandle is one we returned; the tag rejects other objects.
    let r = unsafe { m.as_mut() }.ok_or(missing("mhandle"))?;
    if r.tag != MR_TAG {
        return Err(Error::BadState {
            op: "memory handle",
            state: "not a live ibnet registration",
        });
    }
    Ok(r)
}

/// `deregMr`.
pub fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    entry("deregMr", || {
        let _ = comm_ref(comm, "comm")?;
        let m = mr_ref(mhandle)?;
        m.tag = DEAD;
        let mr = m.mr.take();
        // SAFETY: a live MrBox we allocated; freed once (tag cleared above).
        drop(unsafe { Box::from_raw(m as *mut MrBox) });
        if let Some(mr) = mr {
            mr.dereg()?;
        }
        Ok(())
    })
}

fn covers(m: &MrBox, addr: u64, size: u64) -> Result<(), Error> {
    if size == 0 {
        return Ok(());
    }
    if addr < m.addr || addr.saturating_add(size) > m.addr + m.len {
        return Err(Error::OutOfRange {
            what: "buffer outside its registration",
            value: addr as i64,
            min: m.addr as i64,
            max: (m.addr + m.len) as i64,
        });
    }
    Ok(())
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
        let m = mr_ref(mhandle)?;
        if data.is_null() && size > 0 {
            return Err(missing("data"));
        }
        covers(m, data as u64, size)?;
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
        let m = mr_ref(mh)?;
        if d.is_null() && size > 0 {
            return Err(missing("data[i]"));
        }
        covers(m, d as u64, size)?;
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
        let (bufs, n) = gather(n, data, sizes, tags, mhandles)?;
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
        let (bufs, n) = gather(n, data, Sizes::Int(sizes), core::ptr::null(), mhandles)?;
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
