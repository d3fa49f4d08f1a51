//! What both comm directions share: the provider handle, CQ, QPs, request pool, the peer's
//! identity, and completion processing for `test`.

use heapless::Vec;

use super::events::Sink;
use super::types::{CommConfig, Done};
use crate::error::{Error, ErrorKind, PeerId, ReqType, Result};
use crate::provider::{
    Access, AsyncFailure, Completion, ConnectAttr, Ece, MrKeys, PortInfo, Provider, QpAttr,
    RegKind, WcOpcode, WcStatus,
};
use crate::request::{wr_id_lane, ReqId, Request, RequestPool};
use crate::wire::{QpInfo, MAX_QPS};

/// Completions taken from the CQ per poll.
const POLL_BATCH: usize = 4;

/// Provider objects and bookkeeping shared by [`super::SendComm`] and [`super::RecvComm`].
pub(super) struct Base<P: Provider> {
    pub dev: P,
    pub port: PortInfo,
    pub cq: Option<P::Cq>,
    pub qps: Vec<P::Qp, MAX_QPS>,
    pub reqs: RequestPool,
    pub peer: PeerId,
    /// Next QP for round-robin posting (data QPs pair by index with the peer's).
    pub qp_index: usize,
    /// Profiler events (`None`: no profiler; one branch per post and completion).
    pub sink: Option<Sink>,
    /// Where the comm is in its life.
    life: Life,
    /// How the QPs were connected (`connect_all`), for `revive`: the attributes and each
    /// QP's remote QP number.
    conn: Option<ConnectAttr>,
    rqpn: Vec<u32, MAX_QPS>,
}

/// A comm's life (see the module doc of [`super`]).
///
/// `repr(u8)`: a tag byte of its own, so the data calls' state checks are one byte compare
/// (without it the tag hides in `ErrorKind`'s niche, and each check decodes it first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Life {
    /// Created; a send comm waits for the acceptor's answer (`connect`).
    Unconnected,
    /// QPs connected: data calls allowed.
    Connected,
    /// A completion or post failed, or the peer is gone (reported once, with this kind):
    /// every later call fails fast, reported the same way.
    Poisoned(ErrorKind),
}

impl<P: Provider> Base<P> {
    /// Creates the CQ and `nqps` QPs.
    pub fn new(dev: P, nqps: u8, cq_depth: u32, attr: &QpAttr) -> Result<Self> {
        if nqps == 0 || nqps as usize > MAX_QPS {
            return Err(Error::OutOfRange {
                what: "QPs per connection",
                value: nqps as i64,
                min: 1,
                max: MAX_QPS as i64,
            });
        }
        let port = dev.port_info();
        let cq = dev.create_cq(cq_depth)?;
        let mut base = Self {
            dev,
            port,
            cq: Some(cq),
            qps: Vec::new(),
            reqs: RequestPool::new(),
            peer: PeerId::default(),
            qp_index: 0,
            sink: None,
            life: Life::Unconnected,
            conn: None,
            rqpn: Vec::new(),
        };
        for _ in 0..nqps {
            let qp = base.create_qp(attr)?;
            // Cannot fail: nqps ≤ MAX_QPS was checked above.
            let _ = base.qps.push(qp);
        }
        Ok(base)
    }

    /// Creates one more QP on this comm's CQ (flush QP).
    pub fn create_qp(&self, attr: &QpAttr) -> Result<P::Qp> {
        let cq = self.cq.as_ref().ok_or(Error::BadState {
            op: "create_qp",
            state: "closed",
        })?;
        self.dev.create_qp(cq, attr)
    }

    /// Registers control memory (FIFO, staging ring) for the comm's lifetime.
    pub fn reg(&self, addr: u64, len: usize, access: Access) -> Result<(P::Mr, MrKeys)> {
        let mr = self.dev.reg_mr(addr, len as u64, access, RegKind::Plain)?;
        let keys = self.dev.mr_keys(&mr);
        Ok((mr, keys))
    }

    /// The local half of the handshake, without the FIFO.
    pub fn local_info(&self, mtu: crate::provider::Mtu, sl: u8, tc: u8) -> QpInfo {
        QpInfo {
            port: self.port.port,
            link_layer: self.port.link_layer,
            mtu,
            lid: self.port.lid,
            gid: self.port.gid,
            sl,
            tc,
            qpn: self.qps.iter().map(|q| self.dev.qp_num(q)).collect(),
            fifo: None,
            addr: self.port.addr,
            ece: Vec::new(),
        }
    }

    /// Every QP's ECE options (`ibv_query_ece`), or empty when any QP has none (the provider
    /// or device does not support ECE): ECE is used for all QPs of a comm or for none.
    pub fn query_ece_all(&self) -> Result<Vec<Ece, MAX_QPS>> {
        let mut out = Vec::new();
        for qp in &self.qps {
            match self.dev.query_ece(qp)? {
                // Cannot fail: one entry per QP, at most MAX_QPS.
                Some(e) => out.push(e).map_err(|_| Error::Full {
                    what: "ECE entries",
                    cap: MAX_QPS,
                })?,
                None => return Ok(Vec::new()),
            }
        }
        Ok(out)
    }

    /// Applies the peer's ECE options to QP `i` for each `i` (before the QPs connect); `false`
    /// when the peer sent none or the provider does not support ECE.
    pub fn set_ece_all(&mut self, remote: &QpInfo) -> Result<bool> {
        if remote.ece.len() != self.qps.len() {
            return Ok(false);
        }
        let mut all = true;
        for (qp, e) in self.qps.iter_mut().zip(remote.ece.iter()) {
            all &= self.dev.set_ece(qp, e)?;
        }
        Ok(all)
    }

    /// Checks the peer's description against ours and remembers who the peer is.
    pub fn accept_peer(&mut self, remote: &QpInfo) -> Result<()> {
        if remote.link_layer != self.port.link_layer {
            return Err(Error::Wire {
                what: crate::handshake::PEER_LINK_LAYER,
                value: remote.link_layer as u64,
            });
        }
        if remote.qpn.len() != self.qps.len() {
            return Err(Error::Wire {
                what: "QP count differs from ours",
                value: remote.qpn.len() as u64,
            });
        }
        self.peer = PeerId {
            gid: remote.gid,
            lid: remote.lid,
            qpn: remote.qpn[0],
            addr: self.peer.addr,
        };
        Ok(())
    }

    /// Connects QP `i` to the peer's QP `i`.
    pub fn connect_all(&mut self, remote: &QpInfo, attr: &ConnectAttr) -> Result<()> {
        for (qp, &rqpn) in self.qps.iter_mut().zip(remote.qpn.iter()) {
            let a = ConnectAttr {
                remote_qpn: rqpn,
                ..*attr
            };
            self.dev.connect_qp(qp, &a)?;
            // Cannot fail: one per QP, at most MAX_QPS.
            let _ = self.rqpn.push(rqpn);
        }
        self.conn = Some(*attr);
        Ok(())
    }

    /// A fused comm's failback of this rail (`crate::fused`): every QP reset to RTS towards
    /// the same remote QP (`Provider::reset_qp`), what the CQ still holds from before thrown
    /// away (at most `max_polls` polls), every request given up (their WRs went with the
    /// reset), the round robin back at QP 0, and the comm connected again (no longer
    /// poisoned). The peer resets its side before the two exchange anything.
    pub fn revive(&mut self, max_polls: usize) -> Result<()> {
        let attr = self.conn.ok_or(Error::BadState {
            op: "revive",
            state: "never connected",
        })?;
        for (qp, &rqpn) in self.qps.iter_mut().zip(self.rqpn.iter()) {
            let a = ConnectAttr {
                remote_qpn: rqpn,
                ..attr
            };
            self.dev.reset_qp(qp, &a)?;
        }
        let cq = self.cq.as_mut().ok_or(Error::BadState {
            op: "revive",
            state: "closed",
        })?;
        for _ in 0..max_polls {
            let mut wcs = [Completion::EMPTY; POLL_BATCH];
            if self.dev.poll_cq(cq, &mut wcs)? == 0 {
                break;
            }
        }
        self.reqs.free_all();
        self.qp_index = 0;
        self.life = Life::Connected;
        Ok(())
    }

    /// The connect attributes towards `remote` with `mtu`, `sl`, `tc`.
    pub fn connect_attr(
        &self,
        remote: &QpInfo,
        mtu: crate::provider::Mtu,
        cfg: &CommConfig,
        sl: u8,
        tc: u8,
    ) -> ConnectAttr {
        ConnectAttr {
            remote_qpn: 0,
            remote_lid: remote.lid,
            remote_gid: remote.gid,
            remote_addr: remote.addr,
            link_layer: self.port.link_layer,
            mtu,
            gid_index: self.port.gid_index,
            timeout: cfg.timeout,
            retry_cnt: cfg.retry_cnt,
            sl,
            tc,
            pkey_index: cfg.pkey_index,
        }
    }

    /// The comm's state.
    #[inline]
    pub fn life(&self) -> Life {
        self.life
    }

    /// The comm's [`Lifecycle`](crate::lifecycle::Lifecycle) (one rail: never degraded).
    pub fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        use crate::lifecycle::Lifecycle;
        match self.life {
            Life::Unconnected => Lifecycle::Connecting,
            Life::Connected => Lifecycle::Ready,
            Life::Poisoned(k) => Lifecycle::Failed(k),
        }
    }

    /// The QPs are connected.
    pub fn set_connected(&mut self) {
        self.life = Life::Connected;
    }

    /// The failure `e` is being reported: later calls fail fast, reported as `e` (the first
    /// failure's kind stays).
    pub fn poison(&mut self, e: &Error) {
        if !matches!(self.life, Life::Poisoned(_)) {
            self.life = Life::Poisoned(e.kind());
        }
    }

    /// Records the peer's socket address, for error messages.
    pub fn set_peer_addr(&mut self, addr: core::net::SocketAddr) {
        self.peer.addr = Some(addr);
    }

    /// Fails fast on a poisoned comm, or on one an async event made unusable
    /// ([`Self::check_events`]).
    #[inline(always)]
    pub fn check_live(&mut self, op: &'static str) -> Result<()> {
        if let Life::Poisoned(cause) = self.life {
            return Err(Error::Poisoned { op, cause });
        }
        self.check_events()
    }

    /// A data call (`op`) needs a connected comm that is not poisoned, and whose device (and
    /// QPs and CQ) no async event made unusable ([`Self::check_events`]).
    #[inline(always)]
    pub fn check_connected(&mut self, op: &'static str) -> Result<()> {
        // The common case first, one compare; the refusals out of line.
        if matches!(self.life, Life::Connected) {
            return self.check_events();
        }
        Err(self.not_connected(op))
    }

    /// [`Self::check_connected`]'s refusal of a comm that is not connected (`Unconnected`, or
    /// `Poisoned`, reported as it was).
    #[cold]
    #[inline(never)]
    fn not_connected(&self, op: &'static str) -> Error {
        match self.life {
            Life::Poisoned(cause) => Error::Poisoned { op, cause },
            _ => Error::BadState {
                op,
                state: "not connected",
            },
        }
    }

    /// Every data call's check of the provider's async-event flags
    /// ([`Provider::async_failure`]: an atomic load or two), also when the call would only
    /// wait, as NCCL checks its fatal-event counter in `isend`, `irecv`, `test` and `iflush`:
    /// a device or comm that an event made unusable poisons the comm, and is the error.
    #[inline]
    pub fn check_events(&mut self) -> Result<()> {
        let Some(cq) = &self.cq else { return Ok(()) };
        match self.dev.async_failure(cq) {
            None => Ok(()),
            Some(what) => Err(self.async_failed(what)),
        }
    }

    #[cold]
    fn async_failed(&mut self, what: AsyncFailure) -> Error {
        let e = Error::AsyncEvent {
            what,
            dev: self.dev.dev_name(),
            peer: self.peer,
        };
        self.poison(&e);
        e
    }

    /// The next QP index for round-robin posting.
    #[inline]
    pub fn next_qp(&mut self) -> usize {
        let q = self.qp_index;
        // No division: `q < qps.len()` always (a comm has at least one QP).
        self.qp_index = if q + 1 >= self.qps.len() { 0 } else { q + 1 };
        q
    }

    /// `test`: polls the CQ until `id` is done or the CQ is empty. `finish` turns a done
    /// request into what `test` reports (a receive's sizes; it gets the peer by reference, for
    /// its errors, so a good completion copies none of it); an error from it poisons the comm.
    pub fn test(
        &mut self,
        id: ReqId,
        finish: impl FnOnce(&Request, &PeerId) -> Result<Done>,
    ) -> Result<Option<Done>> {
        self.check_live("test")?;
        loop {
            let r = self.reqs.get(id)?;
            if r.events == 0 {
                if let Some(sink) = self.sink {
                    sink.stop(id.index(), None);
                }
                let done = finish(r, &self.peer);
                self.reqs.free(id)?;
                return match done {
                    Ok(d) => Ok(Some(d)),
                    Err(e) => {
                        self.poison(&e);
                        Err(e)
                    }
                };
            }
            let mut wcs = [Completion::EMPTY; POLL_BATCH];
            let cq = self.cq.as_mut().ok_or(Error::BadState {
                op: "test",
                state: "closed",
            })?;
            let n = self.dev.poll_cq(cq, &mut wcs)?;
            if n == 0 {
                return Ok(None);
            }
            self.complete_all(&wcs[..n])?;
        }
    }

    /// Applies a batch of completions. A failed one poisons the comm and is the error, but
    /// only after every good one of the batch is applied: a completion taken from the CQ is
    /// never dropped (a fused receiver counts a failed rail's completed receives, `drain`).
    fn complete_all(&mut self, wcs: &[Completion]) -> Result<()> {
        let mut first = Ok(());
        for wc in wcs {
            if let Err(e) = self.complete(wc) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        if let Err(e) = &first {
            self.poison(e);
        }
        first
    }

    /// Polls the CQ until it is empty, applying every good completion and skipping failed
    /// ones (flushed receives), also on a poisoned comm: after a failure, which requests had
    /// completed is then known ([`Self::finish`]). At most `max_polls` polls.
    pub fn drain(&mut self, max_polls: usize) -> Result<()> {
        for _ in 0..max_polls {
            let mut wcs = [Completion::EMPTY; POLL_BATCH];
            let cq = self.cq.as_mut().ok_or(Error::BadState {
                op: "drain",
                state: "closed",
            })?;
            let n = self.dev.poll_cq(cq, &mut wcs)?;
            if n == 0 {
                return Ok(());
            }
            for wc in wcs[..n].iter().filter(|w| w.status == WcStatus::Success) {
                // A bogus one among them changes nothing the comm still relies on: it is
                // poisoned already, and only finished requests are read from now on.
                let _ = self.complete(wc);
            }
        }
        Ok(())
    }

    /// Reports and frees `id` if it has no events left (`None`: still waiting). Reads no CQ and
    /// works on a poisoned comm too: a fused comm asks which of a failed rail's requests had
    /// completed before the failure. `finish` is `test`'s; an error from it poisons the comm.
    pub fn finish(
        &mut self,
        id: ReqId,
        finish: impl FnOnce(&Request, &PeerId) -> Result<Done>,
    ) -> Result<Option<Done>> {
        let r = self.reqs.get(id)?;
        if r.events != 0 {
            return Ok(None);
        }
        if let Some(sink) = self.sink {
            sink.stop(id.index(), None);
        }
        let done = finish(r, &self.peer);
        self.reqs.free(id)?;
        match done {
            Ok(d) => Ok(Some(d)),
            Err(e) => {
                self.poison(&e);
                Err(e)
            }
        }
    }

    /// Polls the CQ once and applies what it finds, for no request in particular: a failed
    /// completion surfaces here even when nobody waits on the request it belongs to (a fused
    /// comm checks an idle rail this way).
    pub fn progress(&mut self) -> Result<()> {
        self.check_live("progress")?;
        let mut wcs = [Completion::EMPTY; POLL_BATCH];
        let cq = self.cq.as_mut().ok_or(Error::BadState {
            op: "progress",
            state: "closed",
        })?;
        let n = self.dev.poll_cq(cq, &mut wcs)?;
        self.complete_all(&wcs[..n])
    }

    /// What a done send or flush reports (a receive's report is its comm's).
    pub fn done_of(r: &Request) -> Done {
        let mut sizes = [0; crate::fifo::MAX_RECVS];
        match r.kind {
            Some(ReqType::Send) => {
                sizes[0] = r.send.size;
                Done { n: 1, sizes }
            }
            _ => Done { n: 0, sizes },
        }
    }

    /// The comm index of the QP numbered `qpn` (for profiler events only).
    fn qp_index_of(&self, qpn: u32) -> Option<usize> {
        self.qps.iter().position(|q| self.dev.qp_num(q) == qpn)
    }

    /// Applies one completion to the requests its `wr_id` names.
    fn complete(&mut self, wc: &Completion) -> Result<()> {
        let bogus = Error::BogusCompletion { wr_id: wc.wr_id };
        let lane0 = wr_id_lane(wc.wr_id, 0);
        if wc.status != WcStatus::Success {
            let r = self.reqs.by_index(lane0);
            let req = r.as_ref().and_then(|r| r.kind).unwrap_or(ReqType::Recv);
            // A send's size is its request's (a failed completion's byte_len is not reliable).
            let size = match r {
                Some(r) if r.kind == Some(ReqType::Send) => r.send.size,
                _ => u64::from(wc.byte_len),
            };
            return Err(Error::Completion {
                status: wc.status,
                opcode: wc.opcode,
                vendor_err: wc.vendor_err,
                req,
                peer: self.peer,
                local_gid: self.port.gid,
                hca: self.dev.dev_name(),
                local_qpn: wc.qp_num,
                size,
            });
        }
        // Only with a profiler: which of our QPs completed (its events stop now).
        let sink = self.sink;
        let qi = sink.and_then(|_| self.qp_index_of(wc.qp_num));
        let r = self.reqs.by_index(lane0).ok_or(bogus)?;
        match r.kind {
            Some(ReqType::Send) => {
                // One signaled completion retires every send of the multi-receive.
                let nreqs = r.nreqs as usize;
                for lane in 0..nreqs {
                    let idx = wr_id_lane(wc.wr_id, lane);
                    let s = self.reqs.by_index(idx).ok_or(bogus)?;
                    if s.kind != Some(ReqType::Send) || s.events == 0 {
                        return Err(bogus);
                    }
                    s.events -= 1;
                    if let (Some(sink), Some(qi)) = (sink, qi) {
                        sink.stop(idx, Some(qi));
                    }
                }
            }
            Some(kind) => {
                if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    if kind != ReqType::Recv {
                        return Err(bogus);
                    }
                    // A single receive's immediate is the bytes this QP carried; a
                    // multi-receive's sizes are in the sizes FIFO (read when it is done).
                    if r.nreqs == 1 {
                        r.sizes[0] += wc.imm as u64;
                    } else {
                        r.imm_mask |= wc.imm;
                    }
                    if let (Some(sink), Some(qi)) = (sink, qi) {
                        sink.stop(lane0, Some(qi));
                    }
                }
                if r.events == 0 {
                    return Err(bogus);
                }
                r.events -= 1;
            }
            None => return Err(bogus),
        }
        Ok(())
    }

    /// Destroys every provider object (idempotent). Profiler events of requests still open
    /// (a receive nobody will send to) are stopped first, so every start has its stop.
    pub fn teardown(&mut self) -> Result<()> {
        if let Some(sink) = self.sink.take() {
            for idx in self.reqs.live() {
                sink.stop(idx, None);
            }
        }
        let mut first = Ok(());
        while let Some(qp) = self.qps.pop() {
            let r = self.dev.destroy_qp(qp);
            if first.is_ok() {
                first = r;
            }
        }
        if let Some(cq) = self.cq.take() {
            let r = self.dev.destroy_cq(cq);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl<P: Provider> Drop for Base<P> {
    /// Releases the CQ and QPs on every path, including a constructor that fails half-way
    /// (a peer with the wrong link layer must not leak a CQ and its QPs on every retry).
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}
