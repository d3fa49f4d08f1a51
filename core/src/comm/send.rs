//! The sending side of a connection.
//!
//! Drive it as: [`SendComm::new`] → send [`SendComm::local_info`] to the peer → receive the
//! acceptor's answer → [`SendComm::connect`] → then [`SendComm::isend`] / [`SendComm::test`]
//! from one thread. `isend` returns `Ok(None)` ("retry later") until the receiver has posted a
//! matching receive.

use super::base::{Base, Life};
use super::events::{QpEvent, QpOp, Sink};
use super::types::{CommConfig, Done, TruncNote, Truncation};
use crate::error::{Error, ReqType, Result};
use crate::fifo::{FifoRing, PostedRecv, MAX_RECVS, MAX_REQUESTS};
use crate::provider::{Access, Ece, MrKeys, Provider, QpAttr, SendWr, Sge, WrOpcode};
use crate::request::{pack_wr_id, ReqId};
use crate::wire::{QpInfo, RemoteBuf, MAX_QPS};

/// The largest message one `isend` carries, advertised as `maxP2pBytes` (NCCL splits larger
/// transfers): 2 GiB − 128. What bounds it, tightest first: `test` reports sizes through
/// NCCL's `int*` in every table version (v6–v12), so a larger message's size could not be
/// reported (NCCL's own 1 TiB `NCCL_MAX_NET_SIZE_BYTES` meets the same `int` there); one
/// RDMA write must fit the ports' `max_msg_sz` (2³¹ on mlx5 and rxe); the immediate and the
/// sizes FIFO carry 32-bit sizes. 128 below 2³¹ keeps the pieces NCCL cuts at it, and the
/// parts of a split, 128-byte aligned.
pub const MAX_MSG_SIZE: u64 = (1 << 31) - SPLIT_ALIGN;

/// RDMA writes of a split message are multiples of this, so LL/LL128 lines stay whole.
pub(crate) const SPLIT_ALIGN: u64 = 128;

/// What [`SendComm::peek`] found: the receive an `isend` would match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peeked {
    /// The FIFO slot's sequence number (the receiver's irecv count).
    pub seq: u64,
    /// The receive's index in its slot.
    pub index: u8,
    /// The slot's width (receives of the multi-receive).
    pub nreqs: u8,
    /// The receive itself: where the data goes, and its rkey.
    pub posted: PostedRecv,
    /// The slot's live-rail mask, as a fused receiver posted it (0 from a plain comm; see
    /// [`crate::fused`]).
    pub rails: u32,
}

/// The sending side of a connection.
pub struct SendComm<P: Provider> {
    base: Base<P>,
    cfg: CommConfig,
    /// The ring the receiver writes its posted receives into.
    fifo: P::Fifo,
    fifo_mr: Option<P::Mr>,
    fifo_keys: MrKeys,
    /// Sequence number of the next FIFO slot to consume.
    fifo_head: u64,
    /// Requests matched so far against the receives of slot `fifo_head`.
    slot_reqs: [Option<ReqId>; MAX_RECVS],
    /// Where each matched send lands in its receive buffer (0 but for a fused comm's parts).
    slot_roff: [u64; MAX_RECVS],
    /// The receiver's sizes FIFO (from its answer; set by `connect`).
    rem_sizes: RemoteBuf,
    /// Our QPs' ECE options, sent to the peer (empty: ECE off or not supported).
    ece: heapless::Vec<Ece, MAX_QPS>,
    /// The first send cut to the posted receive's size, until the caller takes it.
    trunc: TruncNote,
}

impl<P: Provider> SendComm<P> {
    /// Creates the CQ, the QPs and the registered FIFO.
    pub fn new(dev: P, cfg: CommConfig) -> Result<Self> {
        let attr = QpAttr {
            max_send_wr: 2 * MAX_REQUESTS as u32,
            max_recv_wr: MAX_REQUESTS as u32,
            max_inline: 0,
            access: Access {
                remote_write: true,
                // A fused receiver's failback reads the sender's rail state (`crate::fused`).
                remote_read: true,
                ..Access::default()
            },
        };
        let cq_depth = 2 * MAX_REQUESTS as u32 * cfg.nqps as u32;
        let base = Base::new(dev, cfg.nqps, cq_depth, &attr)?;
        let fifo = base.dev.alloc_fifo()?;
        let access = Access {
            local_write: true,
            remote_write: true,
            remote_read: true,
            relaxed_ordering: false,
        };
        let (mr, keys) = base.reg(fifo.base_addr(), FifoRing::<MAX_REQUESTS>::BYTES, access)?;
        let ece = if cfg.ece {
            base.query_ece_all()?
        } else {
            heapless::Vec::new()
        };
        Ok(Self {
            base,
            cfg,
            fifo,
            fifo_mr: Some(mr),
            fifo_keys: keys,
            fifo_head: 0,
            slot_reqs: [None; MAX_RECVS],
            slot_roff: [0; MAX_RECVS],
            rem_sizes: RemoteBuf::default(),
            ece,
            trunc: TruncNote::None,
        })
    }

    /// What the peer needs: QPs, port, and where to write receive posts.
    pub fn local_info(&self) -> QpInfo {
        let mut info = self
            .base
            .local_info(self.base.port.mtu, self.cfg.sl, self.cfg.tc);
        info.fifo = Some(RemoteBuf {
            addr: self.fifo.base_addr(),
            rkey: self.fifo_keys.rkey,
        });
        info.ece = self.ece.clone();
        info
    }

    /// Records the peer's socket address (the bootstrap connection's far end), so errors name it.
    pub fn set_peer_addr(&mut self, addr: core::net::SocketAddr) {
        self.base.set_peer_addr(addr);
    }

    /// Connects the QPs to the acceptor's (whose `mtu` is the negotiated one).
    pub fn connect(&mut self, remote: &QpInfo) -> Result<()> {
        if self.base.life() != Life::Unconnected {
            return Err(Error::BadState {
                op: "connect",
                state: "connected",
            });
        }
        // Where a multi-receive's sizes go (wire version 3 requires it in the answer).
        let sizes = remote.fifo.ok_or(Error::Wire {
            what: "acceptor sent no sizes FIFO",
            value: 0,
        })?;
        if sizes.addr == 0 || sizes.rkey == 0 {
            return Err(Error::Wire {
                what: "acceptor's sizes FIFO address or rkey is 0",
                value: sizes.addr,
            });
        }
        self.base.accept_peer(remote)?;
        self.rem_sizes = sizes;
        // The acceptor's answer carries the options its QPs settled on (NCCL 2.28 sets them on
        // the requester's QPs before RTR); none when it or we have no ECE.
        if self.cfg.ece && !self.ece.is_empty() {
            self.base.set_ece_all(remote)?;
        }
        let mtu = remote.mtu.min(self.base.port.mtu);
        let attr = self
            .base
            .connect_attr(remote, mtu, &self.cfg, self.cfg.sl, self.cfg.tc);
        self.base.connect_all(remote, &attr)?;
        self.base.set_connected();
        Ok(())
    }

    /// Sends profiler events to `sink` (`None`: none; see [`super::events`]).
    pub fn set_events(&mut self, sink: Option<Sink>) {
        self.base.sink = sink;
    }

    /// A hint before [`SendComm::isend`]: `false` only when the receiver has not posted the
    /// FIFO slot the next send matches, so that an `isend` now could not send (it would
    /// return `Ok(None)`, or reject bad arguments). A comm that is not connected answers
    /// `true`: its `isend` reports that. One load, no request touched: a caller polling for
    /// the receiver skips the `isend` call while this is `false`.
    #[inline]
    pub fn peer_posted(&self) -> bool {
        self.base.life() != Life::Connected || self.fifo.is_posted(self.fifo_head)
    }

    /// Sends `size` bytes at `addr` (registered with `mr`) to the receive tagged `tag`.
    ///
    /// `Ok(None)`: the receiver has not posted the matching receive yet; call again.
    pub fn isend(&mut self, addr: u64, size: u64, tag: u32, mr: MrKeys) -> Result<Option<ReqId>> {
        // Inlined with no offset and no parent: a one-device comm pays nothing for fusion.
        self.isend_impl(addr, size, tag, mr, 0, 0)
    }

    /// [`SendComm::isend`] with the profiler parent NCCL passed (`phandle`; 0: none).
    pub fn isend_under(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        mr: MrKeys,
        parent: usize,
    ) -> Result<Option<ReqId>> {
        self.isend_impl(addr, size, tag, mr, 0, parent)
    }

    /// [`Self::isend`] of one part of a message: the `size` bytes at `addr` land `roff` bytes
    /// into the matching receive buffer (a fused comm's rail carries the part of a message
    /// its stripe gives it, [`crate::fused`]). Bytes past the posted receive are not sent (see
    /// [`Self::take_truncation`]).
    pub fn isend_at(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        mr: MrKeys,
        roff: u64,
    ) -> Result<Option<ReqId>> {
        self.isend_impl(addr, size, tag, mr, roff, 0)
    }

    #[inline(always)]
    fn isend_impl(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        mr: MrKeys,
        roff: u64,
        parent: usize,
    ) -> Result<Option<ReqId>> {
        self.base.check_connected("isend")?;
        if size > MAX_MSG_SIZE || roff > MAX_MSG_SIZE {
            return Err(Error::OutOfRange {
                what: "send size",
                value: size.max(roff) as i64,
                min: 0,
                max: MAX_MSG_SIZE as i64,
            });
        }
        let mut posted = [PostedRecv::default(); MAX_RECVS];
        let Some((n, r, _)) = self.match_tag(tag, &mut posted)? else {
            return Ok(None);
        };
        let p = posted[r];
        // A send larger than the receive is cut to it, as NCCL does (noted once per comm).
        let size = if roff + size > p.size {
            self.truncate(roff + size, p.size, tag) - roff.min(p.size)
        } else {
            size
        };
        let events = if self.cfg.split_data {
            self.base.qps.len() as u32
        } else {
            1
        };
        let id = self.base.reqs.alloc(ReqType::Send, events, n as u8)?;
        let req = self.base.reqs.get(id)?;
        req.send.addr = addr;
        req.send.size = size;
        req.send.lkey = mr.lkey;
        req.parent = parent;
        self.slot_reqs[r] = Some(id);
        self.slot_roff[r] = roff;
        // A multi-receive goes out only once every one of its receives has a send.
        if self.slot_reqs[..n].iter().any(Option::is_none) {
            return Ok(Some(id));
        }
        if let Err(e) = self.multi_send(&posted[..n]) {
            return Err(self.poison(e));
        }
        // `slot_roff` needs no reset: every matched send sets its own entry.
        self.slot_reqs = [None; MAX_RECVS];
        self.fifo_head += 1;
        Ok(Some(id))
    }

    /// A send of `send` bytes (its offset included) into a receive of `recv`: notes the
    /// comm's first truncation; returns the bytes that fit.
    #[cold]
    fn truncate(&mut self, send: u64, recv: u64, tag: u32) -> u64 {
        self.trunc.note(Truncation { send, recv, tag });
        recv
    }

    /// The comm's first send that was cut to the size of the receive it matched (NCCL's
    /// semantics: the bytes that fit are sent, the receiver sees the receive's size), once:
    /// later calls, and later truncations, give `None`. The caller logs it (one WARN per comm).
    #[inline]
    pub fn take_truncation(&mut self) -> Option<Truncation> {
        self.trunc.take()
    }

    /// The receive an `isend` with `tag` would match now (without matching it), or `None`
    /// when the receiver has not posted it yet.
    pub fn peek(&mut self, tag: u32) -> Result<Option<Peeked>> {
        self.base.check_connected("isend")?;
        let mut posted = [PostedRecv::default(); MAX_RECVS];
        Ok(self
            .match_tag(tag, &mut posted)?
            .map(|(n, r, rails)| Peeked {
                seq: self.fifo_head,
                index: r as u8,
                nreqs: n as u8,
                posted: posted[r],
                rails,
            }))
    }

    /// The slot at `fifo_head` (read into `posted`): its width, the first unmatched receive
    /// tagged `tag` and the slot's live-rail mask; `None` when not posted yet or no such
    /// receive. A hostile element poisons the comm.
    #[inline(always)]
    fn match_tag(
        &mut self,
        tag: u32,
        posted: &mut [PostedRecv; MAX_RECVS],
    ) -> Result<Option<(usize, usize, u32)>> {
        let (n, rails) = match self.fifo.poll_rails(self.fifo_head, posted) {
            Ok(None) => return Ok(None),
            Ok(Some(x)) => x,
            Err(f) => {
                return Err(self.poison(Error::BadFifoElem {
                    field: f.field,
                    value: f.value,
                    peer: self.base.peer,
                }))
            }
        };
        let Some(r) = (0..n).find(|&r| self.slot_reqs[r].is_none() && posted[r].tag == tag) else {
            return Ok(None);
        };
        let p = posted[r];
        if p.size > 0 && (p.addr == 0 || p.rkey == 0) {
            let (field, value) = if p.addr == 0 {
                ("addr", p.addr)
            } else {
                ("rkey", p.rkey as u64)
            };
            return Err(self.poison(Error::BadFifoElem {
                field,
                value,
                peer: self.base.peer,
            }));
        }
        Ok(Some((n, r, rails)))
    }

    /// One signaled RDMA WRITE of `local` to `remote_addr` (`rkey`) outside any FIFO slot,
    /// as a send request of its own (done when the peer acknowledged it). A fused comm moves
    /// a failed rail's parts and its notices with it ([`crate::fused`]).
    pub fn iwrite(&mut self, local: Sge, remote_addr: u64, rkey: u32) -> Result<ReqId> {
        self.base.check_connected("iwrite")?;
        let id = self.base.reqs.alloc(ReqType::Send, 1, 1)?;
        let req = self.base.reqs.get(id)?;
        req.send.addr = local.addr;
        req.send.size = u64::from(local.len);
        req.send.lkey = local.lkey;
        let wr = SendWr {
            wr_id: pack_wr_id(&[id.index()]),
            opcode: WrOpcode::Write,
            sge: local,
            remote_addr,
            rkey,
            signaled: true,
            ..SendWr::EMPTY
        };
        // On QP 0, outside the data QPs' round robin: the receiver posts each receive on the
        // QP the matching send will use (the same order on both sides), and a write without
        // immediate, which consumes no receive, must not shift the sender's turn.
        let qp = &mut self.base.qps[0];
        if let Err(e) = self.base.dev.post_send(qp, &[wr]) {
            let _ = self.base.reqs.free(id);
            return Err(self.poison(e));
        }
        Ok(id)
    }

    /// Polls for completion of `id`.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        self.base.test(id, |r, _| Ok(Base::<P>::done_of(r)))
    }

    /// A fused comm's failback of this rail (`Base::revive`): QPs reset, requests given up,
    /// connected again; the next FIFO slot to consume is `head` (the receiver's sequence
    /// number where the rail rejoins, `crate::fused`).
    pub fn revive(&mut self, head: u64) -> Result<()> {
        let cq = 2 * MAX_REQUESTS * self.base.qps.len();
        self.base.revive(cq / 4 + 2)?;
        self.slot_reqs = [None; MAX_RECVS];
        self.fifo_head = head;
        Ok(())
    }

    /// The sequence number of the next FIFO slot this comm consumes.
    pub fn fifo_head(&self) -> u64 {
        self.fifo_head
    }

    /// Sets the next FIFO slot to consume (a revived rail rejoining at the receiver's
    /// sequence number, `crate::fused::heal`); nothing of the slot matched yet.
    pub fn set_fifo_head(&mut self, head: u64) {
        self.slot_reqs = [None; MAX_RECVS];
        self.fifo_head = head;
    }

    /// The comm failed outside the core (its caller found the peer gone): every later call is
    /// refused at once with `Error::Poisoned`, reported as `e` was (the first failure stays).
    pub fn fail(&mut self, e: &Error) {
        self.base.poison(e);
    }

    /// Whether send `id` is matched to a receive of a multi-receive whose other sends have
    /// not all come: it waits in the comm, not posted (nothing of it can land).
    pub fn unposted(&self, id: ReqId) -> bool {
        self.slot_reqs.contains(&Some(id))
    }

    /// `id` if it was acknowledged before now, without polling (see `Base::finish`; also on
    /// a poisoned comm).
    pub fn completed(&mut self, id: ReqId) -> Result<Option<Done>> {
        self.base.finish(id, |r, _| Ok(Base::<P>::done_of(r)))
    }

    /// After a failure (the comm is poisoned): takes every completion left in the CQ, the
    /// good ones applied, so [`Self::completed`] then says which sends were acknowledged
    /// before the failure (a fused comm moves only the others, `crate::fused`).
    pub fn drain(&mut self) -> Result<()> {
        // Every signaled send of the comm fits the CQ: that many completions, in polls of 4,
        // and one more poll that finds the CQ empty.
        let cq = 2 * MAX_REQUESTS * self.base.qps.len();
        self.base.drain(cq / 4 + 2)
    }

    /// Polls the CQ once for no request in particular (see `Base::progress`): an error
    /// completion or a fatal device event surfaces as the error it is.
    pub fn progress(&mut self) -> Result<()> {
        self.base.progress()
    }

    /// Posts the data writes and the write-with-immediate for the slot at `fifo_head`.
    fn multi_send(&mut self, posted: &[PostedRecv]) -> Result<()> {
        let n = posted.len();
        if let ([one], Some(id)) = (posted, self.slot_reqs[0]) {
            let split = self.cfg.split_data && self.base.qps.len() > 1;
            let s = self.base.reqs.get(id)?.send;
            let ar_imm = self.cfg.adaptive_routing && s.size > self.cfg.ar_threshold;
            if !split && !ar_imm {
                return self.single_send(one, id, &s);
            }
        }
        let mut lanes = [0u8; MAX_RECVS];
        let mut sends = [crate::request::SendState::default(); MAX_RECVS];
        for r in 0..n {
            let id = self.slot_reqs[r].ok_or(Error::BadState {
                op: "multi_send",
                state: "unmatched",
            })?;
            lanes[r] = id.index();
            sends[r] = self.base.reqs.get(id)?.send;
        }
        let wr_id = pack_wr_id(&lanes[..n]);
        let nqps = if self.cfg.split_data {
            self.base.qps.len() as u64
        } else {
            1
        };
        // With one receive the immediate is the size. With several it is a bitmask of the
        // non-empty sends, and the write that carries it also writes every send's size into
        // the receiver's sizes FIFO (module doc of `fifo`).
        let mask = sends[..n]
            .iter()
            .enumerate()
            .fold(0u32, |m, (r, s)| m | ((s.size != 0) as u32) << r);
        let sizes_wr = self.imm_wr(posted, &sends[..n]);
        let separate_imm =
            n > 1 || (self.cfg.adaptive_routing && sends[0].size > self.cfg.ar_threshold);
        for q in 0..nqps {
            let mut wrs = [SendWr::EMPTY; MAX_RECVS + 1];
            // Per send: the index of its WR in `wrs` (for profiler events).
            let mut wr_of = [usize::MAX; MAX_RECVS];
            let mut k = 0;
            let mut imm_len = 0u64;
            for r in 0..n {
                let chunk = sends[r].size.div_ceil(nqps).div_ceil(SPLIT_ALIGN) * SPLIT_ALIGN;
                let off = (q * chunk).min(sends[r].size);
                let len = (sends[r].size - off).min(chunk);
                if r == 0 {
                    imm_len = len;
                }
                // An empty write is only kept when it must carry the immediate itself.
                let carries_imm = n == 1 && !separate_imm;
                if len == 0 && !carries_imm {
                    continue;
                }
                wrs[k] = SendWr {
                    opcode: WrOpcode::Write,
                    sge: Sge {
                        addr: sends[r].addr + off,
                        len: len as u32,
                        lkey: sends[r].lkey,
                    },
                    remote_addr: posted[r].addr + self.slot_roff[r] + off,
                    rkey: posted[r].rkey,
                    ..SendWr::EMPTY
                };
                wr_of[r] = k;
                k += 1;
            }
            let imm = if n == 1 { imm_len as u32 } else { mask };
            if separate_imm || k == 0 {
                wrs[k] = sizes_wr;
                k += 1;
            }
            let last = &mut wrs[k - 1];
            last.opcode = WrOpcode::WriteWithImm;
            last.imm = imm;
            last.wr_id = wr_id;
            last.signaled = true;
            let qi = self.base.next_qp();
            if let Some(sink) = self.base.sink {
                self.start_events(sink, qi, wr_id, &wrs[..k], &wr_of[..n])?;
            }
            let qp = &mut self.base.qps[qi];
            self.base.dev.post_send(qp, &wrs[..k])?;
        }
        Ok(())
    }

    /// [`Self::multi_send`] of a slot with one receive, on one QP, with the immediate on the
    /// data write (no split, no adaptive routing): the one WRITE_WITH_IMM the general path
    /// builds for that case (its size as immediate, even when 0), without its per-QP and
    /// per-receive arrays: the common small message's path.
    #[inline(always)]
    fn single_send(
        &mut self,
        posted: &PostedRecv,
        id: ReqId,
        s: &crate::request::SendState,
    ) -> Result<()> {
        let wr = SendWr {
            wr_id: pack_wr_id(&[id.index()]),
            opcode: WrOpcode::WriteWithImm,
            sge: Sge {
                addr: s.addr,
                len: s.size as u32,
                lkey: s.lkey,
            },
            remote_addr: posted.addr + self.slot_roff[0],
            rkey: posted.rkey,
            imm: s.size as u32,
            signaled: true,
            inline: false,
        };
        let qi = self.base.next_qp();
        if let Some(sink) = self.base.sink {
            self.start_events(sink, qi, wr.wr_id, &[wr], &[0])?;
        }
        let qp = &mut self.base.qps[qi];
        self.base.dev.post_send(qp, &[wr])
    }

    /// The write that carries a separate immediate: for a multi-receive it writes every send's
    /// size into the receiver's sizes FIFO row of this slot; for one receive it writes nothing
    /// (adaptive routing).
    fn imm_wr(&self, posted: &[PostedRecv], sends: &[crate::request::SendState]) -> SendWr {
        if sends.len() == 1 {
            return SendWr {
                remote_addr: posted[0].addr,
                rkey: posted[0].rkey,
                ..SendWr::EMPTY
            };
        }
        let slot = FifoRing::<MAX_REQUESTS>::slot_of(self.fifo_head);
        let mut sz = [0u64; MAX_RECVS];
        for (d, s) in sz.iter_mut().zip(sends) {
            *d = s.size;
        }
        let (addr, len) = self.fifo.stage_sizes(slot, &sz[..sends.len()]);
        SendWr {
            sge: Sge {
                addr,
                len: len as u32,
                lkey: self.fifo_keys.lkey,
            },
            remote_addr: self.rem_sizes.addr + FifoRing::<MAX_REQUESTS>::sizes_offset(slot) as u64,
            rkey: self.rem_sizes.rkey,
            ..SendWr::EMPTY
        }
    }

    /// Starts one QP event per send of the slot on QP index `qi` (NCCL 2.28 starts one even
    /// for a send with nothing on that QP, with length 0).
    fn start_events(
        &mut self,
        sink: Sink,
        qi: usize,
        wr_id: u64,
        wrs: &[SendWr],
        wr_of: &[usize],
    ) -> Result<()> {
        let qpn = self.base.dev.qp_num(&self.base.qps[qi]);
        for (r, &w) in wr_of.iter().enumerate() {
            let id = self.slot_reqs[r].ok_or(Error::BadState {
                op: "multi_send",
                state: "unmatched",
            })?;
            let (op, length) = match wrs.get(w) {
                Some(wr) if wr.opcode == WrOpcode::WriteWithImm => (QpOp::WriteWithImm, wr.sge.len),
                Some(wr) => (QpOp::Write, wr.sge.len),
                None => (QpOp::Write, 0),
            };
            let ev = QpEvent {
                device: sink.device,
                wr_id,
                op,
                qpn,
                length: length as u64,
            };
            let parent = self.base.reqs.get(id)?.parent;
            sink.start(id.index(), qi, parent, &ev);
        }
        Ok(())
    }

    fn poison(&mut self, e: Error) -> Error {
        self.base.poison(&e);
        e
    }

    /// Where the comm is in its life.
    pub fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        self.base.lifecycle()
    }

    /// Destroys QPs, CQ and the FIFO registration.
    pub fn close(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let r = self.base.teardown();
        let m = self
            .fifo_mr
            .take()
            .map_or(Ok(()), |mr| self.base.dev.dereg_mr(mr));
        r.and(m)
    }

    /// Requests in use (for tests and diagnostics).
    pub fn requests_in_use(&self) -> usize {
        self.base.reqs.in_use()
    }
}

impl<P: Provider> Drop for SendComm<P> {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}
