//! An **in-process double** of a net plugin for the proxy engine (`ibnet-proxy`): [`Net`] over ibnet's own comms ([`SendComm`] / [`RecvComm`] on any
//! [`Provider`]), with both ends of every connection in this process and no sockets.
//!
//! It exists for the tests, the benches and single-host tools: one proxy thread serves both
//! directions of every connection through the same `InProcessNet`. It is not how the plugin
//! runs: across processes `ibnet-ffi`'s plugin table carries the same comms with a socket
//! handshake, and the engine drives that through its own `Net` impl.
//!
//! Comms, listeners and registrations live in fixed tables inside the `InProcessNet`
//! (capacities `C` comms per direction and [`IN_PROCESS_MRS`] registrations); handles are table
//! indices. Connection setup is an in-process rendezvous: `listen` returns a handle naming a
//! mailbox in this `InProcessNet`, `connect` creates the send comm and leaves its `QpInfo` in
//! the mailbox, `accept` creates the receive comm from it and answers, and the next `connect`
//! call completes.
//!
//! ```text
//!  listen  ─▶ mailbox m, handle = "IBPX" m gen
//!  connect(handle) #1: SendComm::new, mailbox.conn = send.local_info()   → None
//!  accept(m):          RecvComm::new(conn), mailbox.acc = recv.local_info() → Some(recv)
//!  connect(handle) #2: send.connect(acc)                                  → Some(send)
//! ```

use ibnet_core::comm::{CommConfig, RecvBuf, RecvComm, SendComm};
use ibnet_core::error::{Error, Result};
use ibnet_core::provider::{Access, MrKeys, Provider, RegKind};
use ibnet_core::request::ReqId;
use ibnet_core::wire::QpInfo;
use ibnet_proxy::net::{CommRef, Net, NetBuf, NetHandle, NetProps, PtrType, SizeReport};
use ibnet_proxy::MAX_RECVS;

/// Registrations one [`InProcessNet`] holds.
pub const IN_PROCESS_MRS: usize = 128;

const MAGIC: [u8; 4] = *b"IBPX";

/// A registration handle of [`InProcessNet`]: table slot + keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProcessMr {
    slot: u16,
    keys: MrKeys,
}

impl InProcessMr {
    /// The registration's keys.
    pub fn keys(&self) -> MrKeys {
        self.keys
    }
}

#[derive(Default)]
struct Mailbox {
    used: bool,
    gen: u16,
    listening: bool,
    accepted: bool,
    connected: bool,
    conn_info: Option<QpInfo>,
    acc_info: Option<QpInfo>,
}

/// [`Net`] over ibnet's comms on provider `P`, with room for `C` comms per direction.
pub struct InProcessNet<P: Provider + Clone, const C: usize = 8> {
    dev: P,
    cfg: CommConfig,
    props: NetProps,
    sends: [Option<SendComm<P>>; C],
    recvs: [Option<RecvComm<P>>; C],
    pending: [Option<SendComm<P>>; C],
    mailbox: [Mailbox; C],
    mrs: [Option<P::Mr>; IN_PROCESS_MRS],
}

impl<P: Provider + Clone, const C: usize> InProcessNet<P, C> {
    /// A `InProcessNet` opening comms on `dev` with `cfg`. Properties: up to 8 grouped receives,
    /// no DMA-BUF, multi-receive sizes in bytes (ibnet's comms report them).
    pub fn new(dev: P, cfg: CommConfig) -> Self {
        const { assert!(C > 0 && C <= u16::MAX as usize) };
        Self {
            dev,
            cfg,
            props: NetProps {
                max_recvs: MAX_RECVS,
                dmabuf: false,
                sizes: SizeReport::Bytes,
            },
            sends: core::array::from_fn(|_| None),
            recvs: core::array::from_fn(|_| None),
            pending: core::array::from_fn(|_| None),
            mailbox: core::array::from_fn(|_| Mailbox::default()),
            mrs: core::array::from_fn(|_| None),
        }
    }

    /// Overrides the reported properties (e.g. `max_recvs = 1` to turn grouping off, or
    /// `dmabuf = true` over a provider that registers DMA-BUFs).
    pub fn with_props(mut self, props: NetProps) -> Self {
        self.props = props;
        self
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.dev
    }

    /// Live comms (send, receive), for leak checks.
    pub fn live_comms(&self) -> (usize, usize) {
        let s = self.sends.iter().filter(|c| c.is_some()).count()
            + self.pending.iter().filter(|c| c.is_some()).count();
        (s, self.recvs.iter().filter(|c| c.is_some()).count())
    }

    /// Live listeners/mailboxes and registrations, for leak checks.
    pub fn live_listens_and_mrs(&self) -> (usize, usize) {
        (
            self.mailbox.iter().filter(|m| m.used).count(),
            self.mrs.iter().filter(|m| m.is_some()).count(),
        )
    }

    fn send(&mut self, c: u16) -> Result<&mut SendComm<P>> {
        self.sends
            .get_mut(c as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::Missing { what: "send comm" })
    }

    fn recv(&mut self, c: u16) -> Result<&mut RecvComm<P>> {
        self.recvs
            .get_mut(c as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::Missing { what: "recv comm" })
    }

    fn free_slot<T>(t: &[Option<T>], what: &'static str) -> Result<usize> {
        t.iter()
            .position(Option::is_none)
            .ok_or(Error::Full { what, cap: t.len() })
    }

    fn mailbox_of(&mut self, handle: &NetHandle) -> Result<usize> {
        let bad = |value| Error::Wire {
            what: "proxy connect handle",
            value,
        };
        if handle[..4] != MAGIC {
            return Err(bad(
                u32::from_le_bytes([handle[0], handle[1], handle[2], handle[3]]) as u64,
            ));
        }
        let m = u16::from_le_bytes([handle[4], handle[5]]) as usize;
        let gen = u16::from_le_bytes([handle[6], handle[7]]);
        match self.mailbox.get(m) {
            Some(b) if b.used && b.gen == gen => Ok(m),
            _ => Err(bad(m as u64)),
        }
    }

    /// Frees mailbox `m` once nobody needs it any more.
    fn maybe_release(&mut self, m: usize) {
        let b = &mut self.mailbox[m];
        let connector_done = b.connected || b.conn_info.is_none();
        if b.used && !b.listening && connector_done {
            let gen = b.gen;
            *b = Mailbox {
                gen,
                ..Mailbox::default()
            };
        }
    }

    fn rbufs(bufs: &[NetBuf<InProcessMr>], out: &mut [RecvBuf; MAX_RECVS]) -> Result<usize> {
        if bufs.len() > MAX_RECVS {
            return Err(Error::OutOfRange {
                what: "buffers in one irecv",
                value: bufs.len() as i64,
                min: 1,
                max: MAX_RECVS as i64,
            });
        }
        for (o, b) in out.iter_mut().zip(bufs) {
            *o = rbuf(b);
        }
        Ok(bufs.len())
    }
}

/// The comm's receive buffer for an engine buffer.
#[inline(always)]
fn rbuf(b: &NetBuf<InProcessMr>) -> RecvBuf {
    RecvBuf {
        addr: b.addr,
        size: b.size as u64,
        tag: b.tag,
        mr: b.mr.keys,
    }
}

impl<P: Provider + Clone, const C: usize> Net for InProcessNet<P, C> {
    type Listen = u16;
    type Send = u16;
    type Recv = u16;
    type Mr = InProcessMr;
    type Req = ReqId;

    // The comms need no word when the GPU consumed a receive (`irecv_consumed` is the no-op
    // default).
    const IRECV_CONSUMED: bool = false;

    fn properties(&mut self, dev: u32) -> Result<NetProps> {
        check_dev(dev)?;
        Ok(self.props)
    }

    fn listen(&mut self, dev: u32, handle: &mut NetHandle) -> Result<u16> {
        check_dev(dev)?;
        let m = self
            .mailbox
            .iter()
            .position(|b| !b.used)
            .ok_or(Error::Full {
                what: "InProcessNet listeners",
                cap: C,
            })?;
        let b = &mut self.mailbox[m];
        b.gen = b.gen.wrapping_add(1);
        b.used = true;
        b.listening = true;
        *handle = [0; 128];
        handle[..4].copy_from_slice(&MAGIC);
        handle[4..6].copy_from_slice(&(m as u16).to_le_bytes());
        handle[6..8].copy_from_slice(&b.gen.to_le_bytes());
        Ok(m as u16)
    }

    fn connect(&mut self, dev: u32, handle: &NetHandle) -> Result<Option<u16>> {
        check_dev(dev)?;
        let m = self.mailbox_of(handle)?;
        if self.mailbox[m].connected {
            return Err(Error::BadState {
                op: "connect",
                state: "handle already connected",
            });
        }
        if self.pending[m].is_none() {
            let s = SendComm::new(self.dev.clone(), self.cfg)?;
            self.mailbox[m].conn_info = Some(s.local_info());
            self.pending[m] = Some(s);
            return Ok(None);
        }
        let Some(info) = self.mailbox[m].acc_info.take() else {
            return Ok(None);
        };
        let slot = Self::free_slot(&self.sends, "InProcessNet send comms")?;
        let mut s = self.pending[m].take().ok_or(Error::BadState {
            op: "connect",
            state: "no pending comm",
        })?;
        s.connect(&info)?;
        self.sends[slot] = Some(s);
        self.mailbox[m].connected = true;
        self.maybe_release(m);
        Ok(Some(slot as u16))
    }

    fn accept(&mut self, listen: u16) -> Result<Option<u16>> {
        let m = listen as usize;
        let b = self
            .mailbox
            .get(m)
            .filter(|b| b.used && b.listening)
            .ok_or(Error::Missing {
                what: "listen comm",
            })?;
        if b.accepted {
            return Err(Error::BadState {
                op: "accept",
                state: "already accepted",
            });
        }
        let Some(info) = b.conn_info.as_ref() else {
            return Ok(None);
        };
        let slot = Self::free_slot(&self.recvs, "InProcessNet recv comms")?;
        let r = RecvComm::new(self.dev.clone(), self.cfg, info)?;
        let b = &mut self.mailbox[m];
        b.acc_info = Some(r.local_info());
        b.accepted = true;
        self.recvs[slot] = Some(r);
        Ok(Some(slot as u16))
    }

    fn reg_mr(
        &mut self,
        _comm: CommRef<u16, u16>,
        addr: u64,
        size: usize,
        _ptr: PtrType,
        dmabuf: Option<(i32, u64)>,
    ) -> Result<InProcessMr> {
        let slot = Self::free_slot(&self.mrs, "InProcessNet registrations")?;
        let kind = match dmabuf {
            Some((fd, offset)) => RegKind::DmaBuf { fd, offset },
            None => RegKind::Plain,
        };
        let mr = self.dev.reg_mr(addr, size as u64, Access::ALL, kind)?;
        let keys = self.dev.mr_keys(&mr);
        self.mrs[slot] = Some(mr);
        Ok(InProcessMr {
            slot: slot as u16,
            keys,
        })
    }

    fn dereg_mr(&mut self, _comm: CommRef<u16, u16>, mr: InProcessMr) -> Result<()> {
        let m = self
            .mrs
            .get_mut(mr.slot as usize)
            .and_then(Option::take)
            .ok_or(Error::Missing {
                what: "registration",
            })?;
        self.dev.dereg_mr(m)
    }

    #[inline(always)]
    fn isend(
        &mut self,
        comm: u16,
        addr: u64,
        size: usize,
        tag: u32,
        mr: InProcessMr,
    ) -> Result<Option<ReqId>> {
        self.send(comm)?.isend(addr, size as u64, tag, mr.keys)
    }

    #[inline(always)]
    fn send_ready(&mut self, comm: u16) -> bool {
        // An unknown comm answers `true`: `isend` reports it.
        self.sends
            .get(comm as usize)
            .and_then(Option::as_ref)
            .is_none_or(SendComm::peer_posted)
    }

    #[inline(always)]
    fn irecv(&mut self, comm: u16, bufs: &[NetBuf<InProcessMr>]) -> Result<Option<ReqId>> {
        if let [b] = bufs {
            // One buffer (the common case): no table of `MAX_RECVS` to fill.
            return self.recv(comm)?.irecv(&[rbuf(b)]);
        }
        let mut rb = [RecvBuf::default(); MAX_RECVS];
        let n = Self::rbufs(bufs, &mut rb)?;
        self.recv(comm)?.irecv(&rb[..n])
    }

    fn iflush(&mut self, comm: u16, bufs: &[NetBuf<InProcessMr>]) -> Result<Option<ReqId>> {
        let mut rb = [RecvBuf::default(); MAX_RECVS];
        let n = Self::rbufs(bufs, &mut rb)?;
        self.recv(comm)?.iflush(&rb[..n])
    }

    #[inline(always)]
    fn test(
        &mut self,
        comm: CommRef<u16, u16>,
        req: ReqId,
        sizes: &mut [usize; MAX_RECVS],
    ) -> Result<bool> {
        let done = match comm {
            CommRef::Send(c) => self.send(c)?.test(req),
            CommRef::Recv(c) => self.recv(c)?.test(req),
        };
        // Read the sizes where the comm returned them (a `Done` is 72 bytes: no copy).
        let d = match done {
            Ok(Some(ref d)) => d,
            Ok(None) => return Ok(false),
            Err(e) => return Err(e),
        };
        let n = usize::from(d.n).min(MAX_RECVS);
        if n == 1 {
            // A send or a single receive (the common case): one word, no copy loop.
            sizes[0] = d.sizes[0] as usize;
        } else {
            for (o, s) in sizes.iter_mut().zip(&d.sizes[..n]) {
                *o = *s as usize;
            }
        }
        Ok(true)
    }

    #[inline(always)]
    fn test_send(&mut self, comm: u16, req: ReqId) -> Result<bool> {
        // No sizes to copy: only whether the comm returned a `Done`.
        Ok(self.send(comm)?.test(req)?.is_some())
    }

    #[inline(always)]
    fn test_recv1(&mut self, comm: u16, req: ReqId) -> Result<Option<usize>> {
        // A single receive: its one size, read where the comm returned it.
        Ok(self.recv(comm)?.test(req)?.map(|d| d.sizes[0] as usize))
    }

    fn close_send(&mut self, comm: u16) -> Result<()> {
        let c = self
            .sends
            .get_mut(comm as usize)
            .and_then(Option::take)
            .ok_or(Error::Missing { what: "send comm" })?;
        c.close()
    }

    fn close_recv(&mut self, comm: u16) -> Result<()> {
        let c = self
            .recvs
            .get_mut(comm as usize)
            .and_then(Option::take)
            .ok_or(Error::Missing { what: "recv comm" })?;
        c.close()
    }

    fn close_listen(&mut self, listen: u16) -> Result<()> {
        let m = listen as usize;
        match self.mailbox.get_mut(m) {
            Some(b) if b.used && b.listening => b.listening = false,
            _ => {
                return Err(Error::Missing {
                    what: "listen comm",
                })
            }
        }
        self.maybe_release(m);
        Ok(())
    }
}

fn check_dev(dev: u32) -> Result<()> {
    if dev != 0 {
        return Err(Error::OutOfRange {
            what: "net device",
            value: dev as i64,
            min: 0,
            max: 0,
        });
    }
    Ok(())
}
