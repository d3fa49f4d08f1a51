//! Reaching a peer provider, and noticing when its process dies.
//!
//! * **In-process** (same pid): the peer's [`Segment`] is found in a process-wide registry by
//!   its nonce; copies are atomic word copies, or `process_vm_writev` into our own pid above
//!   `segment::WORD_COPY_MAX` (see `segment::copy_leased`).
//! * **Cross-process** (same host): the peer's memfd is opened through
//!   `/proc/<pid>/fd/<fd>` and mapped; a `pidfd` of the peer is watched by the provider's
//!   monitor thread, which sets [`Peer::dead`] within [`MONITOR_PERIOD`] of the peer's exit.
//!   Copies use `process_vm_writev`/`readv`.
//!
//! The hot path only ever loads `Peer::dead`; everything else here is control path.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use ibnet_core::Error;

use crate::addr::SoftAddr;
use crate::segment::{Fabric, Segment, MAGIC};
use crate::sys;

/// How often the monitor looks at its peers' pidfds.
pub const MONITOR_PERIOD: Duration = Duration::from_millis(50);

/// The message for a refused cross-memory attach (the `call` of [`Error::Provider`]).
pub const CMA_REFUSED: &str = "process_vm_readv/writev into the peer refused: cross-memory attach \
    is not permitted (Yama ptrace_scope, seccomp or an LSM). Fix: sysctl \
    kernel.yama.ptrace_scope=0, or keep IBNET_SOFT_PTRACER=1 with ptrace_scope=1, or run the \
    ranks in one container/PID namespace with CAP_SYS_PTRACE";

/// A peer provider instance.
#[derive(Debug)]
pub struct Peer {
    /// The peer's segment (its registration table and QP blocks), mapped here.
    pub seg: Arc<Segment>,
    /// How to copy into its memory.
    pub fabric: Fabric,
    /// Set (Release) by the monitor once the peer process has exited.
    pub dead: AtomicBool,
    /// Our lease lane in the peer's segment (see `segment`, "Lanes").
    pub lane: u8,
    pidfd: Option<OwnedFd>,
}

impl Peer {
    /// Has the peer's process exited?
    #[inline]
    pub fn is_dead(&self) -> bool {
        // Acquire: pairs with the monitor's Release store.
        self.dead.load(Ordering::Acquire)
    }

    /// Takes a lease on the peer's registration `key` in our lane (`own`: the peer is our own
    /// provider, a loopback QP: the owner's lane). See [`Segment::lease_lane`].
    #[inline]
    pub fn lease(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: u32,
        own: bool,
    ) -> Result<crate::segment::Lease<'_>, crate::segment::LeaseError> {
        let lane = if own {
            crate::segment::OWN_LANE
        } else {
            self.lane
        };
        self.seg.lease_lane(key, addr, len, need, lane)
    }

    /// Marks the peer dead (the monitor, or a copy that failed with ESRCH).
    pub fn mark_dead(&self) {
        // Release: pairs with the Acquire load in `is_dead`.
        self.dead.store(true, Ordering::Release);
    }
}

static LOCAL: Mutex<Vec<Weak<Segment>>> = Mutex::new(Vec::new());

/// Makes an own segment findable by in-process peers.
pub fn register_local(seg: &Arc<Segment>) {
    let mut l = LOCAL.lock().unwrap_or_else(|p| p.into_inner());
    l.retain(|w| w.strong_count() > 0);
    l.push(Arc::downgrade(seg));
}

fn find_local(nonce: u64) -> Option<Arc<Segment>> {
    let l = LOCAL.lock().unwrap_or_else(|p| p.into_inner());
    l.iter()
        .filter_map(Weak::upgrade)
        .find(|s| s.nonce == nonce)
}

fn os_err(call: &'static str, e: &io::Error) -> Error {
    Error::Provider {
        call,
        errno: e.raw_os_error().unwrap_or(0),
    }
}

/// Resolves `a` to a peer: in-process or attached cross-process; claims a lease lane in its
/// segment for our provider (nonce `me`). Control path.
pub fn resolve(a: &SoftAddr, me: u64) -> Result<Arc<Peer>, Error> {
    if a.pid == sys::getpid() {
        let seg = find_local(a.nonce).ok_or(Error::Wire {
            what: "soft provider address names no live provider in this process",
            value: a.nonce,
        })?;
        let lane = seg.claim_lane(a.pid, me);
        return Ok(Arc::new(Peer {
            seg,
            fabric: Fabric::InProc,
            dead: AtomicBool::new(false),
            lane,
            pidfd: None,
        }));
    }
    // The pidfd first: if the pid is reused after this point, the pidfd still names the process
    // we attach to below (the segment's nonce proves it is the right one).
    let pidfd = match sys::pidfd_open(a.pid) {
        Ok(fd) => Some(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => None,
        Err(e) => return Err(os_err("pidfd_open (peer process gone?)", &e)),
    };
    let seg = Segment::attach(a.pid, a.fd, a.nonce).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => os_err(CMA_REFUSED, &e),
        Some(_) => os_err("open /proc/<pid>/fd/<fd> of the peer's segment", &e),
        None => Error::Wire {
            what: "peer segment identity or size",
            value: a.nonce,
        },
    })?;
    // Probe cross-memory attach now, so a refusal is one clear error at connect time.
    let mut m = 0u64;
    match sys::cma_read_u64(a.pid, a.magic_addr, &mut m) {
        Ok(()) if m == MAGIC => {}
        Ok(()) => {
            return Err(Error::Wire {
                what: "peer segment magic via CMA",
                value: m,
            })
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) => {
            return Err(os_err(CMA_REFUSED, &e))
        }
        Err(e) => return Err(os_err("process_vm_readv (probe of the peer)", &e)),
    }
    let lane = seg.claim_lane(sys::getpid(), me);
    Ok(Arc::new(Peer {
        seg: Arc::new(seg),
        fabric: Fabric::Cross {
            pid: a.pid,
            base: a.magic_addr,
        },
        dead: AtomicBool::new(false),
        lane,
        pidfd,
    }))
}

struct MonState {
    stop: bool,
    peers: Vec<Arc<Peer>>,
}

struct MonShared {
    st: Mutex<MonState>,
    cv: Condvar,
}

/// The liveness monitor: one thread per provider, started with the first cross-process peer,
/// joined by [`Monitor::stop`].
pub struct Monitor {
    sh: Arc<MonShared>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Default for Monitor {
    fn default() -> Self {
        Self {
            sh: Arc::new(MonShared {
                st: Mutex::new(MonState {
                    stop: false,
                    peers: Vec::new(),
                }),
                cv: Condvar::new(),
            }),
            handle: Mutex::new(None),
        }
    }
}

impl Monitor {
    /// Watches `p` until it dies or nobody else holds it.
    pub fn watch(&self, p: &Arc<Peer>) -> Result<(), Error> {
        if p.fabric == Fabric::InProc {
            return Ok(());
        }
        let mut h = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut st = self.sh.st.lock().unwrap_or_else(|e| e.into_inner());
            if st.stop {
                return Err(Error::BadState {
                    op: "connect_qp",
                    state: "provider shut down",
                });
            }
            if !st.peers.iter().any(|q| Arc::ptr_eq(q, p)) {
                st.peers.push(p.clone());
            }
        }
        if h.is_none() {
            let sh = self.sh.clone();
            let t = std::thread::Builder::new()
                .name("ibnet-soft-mon".into())
                .spawn(move || monitor_loop(&sh))
                .map_err(|e| os_err("spawn monitor thread", &e))?;
            *h = Some(t);
        }
        Ok(())
    }

    /// Stops and joins the thread (idempotent).
    pub fn stop(&self) {
        {
            let mut st = self.sh.st.lock().unwrap_or_else(|e| e.into_inner());
            st.stop = true;
            st.peers.clear();
        }
        self.sh.cv.notify_all();
        let t = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

fn monitor_loop(sh: &MonShared) {
    let mut fds = Vec::new();
    let mut ready = Vec::new();
    let mut st = sh.st.lock().unwrap_or_else(|e| e.into_inner());
    while !st.stop {
        // Forget peers nobody else holds any more, and those already dead.
        st.peers
            .retain(|p| Arc::strong_count(p) > 1 && !p.is_dead());
        fds.clear();
        fds.extend(
            st.peers
                .iter()
                .map(|p| p.pidfd.as_ref().map_or(-1, |f| f.as_raw_fd())),
        );
        if !fds.is_empty() && sys::poll_readable(&fds, &mut ready).is_ok() {
            for (p, &r) in st.peers.iter().zip(&ready) {
                let gone = match (&p.pidfd, p.fabric) {
                    (Some(_), _) => r,
                    (None, Fabric::Cross { pid, .. }) => !sys::pid_alive(pid),
                    (None, Fabric::InProc) => false,
                };
                if gone {
                    p.mark_dead();
                }
            }
        }
        st = sh
            .cv
            .wait_timeout(st, MONITOR_PERIOD)
            .map_or_else(|e| e.into_inner().0, |r| r.0);
    }
}
