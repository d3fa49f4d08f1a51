//! The handle bytes NCCL gives to `connect`, through the exported v11 table of the real plugin
//! (`IBNET_PROVIDER=soft`, so a device exists without RDMA hardware).
//!
//! Input: NCCL's 128-byte handle (shorter inputs are zero-filled, longer ones cut).
//! Oracles: a handle that decodes re-encodes to the same 64 bytes; `connect` never succeeds
//! with a comm here, never panics across `extern "C"`, and leaves `*sendComm` NULL on error.
//!
//! No packet leaves the host: a handle that decodes is re-pointed, before `connect` sees it,
//! at a loopback port that is bound but not listening (IPv4 or IPv6 as the handle says), so the
//! TCP connect is refused at once. Everything else in the handle (family, provider tag, nonce,
//! reserved bytes, the scratch area with the progress token) reaches `connect` as fuzzed.
#![no_main]

use std::ffi::c_void;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use ibnet_core::wire::{ConnectHandle, HANDLE_SCRATCH_OFFSET, NCCL_NET_HANDLE_MAXSIZE};
use ibnet_core::Error;
use libfuzzer_sys::fuzz_target;
use nccl_net_ibnet::abi::exports::ncclNetPlugin_v11 as NET;
use ibnet_nccl::types::ncclResult_t;

struct Env {
    ctx: usize,
    /// Bound, never listening: connects to these are refused.
    v4: SocketAddr,
    v6: Option<SocketAddr>,
    _socks: Vec<OwnedFd>,
}

/// A TCP socket bound to `ip` port 0 and never listened on.
fn closed_port(ip: std::net::IpAddr) -> Option<(SocketAddr, OwnedFd)> {
    // std cannot bind a TCP socket without listening on it: use the socket calls directly.
    let fam = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed sockaddr_storage is a valid value; we fill the family's fields.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match ip {
        std::net::IpAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::IpAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_addr.s6_addr = a.octets();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: `ss` holds a valid sockaddr of `len` bytes.
    let rc = unsafe {
        libc::bind(
            owned.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return None;
    }
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `ss` is writable for `len` bytes.
    let rc = unsafe {
        libc::getsockname(
            owned.as_raw_fd(),
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: the family's struct was written by getsockname.
    let port = unsafe {
        match ip {
            std::net::IpAddr::V4(_) => (*(&ss as *const _ as *const libc::sockaddr_in)).sin_port,
            std::net::IpAddr::V6(_) => (*(&ss as *const _ as *const libc::sockaddr_in6)).sin6_port,
        }
    };
    Some((SocketAddr::new(ip, u16::from_be(port)), owned))
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        // Before the plugin reads its environment (once, at its first init).
        std::env::set_var("IBNET_PROVIDER", "soft");
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        std::env::set_var("IBNET_HANDSHAKE_TIMEOUT", "1");
        std::env::set_var("IBNET_SOFT_WORKERS", "0");
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: the table's init with a valid out pointer, no config, no logger.
        let rc = unsafe {
            (NET.init.expect("in the table"))(&mut ctx, 0, std::ptr::null_mut(), None, None)
        };
        assert_eq!(rc, ncclResult_t::Success);
        let mut n = 0;
        // SAFETY: valid out pointer.
        assert_eq!(
            unsafe { (NET.devices.expect("in the table"))(&mut n) },
            ncclResult_t::Success
        );
        if n < 1 {
            eprintln!("connect_handle: no soft device (cross-memory attach refused?): shallow run");
        }
        let (v4, s4) = closed_port(Ipv4Addr::LOCALHOST.into()).expect("a loopback IPv4 port");
        let mut socks = vec![s4];
        let v6 = closed_port(Ipv6Addr::LOCALHOST.into()).map(|(a, s)| {
            socks.push(s);
            a
        });
        Env {
            ctx: ctx as usize,
            v4,
            v6,
            _socks: socks,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let e = env();
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let n = data.len().min(h.len());
    h[..n].copy_from_slice(&data[..n]);
    let decoded = ConnectHandle::decode(&h);
    match decoded {
        Ok(ch) => {
            let mut again = [0u8; NCCL_NET_HANDLE_MAXSIZE];
            ch.encode(&mut again).expect("a decoded handle encodes");
            assert_eq!(
                &again[..HANDLE_SCRATCH_OFFSET],
                &h[..HANDLE_SCRATCH_OFFSET],
                "handle re-encodes to other bytes"
            );
            // Re-point it at a refused loopback port; keep nonce, provider and scratch.
            let to = match ch.addr {
                SocketAddr::V6(_) => e.v6.unwrap_or(e.v4),
                SocketAddr::V4(_) => e.v4,
            };
            let safe = ConnectHandle { addr: to, ..ch };
            let scratch = h[HANDLE_SCRATCH_OFFSET..].to_vec();
            safe.encode(&mut h).expect("loopback handle encodes");
            h[HANDLE_SCRATCH_OFFSET..].copy_from_slice(&scratch);
        }
        Err(err) => assert!(matches!(err, Error::Wire { .. }), "{err:?}"),
    }
    let mut comm: *mut c_void = std::ptr::null_mut();
    // SAFETY: the table's connect with the context from init, a 128-byte handle and a valid
    // out pointer, as NCCL calls it.
    let rc = unsafe {
        (NET.connect.expect("in the table"))(
            e.ctx as *mut c_void,
            0,
            h.as_mut_ptr().cast(),
            &mut comm,
            std::ptr::null_mut(),
        )
    };
    assert!(comm.is_null(), "connect made a comm to a refused port");
    if decoded.is_err() {
        assert_ne!(
            rc,
            ncclResult_t::Success,
            "an undecodable handle was accepted"
        );
    }
});
