//! The sending side of a fused comm: one [`SendComm`] per rail, each message striped across
//! the rails of the receiver's live-rail mask that are live here, and a failed rail's parts
//! moved to a healthy one (see the module doc of `crate::fused` for the protocol).

use core::mem::MaybeUninit;
use core::ptr::addr_of_mut;

use heapless::Vec;

use super::event::RailEvent;
use super::heal::{ctl_seq, Ctl};
use super::notice::{GroupNotice, Notice};
use super::rail_set::RailSet;
use super::resilience::Resilience;
use super::stripe::{stripe_weighted, Part};
use super::vnic::MAX_DEVS_PER_NIC;
use crate::comm::{CommConfig, Done, Peeked, SendComm, TruncNote, Truncation};
use crate::error::{Error, Result};
use crate::fifo::{FifoRing, PostedRecv, MAX_RECVS, MAX_REQUESTS};
use crate::provider::{Access, MrKeys, Provider, Sge};
use crate::request::ReqId;
use crate::wire::{QpInfo, RemoteBuf};

const N: usize = MAX_DEVS_PER_NIC;

mod heal;

/// Where one rail's part of a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leg {
    /// Acknowledged on its own rail, or nothing to do (a rail outside the receiver's mask).
    Done,
    /// Posted on its own rail; waiting for the acknowledgement.
    Native(ReqId),
    /// Its rail failed before the acknowledgement: to be written again by another rail. (Also
    /// a rail in the receiver's mask that this side knew was dead when it posted the message:
    /// its part is empty, so "moving" it is only telling the receiver.)
    Lost,
    /// Being written again by rail `carrier` (data only: no completion at the receiver).
    Moving { carrier: u8, id: ReqId },
    /// Written again and acknowledged; the receiver learns it from a notice.
    Moved,
}

/// One message in flight.
#[derive(Debug, Clone, Copy)]
struct Msg {
    gen: u16,
    used: bool,
    /// The receive's FIFO sequence number (the same on every rail).
    seq: u64,
    nreqs: u8,
    /// The receive's index in its multi-receive.
    index: u8,
    addr: u64,
    size: u64,
    /// The send buffer's keys on each rail.
    mrs: [MrKeys; N],
    /// The receive buffer as each rail's clear-to-send gave it (address, rkey); `None` for a
    /// rail that was already down.
    dst: [Option<(u64, u32)>; N],
    /// The receiver's live-rail mask from the clear-to-send (the rails it expects parts on).
    posted: u8,
    /// The rails the message is striped over: `posted` less the rails this side knew were
    /// dead when it posted the message (`parts` is `stripe_set(size, set)`).
    set: u8,
    parts: [Part; N],
    legs: [Leg; N],
    /// Rails whose moved part the receiver has acknowledged notice of.
    told: u8,
    /// The notice in flight: carrier, request, rails it tells. For a multi-receive, `told`
    /// and `telling` are the group's, kept by the send of receive 0.
    telling: Option<(u8, ReqId, u8)>,
    /// A send of a multi-receive whose whole group is finished (set on every send of it).
    gdone: bool,
    /// Failed attempts: moved parts or notices of this message whose carrier failed too
    /// (`NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS`).
    attempts: u8,
}

impl Msg {
    const FREE: Self = Self {
        gen: 0,
        used: false,
        seq: 0,
        nreqs: 0,
        index: 0,
        addr: 0,
        size: 0,
        mrs: [MrKeys { lkey: 0, rkey: 0 }; N],
        dst: [None; N],
        posted: 0,
        set: 0,
        parts: [Part { off: 0, len: 0 }; N],
        legs: [Leg::Done; N],
        told: 0,
        telling: None,
        gdone: false,
        attempts: 0,
    };

    fn moved(&self) -> u8 {
        self.legs
            .iter()
            .enumerate()
            .filter(|(_, l)| **l == Leg::Moved)
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    fn settled(&self) -> bool {
        self.legs
            .iter()
            .all(|l| matches!(l, Leg::Done | Leg::Moved))
    }

    fn finished(&self) -> bool {
        self.telling.is_none() && self.settled() && self.moved() & !self.told == 0
    }

    /// Whether the message still has failover work: a part lost or moving, a notice in
    /// flight or not yet written (a multi-receive's until its group is finished).
    fn failing_over(&self) -> bool {
        let untold = if self.nreqs > 1 {
            self.moved() != 0 && !self.gdone
        } else {
            self.moved() & !self.told != 0
        };
        untold || self.telling.is_some() || !self.settled()
    }
}

/// The sending side of a fused comm.
pub struct FusedSend<P: Provider> {
    /// The rails (first: dropped first, the registrations before the rings), which are in
    /// use, the rail news, settings, clock, weights and lifecycle. A rail is `broken` once
    /// its own comm failed here (drained once: see `fail_rail`).
    rails: RailSet<P, SendComm<P>>,
    msgs: [Msg; MAX_REQUESTS],
    free: Vec<u8, MAX_REQUESTS>,
    /// The message slot of each send of a multi-receive: row `seq % MAX_REQUESTS`, column
    /// the receive's index (checked against the message before use).
    by_seq: [[u8; MAX_RECVS]; MAX_REQUESTS],
    /// Where notices are staged before they are written (registered on every rail: the
    /// set's notice registrations).
    stage: P::Fifo,
    /// The receiver's notice ring, as each rail reaches it.
    ring: [RemoteBuf; N],
    /// Where the receiver says a rail is out of use on its side (slot = rail; registered on
    /// every rail: the set's back registrations).
    back: P::Fifo,
    /// Some message has failover work (`Msg::failing_over`): `test` also moves other
    /// messages' parts along. Cleared once none has, so a comm that lost a rail long ago
    /// pays nothing for it. Not `Lifecycle::RailDegraded`: that lasts while a rail is out of
    /// use; this, while a message has failover work.
    degraded: bool,
    resent: u64,
    /// Bytes each rail carried (its own parts and parts it wrote again for a failed rail).
    carried: [u64; N],
    /// The time before which lost parts wait (the last failure + the probe delay; the
    /// caller's clock, ms).
    hold_until: u64,
    /// Failback (`crate::fused::heal`), per rail: whether it is reset and waits for the
    /// receiver's JOIN (its generation, retry time and failed attempts: the rail set's).
    ready: [bool; N],
    /// The first send cut to the posted receive's size, until the caller takes it.
    trunc: TruncNote,
}

impl<P: Provider + Clone> FusedSend<P> {
    /// Builds a fused send comm in `slot`: one send comm per rail device in `devs` (rail
    /// order), and the notice stage and back ring registered on each.
    ///
    /// The comm is large (about 200 KB with four rails: the message table and one comm per
    /// rail), so it is written field by field into `slot` (a `Box::new_uninit`'s, say) and
    /// never passes through the stack whole; each rail's comm is made on the stack one at a
    /// time, as a plain comm is. On `Ok`, `slot` holds the comm (the returned reference), so
    /// the caller may `assume_init` it; on `Err`, `slot` holds nothing: what was made is
    /// released. A previous value in `slot` is overwritten without being dropped.
    #[allow(unsafe_code)]
    pub fn init<'a>(
        slot: &'a mut MaybeUninit<Self>,
        devs: &[P],
        cfg: CommConfig,
    ) -> Result<&'a mut Self> {
        if devs.is_empty() || devs.len() > N {
            return Err(Error::OutOfRange {
                what: "rails of a fused comm",
                value: devs.len() as i64,
                min: 1,
                max: N as i64,
            });
        }
        let stage = devs[0].alloc_fifo()?;
        let back = devs[0].alloc_fifo()?;
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
            addr_of_mut!((*p).by_seq).write([[0; MAX_RECVS]; MAX_REQUESTS]);
            addr_of_mut!((*p).stage).write(stage);
            addr_of_mut!((*p).ring).write([RemoteBuf::default(); N]);
            addr_of_mut!((*p).back).write(back);
            addr_of_mut!((*p).degraded).write(false);
            addr_of_mut!((*p).resent).write(0);
            addr_of_mut!((*p).carried).write([0; N]);
            addr_of_mut!((*p).hold_until).write(0);
            addr_of_mut!((*p).ready).write([false; N]);
            addr_of_mut!((*p).trunc).write(TruncNote::None);
        }
        // Every field written above: this pattern names them all, so a new field that the
        // writes above miss does not compile.
        let _ = |s: &Self| {
            let Self {
                rails: _,
                msgs: _,
                free: _,
                by_seq: _,
                stage: _,
                ring: _,
                back: _,
                degraded: _,
                resent: _,
                carried: _,
                hold_until: _,
                ready: _,
                trunc: _,
            } = s;
        };
        // SAFETY: every field of `*p` was written above.
        let r = unsafe { slot.assume_init_mut() }.set_up(devs, cfg);
        if let Err(e) = r {
            // SAFETY: `slot` is initialised (above) and dropped once here; the caller is told
            // it holds nothing on `Err`.
            unsafe { slot.assume_init_drop() };
            return Err(e);
        }
        // SAFETY: initialised above and not dropped (`set_up` succeeded).
        Ok(unsafe { slot.assume_init_mut() })
    }

    /// The fallible part of [`init`](Self::init): the rails' comms and the registrations of
    /// the notice stage and back ring on each rail (dropping `self` releases what was made).
    fn set_up(&mut self, devs: &[P], cfg: CommConfig) -> Result<()> {
        for d in devs {
            self.rails.push(SendComm::new(d.clone(), cfg)?);
        }
        let local = Access {
            local_write: true,
            ..Access::default()
        };
        let remote = Access {
            local_write: true,
            remote_write: true,
            // The receiver's failback reads this side's READY words (`crate::fused::heal`).
            remote_read: true,
            ..Access::default()
        };
        let bytes = FifoRing::<MAX_REQUESTS>::BYTES as u64;
        let (stage, back) = (self.stage.base_addr(), self.back.base_addr());
        self.rails
            .register(devs, bytes, (stage, local), (back, remote))
    }

    /// Sets how rail failures are handled (default: [`Resilience::default`]).
    pub fn set_resilience(&mut self, r: Resilience) {
        self.rails.res = r;
    }

    /// The caller's monotonic clock, in ms (the core reads none): a probe delay
    /// ([`Resilience::probe_delay_ms`]) counts in it. Call before `isend`/`test`.
    #[inline]
    pub fn tick(&mut self, now_ms: u64) {
        self.rails.now = now_ms;
    }

    /// Whether the comm counts time (a probe delay is set): the caller then feeds
    /// [`Self::tick`] before each call, and may skip reading its clock otherwise.
    #[inline]
    pub fn wants_clock(&self) -> bool {
        self.rails.res.wants_clock()
    }

    /// How many rails the comm has.
    pub fn rails(&self) -> usize {
        self.rails.len()
    }

    /// Rail `i`'s half of the handshake.
    pub fn local_info(&self, i: usize) -> Option<QpInfo> {
        self.rails.get(i).map(SendComm::local_info)
    }

    /// Connects rail `i` to the receiver's rail `i`.
    pub fn connect(&mut self, i: usize, remote: &QpInfo) -> Result<()> {
        let r = self.rails.get_mut(i).ok_or(Error::OutOfRange {
            what: "rail",
            value: i as i64,
            min: 0,
            max: N as i64 - 1,
        })?;
        r.connect(remote)?;
        self.rails.connected();
        Ok(())
    }

    /// The receiver's notice ring as each rail reaches it (`FusedRecv::notice_ring`).
    pub fn set_notice_ring(&mut self, ring: &[RemoteBuf]) -> Result<()> {
        if ring.len() != self.rails.len() || ring.iter().any(|r| r.addr == 0 || r.rkey == 0) {
            return Err(Error::Wire {
                what: "fused receiver's notice ring",
                value: ring.len() as u64,
            });
        }
        self.ring[..ring.len()].copy_from_slice(ring);
        Ok(())
    }

    /// Where the receiver reports rails it took out of use, as each rail reaches it (for
    /// `FusedRecv::set_back_ring`).
    pub fn back_ring(&self) -> Vec<RemoteBuf, N> {
        (0..self.rails.len())
            .map(|i| RemoteBuf {
                addr: self.back.base_addr(),
                rkey: self.rails.back_keys[i].rkey,
            })
            .collect()
    }

    /// Whether the receiver reported rail `i` out of use on its side.
    fn dropped_by_peer(&self, i: usize) -> Result<bool> {
        let mut out = [PostedRecv::default(); MAX_RECVS];
        let seq = ctl_seq(Ctl::Drop, i, self.rails.gen[i]);
        match self.back.poll(seq, &mut out) {
            Ok(None) => Ok(false),
            Ok(Some(_))
                if Notice::decode(&out[0], 0, self.rails.len(), 0)
                    .is_some_and(|n| n.rail as usize == i) =>
            {
                Ok(true)
            }
            _ => Err(Error::BadFifoElem {
                field: "rail notice from the receiver",
                value: i as u64,
                peer: Default::default(),
            }),
        }
    }

    /// The comm failed outside the core (its caller found the peer gone): every later call is
    /// refused at once with `Error::Poisoned`, reported as `e` was (the first failure stays).
    pub fn fail(&mut self, e: &Error) {
        self.rails.fail(e);
    }

    /// Rails that failed since the last call (each once), for the caller to log.
    pub fn take_events(&mut self) -> Vec<RailEvent, N> {
        self.rails.take_events()
    }

    /// Whether [`Self::take_events`] or [`Self::take_returned`] has anything to give (one test
    /// per data call, so that neither is taken, nor its vector moved, when nothing happened).
    #[inline]
    pub fn has_rail_news(&self) -> bool {
        self.rails.has_rail_news()
    }

    /// Sets each rail's stripe weight (rail order; its speed, in units both ends share): a
    /// message's parts are cut in proportion ([`stripe_weighted`]). Both ends must hold the
    /// same weights: the plugin sets each rail's smaller speed of the two ends', which it
    /// exchanges in the handshake's rail lists. Rails past `w` keep theirs (1 by default:
    /// equal shares). Control path: call it before the first message.
    pub fn set_rail_weights(&mut self, w: &[u32]) {
        self.rails.set_weights(w);
    }

    /// Rail `i`'s stripe weight ([`Self::set_rail_weights`]; 0 past the most rails).
    pub fn rail_weight(&self, i: usize) -> u32 {
        self.rails.weight(i)
    }

    /// The comm's first send cut to the size of its receive, once (see
    /// [`SendComm::take_truncation`]).
    #[inline]
    pub fn take_truncation(&mut self) -> Option<Truncation> {
        self.trunc.take()
    }

    /// Bytes written again on another rail after their own rail failed.
    pub fn resent_bytes(&self) -> u64 {
        self.resent
    }

    /// Bytes rail `i` carried so far: its parts of every message posted on it, and the parts
    /// of failed rails it wrote again.
    pub fn rail_bytes(&self, i: usize) -> u64 {
        self.carried.get(i).copied().unwrap_or(0)
    }

    /// Where the comm is in its life: connecting (a rail's QPs not connected yet), ready,
    /// rail-degraded (a rail out of use) or failed (a failure no rail could mend); stored,
    /// moved as those happen.
    #[inline]
    pub fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        self.rails.lifecycle()
    }

    /// Whether rail `i` is still in use.
    pub fn rail_live(&self, i: usize) -> bool {
        self.rails.live(i)
    }

    /// Sends `size` bytes at `addr` to the receive tagged `tag`, striped over the rails of the
    /// receiver's live-rail mask that are live here; `mrs[i]` are the buffer's keys on rail
    /// `i`. `Ok(None)`: not every such rail has the receive posted yet; call again.
    pub fn isend(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        mrs: &[MrKeys],
    ) -> Result<Option<ReqId>> {
        self.rails.check("isend")?;
        self.heal_step();
        let nr = self.rails.len();
        if mrs.len() != nr {
            return Err(Error::OutOfRange {
                what: "registrations of a fused send (one per rail)",
                value: mrs.len() as i64,
                min: nr as i64,
                max: nr as i64,
            });
        }
        let Some((peeks, posted)) = self.peek_all(tag)? else {
            return Ok(None);
        };
        let set = posted & self.rails.live_mask();
        let Some(first) = peeks.iter().flatten().next().copied().filter(|_| set != 0) else {
            return Err(self.rails.poison(Error::BadState {
                op: "isend",
                state: "no healthy rail left",
            }));
        };
        if peeks
            .iter()
            .flatten()
            .any(|p| p.seq != first.seq || p.index != first.index)
        {
            return Err(self.rails.poison(Error::Wire {
                what: "fused receiver posted different receives on its rails",
                value: first.seq,
            }));
        }
        let k = self.free.pop().ok_or(Error::Full {
            what: "fused send requests",
            cap: MAX_REQUESTS,
        })?;
        // Larger than the receive (the same on every rail): cut to it, as a plain comm does.
        let size = if size > first.posted.size {
            self.trunc.note(Truncation {
                send: size,
                recv: first.posted.size,
                tag,
            });
            first.posted.size
        } else {
            size
        };
        let m = &mut self.msgs[k as usize];
        *m = Msg {
            gen: m.gen.wrapping_add(1),
            used: true,
            seq: first.seq,
            nreqs: first.nreqs,
            index: first.index,
            addr,
            size,
            posted,
            set,
            parts: stripe_weighted(size, set, &self.rails.weights),
            ..Msg::FREE
        };
        m.mrs[..nr].copy_from_slice(mrs);
        self.by_seq[(first.seq % MAX_REQUESTS as u64) as usize][first.index as usize % MAX_RECVS] =
            k;
        let id = ReqId::from_bits(u32::from(m.gen) << 8 | u32::from(k));
        for (i, p) in peeks.iter().enumerate().take(nr) {
            self.post_part(k as usize, i, *p, tag)?;
        }
        self.advance(k as usize)?;
        if self.msgs[k as usize].failing_over() {
            self.degraded = true;
        }
        Ok(Some(id))
    }

    /// Posts rail `i`'s part of the new message `k` (`p`: the rail's clear-to-send). A rail
    /// outside the receiver's mask has no part and nothing to tell; one in it but dead here
    /// has an empty part, which the receiver learns of from a notice (its next clear-to-send
    /// leaves the rail out).
    fn post_part(&mut self, k: usize, i: usize, p: Option<Peeked>, tag: u32) -> Result<()> {
        let m = &mut self.msgs[k];
        if m.posted >> i & 1 == 0 {
            m.legs[i] = Leg::Done;
            return Ok(());
        }
        m.dst[i] = p.map(|p| (p.posted.addr, p.posted.rkey));
        if m.set >> i & 1 == 0 || p.is_none() {
            m.legs[i] = Leg::Lost;
            return Ok(());
        }
        let (part, addr, mr) = (m.parts[i], m.addr, m.mrs[i]);
        match self.rails[i].isend_at(addr + part.off, part.len, tag, mr, part.off) {
            Ok(Some(sub)) => {
                self.carried[i] += part.len;
                self.msgs[k].legs[i] = Leg::Native(sub);
                Ok(())
            }
            Ok(None) => Err(self.rails.poison(Error::BadState {
                op: "isend",
                state: "a peeked receive did not match",
            })),
            Err(e) => {
                self.msgs[k].legs[i] = Leg::Lost;
                self.fail_rail(i, e)
            }
        }
    }

    /// The matching receive on every live rail of the receiver's live-rail mask, and that
    /// mask; `None` while such a rail has not posted it yet. A rail that errors (or, idle,
    /// shows an error completion), that the receiver reported out of use, or that the mask
    /// leaves out is taken out of use here.
    #[allow(clippy::type_complexity)] // one array of peeks and the mask they carry
    fn peek_all(&mut self, tag: u32) -> Result<Option<([Option<Peeked>; N], u8)>> {
        let mut peeks = [None; N];
        let nr = self.rails.len();
        for (i, slot) in peeks.iter_mut().enumerate().take(nr) {
            if !self.rails.live(i) {
                continue;
            }
            match self.rails[i].peek(tag) {
                Ok(p) => *slot = p,
                Err(e) => self.fail_rail(i, e)?,
            }
        }
        let mut posted = self.posted_mask(&peeks)?;
        if let (Some(m), Some(seq)) = (posted, peeks.iter().flatten().next().map(|p| p.seq)) {
            if self.ready.iter().any(|&r| r) {
                if !self.rejoin(seq, m, &mut peeks, tag)? {
                    return Ok(None);
                }
                posted = self.posted_mask(&peeks)?;
            }
        }
        for (i, p) in peeks.iter().enumerate().take(nr) {
            if !self.rails.live(i) || p.is_some() {
                continue;
            }
            if posted.is_some_and(|m| m >> i & 1 == 0) {
                // Left out by the receiver: it will never post on this rail again.
                self.drop_rail(i, Self::DROPPED)?;
                continue;
            }
            match self.rails[i].progress() {
                Err(e) => self.fail_rail(i, e)?,
                // The receiver took the rail out of use: it posts there no more.
                // A hostile back notice fails the comm (every later call refused).
                Ok(()) if self.dropped_by_peer(i).map_err(|e| self.rails.poison(e))? => {
                    self.drop_rail(i, Self::DROPPED)?
                }
                // A healthy rail whose receive is not posted yet: try again later.
                Ok(()) => return Ok(None),
            }
        }
        match posted {
            Some(m) => Ok(Some((peeks, m))),
            None => Err(self.rails.poison(Error::BadState {
                op: "isend",
                state: "no healthy rail left",
            })),
        }
    }

    /// What a rail the receiver took out of use fails with here.
    const DROPPED: Error = Error::RailDroppedByPeer {
        what: "the receiver took this rail out of use",
    };

    /// The receiver's live-rail mask, as the clear-to-sends in `peeks` carry it (`None`: no
    /// peek). Refused as hostile (the comm fails, as for a hostile notice): an empty mask, one
    /// naming a rail the comm lacks or leaving out the rail it came on, masks that differ.
    fn posted_mask(&mut self, peeks: &[Option<Peeked>; N]) -> Result<Option<u8>> {
        let all = (1u32 << self.rails.len()) - 1;
        let mut mask = None;
        for (i, p) in peeks.iter().enumerate() {
            let Some(p) = p else { continue };
            let m = *mask.get_or_insert(p.rails);
            if m != p.rails || m & !all != 0 || m >> i & 1 == 0 {
                return Err(self.rails.poison(Error::BadFifoElem {
                    field: "live-rail mask of a fused clear-to-send",
                    value: p.rails.into(),
                    peer: Default::default(),
                }));
            }
        }
        Ok(mask.map(|m| m as u8))
    }

    /// Polls for completion of `id`: done when every rail's part is acknowledged (on its own
    /// rail, or on another one and the receiver told).
    pub fn test(&mut self, id: ReqId) -> Result<Option<Done>> {
        self.rails.check("test")?;
        self.heal_step();
        let k = self.lookup(id)?;
        self.advance(k)?;
        if self.degraded {
            let mut busy = false;
            for j in 0..MAX_REQUESTS {
                if j != k && self.msgs[j].used {
                    self.advance(j)?;
                    busy |= self.msgs[j].failing_over();
                }
            }
            self.degraded = busy || self.msgs[k].failing_over();
        }
        let done = if self.msgs[k].nreqs > 1 {
            self.group_finished(k)?
        } else {
            self.msgs[k].finished()
        };
        if !done {
            return Ok(None);
        }
        let mut sizes = [0; MAX_RECVS];
        sizes[0] = self.msgs[k].size;
        self.msgs[k].used = false;
        // Cannot fail: a used slot is not in the free list, which has room for every slot.
        let _ = self.free.push(k as u8);
        Ok(Some(Done { n: 1, sizes }))
    }

    fn lookup(&self, id: ReqId) -> Result<usize> {
        let b = id.to_bits();
        let k = (b & 0xff) as usize;
        let m = &self.msgs[k];
        if !m.used || u32::from(m.gen) != b >> 8 {
            return Err(Error::StaleRequest { idx: k as u16 });
        }
        Ok(k)
    }

    /// Moves message `k` along: tests its legs, moves lost parts, tells the receiver.
    fn advance(&mut self, k: usize) -> Result<()> {
        for i in 0..self.rails.len() {
            match self.msgs[k].legs[i] {
                Leg::Native(sub) => match self.rails[i].test(sub) {
                    Ok(Some(_)) => self.msgs[k].legs[i] = Leg::Done,
                    Ok(None) => {}
                    Err(e) => self.fail_rail(i, e)?,
                },
                Leg::Moving { carrier, id } => match self.rails[carrier as usize].test(id) {
                    Ok(Some(_)) => self.msgs[k].legs[i] = Leg::Moved,
                    Ok(None) => {}
                    Err(e) => self.fail_rail(carrier as usize, e)?,
                },
                Leg::Done | Leg::Lost | Leg::Moved => {}
            }
        }
        for i in 0..self.rails.len() {
            if self.msgs[k].legs[i] == Leg::Lost {
                self.move_part(k, i)?;
            }
        }
        self.tell(k)
    }

    /// Writes rail `i`'s part of message `k` again, on the first live rail that has the
    /// message's receive (the bytes go to the same addresses: a repeated write is harmless).
    fn move_part(&mut self, k: usize, i: usize) -> Result<()> {
        let m = self.msgs[k];
        let part = m.parts[i];
        if part.len == 0 {
            // Nothing to write: the notice alone tells the receiver.
            self.msgs[k].legs[i] = Leg::Moved;
            return Ok(());
        }
        if self.rails.now < self.hold_until {
            // The probe delay since the last failure has not passed: the part stays lost.
            return Ok(());
        }
        let carrier = (0..self.rails.len()).find(|&c| self.rails.live(c) && m.dst[c].is_some());
        let Some(c) = carrier else {
            return Err(self.rails.poison(Error::BadState {
                op: "rail failover",
                state: "no healthy rail left for a message in flight",
            }));
        };
        let (raddr, rkey) = m.dst[c].unwrap_or_default();
        let local = Sge {
            addr: m.addr + part.off,
            len: part.len as u32,
            lkey: m.mrs[c].lkey,
        };
        match self.rails[c].iwrite(local, raddr + part.off, rkey) {
            Ok(id) => {
                self.resent += part.len;
                self.carried[c] += part.len;
                self.msgs[k].legs[i] = Leg::Moving {
                    carrier: c as u8,
                    id,
                };
                Ok(())
            }
            // The part stays lost; the next step picks another carrier.
            Err(e) => {
                self.msgs[k].attempts = self.msgs[k].attempts.saturating_add(1);
                self.fail_rail(c, e)
            }
        }
    }

    /// Once every moved part of message `k` is acknowledged, tells the receiver which rails'
    /// parts it got that way (one notice; a later one repeats the earlier rails, so the order
    /// in which two notices land does not matter). A multi-receive's sends are told together
    /// ([`Self::tell_group`]).
    fn tell(&mut self, k: usize) -> Result<()> {
        if self.msgs[k].nreqs > 1 {
            return self.tell_group(k);
        }
        if self.telling_pending(k)? {
            return Ok(());
        }
        let m = self.msgs[k];
        let moved = m.moved();
        let busy = m
            .legs
            .iter()
            .any(|l| matches!(l, Leg::Lost | Leg::Moving { .. }));
        if moved & !m.told == 0 || busy {
            return Ok(());
        }
        let mut elems = [PostedRecv::default(); MAX_DEVS_PER_NIC];
        let nr = self.rails.len();
        for (r, e) in elems.iter_mut().enumerate().take(nr) {
            if moved & (1 << r) != 0 {
                *e = Notice {
                    seq: m.seq,
                    rail: r as u8,
                    bytes: m.parts[r].len,
                    mask: u32::from(m.parts[r].len > 0) << m.index,
                }
                .encode();
            }
        }
        self.write_notice(k, &elems[..nr], moved)
    }

    /// [`Self::tell`] for a multi-receive: once every send of the group is posted and none
    /// has a part still lost or moving, one notice names the rails any send of the group
    /// moved, with every send's size; it is kept by the send of receive 0.
    fn tell_group(&mut self, k: usize) -> Result<()> {
        let Some(g) = self.members(k) else {
            return Ok(());
        };
        let (n, lead) = (self.msgs[k].nreqs as usize, g[0]);
        if self.telling_pending(lead)? {
            return Ok(());
        }
        let mut moved = 0;
        for &j in &g[..n] {
            let m = &self.msgs[j];
            if m.legs
                .iter()
                .any(|l| matches!(l, Leg::Lost | Leg::Moving { .. }))
            {
                return Ok(());
            }
            moved |= m.moved();
        }
        if moved & !self.msgs[lead].told == 0 {
            return Ok(());
        }
        let mut elems = [PostedRecv::default(); MAX_RECVS];
        for (i, e) in elems.iter_mut().enumerate().take(n) {
            let m = &self.msgs[g[i]];
            *e = GroupNotice {
                seq: m.seq,
                rails: moved,
                index: i as u8,
                size: m.size,
                stripe: m.set,
            }
            .encode();
        }
        self.write_notice(lead, &elems[..n], moved)
    }

    /// The slots of the sends of message `k`'s multi-receive by receive index, once every
    /// one of them is posted (and none freed).
    fn members(&self, k: usize) -> Option<[usize; MAX_RECVS]> {
        let m = &self.msgs[k];
        let row = &self.by_seq[(m.seq % MAX_REQUESTS as u64) as usize];
        let mut out = [0; MAX_RECVS];
        for (i, o) in out.iter_mut().enumerate().take(m.nreqs as usize) {
            let j = row[i] as usize;
            let x = &self.msgs[j];
            if !x.used || x.seq != m.seq || x.index as usize != i || x.nreqs != m.nreqs {
                return None;
            }
            *o = j;
        }
        Some(out)
    }

    /// Whether send `k` of a multi-receive is finished: every send of its group posted, their
    /// parts all acknowledged, and the group's notice (if any) acknowledged. Once true it is
    /// marked on every send of the group, so the first one freed does not undo it.
    fn group_finished(&mut self, k: usize) -> Result<bool> {
        if self.msgs[k].gdone {
            return Ok(true);
        }
        if !self.msgs[k].settled() {
            return Ok(false);
        }
        let Some(g) = self.members(k) else {
            return Ok(false);
        };
        let n = self.msgs[k].nreqs as usize;
        for &j in &g[..n] {
            if j != k {
                self.advance(j)?;
            }
        }
        let moved = g[..n].iter().fold(0, |a, &j| a | self.msgs[j].moved());
        let lead = &self.msgs[g[0]];
        let done = lead.telling.is_none()
            && moved & !lead.told == 0
            && g[..n].iter().all(|&j| self.msgs[j].settled());
        if done {
            for &j in &g[..n] {
                self.msgs[j].gdone = true;
            }
        }
        Ok(done)
    }

    /// Tests the notice message `k` has in flight: `true` while it is not acknowledged yet.
    /// Acknowledged, its rails count as told; its carrier failed, it is to be written again.
    fn telling_pending(&mut self, k: usize) -> Result<bool> {
        let Some((c, id, mask)) = self.msgs[k].telling else {
            return Ok(false);
        };
        match self.rails[c as usize].test(id) {
            Ok(Some(_)) => {
                let m = &mut self.msgs[k];
                m.told |= mask;
                m.telling = None;
                Ok(false)
            }
            Ok(None) => Ok(true),
            Err(e) => {
                self.msgs[k].telling = None;
                self.msgs[k].attempts = self.msgs[k].attempts.saturating_add(1);
                self.fail_rail(c as usize, e)?;
                Ok(false)
            }
        }
    }

    /// Writes the notice `elems` for message `k` (telling rails `moved`) into its slot of the
    /// receiver's ring, on the first live rail; `k` keeps it in flight.
    fn write_notice(&mut self, k: usize, elems: &[PostedRecv], moved: u8) -> Result<()> {
        let Some(c) = self.rails.first_live() else {
            return Err(self.rails.poison(Error::BadState {
                op: "rail failover",
                state: "no healthy rail left",
            }));
        };
        let (off, len) = self.stage.publish(self.msgs[k].seq, elems);
        let local = Sge {
            addr: self.stage.base_addr() + off as u64,
            len: len as u32,
            lkey: self.rails.notice_keys[c].lkey,
        };
        let ring = self.ring[c];
        match self.rails[c].iwrite(local, ring.addr + off as u64, ring.rkey) {
            Ok(id) => {
                self.msgs[k].telling = Some((c as u8, id, moved));
                Ok(())
            }
            Err(e) => {
                self.msgs[k].attempts = self.msgs[k].attempts.saturating_add(1);
                self.fail_rail(c, e)
            }
        }
    }

    /// Rail `i`'s own comm failed with `e`: after its completion queue is drained (a part
    /// acknowledged before the failure is done: the receiver has it), its unacknowledged
    /// parts are lost (to be moved), and so are parts and notices it was carrying; then it is
    /// out of use ([`Self::drop_rail`]). Also for a rail already out of use (dropped by the
    /// receiver) whose parts were still in flight.
    fn fail_rail(&mut self, i: usize, e: Error) -> Result<()> {
        // Failover off, or a failure no other rail can mend: the comm's error. Broken the
        // first time: drained (a rail whose CQ cannot be read, a fatal device event, says no
        // more: what it had not acknowledged is lost).
        if self.rails.break_rail(i, e)? {
            self.degraded = true;
            self.hold_until = self.rails.now.saturating_add(self.rails.res.probe_delay_ms);
            let rail = &mut self.rails[i];
            let mut acked = |id: ReqId| matches!(rail.completed(id), Ok(Some(_)));
            for m in self.msgs.iter_mut().filter(|m| m.used) {
                for l in m.legs.iter_mut() {
                    if let Leg::Moving { carrier, id } = *l {
                        if carrier as usize == i {
                            *l = if acked(id) {
                                Leg::Moved
                            } else {
                                m.attempts = m.attempts.saturating_add(1);
                                Leg::Lost
                            };
                        }
                    }
                }
                if let Leg::Native(sub) = m.legs[i] {
                    m.legs[i] = if acked(sub) { Leg::Done } else { Leg::Lost };
                }
                if let Some((c, id, mask)) = m.telling {
                    if c as usize == i {
                        m.telling = None;
                        if acked(id) {
                            m.told |= mask;
                        } else {
                            m.attempts = m.attempts.saturating_add(1);
                        }
                    }
                }
            }
        }
        let max = self.rails.res.max_attempts.map_or(u32::MAX, |m| m);
        if self
            .msgs
            .iter()
            .any(|m| m.used && u32::from(m.attempts) > max)
        {
            // More failed attempts at one message than NCCL_IB_RESILIENCY_PORT_FAILOVER_
            // MAX_ATTEMPTS allows: the comm fails with the failure that made one too many.
            return Err(self.rails.poison(e));
        }
        self.drop_rail(i, e)
    }

    /// Takes rail `i` out of use after `e`: no new part goes on it (reported once). Without
    /// a live rail left, `e` is the comm's error. Parts in flight on it stay where they are:
    /// a rail the receiver took out of use still has them acknowledged or fails them
    /// ([`Self::fail_rail`]), and only a failed part is written again, so a part never lands
    /// twice (the module doc's "Sender").
    fn drop_rail(&mut self, i: usize, e: Error) -> Result<()> {
        if !self.rails.live(i) {
            return Ok(());
        }
        if !self.rails.res.failover {
            return Err(self.rails.poison(e));
        }
        self.degraded = true;
        self.rails.retry_later(i);
        // A send of a multi-receive that waits on this rail for the group's other sends,
        // which will not come here now, is never posted: it is lost (nothing of it landed).
        for m in self.msgs.iter_mut().filter(|m| m.used) {
            if let Leg::Native(sub) = m.legs[i] {
                if self.rails[i].unposted(sub) {
                    m.legs[i] = Leg::Lost;
                }
            }
        }
        self.rails.drop_out(i, e)
    }

    /// Fused send requests in use (for tests and diagnostics).
    pub fn requests_in_use(&self) -> usize {
        MAX_REQUESTS - self.free.len()
    }

    /// Closes every rail and releases the notice stage.
    pub fn close(mut self) -> Result<()> {
        self.close_in_place()
    }

    /// [`Self::close`] of a comm that stays where it is (in a box the caller frees): every
    /// rail closed and the rings released; what is left is dropped with nothing more to do.
    pub fn close_in_place(&mut self) -> Result<()> {
        self.rails.close()
    }
}
