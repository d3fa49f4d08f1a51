//! [`Provider`] over libibverbs: one plugin device (a device port and its shared PD).
//!
//! * QPs are RC; `connect_qp` takes them RESET → INIT → RTR → RTS with the negotiated MTU, the
//!   GRH (RoCE, or IB with a global GID), SL/TC, pkey index, timeout and retry count.
//! * `post_send`/`post_recv`/`poll_cq` call through `context->ops` (they are inline in verbs.h);
//!   WR chains are built on the stack, so the hot path does not allocate.
//! * `reg_mr` asks for relaxed ordering only for registrations that request it (NCCL's data
//!   buffers, plain or DMA-BUF, when `NCCL_IB_PCI_RELAXED_ORDERING` allows it; never the FIFO
//!   and flush rings), through `ibv_reg_mr_iova2` / `ibv_reg_dmabuf_mr`, retrying without it on
//!   EINVAL (old drivers); DMA-BUF registrations honour the offset and never keep the fd.
//! * QP connection details (modify retry, RoCE GRH / InfiniBand FLID routing, ECE) are in
//!   [`super::qp`].
//! * A device-fatal async event makes every later poll on the device fail; a QP or CQ error
//!   only the polls of the comm owning it (see [`super::events`]), a QP error until a
//!   failback's `reset_qp` of that QP, which never sleeps (one attempt per transition).
#![allow(unsafe_code)] // This module calls C through raw pointers (the FFI boundary); every block has a SAFETY comment.

use core::mem::MaybeUninit;
use std::sync::Arc;

use ibnet_core::fifo::FifoRing;
use ibnet_core::provider::*;
use ibnet_core::{Error, Result};

use super::device::VerbsDev;
use super::events::{CommFlag, Failure};
use super::loader::{errno_or, last_errno};
use super::qp::Retry;
use super::sys::*;

/// One verbs device port, as a [`Provider`]. Cheap to clone.
#[derive(Clone)]
pub struct VerbsPort {
    /// The device.
    pub dev: Arc<VerbsDev>,
    /// Ask for PCIe relaxed ordering on registrations (`NCCL_IB_PCI_RELAXED_ORDERING`).
    pub relaxed_ordering: bool,
    /// Test fault (`IBNET_FAULT_RO_EINVAL`): treat every relaxed-ordering registration as
    /// refused with EINVAL, so the fallback runs.
    pub fault_ro_einval: bool,
    /// How QPs connect (modify retry, ECE); shared by every port of the plugin.
    pub qp: Arc<super::qp::QpOpts>,
    /// The GID index and GID [`Provider::port_info`] reports: discovery's, and in a comm's
    /// own copy the one chosen as the comm was made ([`VerbsPort::with_gid`]).
    pub gid: (u8, [u8; 16]),
}

impl VerbsPort {
    /// This port for a new comm, with the GID chosen for it
    /// ([`VerbsDev::choose_gid`](super::device::VerbsDev::choose_gid)): the comm reads it
    /// from its own copy, never from state another thread's connection may change.
    pub fn with_gid(&self, gid: (u8, [u8; 16])) -> Self {
        Self {
            gid,
            ..self.clone()
        }
    }
}

/// Logs the relaxed-ordering fallback once per process (registrations are not a hot path, but
/// one line is enough to tell an operator what happened).
fn note_ro_fallback(dev: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        ibnet_nccl::info!(
            ibnet_nccl::log::INIT | ibnet_nccl::log::NET,
            "{dev}: relaxed-ordering registration refused (EINVAL); registering without it"
        )
    });
}

/// A completion queue and its comm's async-error word (set by the device's event thread for a
/// CQ error or an error of a QP completing on it; a QP's share cleared by `reset_qp`).
pub struct VCq(*mut ibv_cq, CommFlag);
/// A queue pair and its access rights.
pub struct VQp {
    raw: *mut ibv_qp,
    access: Access,
}
/// A memory registration.
pub struct VMr(*mut ibv_mr);

// SAFETY: verbs objects may be used from any thread; each wrapper is owned by one comm, which is
// used by one thread at a time.
unsafe impl Send for VCq {}
// SAFETY: as above.
unsafe impl Send for VQp {}
// SAFETY: as above; MR keys are read-only after creation.
unsafe impl Send for VMr {}
// SAFETY: an MR is immutable after registration.
unsafe impl Sync for VMr {}

fn fail(call: &'static str, errno: i32) -> Error {
    Error::Provider { call, errno }
}

fn access_flags(a: Access) -> i32 {
    let mut f = 0;
    if a.local_write {
        f |= IBV_ACCESS_LOCAL_WRITE;
    }
    if a.remote_write {
        f |= IBV_ACCESS_REMOTE_WRITE;
    }
    if a.remote_read {
        f |= IBV_ACCESS_REMOTE_READ;
    }
    f
}

/// A FIFO ring allocated zeroed on the heap (it is tens of KiB: `Box::default()` would build it
/// on the stack first).
fn zeroed_fifo() -> Box<FifoRing> {
    let layout = std::alloc::Layout::new::<FifoRing>();
    // SAFETY: the layout is FifoRing's (non-zero size). All-zero bytes are a valid FifoRing: it
    // is `repr(C)` arrays of atomics (u32/u64), and zero is its `new()` state; so the zeroed
    // allocation may be owned by a Box of that type, which frees it with the same layout.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut FifoRing;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(p)
    }
}

/// Maps a completion's opcode. Unknown opcodes of successful completions are an error (never
/// guessed); a failed completion's opcode is undefined in verbs, so only its status counts.
fn wc_opcode(opcode: i32, status: WcStatus) -> Result<WcOpcode> {
    Ok(match opcode {
        0 => WcOpcode::Send,
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        128 => WcOpcode::Recv,
        129 => WcOpcode::RecvRdmaWithImm,
        _ if status != WcStatus::Success => WcOpcode::Unknown,
        _ => {
            return Err(fail(
                "ibv_poll_cq (unknown completion opcode)",
                libc::EPROTO,
            ))
        }
    })
}

/// Longest WR chain `post_send` accepts in one call.
const MAX_CHAIN: usize = 32;
/// Completions read per `poll_cq` call into the stack array.
const POLL_BATCH: usize = 64;

impl VerbsPort {
    fn v(&self) -> &'static super::loader::Verbs {
        self.dev.ctx.verbs
    }

    fn modify(
        &self,
        qp: *mut ibv_qp,
        attr: &mut ibv_qp_attr,
        mask: i32,
        what: &'static str,
        retry: Retry,
    ) -> Result<()> {
        let (v, name) = (self.v(), &self.dev.ctx.name);
        super::qp::modify(v, &self.qp, name, qp, attr, mask, what, retry)
    }

    /// The GID at `index` now (the table can change after init; the comm chose `index` when
    /// it was created).
    fn gid_at(&self, index: u8) -> [u8; 16] {
        let mut g = ibv_gid::default();
        // SAFETY: live context, writable gid.
        let rc = unsafe {
            (self.v().query_gid)(self.dev.ctx.raw, self.dev.port, i32::from(index), &mut g)
        };
        if rc == 0 {
            g.raw
        } else {
            self.gid.1
        }
    }

    /// The address vector of the peer `a` names, for RTR.
    fn address_vector(&self, a: &ConnectAttr) -> ibv_ah_attr {
        let mut ah = ibv_ah_attr {
            dlid: a.remote_lid,
            sl: a.sl,
            port_num: self.dev.port,
            ..Default::default()
        };
        // RoCE: always a GRH, with the traffic class. InfiniBand: the LID within the subnet,
        // the FLID and a GRH across subnets (NCCL 2.28; no traffic class there).
        let (global, tc) = if a.link_layer == LinkLayer::Ethernet {
            (true, a.tc)
        } else {
            let (dlid, global) =
                super::qp::ib_route(&self.gid_at(a.gid_index), &a.remote_gid.0, a.remote_lid);
            ah.dlid = dlid;
            (global, 0)
        };
        if global {
            ah.is_global = 1;
            ah.grh = ibv_global_route {
                dgid: ibv_gid {
                    raw: a.remote_gid.0,
                },
                flow_label: 0,
                sgid_index: a.gid_index,
                hop_limit: 255,
                traffic_class: tc,
            };
        }
        ah
    }
}

impl VerbsPort {
    /// Names both GIDs when a QP cannot reach RTR (on RoCE usually because the two sides chose
    /// GIDs of different address families), next to the API's WARN of the error itself.
    fn warn_rtr(&self, qp: &VQp, a: &ConnectAttr) {
        let v4 = |g: [u8; 16]| std::net::Ipv6Addr::from(g).to_ipv4_mapped().is_some();
        let hint = if a.link_layer == LinkLayer::Ethernet && v4(self.gid.1) != v4(a.remote_gid.0) {
            ": the two GIDs are of different address families (IPv4-mapped and IPv6); \
             choose the same NCCL_IB_ADDR_FAMILY / NCCL_IB_GID_INDEX on both sides"
        } else {
            ""
        };
        ibnet_nccl::warn!(
            "{}:{} QP {:#x} cannot connect to peer gid {} qpn {:#x} from local GID index {} \
             ({}){hint}",
            self.dev.name.to_string_lossy(),
            self.dev.port,
            self.qp_num(qp),
            std::net::Ipv6Addr::from(a.remote_gid.0),
            a.remote_qpn,
            a.gid_index,
            std::net::Ipv6Addr::from(self.gid.1)
        );
    }

    /// INIT → RTR → RTS, connected to the remote QP `a` names; one INFO line of what was
    /// negotiated. `retry`: [`Retry::Nccl`] is connection setup: each transition retried as
    /// NCCL does, and a failed RTR also WARNs naming both GIDs. A failback's reset passes
    /// [`Retry::Never`]: one attempt per transition and no RTR WARN (while the rail's link is
    /// still down RTR fails, RoCE cannot resolve the peer's address, and the failed attempt is
    /// the core's to count and retry later, not a WARN or a sleep per attempt).
    fn bring_up(&self, qp: &mut VQp, a: &ConnectAttr, retry: Retry) -> Result<()> {
        let rtr_warn = retry == Retry::Nccl;
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: a.pkey_index,
            port_num: self.dev.port,
            qp_access_flags: access_flags(qp.access) as u32,
            ..Default::default()
        };
        self.modify(
            qp.raw,
            &mut attr,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
            retry,
        )?;
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: a.mtu as i32,
            dest_qp_num: a.remote_qpn,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: self.address_vector(a),
            ..Default::default()
        };
        self.modify(
            qp.raw,
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN_MASK
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
            retry,
        )
        .inspect_err(|_| {
            if rtr_warn {
                self.warn_rtr(qp, a)
            }
        })?;
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            qp.raw,
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
            retry,
        )?;
        // Connection setup, not the hot path: one line per QP says what was negotiated.
        ibnet_nccl::info!(
            ibnet_nccl::log::NET,
            "{}:{} QP {:#x} connected to peer gid {} qpn {:#x}: path MTU {} (the minimum of both \
             ports' active MTU), local GID index {}, timeout {} retry {}",
            self.dev.name.to_string_lossy(),
            self.dev.port,
            self.qp_num(qp),
            std::net::Ipv6Addr::from(a.remote_gid.0),
            a.remote_qpn,
            128u32 << (a.mtu as u32).min(5),
            a.gid_index,
            a.timeout,
            a.retry_cnt
        );
        super::qp::log_connected(self.v(), &self.dev.ctx.name, qp.raw);
        Ok(())
    }
}

impl VerbsPort {
    /// One INFO per failed failback reset (not a WARN: while the rail's link is down every
    /// attempt fails, and the core counts them).
    fn note_failed_reset(&self, qp: &VQp, a: &ConnectAttr, e: &Error) {
        ibnet_nccl::info!(
            ibnet_nccl::log::NET,
            "{}:{} QP {:#x}: failback reset to peer gid {} qpn {:#x} failed ({e}); the rail \
             stays out of use until the next attempt",
            self.dev.name.to_string_lossy(),
            self.dev.port,
            self.qp_num(qp),
            std::net::Ipv6Addr::from(a.remote_gid.0),
            a.remote_qpn
        )
    }
}

impl Provider for VerbsPort {
    type Cq = VCq;
    type Qp = VQp;
    type Mr = VMr;
    type Fifo = Box<FifoRing>;

    fn port_info(&self) -> PortInfo {
        let d = &self.dev;
        // Chosen as each comm is made (`VerbsDev::choose_gid`, `with_gid`): the GID table may
        // change. This copy's own, read once by the comm (`Base::new`).
        let (gid_index, gid) = self.gid;
        PortInfo {
            port: d.port,
            link_layer: if d.link_layer == IBV_LINK_LAYER_INFINIBAND {
                LinkLayer::Infiniband
            } else {
                LinkLayer::Ethernet
            },
            lid: d.lid,
            gid: Gid(gid),
            gid_index,
            mtu: Mtu::from_raw(d.mtu).unwrap_or(Mtu::M1024),
            addr: ProviderAddr::EMPTY,
        }
    }

    fn dev_name(&self) -> DevName {
        DevName::new(&self.dev.ctx.name)
    }

    fn alloc_fifo(&self) -> Result<Self::Fifo> {
        Ok(zeroed_fifo())
    }

    fn create_cq(&self, depth: u32) -> Result<VCq> {
        // SAFETY: live context; no channel, no completion vector preference.
        let cq = unsafe {
            (self.v().create_cq)(
                self.dev.ctx.raw,
                depth as i32,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(fail("ibv_create_cq", last_errno()));
        }
        let flag = self.dev.ctx.events.add_cq(cq as usize);
        Ok(VCq(cq, flag))
    }

    fn create_qp(&self, cq: &VCq, attr: &QpAttr) -> Result<VQp> {
        let mut ia = ibv_qp_init_attr {
            qp_context: core::ptr::null_mut(),
            send_cq: cq.0,
            recv_cq: cq.0,
            srq: core::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: attr.max_send_wr,
                max_recv_wr: attr.max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: attr.max_inline,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD and CQ are live; `ia` is fully initialised.
        let qp = unsafe { (self.v().create_qp)(self.dev.ctx.pd, &mut ia) };
        if qp.is_null() {
            return Err(fail("ibv_create_qp", last_errno()));
        }
        self.dev.ctx.events.add_qp(qp as usize, cq.0 as usize);
        Ok(VQp {
            raw: qp,
            access: attr.access,
        })
    }

    fn qp_num(&self, qp: &VQp) -> u32 {
        // SAFETY: `qp.raw` is a live QP; `qp_num` is in the stable prefix.
        unsafe { (*qp.raw).qp_num }
    }

    fn connect_qp(&self, qp: &mut VQp, a: &ConnectAttr) -> Result<()> {
        self.bring_up(qp, a, Retry::Nccl)
    }

    fn query_ece(&self, qp: &VQp) -> Result<Option<Ece>> {
        if !self.qp.ece {
            return Ok(None);
        }
        super::qp::query_ece(self.v(), &self.dev.ctx.name, qp.raw)
    }

    fn set_ece(&self, qp: &mut VQp, ece: &Ece) -> Result<bool> {
        if !self.qp.ece {
            return Ok(false);
        }
        super::qp::set_ece(self.v(), &self.dev.ctx.name, qp.raw, ece)
    }

    fn post_send(&self, qp: &mut VQp, wrs: &[SendWr]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        if wrs.len() > MAX_CHAIN {
            return Err(Error::Full {
                what: "verbs WR chain",
                cap: MAX_CHAIN,
            });
        }
        // Only the first `wrs.len()` entries are written (and read by the provider).
        let mut sges = [const { MaybeUninit::<ibv_sge>::uninit() }; MAX_CHAIN];
        let mut raw = [const { MaybeUninit::<ibv_send_wr>::uninit() }; MAX_CHAIN];
        let base = raw.as_mut_ptr() as *mut ibv_send_wr;
        let sp = sges.as_mut_ptr() as *mut ibv_sge;
        let n = wrs.len();
        for (i, w) in wrs.iter().enumerate() {
            let sge = ibv_sge {
                addr: w.sge.addr,
                length: w.sge.len,
                lkey: w.sge.lkey,
            };
            // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero flags, union zero).
            let mut r: ibv_send_wr = unsafe { core::mem::zeroed() };
            r.wr_id = w.wr_id;
            r.num_sge = if w.sge.len == 0 { 0 } else { 1 };
            r.opcode = match w.opcode {
                WrOpcode::Write => IBV_WR_RDMA_WRITE,
                WrOpcode::WriteWithImm => IBV_WR_RDMA_WRITE_WITH_IMM,
                WrOpcode::Read => IBV_WR_RDMA_READ,
            };
            r.send_flags = if w.signaled { IBV_SEND_SIGNALED } else { 0 }
                | if w.inline { IBV_SEND_INLINE } else { 0 };
            r.imm_data = w.imm.to_be();
            r.wr.remote_addr = w.remote_addr;
            r.wr.rkey = w.rkey;
            // SAFETY: `i < n <= MAX_CHAIN`: in bounds of both arrays. Every write goes through
            // `base`/`sp` (never the arrays again), so the pointers stored in the chain stay
            // valid for the post call below.
            unsafe {
                r.sg_list = sp.add(i);
                r.next = if i + 1 < n {
                    base.add(i + 1)
                } else {
                    core::ptr::null_mut()
                };
                sp.add(i).write(sge);
                base.add(i).write(r);
            }
        }
        let mut bad: *mut ibv_send_wr = core::ptr::null_mut();
        // SAFETY: the QP is live; its context's ops table is the provider's; the chain and SGEs
        // live on this stack frame until the call returns (the NIC copies WQEs at post time).
        let rc = unsafe {
            let ops = &(*(*qp.raw).context).ops;
            match ops.post_send {
                Some(f) => f(qp.raw, base, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(fail("ibv_post_send", errno_or(rc)));
        }
        Ok(())
    }

    fn post_recv(&self, qp: &mut VQp, wr_id: u64) -> Result<()> {
        let mut wr = ibv_recv_wr {
            wr_id,
            next: core::ptr::null_mut(),
            sg_list: core::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut ibv_recv_wr = core::ptr::null_mut();
        // SAFETY: as in post_send.
        let rc = unsafe {
            let ops = &(*(*qp.raw).context).ops;
            match ops.post_recv {
                Some(f) => f(qp.raw, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(fail("ibv_post_recv", errno_or(rc)));
        }
        Ok(())
    }

    #[inline]
    fn async_failure(&self, cq: &VCq) -> Option<AsyncFailure> {
        // Two atomic loads (the device's fatal count, the comm's flag): see `event_flags`.
        match self.dev.ctx.events.check(&cq.1) {
            Ok(()) => None,
            Err(Failure::Device) => Some(AsyncFailure::Device),
            Err(Failure::Comm) => Some(AsyncFailure::Comm),
        }
    }

    fn poll_cq(&self, cq: &mut VCq, out: &mut [Completion]) -> Result<usize> {
        match self.dev.ctx.events.check(&cq.1) {
            Ok(()) => {}
            Err(Failure::Device) => {
                return Err(fail("async event (fatal device error)", libc::EIO));
            }
            Err(Failure::Comm) => {
                return Err(fail("async event (QP/CQ error on this comm)", libc::EIO));
            }
        }
        // Written by the provider; only the first `rc` entries are read.
        let mut wcs = [const { MaybeUninit::<ibv_wc>::uninit() }; POLL_BATCH];
        let n = out.len().min(POLL_BATCH) as i32;
        // SAFETY: the CQ is live; `wcs` has room for `n` entries.
        let rc = unsafe {
            let ops = &(*(*cq.0).context).ops;
            match ops.poll_cq {
                Some(f) => f(cq.0, n, wcs.as_mut_ptr() as *mut ibv_wc),
                None => -libc::ENOSYS,
            }
        };
        if rc < 0 {
            return Err(fail("ibv_poll_cq", -rc));
        }
        let rc = (rc as usize).min(n as usize);
        for (o, w) in out.iter_mut().zip(&wcs[..rc]) {
            // SAFETY: poll_cq wrote the first `rc` entries.
            let w = unsafe { w.assume_init_ref() };
            let status = WcStatus::from_raw(w.status as u32);
            *o = Completion {
                wr_id: w.wr_id,
                status,
                opcode: wc_opcode(w.opcode, status)?,
                byte_len: w.byte_len,
                imm: if w.wc_flags & IBV_WC_WITH_IMM != 0 {
                    u32::from_be(w.imm_data)
                } else {
                    0
                },
                vendor_err: w.vendor_err,
                qp_num: w.qp_num,
            };
        }
        Ok(rc)
    }

    fn reg_mr(&self, addr: u64, len: u64, access: Access, kind: RegKind) -> Result<VMr> {
        let v = self.v();
        let pd = self.dev.ctx.pd;
        let flags = access_flags(access);
        let len = usize::try_from(len).map_err(|_| Error::OutOfRange {
            what: "registration length",
            value: len as i64,
            min: 0,
            max: isize::MAX as i64,
        })?;
        let mr = match kind {
            RegKind::DmaBuf { fd, offset } => {
                let f = v.reg_dmabuf_mr.ok_or(fail(
                    "ibv_reg_dmabuf_mr (libibverbs < IBVERBS_1.12)",
                    libc::ENOSYS,
                ))?;
                // Relaxed ordering for DMA-BUF too (NCCL 2.28), with the same EINVAL fallback.
                let ro =
                    access.relaxed_ordering && self.relaxed_ordering && v.reg_mr_iova2.is_some();
                let mut mr = core::ptr::null_mut();
                if ro && self.fault_ro_einval {
                    note_ro_fallback(&self.dev.name.to_string_lossy());
                } else if ro {
                    // SAFETY: the PD is live; the fd is only used during the call (never kept).
                    mr = unsafe {
                        f(
                            pd,
                            offset,
                            len,
                            addr,
                            fd,
                            flags | IBV_ACCESS_RELAXED_ORDERING,
                        )
                    };
                    if mr.is_null() && last_errno() != libc::EINVAL {
                        return Err(fail("ibv_reg_dmabuf_mr", last_errno()));
                    }
                    if mr.is_null() {
                        note_ro_fallback(&self.dev.name.to_string_lossy());
                    }
                }
                if mr.is_null() {
                    // SAFETY: as above, without relaxed ordering.
                    mr = unsafe { f(pd, offset, len, addr, fd, flags) };
                }
                if mr.is_null() {
                    return Err(fail("ibv_reg_dmabuf_mr", last_errno()));
                }
                mr
            }
            RegKind::Plain => {
                // Only registrations that ask for it (NCCL's buffers, never the FIFO/flush
                // rings), and only when NCCL_IB_PCI_RELAXED_ORDERING allows it.
                let ro =
                    access.relaxed_ordering && self.relaxed_ordering && v.reg_mr_iova2.is_some();
                let mut mr = core::ptr::null_mut();
                if ro && self.fault_ro_einval {
                    note_ro_fallback(&self.dev.name.to_string_lossy());
                } else if ro {
                    if let Some(f) = v.reg_mr_iova2 {
                        // SAFETY: the PD is live; the caller guarantees the range is mapped.
                        mr = unsafe {
                            f(
                                pd,
                                addr as *mut _,
                                len,
                                addr,
                                (flags | IBV_ACCESS_RELAXED_ORDERING) as u32,
                            )
                        };
                        if mr.is_null() && last_errno() != libc::EINVAL {
                            return Err(fail("ibv_reg_mr_iova2", last_errno()));
                        }
                        if mr.is_null() {
                            note_ro_fallback(&self.dev.name.to_string_lossy());
                        }
                    }
                }
                if mr.is_null() {
                    // SAFETY: as above, without relaxed ordering (old drivers reject it: EINVAL).
                    mr = unsafe { (v.reg_mr)(pd, addr as *mut _, len, flags) };
                }
                if mr.is_null() {
                    return Err(fail("ibv_reg_mr", last_errno()));
                }
                mr
            }
        };
        Ok(VMr(mr))
    }

    fn mr_keys(&self, mr: &VMr) -> MrKeys {
        // SAFETY: a live MR; the keys are immutable.
        unsafe {
            MrKeys {
                lkey: (*mr.0).lkey,
                rkey: (*mr.0).rkey,
            }
        }
    }

    fn dereg_mr(&self, mr: VMr) -> Result<()> {
        // SAFETY: a live MR, released once (consumed).
        let rc = unsafe { (self.v().dereg_mr)(mr.0) };
        if rc != 0 {
            return Err(fail("ibv_dereg_mr", errno_or(rc)));
        }
        Ok(())
    }

    /// RESET, then INIT → RTR → RTS as `connect_qp` (the same remote QP and PSNs), without its
    /// RTR WARN: the outstanding WRs and posted receives are dropped by the device.
    ///
    /// It runs inside a data call (`test`, through the fused comm's failback), so it never
    /// sleeps: one attempt per transition ([`Retry::Never`]); a failure is returned at once
    /// and the core tries the reset again after its start delay.
    ///
    /// Once the QP is in RESET, the error an async event recorded for this QP is cleared
    /// ([`Events::clear_qp`](super::events::Events::clear_qp)), so the rail's polls work
    /// again. Only the QP's own: a CQ error on the comm's CQ and a device-fatal event stay
    /// (the rule is `event_flags`' module docs).
    fn reset_qp(&self, qp: &mut VQp, a: &ConnectAttr) -> Result<()> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RESET,
            ..Default::default()
        };
        let what = "ibv_modify_qp(RESET)";
        self.modify(qp.raw, &mut attr, IBV_QP_STATE, what, Retry::Never)
            .inspect_err(|e| self.note_failed_reset(qp, a, e))?;
        self.dev.ctx.events.clear_qp(qp.raw as usize);
        // A failback attempt (the rail is out of use). While the rail's link is still down RTR
        // fails; one INFO per failed attempt, no WARN (the rail stays out and the core tries
        // again after its start delay).
        self.bring_up(qp, a, Retry::Never)
            .inspect_err(|e| self.note_failed_reset(qp, a, e))
    }

    fn destroy_qp(&self, qp: VQp) -> Result<()> {
        self.dev.ctx.events.remove_qp(qp.raw as usize);
        // SAFETY: a live QP, destroyed once (consumed).
        let rc = unsafe { (self.v().destroy_qp)(qp.raw) };
        if rc != 0 {
            return Err(fail("ibv_destroy_qp", errno_or(rc)));
        }
        Ok(())
    }

    fn destroy_cq(&self, cq: VCq) -> Result<()> {
        self.dev.ctx.events.remove_cq(cq.0 as usize);
        // SAFETY: a live CQ, destroyed once (consumed), after its QPs.
        let rc = unsafe { (self.v().destroy_cq)(cq.0) };
        if rc != 0 {
            return Err(fail("ibv_destroy_cq", errno_or(rc)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::Discovery;

    /// A port of the fake libibverbs (`super::super::fake`), auto-selecting its GID under
    /// `cfg`.
    fn fake_port(cfg: &Discovery) -> VerbsPort {
        VerbsPort {
            gid: (0, [0; 16]),
            dev: Arc::new(super::super::device::fake_dev(cfg)),
            relaxed_ordering: false,
            fault_ro_einval: false,
            qp: Arc::new(super::super::qp::QpOpts {
                retry_all: false,
                retry_cnt: 0,
                retry_sleep_ms: 0,
                ece: false,
                fault_timeouts: Default::default(),
            }),
        }
    }

    /// Two connects interleaved on one port while its GID moves (A chooses, the table
    /// changes, B chooses, then A's comm is made): each comm reports the GID chosen for it,
    /// never the other connect's (the choice used to go through the port's shared `last_gid`).
    #[test]
    fn a_comm_uses_its_own_gid_choice_not_a_concurrent_connects() {
        let v4 = |a: u8| {
            let mut g = [0u8; 16];
            g[10..12].copy_from_slice(&[0xff, 0xff]);
            g[12..].copy_from_slice(&[10, 0, 0, a]);
            g
        };
        let mut ll = [0u8; 16];
        ll[..2].copy_from_slice(&[0xfe, 0x80]);
        ll[15] = 1;
        let port = fake_port(&Discovery::default());
        super::super::fake::set_gids(&[ll, v4(1), ll, ll]);
        let a = port.with_gid(port.dev.choose_gid().unwrap());
        super::super::fake::set_gids(&[ll, ll, v4(2), ll]);
        let b = port.with_gid(port.dev.choose_gid().unwrap());
        let (pa, pb) = (a.port_info(), b.port_info());
        assert_eq!((pa.gid_index, pa.gid.0), (1, v4(1)), "A's own choice");
        assert_eq!((pb.gid_index, pb.gid.0), (2, v4(2)), "B's own choice");

        // The user set the family: once its GID is gone, a new comm's choice is
        // `Error::NoGid` naming the port (the failed call's one WARN; it fails `accept`).
        let mut p = ibnet_core::params::Params::default();
        p.set("NCCL_IB_ADDR_FAMILY", "AF_INET").unwrap();
        let strict = fake_port(&Discovery::from_params(&p));
        super::super::fake::set_gids(&[ll, ll, ll, ll]);
        let e = strict.dev.choose_gid().unwrap_err();
        assert!(
            matches!(
                e,
                Error::NoGid {
                    port: 1,
                    inet6: false,
                    range: None,
                    ..
                }
            ),
            "{e}"
        );
        assert!(ibnet_core::policy::nonce::fails_accept(&e, || false));
        assert!(
            e.to_string().starts_with("fake_gid0:1: no valid GID"),
            "{e}"
        );
        // Unset: the same table keeps index 0, as NCCL.
        assert_eq!(port.dev.choose_gid().unwrap(), (0, ll));
    }

    /// A fake port whose QPs connect, with NCCL's default modify retry count (34 retries, no
    /// sleep: a retry shows as injected faults consumed, never as time).
    fn fake_qp_port() -> VerbsPort {
        let mut p = fake_port(&Discovery::default());
        p.qp = Arc::new(super::super::qp::QpOpts {
            retry_cnt: 34,
            ..Default::default()
        });
        p
    }

    /// A connected pair of QPs on one CQ of `port` (one comm's, as a fused rail's).
    fn connected(port: &VerbsPort, at: &ConnectAttr) -> (VCq, VQp, VQp) {
        let cq = port.create_cq(64).unwrap();
        let qa = QpAttr {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_inline: 0,
            access: Access::ALL,
        };
        let mut a = port.create_qp(&cq, &qa).unwrap();
        let mut b = port.create_qp(&cq, &qa).unwrap();
        port.connect_qp(&mut a, at).unwrap();
        port.connect_qp(&mut b, at).unwrap();
        (cq, a, b)
    }

    fn attr() -> ConnectAttr {
        ConnectAttr {
            remote_qpn: 0x42,
            remote_lid: 0,
            remote_gid: Gid([0; 16]),
            remote_addr: ProviderAddr::EMPTY,
            link_layer: LinkLayer::Ethernet,
            mtu: Mtu::M1024,
            gid_index: 0,
            timeout: 14,
            retry_cnt: 7,
            sl: 0,
            tc: 0,
            pkey_index: 0,
        }
    }

    fn state(qp: &VQp) -> i32 {
        // SAFETY: a live fake QP (`fake::create_qp`'s box).
        unsafe { (*qp.raw).state }
    }

    fn poll(port: &VerbsPort, cq: &mut VCq) -> Result<usize> {
        let mut wcs = [Completion::EMPTY; 4];
        port.poll_cq(cq, &mut wcs)
    }

    fn event(port: &VerbsPort, ty: i32, element: usize) -> super::super::events::Handled {
        use super::super::events::classify;
        port.dev.ctx.events.handle(classify(ty), element)
    }

    /// A QP error event fails the rail's comm until `reset_qp` resets that QP; then its polls
    /// work again (the failback's rail returns). Resetting another QP of the same CQ does not
    /// clear it, two events on one QP count once, and a CQ error stays after every QP was
    /// reset (no QP reset repairs the CQ).
    #[test]
    fn reset_qp_clears_the_async_error_of_its_qp_only() {
        use super::super::events::Handled;
        let port = fake_qp_port();
        let at = attr();
        let (mut cq, mut a, mut b) = connected(&port, &at);
        assert_eq!(port.async_failure(&cq), None);
        assert_eq!(poll(&port, &mut cq).unwrap(), 0);

        let h = event(&port, IBV_EVENT_QP_FATAL, a.raw as usize);
        assert_eq!(h, Handled::FailedComm);
        assert_eq!(port.async_failure(&cq), Some(AsyncFailure::Comm));
        let e = poll(&port, &mut cq).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Provider {
                    errno: libc::EIO,
                    ..
                }
            ),
            "{e}"
        );

        port.reset_qp(&mut b, &at).unwrap();
        assert_eq!(
            port.async_failure(&cq),
            Some(AsyncFailure::Comm),
            "another QP's reset cleared A's error"
        );

        port.reset_qp(&mut a, &at).unwrap();
        assert_eq!(state(&a), IBV_QPS_RTS);
        assert_eq!(port.async_failure(&cq), None, "the reset QP's error stayed");
        assert_eq!(poll(&port, &mut cq).unwrap(), 0);

        // Two events of one QP, then its reset: cleared (counted once).
        event(&port, IBV_EVENT_QP_REQ_ERR, b.raw as usize);
        event(&port, IBV_EVENT_QP_ACCESS_ERR, b.raw as usize);
        port.reset_qp(&mut b, &at).unwrap();
        assert_eq!(port.async_failure(&cq), None);

        // A CQ error is the CQ's: it stays.
        assert_eq!(
            event(&port, IBV_EVENT_CQ_ERR, cq.0 as usize),
            Handled::FailedComm
        );
        port.reset_qp(&mut a, &at).unwrap();
        port.reset_qp(&mut b, &at).unwrap();
        assert_eq!(port.async_failure(&cq), Some(AsyncFailure::Comm));

        port.destroy_qp(a).unwrap();
        port.destroy_qp(b).unwrap();
        port.destroy_cq(cq).unwrap();
    }

    /// A device-fatal event stays fatal whatever QP is reset.
    #[test]
    fn device_fatal_survives_reset_qp() {
        let port = fake_qp_port();
        let at = attr();
        let (mut cq, mut a, b) = connected(&port, &at);
        event(&port, IBV_EVENT_QP_FATAL, a.raw as usize);
        event(&port, IBV_EVENT_DEVICE_FATAL, 0);
        port.reset_qp(&mut a, &at).unwrap();
        assert_eq!(port.async_failure(&cq), Some(AsyncFailure::Device));
        let e = poll(&port, &mut cq).unwrap_err();
        assert!(e.to_string().contains("fatal device error"), "{e}");
        port.destroy_qp(a).unwrap();
        port.destroy_qp(b).unwrap();
        port.destroy_cq(cq).unwrap();
    }

    /// `reset_qp` runs inside a data call: a failed transition is returned at once (never
    /// retried, so never slept on), and the core's next attempt goes on; connection setup
    /// keeps NCCL's retry.
    #[test]
    fn reset_qp_never_retries_but_connect_does() {
        use std::sync::atomic::Ordering::Relaxed;
        let port = fake_qp_port();
        let at = attr();
        let (cq, mut a, b) = connected(&port, &at);
        let faults = &port.qp.fault_timeouts;
        faults.store(2, Relaxed);
        let e = port.reset_qp(&mut a, &at).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Provider {
                    call: "ibv_modify_qp(RESET)",
                    errno: libc::ETIMEDOUT
                }
            ),
            "{e}"
        );
        assert_eq!(faults.load(Relaxed), 1, "the failed RESET was retried");
        // The core's next attempt meets the second fault: again one attempt, failed.
        let e = port.reset_qp(&mut a, &at).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Provider {
                    errno: libc::ETIMEDOUT,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(faults.load(Relaxed), 0);
        // The one after that goes through.
        port.reset_qp(&mut a, &at).unwrap();
        assert_eq!(state(&a), IBV_QPS_RTS);

        // Connection setup retries as NCCL does: two timeouts absorbed.
        let qa = QpAttr {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_inline: 0,
            access: Access::ALL,
        };
        let mut c = port.create_qp(&cq, &qa).unwrap();
        faults.store(2, Relaxed);
        port.connect_qp(&mut c, &at).unwrap();
        assert_eq!((faults.load(Relaxed), state(&c)), (0, IBV_QPS_RTS));
        for q in [a, b, c] {
            port.destroy_qp(q).unwrap();
        }
        port.destroy_cq(cq).unwrap();
    }

    #[test]
    fn unknown_completion_opcodes_are_errors() {
        let ok = WcStatus::Success;
        assert_eq!(wc_opcode(129, ok).unwrap(), WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc_opcode(128, ok).unwrap(), WcOpcode::Recv);
        assert_eq!(wc_opcode(1, ok).unwrap(), WcOpcode::RdmaWrite);
        for bad in [3, 4, 127, 130, -1] {
            assert!(matches!(
                wc_opcode(bad, ok),
                Err(Error::Provider {
                    errno: libc::EPROTO,
                    ..
                })
            ));
        }
        // A failed completion's opcode is undefined: the status carries the error.
        assert_eq!(
            wc_opcode(77, WcStatus::from_raw(5)).unwrap(),
            WcOpcode::Unknown
        );
    }

    #[test]
    fn zeroed_fifo_is_a_fresh_ring() {
        let f = zeroed_fifo();
        let d = FifoRing::<{ ibnet_core::fifo::MAX_REQUESTS }>::new();
        assert_eq!(format!("{f:?}"), format!("{d:?}"));
    }
}
