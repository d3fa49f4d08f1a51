//! What the plugin-level tests share: a process of its own for each test of a grouped binary
//! ([`isolate`]), the plugin initialised over the soft provider, the log lines it wrote,
//! connect/accept loops and a byte-verified transfer (through `api`, the version-agnostic
//! bodies of the exported C entry points). Each group binary includes it as its `util` module.
#![allow(dead_code)]

pub mod isolate;

// Not every binary uses both.
#[allow(unused_imports)]
pub use isolate::{ran_in_child, test_path};

use core::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ibnet_nccl::log::Level;
use ibnet_nccl::types::{ncclNetVDeviceProps_t, ncclResult_t, NCCL_NET_HANDLE_MAXSIZE};
use nccl_net_ibnet::api::{self, Sizes};

/// A listen handle.
pub type Handle = [u8; NCCL_NET_HANDLE_MAXSIZE];

static LINES: Mutex<Vec<(Level, String)>> = Mutex::new(Vec::new());

/// The log sink the tests install (records every line).
pub fn note(l: Level, s: &str) {
    LINES.lock().unwrap().push((l, s.to_string()));
    if std::env::var_os("IBNET_TEST_LOG").is_some() {
        eprintln!("{s}");
    }
}

/// Every line logged so far (and forgets them).
pub fn take_log() -> Vec<(Level, String)> {
    std::mem::take(&mut *LINES.lock().unwrap())
}

/// Sets `env` and initialises the plugin with the soft provider; false (after a loud SKIP
/// line) where the host refuses cross-memory attach.
pub fn init_soft(env: &[(&str, &str)]) -> bool {
    std::env::set_var("IBNET_PROVIDER", "soft");
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    if let Err(u) = ibnet_soft::probe_with(false) {
        eprintln!("SKIP: soft provider unavailable ({u:?})");
        return false;
    }
    ibnet_nccl::log::set_sink(note);
    assert_eq!(api::init(None, -1, None, None), ncclResult_t::Success);
    let mut n = 0;
    assert_eq!(api::devices(&mut n), ncclResult_t::Success);
    assert!(n >= 1, "soft provider: no device");
    true
}

/// Listens on device 0.
pub fn listen() -> (Handle, *mut c_void) {
    listen_on(0)
}

/// Listens on device `dev`.
pub fn listen_on(dev: c_int) -> (Handle, *mut c_void) {
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let mut l = core::ptr::null_mut();
    assert_eq!(
        api::listen(
            core::ptr::null_mut(),
            dev,
            h.as_mut_ptr() as *mut c_void,
            &mut l
        ),
        ncclResult_t::Success
    );
    (h, l)
}

/// The listener's address in `h`.
pub fn addr(h: &Handle) -> SocketAddr {
    ibnet_core::wire::ConnectHandle::decode(&h[..])
        .unwrap()
        .addr
}

/// The listener's nonce in `h`.
pub fn nonce(h: &Handle) -> u64 {
    ibnet_core::wire::ConnectHandle::decode(&h[..])
        .unwrap()
        .nonce
}

/// One `connect` call from device 0.
pub fn connect_once(h: &mut Handle) -> (ncclResult_t, *mut c_void) {
    connect_once_on(0, h)
}

/// One `connect` call from device `dev`.
pub fn connect_once_on(dev: c_int, h: &mut Handle) -> (ncclResult_t, *mut c_void) {
    let mut s = core::ptr::null_mut();
    let r = api::connect(
        core::ptr::null_mut(),
        dev,
        h.as_mut_ptr() as *mut c_void,
        &mut s,
        None,
    );
    (r, s)
}

/// One `accept` call.
pub fn accept_once(l: *mut c_void) -> (ncclResult_t, *mut c_void) {
    let mut r = core::ptr::null_mut();
    (api::accept(l, &mut r), r)
}

/// Calls connect (from device 0) and accept until both return a comm (every call must
/// succeed; `limit` is a hang guard); returns (send, recv, time taken).
pub fn establish(
    h: &mut Handle,
    l: *mut c_void,
    limit: Duration,
) -> (*mut c_void, *mut c_void, Duration) {
    establish_on(0, h, l, limit)
}

/// [`establish`], connecting from device `dev`.
pub fn establish_on(
    dev: c_int,
    h: &mut Handle,
    l: *mut c_void,
    limit: Duration,
) -> (*mut c_void, *mut c_void, Duration) {
    let t0 = Instant::now();
    let (mut s, mut r): (*mut c_void, *mut c_void) = (core::ptr::null_mut(), core::ptr::null_mut());
    while s.is_null() || r.is_null() {
        assert!(t0.elapsed() < limit, "no connection after {limit:?}");
        if s.is_null() {
            let (rc, c) = connect_once_on(dev, h);
            assert_eq!(rc, ncclResult_t::Success, "connect: {:?}", take_log());
            s = c;
        }
        if r.is_null() {
            let (rc, c) = accept_once(l);
            assert_eq!(rc, ncclResult_t::Success, "accept: {:?}", take_log());
            r = c;
        }
    }
    (s, r, t0.elapsed())
}

/// Registers `b` (host memory) on comm `c`; panics on failure.
pub fn reg(c: *mut c_void, b: &mut [u8]) -> *mut c_void {
    let mut mh = core::ptr::null_mut();
    let r = api::reg_mr(
        c,
        b.as_mut_ptr() as *mut c_void,
        b.len() as u64,
        0,
        None,
        &mut mh,
    );
    assert_eq!(r, ncclResult_t::Success);
    mh
}

/// Waits for `req` (None: an error); `limit` is a hang guard.
pub fn wait(req: *mut c_void, limit: Duration) -> Result<(), ncclResult_t> {
    let t0 = Instant::now();
    let mut done: c_int = 0;
    let mut size: c_int = 0;
    while done == 0 {
        assert!(t0.elapsed() < limit, "request not done after {limit:?}");
        match api::test(req, &mut done, &mut size) {
            ncclResult_t::Success => {}
            e => return Err(e),
        }
    }
    Ok(())
}

/// One `irecv` of all of `buf` (registered as `mh`) with `tag` on `r`: its result and request.
pub fn irecv_once(
    r: *mut c_void,
    buf: &mut [u8],
    mh: *mut c_void,
    tag: c_int,
) -> (ncclResult_t, *mut c_void) {
    let mut req: *mut c_void = core::ptr::null_mut();
    let mut data = [buf.as_mut_ptr() as *mut c_void];
    let sizes = [buf.len()];
    let tags = [tag];
    let mut mhs = [mh];
    let rc = api::irecv(
        r,
        1,
        data.as_mut_ptr(),
        Sizes::Size(sizes.as_ptr()),
        tags.as_ptr(),
        mhs.as_mut_ptr(),
        core::ptr::null_mut(),
        &mut req,
    );
    (rc, req)
}

/// Posts one receive of all of `buf` (registered as `mh`) with `tag` on `r`; its request.
pub fn post_recv(r: *mut c_void, buf: &mut [u8], mh: *mut c_void, tag: c_int) -> *mut c_void {
    let (rc, req) = irecv_once(r, buf, mh, tag);
    assert_eq!(rc, ncclResult_t::Success);
    assert!(!req.is_null());
    req
}

/// Sends `len` patterned bytes from `s` to `r` and verifies them.
pub fn transfer(s: *mut c_void, r: *mut c_void, len: usize, seed: u8) {
    let mut src: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    let mut dst = vec![0u8; len];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let rreq = post_recv(r, &mut dst, mr, 7);
    let mut sreq: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while sreq.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30), "isend never posted");
        let rc = api::isend(
            s,
            src.as_mut_ptr() as *mut c_void,
            len as u64,
            7,
            ms,
            core::ptr::null_mut(),
            &mut sreq,
        );
        assert_eq!(rc, ncclResult_t::Success);
    }
    let lim = Duration::from_secs(30);
    let t0 = Instant::now();
    let (mut sd, mut rd) = (false, false);
    while !(sd && rd) {
        assert!(t0.elapsed() < lim, "transfer not done");
        let mut d: c_int = 0;
        if !sd {
            assert_eq!(
                api::test(sreq, &mut d, core::ptr::null_mut()),
                ncclResult_t::Success
            );
            sd = d != 0;
        }
        if !rd {
            let mut sz: c_int = 0;
            assert_eq!(api::test(rreq, &mut d, &mut sz), ncclResult_t::Success);
            rd = d != 0;
        }
    }
    assert_eq!(src, dst, "bytes differ");
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(r, mr), ncclResult_t::Success);
}

/// Closes a pair and its listener.
pub fn close(s: *mut c_void, r: *mut c_void, l: *mut c_void) {
    assert_eq!(api::close_send(s), ncclResult_t::Success);
    assert_eq!(api::close_recv(r), ncclResult_t::Success);
    assert_eq!(api::close_listen(l), ncclResult_t::Success);
}

/// A small xorshift generator (deterministic junk).
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A fused NIC over soft0 and soft1 whose rail 1 fails at the WR the faults `spec` (armed on
/// soft1 only) picks; its send and receive comms and listener, `None` without the soft
/// provider.
pub fn fused_pair(spec: &str) -> Option<(*mut c_void, *mut c_void, *mut c_void)> {
    fused_pair_faults_on(spec, Some("1"))
}

/// [`fused_pair`] with the faults armed on soft device `dev` only, or on both (`None`).
pub fn fused_pair_faults_on(
    spec: &str,
    dev: Option<&str>,
) -> Option<(*mut c_void, *mut c_void, *mut c_void)> {
    let mut env = vec![
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "2"),
        ("IBNET_SOFT_FAULTS", spec),
    ];
    env.extend(dev.map(|d| ("IBNET_SOFT_FAULTS_DEV", d)));
    if !init_soft(&env) {
        return None;
    }
    let d = fuse_first_two();
    let (mut h, l) = listen_on(d);
    let (s, r, _) = establish_on(d, &mut h, l, Duration::from_secs(30));
    let _ = take_log();
    Some((s, r, l))
}

/// A virtual NIC fusing devices 0 and 1 (`makeVDevice`), its device number.
pub fn fuse_first_two() -> c_int {
    let mut d = -1;
    let p = ncclNetVDeviceProps_t {
        ndevs: 2,
        devs: [0, 1, 0, 0],
    };
    assert_eq!(api::make_vdevice(&mut d, &p), ncclResult_t::Success);
    d
}
