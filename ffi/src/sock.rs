//! Non-blocking TCP for the bootstrap handshake.
//!
//! NCCL calls `connect`/`accept` again and again until they produce a comm, so nothing here
//! ever waits: a listener accepts when a connection is queued, a connect is started and later
//! checked; [`crate::handshake_io`] then moves whatever bytes the kernel takes or has.
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use std::cell::Cell;
use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

/// Binds a non-blocking listener on `ip` with a kernel-chosen port and the system's largest
/// backlog (`SOMAXCONN`): a burst of stray connections must not fill the queue ahead of the
/// legitimate peer (accept drops them; see `api::accepting`).
pub fn listen(ip: SocketAddr) -> io::Result<TcpListener> {
    let mut a = ip;
    a.set_port(0);
    let l = TcpListener::bind(a)?;
    // SAFETY: plain listen(2) on our listening socket; Linux updates the backlog of a socket
    // that already listens.
    if unsafe { libc::listen(l.as_raw_fd(), libc::SOMAXCONN) } != 0 {
        return Err(io::Error::last_os_error());
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Accepts one queued connection, if any; the stream is non-blocking with `TCP_NODELAY`.
pub fn try_accept(l: &TcpListener) -> io::Result<Option<TcpStream>> {
    Ok(try_accept_from(l)?.map(|(s, _)| s))
}

/// [`try_accept`], with the peer's address.
pub fn try_accept_from(l: &TcpListener) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    match l.accept() {
        Ok((s, a)) => {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
            Ok(Some((s, a)))
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
            unsafe { core::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            core::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in6.
            unsafe { core::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            core::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Starts a non-blocking connect to `to`; finish it with [`connect_done`].
pub fn connect_start(to: &SocketAddr) -> io::Result<TcpStream> {
    connect_start_from(to, None)
}

std::thread_local! {
    /// The local address this thread's client sockets share (`NCCL_IB_SOCK_CLIENT_PORT_REUSE`).
    static CLIENT_ADDR: Cell<Option<SocketAddr>> = const { Cell::new(None) };
}

/// Like [`connect_start`], but with `NCCL_IB_SOCK_CLIENT_PORT_REUSE` (`reuse_from` = the
/// bootstrap address): every client socket of the calling thread (NCCL's proxy thread) binds
/// the same local port, with `SO_REUSEADDR` and `SO_REUSEPORT`, as the seed's RCCL does, so
/// a rank with many peers uses one ephemeral port instead of one per connection. A connect
/// that would repeat a live 4-tuple (`EADDRNOTAVAIL`, the same peer address twice) or a port
/// taken meanwhile falls back to an ephemeral port.
pub fn connect_start_from(
    to: &SocketAddr,
    reuse_from: Option<SocketAddr>,
) -> io::Result<TcpStream> {
    let Some(from) = reuse_from.filter(|f| f.is_ipv4() == to.is_ipv4()) else {
        return connect_fresh(to, None);
    };
    let local = CLIENT_ADDR.with(Cell::get).filter(|a| a.ip() == from.ip());
    let mut first = from;
    first.set_port(0);
    match connect_fresh(to, Some(local.unwrap_or(first))) {
        Ok(s) => {
            if local.is_none() {
                CLIENT_ADDR.with(|c| c.set(s.local_addr().ok()));
            }
            Ok(s)
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EADDRNOTAVAIL | libc::EADDRINUSE)
            ) =>
        {
            ibnet_nccl::info!(
                ibnet_nccl::log::NET,
                "NCCL_IB_SOCK_CLIENT_PORT_REUSE: {} to {to} is taken ({e}); using an ephemeral port",
                local.unwrap_or(first)
            );
            connect_fresh(to, None)
        }
        Err(e) => Err(e),
    }
}

fn set_reuse(fd: i32) -> io::Result<()> {
    let one: libc::c_int = 1;
    for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
        // SAFETY: `fd` is a live socket; the option value is a c_int of the given size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &one as *const libc::c_int as *const libc::c_void,
                core::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A new non-blocking socket connecting to `to`, bound first to `bind` (with address and port
/// reuse) when given.
fn connect_fresh(to: &SocketAddr, bind: Option<SocketAddr>) -> io::Result<TcpStream> {
    let fam = if to.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            fam,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own; the TcpStream closes it on drop.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    if let Some(b) = bind {
        set_reuse(fd)?;
        let (ss, len) = sockaddr(&b);
        // SAFETY: `ss` holds a valid sockaddr of `len` bytes.
        if unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let (ss, len) = sockaddr(to);
    // SAFETY: `ss` holds a valid sockaddr of `len` bytes.
    let rc = unsafe { libc::connect(fd, &ss as *const _ as *const libc::sockaddr, len) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) && e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
    s.set_nodelay(true)?;
    Ok(s)
}

/// Whether a connect started by [`connect_start`] has completed; its failure is an error.
pub fn connect_done(s: &TcpStream) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout (never blocks).
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    if rc == 0 {
        return Ok(false);
    }
    if let Some(e) = s.take_error()? {
        return Err(e);
    }
    if p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
        return Err(io::Error::from(ErrorKind::ConnectionRefused));
    }
    Ok(true)
}

/// TCP keepalive on a kept bootstrap socket: after `idle_s` seconds without traffic, `cnt`
/// probes `intvl_s` apart; no answer makes the socket fail (`ETIMEDOUT`), so a silent (dead
/// or partitioned) host is noticed within `idle_s + cnt × intvl_s` seconds.
/// `TCP_USER_TIMEOUT` bounds unacknowledged data the same way.
pub fn keepalive(s: &TcpStream, idle_s: i32, intvl_s: i32, cnt: i32) -> io::Result<()> {
    let user_ms = (idle_s + cnt * intvl_s) * 1000;
    let opts = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_s),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, intvl_s),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, cnt),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_ms),
    ];
    for (level, name, v) in opts {
        // SAFETY: setsockopt on our socket with a valid c_int of the stated size.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                name,
                &v as *const libc::c_int as *const libc::c_void,
                core::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connected(c: io::Result<TcpStream>, l: &TcpListener) -> TcpStream {
        let c = c.unwrap();
        while !connect_done(&c).unwrap() {}
        while try_accept(l).unwrap().is_none() {}
        c
    }

    #[test]
    fn client_port_reuse_shares_one_port_per_thread() {
        std::thread::spawn(|| {
            let from: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let (l1, l2) = (listen(from).unwrap(), listen(from).unwrap());
            let (a1, a2) = (l1.local_addr().unwrap(), l2.local_addr().unwrap());
            let c1 = connected(connect_start_from(&a1, Some(from)), &l1);
            let c2 = connected(connect_start_from(&a2, Some(from)), &l2);
            let p = c1.local_addr().unwrap().port();
            assert_eq!(
                c2.local_addr().unwrap().port(),
                p,
                "one local port for both peers"
            );
            // The same peer again would repeat the 4-tuple: an ephemeral port instead.
            let c3 = connected(connect_start_from(&a1, Some(from)), &l1);
            assert_ne!(c3.local_addr().unwrap().port(), p);
            // Without reuse: ephemeral ports.
            let c4 = connected(connect_start(&a2), &l2);
            assert_ne!(c4.local_addr().unwrap().port(), p);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn refused_connect_is_error() {
        let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = l.local_addr().unwrap();
        drop(l);
        let r = connect_start(&to).and_then(|c| loop {
            if connect_done(&c)? {
                break Ok(());
            }
            std::thread::yield_now();
        });
        assert!(r.is_err());
    }
}
