//! The receiving side of a fused comm: one [`RecvComm`] per rail; a message is complete when
//! every rail's part is, natively (the rail's own completion) or by notice (another rail
//! carried it; see the module doc of `crate::fused`).

use core::mem::MaybeUninit;
use core::ptr::addr_of_mut;

use heapless::Vec;

use super::event::RailEvent;
use super::heal::{ctl_seq, Ctl, Phase};
use super::notice::{GroupNotice, Notice};
use super::rail_set::RailSet;
use super::resilience::Resilience;
use super::stripe::stripe_weighted;
use super::vnic::MAX_DEVS_PER_NIC;
use crate::comm::{CommConfig, Done, RecvBuf, RecvComm};
use crate::error::{Error, Result};
use crate::fifo::{FifoRing, PostedRecv, MAX_RECVS, MAX_REQUESTS};
use crate::provider::{Access, MrKeys, Provider};
use crate::request::ReqId;
use crate::wire::{QpInfo, RemoteBuf};

const N: usize = MAX_DEVS_PER_NIC;

mod heal;

/// One receive buffer of a fused (multi-)receive: one registration per rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FusedBuf {
    /// Address of the buffer.
    pub addr: u64,
    /// Its size: the largest send it accepts.
    pub size: u64,
    /// Tag the matching send must carry.
    pub tag: u32,
    /// Keys of the registration covering the buffer, on each rail.
    pub mrs: [MrKeys; N],
}

/// A comm of one rail reads a buffer of several through its rail-0 keys.
impl crate::comm::RecvView for FusedBuf {
    #[inline(always)]
    fn addr(&self) -> u64 {
        self.addr
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline(always)]
    fn tag(&self) -> u32 {
        self.tag
    }
    #[inline(always)]
    fn mr(&self) -> MrKeys {
        self.mrs[0]
    }
}

/// Where one rail's part of a receive stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leg {
    /// Arrived, or nothing to wait for (a rail outside the receive's live-rail mask).
    Done,
    /// Posted on its own rail.
    Native(ReqId),
    /// The rail is out of use here: only a notice completes it.
    Notice,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Recv,
    Flush,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    gen: u16,
    used: bool,
    kind: Kind,
    seq: u64,
    n: u8,
    /// The live-rail mask the receive was posted with (the rails the sender may use).
    posted: u8,
    /// Each receive's buffer size.
    caps: [u64; MAX_RECVS],
    legs: [Leg; N],
    sizes: [u64; MAX_RECVS],
}

impl Msg {
    const FREE: Self = Self {
        gen: 0,
        used: false,
        kind: Kind::Recv,
        seq: 0,
        n: 0,
        posted: 0,
        caps: [0; MAX_RECVS],
        legs: [Leg::Done; N],
        sizes: [0; MAX_RECVS],
    };
}

/// The receiving side of a fused comm.
pub struct FusedRecv<P: Provider> {
    /// The rails (first: dropped first, the registrations before the rings), which are in
    /// use, the rail news, settings, clock, weights and lifecycle. A rail is `broken` once
    /// its own comm failed here (drained once: see `rail_down`).
    rails: RailSet<P, RecvComm<P>>,
    msgs: [Msg; MAX_REQUESTS],
    free: Vec<u8, MAX_REQUESTS>,
    /// Receives posted so far (the FIFO sequence number of the next one, on every rail).
    seq: u64,
    /// The ring senders write notices into (registered on every rail: the set's notice
    /// registrations).
    ring: P::Fifo,
    /// Where "rail out of use" notices to the sender are staged (registered on every rail:
    /// the set's back registrations).
    back_stage: P::Fifo,
    /// The sender's back ring (`FusedSend::back_ring`), as each rail reaches it.
    back_ring: [RemoteBuf; N],
    /// Rails taken out of use here that the sender must hear of, those it has (acknowledged),
    /// and the write in flight per rail (carrier, request).
    back_needed: u8,
    back_told: u8,
    back_pending: [Option<(u8, ReqId)>; N],
    /// Failback (`crate::fused::heal`), per rail: where its round stands, when the round
    /// began, the first receive sequence number it carries since it returned, and the JOIN
    /// write in flight (carrier, request); its generation, retry time and failed attempts
    /// are the rail set's.
    phase: [Phase; N],
    round_at: [u64; N],
    joined_at: [u64; N],
    join_pending: [Option<(u8, ReqId)>; N],
}

impl<P: Provider + Clone> FusedRecv<P> {
    /// Builds a fused receive comm in `slot`: one receive comm per rail device in `devs`,
    /// connected to the sender's rails described by `remote` (same order), and the notice ring
    /// and back stage registered on each.
    ///
    /// Written field by field into `slot` (a `Box::new_uninit`'s, say), so the comm never
    /// passes through the stack whole; see `FusedSend::init`, whose contract this shares: on
    /// `Ok`, `slot` holds the comm; on `Err`, nothing (what was made is released); a previous
    /// value is overwritten without being dropped.
    #[allow(unsafe_code)]
    pub fn init<'a>(
        slot: &'a mut MaybeUninit<Self>,
        devs: &[P],
        cfg: CommConfig,
        remote: &[QpInfo],
    ) -> Result<&'a mut Self> {
        if devs.is_empty() || devs.len() > N || remote.len() != devs.len() {
            return Err(Error::OutOfRange {
                what: "rails of a fused comm",
                value: remote.len() as i64,
                min: devs.len() as i64,
                max: devs.len().min(N) as i64,
            });
        }
        let ring = devs[0].alloc_fifo()?;
        let back_stage = devs[0].alloc_fifo()?;
        let p = slot.as_mut_ptr();
        // SAFETY: `p` comes from `slot`, an exclusive borrow of memory valid and aligned for
        // one `Self`. Each field is written exactly once through a raw field pointer (never
        // read, never turned into a reference to an uninitialised value); `msgs`, the large
        // one, element by element.
        unsafe {
            RailSet::write_new(addr_of_mut!((*p).rails));
            let msgs = addr_of_mut!((*p).msgs).cast::<Msg>();
            for i in 0..MAX_REQUESTS {
                msgs.add(i).write(Msg::FREE);
            }
            addr_of_mut!((*p).free).write((0..MAX_REQUESTS).rev().map(|i| i as u8).collect());
            addr_of_mut!((*p).seq).write(0);
            addr_of_mut!((*p).ring).write(ring);
            addr_of_mut!((*p).back_stage).write(back_stage);
            addr_of_mut!((*p).back_ring).write([RemoteBuf::default(); N]);
            addr_of_mut!((*p).back_needed).write(0);
            addr_of_mut!((*p).back_told).write(0);
            addr_of_mut!((*p).back_pending).write([None; N]);
            addr_of_mut!((*p).phase).write([Phase::Idle; N]);
            addr_of_mut!((*p).round_at).write([0; N]);
            addr_of_mut!((*p).joined_at).write([0; N]);
            addr_of_mut!((*p).join_pending).write([None; N]);
        }
        // Every field written above: `names_every_field`'s pattern names them all.
        let _ = Self::names_every_field;
        // SAFETY: every field of `*p` was written above.
        let r = unsafe { slot.assume_init_mut() }.set_up(devs, cfg, remote);
        if let Err(e) = r {
            // SAFETY: `slot` is initialised (above) and dropped once here; the caller is told
            // it holds nothing on `Err`.
            unsafe { slot.assume_init_drop() };
            return Err(e);
        }
        // SAFETY: initialised above and not dropped (`set_up` succeeded).
        Ok(unsafe { slot.assume_init_mut() })
    }

    /// Names every field in one pattern, so that a field [`init`](Self::init) does not write
    /// fails to compile here (never called; `init` refers to it).
    fn names_every_field(s: &Self) {
        let Self {
            rails: _,
            msgs: _,
            free: _,
            seq: _,
            ring: _,
            back_stage: _,
            back_ring: _,
            back_needed: _,
            back_told: _,
            back_pending: _,
            phase: _,
            round_at: _,
            joined_at: _,
            join_pending: _,
        } = s;
    }

    /// The fallible part of [`init`](Self::init): the rails' comms and the registrations of
    /// the notice ring and back stage on each rail (dropping `self` releases what was made).
    fn set_up(&mut self, devs: &[P], cfg: CommConfig, remote: &[QpInfo]) -> Result<()> {
        for (d, r) in devs.iter().zip(remote) {
            self.rails.push(RecvComm::new(d.clone(), cfg, r)?);
        }
        let remote_access = Access {
            local_write: true,
            remote_write: true,
            ..Access::default()
        };
        let local = Access {
            local_write: true,
            ..Access::default()
        };
        let bytes = FifoRing::<MAX_REQUESTS>::BYTES as u64;
        let (ring, back) = (self.ring.base_addr(), self.back_stage.base_addr());
        self.rails
            .register(devs, bytes, (ring, remote_access), (back, local))?;
        // Each rail's comm connected as it was made.
        self.rails.connected();
        Ok(())
    }

    /// Sets how rail failures are handled (default: [`Resilience::default`]).
    pub fn set_resilience(&mut self, r: Resilience) {
        self.rails.res = r;
    }

    /// Rail `i`'s answer to the sender.
    pub fn local_info(&self, i: usize) -> Option<QpInfo> {
        self.rails.get(i).map(RecvComm::local_info)
    }

    /// The notice ring as each rail reaches it (for `FusedSend::set_notice_ring`).
    pub fn notice_ring(&self) -> Vec<RemoteBuf, N> {
        (0..self.rails.len())
            .map(|i| RemoteBuf {
                addr: self.ring.base_addr(),
                rkey: self.rails.notice_keys[i].rkey,
            })
            .collect()
    }

    /// The sender's back ring as each rail reaches it (`FusedSend::back_ring`).
    pub fn set_back_ring(&mut self, ring: &[RemoteBuf]) -> Result<()> {
        if ring.len() != self.rails.len() || ring.iter().any(|r| r.addr == 0 || r.rkey == 0) {
            return Err(Error::Wire {
                what: "fused sender's back ring",
                value: ring.len() as u64,
            });
        }
        self.back_ring[..ring.len()].copy_from_slice(ring);
        Ok(())
    }

    /// Tells the sender of every rail taken out of use here (one write per rail, on a live
    /// rail), so it stops waiting for that rail's clear-to-send.
    fn tell_back(&mut self) -> Result<()> {
        for d in 0..self.rails.len() {
            let bit = 1u8 << d;
            if self.back_needed & !self.back_told & bit == 0 {
                continue;
            }
            if let Some((c, id)) = self.back_pending[d] {
                match self.rails[c as usize].test(id) {
                    Ok(Some(_)) => {
                        self.back_told |= bit;
                        self.back_pending[d] = None;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.back_pending[d] = None;
                        self.rail_down(c as usize, e)?;
                    }
                }
                continue;
            }
            let Some(c) = self.rails.first_live() else {
                continue;
            };
            let notice = Notice {
                seq: 0,
                rail: d as u8,
                bytes: 0,
                mask: 0,
            };
            let seq = ctl_seq(Ctl::Drop, d, self.rails.gen[d]);
            let (off, len) = self.back_stage.publish(seq, &[notice.encode()]);
            let local = crate::provider::Sge {
                addr: self.back_stage.base_addr() + off as u64,
                len: len as u32,
                lkey: self.rails.back_keys[c].lkey,
            };
            let ring = self.back_ring[c];
            match self.rails[c].iwrite(local, ring.addr + off as u64, ring.rkey) {
                Ok(id) => self.back_pending[d] = Some((c as u8, id)),
                Err(e) => self.rail_down(c, e)?,
            }
        }
        Ok(())
    }

    /// The comm failed outside the core (its caller found the peer gone): every later call is
    /// refused at once with `Error::Poisoned`, reported as `e` was (the first failure stays).
    pub fn fail(&mut self, e: &Error) {
        self.rails.fail(e);
    }

    /// Sets each rail's stripe weight (rail order), the sender's
    /// (`FusedSend::set_rail_weights`): a multi-receive's notice is cut with them. Control
    /// path: call it before the first receive.
    pub fn set_rail_weights(&mut self, w: &[u32]) {
        self.rails.set_weights(w);
    }

    /// Rail `i`'s stripe weight ([`Self::set_rail_weights`]; 0 past the most rails).
    pub fn rail_weight(&self, i: usize) -> u32 {
        self.rails.weight(i)
    }

    /// Rails taken out of use since the last call (each once), for the caller to log.
    pub fn take_events(&mut self) -> Vec<RailEvent, N> {
        self.rails.take_events()
    }

    /// Whether [`Self::take_events`] or [`Self::take_returned`] has anything to give (one test
    /// per data call, so that neither is taken, nor its vector moved, when nothing happened).
    #[inline]
    pub fn has_rail_news(&self) -> bool {
        self.rails.has_rail_news()
    }

    /// Where the comm is in its life: connecting (a rail's QPs not connected yet), ready,
    /// rail-degraded (a rail out of use) or failed (a failure no rail could mend); stored,
    /// moved as those happen.
    #[inline]
    pub fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        self.rails.lifecycle()
    }

    /// How many rails.
    pub fn rails(&self) -> usize {
        self.rails.len()
    }

    /// Whether rail `i` is still in use here.
    pub fn rail_live(&self, i: usize) -> bool {
        self.rails.live(i)
    }

    /// Posts a (multi-)receive of `bufs` (1..=8) on every live rail; each rail's
    /// clear-to-send carries the live rails as a mask, the rails the sender may stripe over.
    pub fn irecv(&mut self, bufs: &[FusedBuf]) -> Result<Option<ReqId>> {
        self.rails.check("irecv")?;
        self.heal_step()?;
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::OutOfRange {
                what: "receives in one irecv",
                value: n as i64,
                min: 1,
                max: MAX_RECVS as i64,
            });
        }
        let (k, id) = self.alloc(Kind::Recv, n as u8)?;
        // The same mask on every rail, even if a rail fails below: the sender learns of that
        // rail from the back notice and tells its (empty) part back.
        let posted = self.rails.live_mask();
        self.msgs[k].seq = self.seq;
        self.msgs[k].posted = posted;
        for (c, b) in self.msgs[k].caps.iter_mut().zip(bufs) {
            *c = b.size;
        }
        let mut sub = [RecvBuf::default(); MAX_RECVS];
        for i in 0..self.rails.len() {
            if posted >> i & 1 == 0 {
                // Out of use before this receive: the sender stripes it over the others.
                self.msgs[k].legs[i] = Leg::Done;
                continue;
            }
            rail_bufs(bufs, i, &mut sub);
            self.msgs[k].legs[i] = match self.rails[i].irecv_rails(&sub[..n], posted) {
                Ok(Some(r)) => Leg::Native(r),
                Ok(None) => Leg::Notice,
                Err(e) => {
                    self.rail_down(i, e)?;
                    Leg::Notice
                }
            };
        }
        self.seq += 1;
        if self.back_needed & !self.back_told != 0 {
            self.tell_back()?;
        }
        Ok(Some(id))
    }

    /// Flushes every live rail's writes to `bufs` (GPU-direct); `Ok(None)` when no rail has
    /// anything to flush.
    pub fn iflush(&mut self, bufs: &[FusedBuf]) -> Result<Option<ReqId>> {
        self.rails.check("iflush")?;
        if bufs.len() > MAX_RECVS {
            return Err(Error::OutOfRange {
                what: "buffers in one iflush",
                value: bufs.len() as i64,
                min: 0,
                max: MAX_RECVS as i64,
            });
        }
        let mut legs = [Leg::Done; N];
        let mut sub = [RecvBuf::default(); MAX_RECVS];
        for (i, leg) in legs.iter_mut().enumerate().take(self.rails.len()) {
            if !self.rails.live(i) {
                continue;
            }
            rail_bufs(bufs, i, &mut sub);
            match self.rails[i].iflush(&sub[..bufs.len()]) {
                Ok(Some(r)) => *leg = Leg::Native(r),
                Ok(None) => {}
                Err(e) => self.rail_down(i, e)?,
            }
        }
        if legs.iter().all(|l| *l == Leg::Done) {
            return Ok(None);
        }
        let (k, id) = self.alloc(Kind::Flush, 0)?;
        self.msgs[k].legs = legs;
        Ok(Some(id))
    }

    fn alloc(&mut self, kind: Kind, n: u8) -> Result<(usize, ReqId)> {
        let k = self.free.pop().ok_or(Error::Full {
            what: "fused receive requests",
            cap: MAX_REQUESTS,
        })? as usize;
        let m = &mut self.msgs[k];
        *m = Msg {
            gen: m.gen.wrapping_add(1),
            used: true,
            kind,
            n,
            ..Msg::FREE
        };
        Ok((k, ReqId::from_bits(u32::from(m.gen) << 8 | k as u32)))
    }

    /// Polls for completion of `id`.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        self.rails.check("test")?;
        self.heal_step()?;
        if self.back_needed & !self.back_told != 0 {
            self.tell_back()?;
        }
        let b = id.to_bits();
        let k = (b & 0xff) as usize;
        if !self.msgs[k].used || u32::from(self.msgs[k].gen) != b >> 8 {
            return Err(Error::StaleRequest { idx: k as u16 });
        }
        for i in 0..self.rails.len() {
            let Leg::Native(sub) = self.msgs[k].legs[i] else {
                continue;
            };
            let r = if self.rails.broken[i] {
                // A rail failed here still completes the receives the sender had
                // acknowledged: its completions are drained (`rail_down`).
                let _ = self.rails[i].drain();
                // An error here is the part's own (its sizes fail `recv_done`: hostile), and
                // the request is freed already: the comm fails, it never waits on.
                match self.rails[i].completed(sub) {
                    Err(e) => return Err(self.rails.poison(e)),
                    ok => ok,
                }
            } else {
                self.rails[i].test(sub)
            };
            match r {
                Ok(Some(d)) => {
                    let m = &mut self.msgs[k];
                    m.legs[i] = Leg::Done;
                    add_sizes(m, &d.sizes);
                }
                Ok(None) => {}
                Err(e) => self.rail_down(i, e)?,
            }
        }
        if self.msgs[k].kind == Kind::Recv && self.msgs[k].legs.iter().any(|l| *l != Leg::Done) {
            self.read_notice(k)?;
        }
        let m = &self.msgs[k];
        if m.legs.iter().any(|l| *l != Leg::Done) {
            return Ok(None);
        }
        let done = match m.kind {
            Kind::Recv => Done {
                n: m.n,
                sizes: m.sizes,
            },
            Kind::Flush => Done {
                n: 0,
                sizes: [0; MAX_RECVS],
            },
        };
        self.msgs[k].used = false;
        // Cannot fail: a used slot is not in the free list, which has room for every slot.
        let _ = self.free.push(k as u8);
        Ok(Some(done))
    }

    /// Applies the notice for message `k`, if one has landed: each rail it names delivered
    /// its part through another rail, or had none (and is out of use from now on).
    fn read_notice(&mut self, k: usize) -> Result<()> {
        let (seq, cap, posted) = (self.msgs[k].seq, self.msgs[k].caps[0], self.msgs[k].posted);
        let mut out = [PostedRecv::default(); MAX_RECVS];
        let n = match self.ring.poll(seq, &mut out) {
            Ok(None) => return Ok(()),
            Ok(Some(n)) => n,
            Err(f) => {
                return Err(self.rails.poison(Error::BadFifoElem {
                    field: f.field,
                    value: f.value,
                    peer: Default::default(),
                }))
            }
        };
        if self.msgs[k].n > 1 {
            return self.read_group_notice(k, &out[..n]);
        }
        for e in out.iter().take(n) {
            if *e == PostedRecv::default() {
                continue;
            }
            let decoded = Notice::decode(e, seq, self.rails.len(), cap);
            // A rail outside the receive's mask had no part to tell of.
            let Some(nt) = decoded.filter(|nt| posted >> nt.rail & 1 == 1) else {
                return Err(self.rails.poison(Error::BadFifoElem {
                    field: "notice",
                    value: e.rkey.into(),
                    peer: Default::default(),
                }));
            };
            let r = nt.rail as usize;
            if seq >= self.joined_at[r] {
                // (A notice of a message from before the rail returned leaves it in use.)
                self.moved_by_peer(r);
            }
            let m = &mut self.msgs[k];
            if m.legs[r] != Leg::Done {
                m.legs[r] = Leg::Done;
                // A single receive (a multi-receive's notice is a `GroupNotice`).
                let mut sizes = [0; MAX_RECVS];
                sizes[0] = nt.bytes;
                add_sizes(m, &sizes);
            }
        }
        Ok(())
    }

    /// Applies a multi-receive's notice (`GroupNotice`, one element per receive): each rail
    /// it names delivered its part of every receive of the group through another rail (or
    /// had none); each receive gets that rail's part of its send's size, cut by the stripe the
    /// element names (the rails the sender striped that send over).
    fn read_group_notice(&mut self, k: usize, elems: &[PostedRecv]) -> Result<()> {
        let (seq, n, nr) = (self.msgs[k].seq, self.msgs[k].n as usize, self.rails.len());
        let posted = self.msgs[k].posted;
        let mut got = [None; MAX_RECVS];
        for (i, e) in elems.iter().enumerate() {
            got[i] = GroupNotice::decode(e, seq, i, posted, self.msgs[k].caps[i]);
        }
        let rails = got[0].map_or(0, |g| g.rails);
        if elems.len() != n || got[..n].iter().any(|g| g.is_none_or(|g| g.rails != rails)) {
            return Err(self.rails.poison(Error::BadFifoElem {
                field: "multi-receive notice",
                value: seq,
                peer: Default::default(),
            }));
        }
        for r in (0..nr).filter(|&r| rails >> r & 1 == 1) {
            if seq >= self.joined_at[r] {
                self.moved_by_peer(r);
            }
            let m = &mut self.msgs[k];
            if m.legs[r] == Leg::Done {
                continue; // its own completion came first
            }
            m.legs[r] = Leg::Done;
            let mut sizes = [0; MAX_RECVS];
            for (s, g) in sizes.iter_mut().zip(&got[..n]) {
                *s = g.map_or(0, |g| {
                    stripe_weighted(g.size, g.stripe, &self.rails.weights)[r].len
                });
            }
            add_sizes(m, &sizes);
        }
        Ok(())
    }

    /// Takes rail `r` out of use here because the sender moved its traffic (a notice named
    /// it); reported once.
    fn moved_by_peer(&mut self, r: usize) {
        if !self.rails.live(r) {
            return;
        }
        self.rails.take_out(
            r,
            Error::RailDroppedByPeer {
                what: "the sender moved this rail's traffic to another rail",
            },
        );
        self.went_out(r);
    }

    /// Takes rail `i` out of use here after `e` (its comm failed here; also a rail a notice
    /// had taken out of use already, whose receives wait on it still). Its receives still
    /// pending are not given up: one that the sender had acknowledged completes on the rail
    /// (its completion is in the rail's queue, which `test` drains from now on: RC never
    /// acknowledges a write it then drops), the others by their notices, whichever comes
    /// first (the module doc's "Receiver"). A flush has nothing left to wait for.
    fn rail_down(&mut self, i: usize, e: Error) -> Result<()> {
        // Failover off, or a failure no other rail can mend: the comm's error. Broken the
        // first time: every completion already there is applied (`Base::drain`); a rail whose
        // CQ cannot be read (a fatal device event) says no more, and its receives wait for
        // notices.
        if self.rails.break_rail(i, e)? {
            for m in self
                .msgs
                .iter_mut()
                .filter(|m| m.used && m.kind == Kind::Flush)
            {
                if let Leg::Native(_) = m.legs[i] {
                    m.legs[i] = Leg::Done;
                }
            }
        }
        if !self.rails.live(i) {
            return Ok(());
        }
        let r = self.rails.drop_out(i, e);
        self.went_out(i);
        self.back_needed |= 1 << i;
        r
    }

    /// Fused requests in use (for tests and diagnostics).
    pub fn requests_in_use(&self) -> usize {
        MAX_REQUESTS - self.free.len()
    }

    /// Closes every rail and releases the notice ring.
    pub fn close(mut self) -> Result<()> {
        self.close_in_place()
    }

    /// [`Self::close`] of a comm that stays where it is (in a box the caller frees): every
    /// rail closed and the rings released; what is left is dropped with nothing more to do.
    pub fn close_in_place(&mut self) -> Result<()> {
        self.rails.close()
    }
}

/// `bufs` as rail `i` posts them (each with that rail's keys), into `out`'s first entries.
fn rail_bufs(bufs: &[FusedBuf], i: usize, out: &mut [RecvBuf; MAX_RECVS]) {
    for (s, b) in out.iter_mut().zip(bufs) {
        *s = RecvBuf {
            addr: b.addr,
            size: b.size,
            tag: b.tag,
            mr: b.mrs[i],
        };
    }
}

/// Adds one rail's sizes to a receive's: each rail reports the real bytes of its part of
/// every receive (its immediate, or its sizes FIFO row for a multi-receive), so they add up.
fn add_sizes(m: &mut Msg, part: &[u64; MAX_RECVS]) {
    for (s, p) in m.sizes.iter_mut().zip(part).take(m.n.max(1) as usize) {
        *s += *p;
    }
}
