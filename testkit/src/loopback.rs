//! The in-process loopback provider.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use ibnet_core::fifo::FifoRing;
use ibnet_core::provider::{
    Access, Completion, ConnectAttr, Gid, LinkLayer, MrKeys, Mtu, PortInfo, Provider, ProviderAddr,
    QpAttr, RegKind, SendWr, WcOpcode, WcStatus, WrOpcode,
};
use ibnet_core::{Error, Result};

const QPN_BASE: u32 = 0x100;

/// A completion queue handle.
#[derive(Debug)]
pub struct LoopCq(usize);
/// A queue pair handle.
#[derive(Debug)]
pub struct LoopQp(usize);
/// A registration handle.
#[derive(Debug)]
pub struct LoopMr(usize);

/// An injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The `n`-th send WR posted from now (0 = the next) fails with `status` at the initiator.
    FailWr {
        /// How many WRs succeed first.
        after: u64,
        /// The status it completes with.
        status: WcStatus,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QpState {
    Init,
    Rts,
    Error,
}

struct Qp {
    cq: usize,
    state: QpState,
    peer: Option<usize>,
    recvs: VecDeque<u64>,
    max_recv: usize,
    max_send: usize,
    alive: bool,
}

struct Cq {
    entries: VecDeque<Completion>,
    depth: usize,
    overrun: bool,
    alive: bool,
}

#[derive(Clone, Copy)]
struct Mr {
    addr: u64,
    len: u64,
    keys: MrKeys,
    access: Access,
}

#[derive(Default)]
struct Fabric {
    qps: Vec<Qp>,
    cqs: Vec<Cq>,
    mrs: Vec<Option<Mr>>,
    fault: Option<Fault>,
    wrs_posted: u64,
}

/// An in-process provider: QPs of one fabric reach each other directly. Clone it to share the
/// fabric between the two ends of a comm.
#[derive(Clone, Default)]
pub struct Loopback {
    fabric: Rc<RefCell<Fabric>>,
}

impl Loopback {
    /// A new, empty fabric.
    pub fn new() -> Self {
        Self::default()
    }

    /// Injects a fault.
    pub fn inject(&self, fault: Fault) {
        self.fabric.borrow_mut().fault = Some(fault);
    }

    /// Send WRs posted so far.
    pub fn wrs_posted(&self) -> u64 {
        self.fabric.borrow().wrs_posted
    }

    /// Live registrations.
    pub fn live_mrs(&self) -> usize {
        self.fabric
            .borrow()
            .mrs
            .iter()
            .filter(|m| m.is_some())
            .count()
    }

    /// Live QPs.
    pub fn live_qps(&self) -> usize {
        self.fabric.borrow().qps.iter().filter(|q| q.alive).count()
    }

    /// Live CQs.
    pub fn live_cqs(&self) -> usize {
        self.fabric.borrow().cqs.iter().filter(|c| c.alive).count()
    }

    /// Moves every QP to the error state (a dead peer / fatal device event).
    pub fn kill(&self) {
        for q in &mut self.fabric.borrow_mut().qps {
            q.state = QpState::Error;
        }
    }
}

/// Multiplier of the key scramble (odd, so invertible modulo 2^32) and its inverse.
const KEY_MUL: u32 = 0x9e37_79b9;
const KEY_MUL_INV: u32 = 0x144c_bc89;
/// An rkey is its lkey with these bits flipped (the two differ, as on a NIC).
const RKEY_XOR: u32 = 0x5555_0000;

/// The keys of registration `i` (its index in the fabric's table, never reused): an odd number
/// scrambled, so keys look arbitrary yet are distinct and lead back to `i` ([`index_of`]).
fn keys_of(i: usize) -> MrKeys {
    let lkey = ((i as u32) << 1 | 1).wrapping_mul(KEY_MUL);
    MrKeys {
        lkey,
        rkey: lkey ^ RKEY_XOR,
    }
}

/// The table index an lkey of [`keys_of`] names (any other key names some index whose keys
/// differ, or none).
fn index_of(lkey: u32) -> usize {
    (lkey.wrapping_mul(KEY_MUL_INV) >> 1) as usize
}

impl Fabric {
    /// Whether a live registration has key `key` (its rkey when `remote`) and covers
    /// `[addr, addr + len)` with `need`. Keys name their registration ([`keys_of`]), so this is
    /// one lookup, as a NIC's key table, not a scan of every registration.
    fn find(&self, key: u32, remote: bool, addr: u64, len: u64, need: Access) -> bool {
        let lkey = if remote { key ^ RKEY_XOR } else { key };
        let Some(Some(m)) = self.mrs.get(index_of(lkey)) else {
            return false;
        };
        let k = if remote { m.keys.rkey } else { m.keys.lkey };
        k == key
            && addr >= m.addr
            && addr.checked_add(len).is_some_and(|e| e <= m.addr + m.len)
            && (!need.remote_write || m.access.remote_write)
            && (!need.remote_read || m.access.remote_read)
    }

    fn push(&mut self, cq: usize, wc: Completion) {
        let c = &mut self.cqs[cq];
        if c.entries.len() >= c.depth {
            c.overrun = true;
        } else {
            c.entries.push_back(wc);
        }
    }

    fn fail(&mut self, qi: usize, wr: &SendWr, status: WcStatus) {
        self.qps[qi].state = QpState::Error;
        let cq = self.qps[qi].cq;
        let opcode = if wr.opcode == WrOpcode::Read {
            WcOpcode::RdmaRead
        } else {
            WcOpcode::RdmaWrite
        };
        let wc = Completion {
            wr_id: wr.wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: 0,
            vendor_err: 0,
            qp_num: QPN_BASE + qi as u32,
        };
        self.push(cq, wc);
    }

    /// Executes one WR; returns the failure status if it fails.
    fn execute(&mut self, qi: usize, wr: &SendWr) -> core::result::Result<(), WcStatus> {
        if let Some(Fault::FailWr { after, status }) = self.fault {
            if after == 0 {
                self.fault = None;
                return Err(status);
            }
            self.fault = Some(Fault::FailWr {
                after: after - 1,
                status,
            });
        }
        let q = &self.qps[qi];
        if q.state != QpState::Rts {
            return Err(WcStatus::WrFlushError);
        }
        let peer = q.peer.ok_or(WcStatus::RetryExceeded)?;
        if !self.qps[peer].alive || self.qps[peer].state == QpState::Error {
            return Err(WcStatus::RetryExceeded);
        }
        let len = wr.sge.len as u64;
        if len > 0
            && !wr.inline
            && !self.find(wr.sge.lkey, false, wr.sge.addr, len, Access::default())
        {
            return Err(WcStatus::LocalProtectionError);
        }
        let need = match wr.opcode {
            WrOpcode::Read => Access {
                remote_read: true,
                ..Access::default()
            },
            _ => Access {
                remote_write: true,
                ..Access::default()
            },
        };
        if len > 0 && !self.find(wr.rkey, true, wr.remote_addr, len, need) {
            return Err(WcStatus::RemoteAccessError);
        }
        if wr.opcode == WrOpcode::WriteWithImm && self.qps[peer].recvs.is_empty() {
            return Err(WcStatus::RnrRetryExceeded);
        }
        if len > 0 {
            let (src, dst) = match wr.opcode {
                WrOpcode::Read => (wr.remote_addr, wr.sge.addr),
                _ => (wr.sge.addr, wr.remote_addr),
            };
            // SAFETY: both ranges lie inside live registrations (checked above), which the
            // tests keep alive and which are plain process memory; `copy` allows overlap.
            unsafe {
                std::ptr::copy(
                    src as usize as *const u8,
                    dst as usize as *mut u8,
                    len as usize,
                )
            };
        }
        if wr.opcode == WrOpcode::WriteWithImm {
            let rid = self.qps[peer].recvs.pop_front().unwrap_or_default();
            let pcq = self.qps[peer].cq;
            let wc = Completion {
                wr_id: rid,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: wr.sge.len,
                imm: wr.imm,
                vendor_err: 0,
                qp_num: QPN_BASE + peer as u32,
            };
            self.push(pcq, wc);
        }
        if wr.signaled {
            let opcode = if wr.opcode == WrOpcode::Read {
                WcOpcode::RdmaRead
            } else {
                WcOpcode::RdmaWrite
            };
            let cq = self.qps[qi].cq;
            let wc = Completion {
                wr_id: wr.wr_id,
                status: WcStatus::Success,
                opcode,
                byte_len: wr.sge.len,
                imm: 0,
                vendor_err: 0,
                qp_num: QPN_BASE + qi as u32,
            };
            self.push(cq, wc);
        }
        Ok(())
    }
}

fn bad(call: &'static str) -> Error {
    Error::Provider {
        call,
        errno: libc_einval(),
    }
}

const fn libc_einval() -> i32 {
    22
}

impl Provider for Loopback {
    type Cq = LoopCq;
    type Qp = LoopQp;
    type Mr = LoopMr;
    type Fifo = Box<FifoRing>;

    fn port_info(&self) -> PortInfo {
        PortInfo {
            port: 1,
            link_layer: LinkLayer::Ethernet,
            lid: 0,
            gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]),
            gid_index: 0,
            mtu: Mtu::M4096,
            addr: ProviderAddr::new(b"loopback").unwrap_or_default(),
        }
    }

    fn alloc_fifo(&self) -> Result<Self::Fifo> {
        Ok(zeroed_fifo())
    }

    fn create_cq(&self, depth: u32) -> Result<LoopCq> {
        let mut f = self.fabric.borrow_mut();
        f.cqs.push(Cq {
            entries: VecDeque::with_capacity(depth as usize),
            depth: depth as usize,
            overrun: false,
            alive: true,
        });
        Ok(LoopCq(f.cqs.len() - 1))
    }

    fn create_qp(&self, cq: &LoopCq, attr: &QpAttr) -> Result<LoopQp> {
        let mut f = self.fabric.borrow_mut();
        if !f.cqs.get(cq.0).is_some_and(|c| c.alive) {
            return Err(bad("create_qp"));
        }
        f.qps.push(Qp {
            cq: cq.0,
            state: QpState::Init,
            peer: None,
            recvs: VecDeque::with_capacity(attr.max_recv_wr as usize),
            max_recv: attr.max_recv_wr as usize,
            max_send: attr.max_send_wr as usize,
            alive: true,
        });
        Ok(LoopQp(f.qps.len() - 1))
    }

    fn qp_num(&self, qp: &LoopQp) -> u32 {
        QPN_BASE + qp.0 as u32
    }

    fn connect_qp(&self, qp: &mut LoopQp, attr: &ConnectAttr) -> Result<()> {
        let mut f = self.fabric.borrow_mut();
        let peer = attr.remote_qpn.checked_sub(QPN_BASE).map(|p| p as usize);
        match peer {
            Some(p) if p < f.qps.len() && f.qps[p].alive => {
                let q = &mut f.qps[qp.0];
                q.peer = Some(p);
                q.state = QpState::Rts;
                Ok(())
            }
            _ => Err(bad("connect_qp")),
        }
    }

    /// RESET → RTS towards the same peer: posted receives dropped (no completions), state
    /// RTS. (A loopback write executes at post: no send WR is outstanding.)
    fn reset_qp(&self, qp: &mut LoopQp, attr: &ConnectAttr) -> Result<()> {
        {
            let mut f = self.fabric.borrow_mut();
            let q = &mut f.qps[qp.0];
            q.recvs.clear();
            q.state = QpState::Init;
        }
        self.connect_qp(qp, attr)
    }

    fn post_send(&self, qp: &mut LoopQp, wrs: &[SendWr]) -> Result<()> {
        let mut f = self.fabric.borrow_mut();
        if wrs.len() > f.qps[qp.0].max_send {
            return Err(Error::Provider {
                call: "post_send",
                errno: 12,
            });
        }
        f.wrs_posted += wrs.len() as u64;
        let mut failed = false;
        for wr in wrs {
            if failed || f.qps[qp.0].state == QpState::Error {
                f.fail(qp.0, wr, WcStatus::WrFlushError);
                continue;
            }
            if let Err(status) = f.execute(qp.0, wr) {
                f.fail(qp.0, wr, status);
                failed = true;
            }
        }
        Ok(())
    }

    fn post_recv(&self, qp: &mut LoopQp, wr_id: u64) -> Result<()> {
        let mut f = self.fabric.borrow_mut();
        let q = &mut f.qps[qp.0];
        if q.recvs.len() >= q.max_recv {
            return Err(Error::Provider {
                call: "post_recv",
                errno: 12,
            });
        }
        if q.state == QpState::Error {
            let cq = q.cq;
            let wc = Completion {
                wr_id,
                status: WcStatus::WrFlushError,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: 0,
                vendor_err: 0,
                qp_num: QPN_BASE + qp.0 as u32,
            };
            f.push(cq, wc);
            return Ok(());
        }
        q.recvs.push_back(wr_id);
        Ok(())
    }

    fn poll_cq(&self, cq: &mut LoopCq, out: &mut [Completion]) -> Result<usize> {
        let mut f = self.fabric.borrow_mut();
        let c = &mut f.cqs[cq.0];
        if c.overrun {
            return Err(Error::Provider {
                call: "poll_cq (CQ overrun)",
                errno: 0,
            });
        }
        let mut n = 0;
        while n < out.len() {
            match c.entries.pop_front() {
                Some(wc) => out[n] = wc,
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }

    fn reg_mr(&self, addr: u64, len: u64, access: Access, kind: RegKind) -> Result<LoopMr> {
        if kind != RegKind::Plain || addr == 0 {
            return Err(bad("reg_mr"));
        }
        let mut f = self.fabric.borrow_mut();
        let keys = keys_of(f.mrs.len());
        f.mrs.push(Some(Mr {
            addr,
            len,
            keys,
            access,
        }));
        Ok(LoopMr(f.mrs.len() - 1))
    }

    fn mr_keys(&self, mr: &LoopMr) -> MrKeys {
        self.fabric.borrow().mrs[mr.0]
            .map(|m| m.keys)
            .unwrap_or_default()
    }

    fn dereg_mr(&self, mr: LoopMr) -> Result<()> {
        let mut f = self.fabric.borrow_mut();
        match f.mrs.get_mut(mr.0) {
            Some(m @ Some(_)) => {
                *m = None;
                Ok(())
            }
            _ => Err(bad("dereg_mr")),
        }
    }

    fn destroy_qp(&self, qp: LoopQp) -> Result<()> {
        let mut f = self.fabric.borrow_mut();
        let q = &mut f.qps[qp.0];
        q.alive = false;
        q.state = QpState::Error;
        q.recvs.clear();
        Ok(())
    }

    fn destroy_cq(&self, cq: LoopCq) -> Result<()> {
        let mut f = self.fabric.borrow_mut();
        let c = &mut f.cqs[cq.0];
        c.alive = false;
        c.entries.clear();
        Ok(())
    }
}

impl Loopback {
    /// Registers `[addr, addr + len)` with full access; returns the keys and the handle.
    pub fn register(&self, addr: u64, len: u64) -> Result<(MrKeys, LoopMr)> {
        let mr = self.reg_mr(addr, len.max(1), Access::ALL, RegKind::Plain)?;
        Ok((self.mr_keys(&mr), mr))
    }
}

/// A zeroed FIFO ring on the heap (`Box::default()` would build its ~136 KiB on the stack
/// first, several times over in a debug build).
fn zeroed_fifo() -> Box<FifoRing> {
    let layout = std::alloc::Layout::new::<FifoRing>();
    // SAFETY: the layout is FifoRing's (non-zero size). All-zero bytes are a valid FifoRing (it
    // is arrays of atomics, and zero is its `new()` state), so the Box may own the allocation
    // and frees it with the same layout.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<FifoRing>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(p)
    }
}
