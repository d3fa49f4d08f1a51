//! The receiving side of a connection.
//!
//! Drive it as: receive the connector's `QpInfo` → [`RecvComm::new`] (creates and connects the
//! QPs, negotiating the MTU) → send [`RecvComm::local_info`] back → wait for the peer's ready
//! message → [`RecvComm::irecv`] / [`RecvComm::test`] / [`RecvComm::iflush`] from one thread.

use super::base::Base;
use super::events::{QpEvent, QpOp, Sink};
use super::types::{CommConfig, Done, RecvBuf, RecvView};
use crate::error::{Error, ReqType, Result};
use crate::fifo::{FifoRing, PostedRecv, MAX_RECVS, MAX_REQUESTS};
use crate::provider::{
    Access, ConnectAttr, Ece, MrKeys, Mtu, Provider, QpAttr, SendWr, Sge, WrOpcode,
};
use crate::request::{ReqId, Request};
use crate::wire::{QpInfo, RemoteBuf, MAX_QPS};

/// A registration and its keys.
type Reg<P> = (<P as Provider>::Mr, MrKeys);

/// The RDMA READ flush: a loopback QP and a one-byte read into registered scratch memory.
struct Flush<P: Provider> {
    qp: Option<P::Qp>,
    /// How `qp` is connected to itself, for a failback's reset ([`RecvComm::revive`]).
    attr: Option<ConnectAttr>,
}

/// The receiving side of a connection.
pub struct RecvComm<P: Provider> {
    base: Base<P>,
    cfg: CommConfig,
    mtu: Mtu,
    sl: u8,
    tc: u8,
    /// Where receive posts are staged before being written to the peer's FIFO (and the flush's
    /// scratch target).
    staging: P::Fifo,
    staging_mr: Option<P::Mr>,
    staging_keys: MrKeys,
    /// The staging ring's sizes FIFO, registered for the peer to write (module doc of `fifo`).
    sizes_mr: Option<P::Mr>,
    sizes_keys: MrKeys,
    /// The peer's FIFO.
    rem_fifo: RemoteBuf,
    /// Sequence number of the next FIFO slot to post.
    fifo_tail: u64,
    flush: Flush<P>,
    /// The ECE options our QPs settled on, for the answer (empty: no ECE).
    ece: heapless::Vec<Ece, MAX_QPS>,
}

impl<P: Provider> RecvComm<P> {
    /// Creates and connects the QPs towards the connector described by `remote`.
    pub fn new(dev: P, cfg: CommConfig, remote: &QpInfo) -> Result<Self> {
        let rem_fifo = remote.fifo.ok_or(Error::Wire {
            what: "connector sent no FIFO",
            value: 0,
        })?;
        if rem_fifo.addr == 0 || rem_fifo.rkey == 0 {
            return Err(Error::Wire {
                what: "connector's FIFO address or rkey is 0",
                value: rem_fifo.addr,
            });
        }
        let nqps = u8::try_from(remote.qpn.len()).map_err(|_| Error::Wire {
            what: "QP count",
            value: remote.qpn.len() as u64,
        })?;
        let attr = QpAttr {
            max_send_wr: 2 * MAX_REQUESTS as u32,
            max_recv_wr: MAX_REQUESTS as u32,
            max_inline: if cfg.use_inline {
                (MAX_RECVS * core::mem::size_of::<crate::fifo::FifoElem>()) as u32
            } else {
                0
            },
            access: Access {
                remote_write: true,
                ..Access::default()
            },
        };
        let cq_depth = 2 * MAX_REQUESTS as u32 * nqps as u32 + MAX_REQUESTS as u32;
        let mut base = Base::new(dev, nqps, cq_depth, &attr)?;
        base.accept_peer(remote)?;
        let mtu = remote.mtu.min(base.port.mtu);
        // The receiver applies the sender's service level and traffic class (NCCL 2.28); on
        // RoCE its QPs, which post the clear-to-send writes, take NCCL_IB_FIFO_TC when set.
        let (sl, tc) = (remote.sl, remote.tc);
        let qp_tc = crate::params::fifo_qp_tc(base.port.link_layer, cfg.fifo_tc, tc);
        let cattr = base.connect_attr(remote, mtu, &cfg, sl, qp_tc);
        // ECE: the requester's options go on our QPs before they connect; what the QPs settled
        // on goes back in the answer.
        let ece_set = cfg.ece && base.set_ece_all(remote)?;
        base.connect_all(remote, &cattr)?;
        base.set_connected();
        let ece = if ece_set {
            base.query_ece_all()?
        } else {
            heapless::Vec::new()
        };

        let staging = base.dev.alloc_fifo()?;
        let ((staging_mr, staging_keys), (sizes_mr, sizes_keys)) =
            Self::reg_staging(&base, &staging)?;
        let mut comm = Self {
            base,
            cfg,
            mtu,
            sl,
            tc,
            staging,
            staging_mr: Some(staging_mr),
            staging_keys,
            sizes_mr: Some(sizes_mr),
            sizes_keys,
            rem_fifo,
            fifo_tail: 0,
            flush: Flush {
                qp: None,
                attr: None,
            },
            ece,
        };
        if cfg.gdr_flush {
            let (qp, attr) = comm.loopback_qp()?;
            comm.flush = Flush {
                qp: Some(qp),
                attr: Some(attr),
            };
        }
        Ok(comm)
    }

    /// Registers the staging ring (written by the flush's READ, read by the peer) and its sizes
    /// FIFO (written by the peer); on a failure nothing stays registered.
    fn reg_staging(base: &Base<P>, staging: &P::Fifo) -> Result<(Reg<P>, Reg<P>)> {
        let ring_access = Access {
            local_write: true,
            remote_read: true,
            ..Access::default()
        };
        let ring = base.reg(
            staging.base_addr(),
            FifoRing::<MAX_REQUESTS>::BYTES,
            ring_access,
        )?;
        let sizes_access = Access {
            local_write: true,
            remote_write: true,
            ..Access::default()
        };
        let sizes_len = FifoRing::<MAX_REQUESTS>::SIZES_BYTES;
        match base.reg(staging.sizes_base(), sizes_len, sizes_access) {
            Ok(sizes) => Ok((ring, sizes)),
            Err(e) => {
                let _ = base.dev.dereg_mr(ring.0);
                Err(e)
            }
        }
    }

    /// A QP connected to itself, for the flush READ, and how it is connected.
    fn loopback_qp(&mut self) -> Result<(P::Qp, ConnectAttr)> {
        let attr = QpAttr {
            max_send_wr: MAX_REQUESTS as u32,
            max_recv_wr: 1,
            max_inline: 0,
            access: Access {
                local_write: true,
                remote_read: true,
                ..Access::default()
            },
        };
        let mut qp = self.base.create_qp(&attr)?;
        let me = self.base.port;
        let info = QpInfo {
            port: me.port,
            link_layer: me.link_layer,
            mtu: me.mtu,
            lid: me.lid,
            gid: me.gid,
            sl: 0,
            tc: 0,
            qpn: core::iter::once(self.base.dev.qp_num(&qp)).collect(),
            fifo: None,
            addr: me.addr,
            ece: heapless::Vec::new(),
        };
        let mut a = self
            .base
            .connect_attr(&info, me.mtu, &self.cfg, self.sl, self.tc);
        a.remote_qpn = info.qpn[0];
        if let Err(e) = self.base.dev.connect_qp(&mut qp, &a) {
            let _ = self.base.dev.destroy_qp(qp);
            return Err(e);
        }
        Ok((qp, a))
    }

    /// Records the peer's socket address (the bootstrap connection's far end), so errors name it.
    pub fn set_peer_addr(&mut self, addr: core::net::SocketAddr) {
        self.base.set_peer_addr(addr);
    }

    /// The answer to the connector: our QPs, the negotiated MTU, and our sizes FIFO.
    pub fn local_info(&self) -> QpInfo {
        let mut info = self.base.local_info(self.mtu, self.sl, self.tc);
        info.fifo = Some(RemoteBuf {
            addr: self.staging.sizes_base(),
            rkey: self.sizes_keys.rkey,
        });
        info.ece = self.ece.clone();
        info
    }

    /// Sends profiler events to `sink` (`None`: none; see [`super::events`]).
    pub fn set_events(&mut self, sink: Option<Sink>) {
        self.base.sink = sink;
    }

    /// Posts a (multi-)receive of `bufs` (1..=8 buffers).
    pub fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<ReqId>> {
        self.irecv_under(bufs, &[])
    }

    /// [`RecvComm::irecv`] with the profiler parent of each buffer (NCCL's `phandles`; an
    /// entry of 0, or a missing one, is none).
    pub fn irecv_under<B: RecvView>(
        &mut self,
        bufs: &[B],
        parents: &[usize],
    ) -> Result<Option<ReqId>> {
        self.irecv_impl(bufs, parents, 0)
    }

    /// [`RecvComm::irecv`] of one rail of a fused comm: the clear-to-send carries `rails`, the
    /// fused receiver's live-rail mask ([`crate::fused`]; a plain comm's is 0).
    pub fn irecv_rails(&mut self, bufs: &[RecvBuf], rails: u8) -> Result<Option<ReqId>> {
        self.irecv_impl(bufs, &[], rails)
    }

    #[inline(always)]
    fn irecv_impl<B: RecvView>(
        &mut self,
        bufs: &[B],
        parents: &[usize],
        rails: u8,
    ) -> Result<Option<ReqId>> {
        self.base.check_live("irecv")?;
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::OutOfRange {
                what: "receives in one irecv",
                value: n as i64,
                min: 1,
                max: MAX_RECVS as i64,
            });
        }
        let nqps = if self.cfg.split_data {
            self.base.qps.len()
        } else {
            1
        };
        let id = self.base.reqs.alloc(ReqType::Recv, nqps as u32, n as u8)?;
        self.base.reqs.get(id)?.fifo_slot =
            FifoRing::<MAX_REQUESTS>::slot_of(self.fifo_tail) as u16;
        if let Err(e) = self.post(id, bufs, parents, nqps, rails) {
            self.base.poison(&e);
            let _ = self.base.reqs.free(id);
            return Err(e);
        }
        Ok(Some(id))
    }

    fn post<B: RecvView>(
        &mut self,
        id: ReqId,
        bufs: &[B],
        parents: &[usize],
        nqps: usize,
        rails: u8,
    ) -> Result<()> {
        for _ in 0..nqps {
            let q = self.base.next_qp();
            if let Some(sink) = self.base.sink {
                self.start_events(sink, id, q, &parents[..parents.len().min(bufs.len())])?;
            }
            self.base
                .dev
                .post_recv(&mut self.base.qps[q], id.index() as u64)?;
        }
        // Tell the sender where to write.
        let mut elems = [PostedRecv::default(); MAX_RECVS];
        for (e, b) in elems.iter_mut().zip(bufs) {
            *e = PostedRecv {
                addr: b.addr(),
                size: b.size(),
                rkey: b.mr().rkey,
                tag: b.tag(),
            };
        }
        let seq = self.fifo_tail;
        let (off, len) = self
            .staging
            .publish_rails(seq, &elems[..bufs.len()], rails.into());
        // Signal once per lap of the ring, so the send queue of unsignaled posts drains.
        let signaled = FifoRing::<MAX_REQUESTS>::slot_of(seq) == 0;
        if signaled {
            self.base.reqs.get(id)?.events += 1;
        }
        let wr = SendWr {
            wr_id: id.index() as u64,
            opcode: WrOpcode::Write,
            sge: Sge {
                addr: self.staging.base_addr() + off as u64,
                len: len as u32,
                lkey: self.staging_keys.lkey,
            },
            remote_addr: self.rem_fifo.addr + off as u64,
            rkey: self.rem_fifo.rkey,
            imm: 0,
            signaled,
            inline: self.cfg.use_inline,
        };
        self.base.dev.post_send(&mut self.base.qps[0], &[wr])?;
        self.fifo_tail += 1;
        Ok(())
    }

    /// Starts one QP event per buffer of request `id` on QP index `q` (as NCCL 2.28).
    fn start_events(&mut self, sink: Sink, id: ReqId, q: usize, parents: &[usize]) -> Result<()> {
        let ev = QpEvent {
            device: sink.device,
            wr_id: id.index() as u64,
            op: QpOp::Recv,
            qpn: self.base.dev.qp_num(&self.base.qps[q]),
            length: 0,
        };
        for &parent in parents {
            sink.start(id.index(), q, parent, &ev);
        }
        Ok(())
    }

    /// Flushes received data out of the NIC (GPU-direct receives): one RDMA READ from the last
    /// non-empty buffer. `Ok(None)` when there is nothing to flush.
    pub fn iflush<B: RecvView>(&mut self, bufs: &[B]) -> Result<Option<ReqId>> {
        self.base.check_live("iflush")?;
        if bufs.len() > MAX_RECVS {
            return Err(Error::OutOfRange {
                what: "buffers in one iflush",
                value: bufs.len() as i64,
                min: 0,
                max: MAX_RECVS as i64,
            });
        }
        let Some(last) = bufs.iter().rposition(|b| b.size() != 0) else {
            return Ok(None);
        };
        let Some(qp) = self.flush.qp.as_mut() else {
            return Ok(None);
        };
        let id = self.base.reqs.alloc(ReqType::Flush, 1, 1)?;
        let wr = SendWr {
            wr_id: id.index() as u64,
            opcode: WrOpcode::Read,
            sge: Sge {
                addr: self.staging.scratch_addr(),
                len: 1,
                lkey: self.staging_keys.lkey,
            },
            remote_addr: bufs[last].addr(),
            rkey: bufs[last].mr().rkey,
            imm: 0,
            signaled: true,
            inline: false,
        };
        if let Err(e) = self.base.dev.post_send(qp, &[wr]) {
            let _ = self.base.reqs.free(id);
            return Err(e);
        }
        Ok(Some(id))
    }

    /// Polls for completion of `id`. A receive reports the bytes each buffer received: a
    /// single receive from its immediates, a multi-receive from the sizes FIFO; each is
    /// checked against the buffer posted (a hostile or broken peer is [`Error::BadSize`]).
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        let staging = &self.staging;
        self.base.test(id, |r, peer| match r.kind {
            Some(ReqType::Recv) => recv_done(staging, r, peer),
            _ => Ok(Base::<P>::done_of(r)),
        })
    }

    /// `id` if it completed before now, without polling (see `Base::finish`; also on a
    /// poisoned comm).
    pub fn completed(&mut self, id: ReqId) -> Result<Option<Done>> {
        let staging = &self.staging;
        self.base.finish(id, |r, peer| match r.kind {
            Some(ReqType::Recv) => recv_done(staging, r, peer),
            _ => Ok(Base::<P>::done_of(r)),
        })
    }

    /// One signaled RDMA WRITE of `local` to `remote_addr` (`rkey`) on QP 0, as a request of
    /// its own (done when acknowledged). A fused receiver tells the sender with it that a rail
    /// is out of use ([`crate::fused`]).
    pub fn iwrite(&mut self, local: Sge, remote_addr: u64, rkey: u32) -> Result<ReqId> {
        self.one_sided(WrOpcode::Write, local, remote_addr, rkey)
    }

    /// One signaled RDMA READ of `remote_addr` (`rkey`) into `local`, on QP 0, as a request
    /// of its own: a fused receiver's failback reads the sender's rail state with it, and its
    /// completion on the rail itself proves the path ([`crate::fused`]).
    pub fn iread(&mut self, local: Sge, remote_addr: u64, rkey: u32) -> Result<ReqId> {
        self.one_sided(WrOpcode::Read, local, remote_addr, rkey)
    }

    /// A fused comm's failback of this rail (`Base::revive`): QPs reset (the flush's loopback
    /// QP too: a flush that failed left it in the error state), requests given up, connected
    /// again; the next receive is posted at FIFO sequence number `tail` (the fused comm's, so
    /// every rail's clear-to-send of a receive has the same one).
    pub fn revive(&mut self, tail: u64) -> Result<()> {
        // Before `Base::revive`, which then throws away what the CQ holds from both.
        if let (Some(qp), Some(a)) = (self.flush.qp.as_mut(), self.flush.attr.as_ref()) {
            self.base.dev.reset_qp(qp, a)?;
        }
        let cq = 2 * MAX_REQUESTS * self.base.qps.len() + MAX_REQUESTS;
        self.base.revive(cq / 4 + 2)?;
        self.fifo_tail = tail;
        Ok(())
    }

    /// Sets the FIFO sequence number of the next receive (a revived rail rejoining at the
    /// fused comm's sequence number, `crate::fused::heal`).
    pub fn set_fifo_tail(&mut self, tail: u64) {
        self.fifo_tail = tail;
    }

    fn one_sided(
        &mut self,
        opcode: WrOpcode,
        local: Sge,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<ReqId> {
        self.base.check_live("iwrite")?;
        let id = self.base.reqs.alloc(ReqType::Send, 1, 1)?;
        let wr = SendWr {
            wr_id: id.index() as u64,
            opcode,
            sge: local,
            remote_addr,
            rkey,
            imm: 0,
            signaled: true,
            inline: false,
        };
        if let Err(e) = self.base.dev.post_send(&mut self.base.qps[0], &[wr]) {
            let _ = self.base.reqs.free(id);
            self.base.poison(&e);
            return Err(e);
        }
        Ok(id)
    }

    /// The comm failed outside the core (its caller found the peer gone): every later call is
    /// refused at once with `Error::Poisoned`, reported as `e` was (the first failure stays).
    pub fn fail(&mut self, e: &Error) {
        self.base.poison(e);
    }

    /// After a failure (the comm is poisoned): takes every completion left in the CQ, the
    /// good ones applied, so [`Self::completed`] then says exactly which receives completed
    /// (the peer had them acknowledged) and which were flushed (a fused comm, `crate::fused`).
    pub fn drain(&mut self) -> Result<()> {
        // Every receive and signaled write of the comm fits the CQ: that many completions, in
        // polls of 4, and one more poll that finds the CQ empty.
        let cq = 2 * MAX_REQUESTS * self.base.qps.len() + MAX_REQUESTS;
        self.base.drain(cq / 4 + 2)
    }

    /// Polls the CQ once for no request in particular (see `Base::progress`).
    pub fn progress(&mut self) -> Result<()> {
        self.base.progress()
    }

    /// Where the comm is in its life.
    pub fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        self.base.lifecycle()
    }

    /// Destroys QPs, CQ and registrations.
    pub fn close(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let f = self
            .flush
            .qp
            .take()
            .map_or(Ok(()), |qp| self.base.dev.destroy_qp(qp));
        let r = self.base.teardown();
        let m = self
            .staging_mr
            .take()
            .map_or(Ok(()), |mr| self.base.dev.dereg_mr(mr));
        let z = self
            .sizes_mr
            .take()
            .map_or(Ok(()), |mr| self.base.dev.dereg_mr(mr));
        f.and(r).and(m).and(z)
    }

    /// Requests in use (for tests and diagnostics).
    pub fn requests_in_use(&self) -> usize {
        self.base.reqs.in_use()
    }
}

/// What a done receive reports: per buffer the bytes the peer says it wrote, each at most the
/// buffer posted in the request's slot, and for a multi-receive non-zero exactly where the
/// immediate's bitmask says so.
fn recv_done(ring: &FifoRing, r: &Request, peer: &crate::error::PeerId) -> Result<Done> {
    let n = r.nreqs as usize;
    let slot = r.fifo_slot as usize;
    let sizes = if n > 1 { ring.sizes(slot, n) } else { r.sizes };
    for (i, &size) in sizes.iter().enumerate().take(n) {
        let posted = ring.posted_size(slot, i);
        let flagged = n == 1 || ((r.imm_mask >> i) & 1 == 1) == (size != 0);
        if size > posted || !flagged {
            return Err(Error::BadSize {
                index: i as u8,
                size,
                posted,
                peer: *peer,
            });
        }
    }
    Ok(Done { n: n as u8, sizes })
}

impl<P: Provider> Drop for RecvComm<P> {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}
