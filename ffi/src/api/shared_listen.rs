//! `NCCL_IB_SOCK_SERVER_PORT_REUSE`: the listen comms a thread creates share one listening
//! socket (one port), as the seed (RCCL) does, so a rank with many peers uses one port.
//!
//! The seed hands every connection on the shared socket to whichever listen comm calls
//! `accept`. ibnet's handles carry a nonce per listen comm, so here a connection is routed by
//! the nonce in its `Hello`, read with `MSG_PEEK` (the acceptor's machine reads it again):
//!
//! ```text
//!  accept(lc) ─▶ accept every queued connection ─▶ unrouted
//!  unrouted: 16 bytes peekable? ─▶ nonce of a live listen comm L ─▶ L's inbox
//!                               └▶ unknown nonce, not a Hello, EOF ─▶ the caller's inbox
//!            still short after the handshake timeout ─▶ the caller's inbox
//!  lc takes its inbox (its `Pending` handshakes them as usual and refuses what is hostile)
//! ```
//!
//! The socket closes when the last listen comm using it does (the seed closes it with the
//! first). Control path only: one mutex per shared socket.

use std::cell::RefCell;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ibnet_core::wire::{Hello, HELLO_LEN};

use crate::sock;

/// A connection and its peer's address, as `accept` hands it to `Pending`.
pub(super) type Conn = (TcpStream, SocketAddr);

/// One thread's shared listening socket.
pub(super) struct SharedListener {
    listener: TcpListener,
    state: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    /// Accepted, their `Hello` not readable yet (since when).
    unrouted: Vec<(Conn, Instant)>,
    /// Per live listen comm (its nonce): connections routed to it, not taken yet.
    inbox: Vec<(u64, Vec<Conn>)>,
}

thread_local! {
    /// This thread's shared socket, while a listen comm uses it.
    static SHARED: RefCell<Weak<SharedListener>> = const { RefCell::new(Weak::new()) };
}

impl SharedListener {
    /// This thread's shared socket on `bind`'s address (created by the first listen), with
    /// `nonce` registered for routing.
    pub(super) fn join(bind: SocketAddr, nonce: u64) -> std::io::Result<Arc<Self>> {
        let s = SHARED.with(|w| -> std::io::Result<Arc<Self>> {
            let mut w = w.borrow_mut();
            if let Some(s) = w
                .upgrade()
                .filter(|s| s.listener.local_addr().is_ok_and(|a| a.ip() == bind.ip()))
            {
                return Ok(s);
            }
            let s = Arc::new(Self {
                listener: sock::listen(bind)?,
                state: Mutex::new(Routes::default()),
            });
            *w = Arc::downgrade(&s);
            Ok(s)
        })?;
        s.routes().inbox.push((nonce, Vec::new()));
        Ok(s)
    }

    /// The shared socket's address (every handle of this thread carries it).
    pub(super) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// A listen comm closes: its routed connections are dropped, its nonce forgotten.
    pub(super) fn leave(&self, nonce: u64) {
        self.routes().inbox.retain(|(n, _)| *n != nonce);
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accepts what is queued, routes what can be, and returns up to `max` connections for
    /// the listen comm of `nonce` (older first). An accept error is returned after routing.
    pub(super) fn take(
        &self,
        nonce: u64,
        max: usize,
        timeout: Duration,
    ) -> (Vec<Conn>, Option<std::io::Error>) {
        let mut r = self.routes();
        let mut err = None;
        loop {
            match sock::try_accept_from(&self.listener) {
                Ok(Some(c)) => r.unrouted.push((c, Instant::now())),
                Ok(None) => break,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let now = Instant::now();
        let unrouted = std::mem::take(&mut r.unrouted);
        for (c, since) in unrouted {
            let to = match peek_nonce(&c.0) {
                Peek::Short if now.duration_since(since) < timeout => {
                    r.unrouted.push((c, since));
                    continue;
                }
                Peek::Nonce(n) if r.inbox.iter().any(|(m, _)| *m == n) => n,
                _ => nonce,
            };
            if let Some((_, q)) = r.inbox.iter_mut().find(|(m, _)| *m == to) {
                q.push(c);
            }
        }
        let mine = r
            .inbox
            .iter_mut()
            .find(|(m, _)| *m == nonce)
            .map(|(_, q)| {
                let k = q.len().min(max);
                q.drain(..k).collect()
            })
            .unwrap_or_default();
        (mine, err)
    }
}

/// What the first bytes of a connection say.
enum Peek {
    /// Fewer than a `Hello`'s bytes have arrived.
    Short,
    /// A well-formed `Hello` with this nonce.
    Nonce(u64),
    /// Not a `Hello`, closed, or an error: whoever takes it refuses it.
    Other,
}

fn peek_nonce(s: &TcpStream) -> Peek {
    let mut b = [0u8; HELLO_LEN];
    match s.peek(&mut b) {
        Ok(0) => Peek::Other,
        Ok(n) if n < HELLO_LEN => Peek::Short,
        Ok(_) => Hello::decode(&b).map_or(Peek::Other, |h| Peek::Nonce(h.nonce)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Peek::Short,
        Err(_) => Peek::Other,
    }
}
