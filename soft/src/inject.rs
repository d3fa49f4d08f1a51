//! The armed faults of `IBNET_SOFT_FAULTS` ([`crate::faults`]) at run time: the dice, the
//! counters, and the rewriting of a FIFO element. Exists only when a fault is armed (the hot
//! path tests an `Option`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ibnet_core::fifo::{FifoRing, PostedRecv, MAX_RECVS};
use ibnet_core::provider::WcStatus;

use crate::faults::Faults;
use crate::segment;
use crate::sys;

/// Bytes of one FIFO element on the wire.
const ELEM: usize = 64;

/// Armed faults of one provider.
pub struct Inject {
    /// What is armed.
    pub spec: Faults,
    dice: AtomicU64,
    regs: AtomicU64,
    wrs: AtomicU64,
    /// The link of `down`/`heal` (`None`: not armed).
    link: Option<Mutex<Link>>,
    /// A private ring to re-encode FIFO elements with (`fifo_corrupt` only).
    scratch: Option<Mutex<Box<FifoRing>>>,
}

/// The link of `down`/`heal`: WRs since it came up, when it went down, how often.
#[derive(Default)]
struct Link {
    wrs: u64,
    down_since: Option<u64>,
    downs: u64,
}

/// Milliseconds of the monotonic clock since the first call.
pub fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// splitmix64: one well-mixed 64-bit value per counter value.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Inject {
    /// The injector for `spec`; `None` when nothing is armed.
    pub fn new(spec: Faults) -> Option<Arc<Self>> {
        spec.any().then(|| {
            Arc::new(Self {
                spec,
                dice: AtomicU64::new(0),
                regs: AtomicU64::new(0),
                wrs: AtomicU64::new(0),
                link: (spec.down != 0).then(|| Mutex::new(Link::default())),
                scratch: (spec.fifo_corrupt != 0).then(|| Mutex::new(segment::zeroed_fifo())),
            })
        })
    }

    /// A seeded random number.
    pub fn rand(&self) -> u64 {
        // Relaxed: a counter; only distinct values matter.
        mix(self.spec.seed ^ mix(self.dice.fetch_add(1, Ordering::Relaxed)))
    }

    /// True with probability `1/one_in` (never for 0).
    pub fn roll(&self, one_in: u64) -> bool {
        one_in != 0 && self.rand().is_multiple_of(one_in)
    }

    /// `reg_mr`: does this registration fail?
    pub fn reg_fails(&self) -> bool {
        let n = self.spec.reg_fail;
        // Relaxed: a counter.
        n != 0 && (self.regs.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(n)
    }

    /// `post_send`, per WR: kills the process at the armed count; returns the status the WR
    /// must fail with, if the link is down or the dice say so.
    pub fn on_post(&self) -> Option<WcStatus> {
        let k = self.spec.kill_after_wrs;
        // Relaxed: a counter.
        if k != 0 && self.wrs.fetch_add(1, Ordering::Relaxed) + 1 >= k {
            sys::kill_self();
        }
        if self.link_down() {
            return Some(WcStatus::RetryExceeded);
        }
        self.roll(self.spec.wr_fail)
            .then_some(self.spec.wr_fail_status)
    }

    /// `down`/`heal`, per posted WR: whether the link is down for it (see the module doc of
    /// `crate::faults`). Test-only: a mutex per WR when armed.
    fn link_down(&self) -> bool {
        let Some(link) = &self.link else {
            return false;
        };
        let mut l = link.lock().unwrap_or_else(|e| e.into_inner());
        let now = crate::inject::now_ms();
        if let Some(since) = l.down_since {
            let heal = self.spec.heal_ms;
            if heal == 0 || now < since + heal {
                return true;
            }
            l.down_since = None;
            l.wrs = 0;
        }
        if self.spec.downs != 0 && l.downs >= self.spec.downs {
            return false;
        }
        l.wrs += 1;
        if l.wrs < self.spec.down {
            return false;
        }
        l.down_since = Some(now);
        l.downs += 1;
        true
    }

    /// Times the link went down so far (`down`), and whether it is down now.
    #[cfg(test)]
    fn link_state(&self) -> (u64, bool) {
        self.link.as_ref().map_or((0, false), |l| {
            let l = l.lock().unwrap_or_else(|e| e.into_inner());
            let heal = self.spec.heal_ms;
            let down = l
                .down_since
                .is_some_and(|s| heal == 0 || now_ms() < s + heal);
            (l.downs, down)
        })
    }

    /// A write of `src_len` bytes from `laddr` (this process): if it is a run of FIFO elements
    /// and the dice say so, writes into `out` the same elements with a stale rkey (consistent:
    /// the reader accepts them) and returns their length.
    pub fn corrupt_fifo(
        &self,
        laddr: u64,
        src_len: usize,
        out: &mut [u8; ELEM * MAX_RECVS],
    ) -> Option<usize> {
        let scratch = self.scratch.as_ref()?;
        if src_len == 0 || !src_len.is_multiple_of(ELEM) || src_len > out.len() {
            return None;
        }
        let src = &mut out[..src_len];
        sys::read_self(laddr, src).ok()?;
        let (seq, mut posted, rails) = decode(src)?;
        let ring = scratch.lock().unwrap_or_else(|e| e.into_inner());
        // Only a genuine element (its check included) is one: re-encode and compare.
        if encode(&ring, seq, &posted, rails, src_len)?[..src_len] != src[..] {
            return None;
        }
        if !self.roll(self.spec.fifo_corrupt) {
            return None;
        }
        for p in &mut posted[..src_len / ELEM] {
            p.rkey ^= 0x8000_0000; // another generation of the same slot: a stale key
        }
        let bad = encode(&ring, seq, &posted, rails, src_len)?;
        out[..src_len].copy_from_slice(&bad[..src_len]);
        Some(src_len)
    }
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]))
}

/// The sequence number, receives and live-rail mask of a run of FIFO elements (layout of
/// `FifoElem`: addr, size, rkey, nreqs, tag, rails, idx, check, padding). A fused receiver's
/// elements carry its mask (the same in each); a plain comm's carry 0.
fn decode(b: &[u8]) -> Option<(u64, [PostedRecv; MAX_RECVS], u32)> {
    let n = b.len() / ELEM;
    let idx = u64_at(b, 32);
    let mut out = [PostedRecv::default(); MAX_RECVS];
    for (i, e) in b.chunks_exact(ELEM).enumerate() {
        if idx == 0 || u64_at(e, 32) != idx || u32_at(e, 20) as usize != n {
            return None;
        }
        out[i] = PostedRecv {
            addr: u64_at(e, 0),
            size: u64_at(e, 8),
            rkey: u32_at(e, 16),
            tag: u32_at(e, 24),
        };
    }
    Some((idx - 1, out, u32_at(b, 28)))
}

/// The bytes the core's writer puts on the wire for `posted` at `seq` with mask `rails`.
fn encode(
    ring: &FifoRing,
    seq: u64,
    posted: &[PostedRecv; MAX_RECVS],
    rails: u32,
    len: usize,
) -> Option<[u8; ELEM * MAX_RECVS]> {
    let (off, n) = ring.publish_rails(seq, &posted[..len / ELEM], rails);
    let mut b = [0u8; ELEM * MAX_RECVS];
    sys::read_self(ring.base_addr() + off as u64, &mut b[..n]).ok()?;
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` genuine elements at `seq` with mask `rails`, as the core's writer puts them on the
    /// wire.
    fn wire(seq: u64, n: usize, rails: u32) -> [u8; ELEM * MAX_RECVS] {
        let ring = segment::zeroed_fifo();
        let mut posted = [PostedRecv::default(); MAX_RECVS];
        for (i, p) in posted.iter_mut().enumerate().take(n) {
            *p = PostedRecv {
                addr: 0x1000 * (i as u64 + 1),
                size: 4096,
                rkey: 0x100 + i as u32,
                tag: i as u32,
            };
        }
        encode(&ring, seq, &posted, rails, n * ELEM).unwrap()
    }

    fn always_corrupt() -> Arc<Inject> {
        Inject::new(Faults::parse("seed=1,fifo_corrupt=1").unwrap()).unwrap()
    }

    #[test]
    fn a_fused_receivers_elements_are_corrupted_with_their_mask_kept() {
        for (rails, n) in [(0u32, 1usize), (0b11, 1), (0b101, 3)] {
            let src = wire(7, n, rails);
            let mut out = [0u8; ELEM * MAX_RECVS];
            let len = always_corrupt()
                .corrupt_fifo(src.as_ptr() as u64, n * ELEM, &mut out)
                .unwrap_or_else(|| panic!("rails {rails:#b}: not corrupted"));
            assert_eq!(len, n * ELEM);
            let (seq, posted, got) = decode(&out[..len]).unwrap();
            assert_eq!((seq, got), (7, rails), "same slot, same mask");
            for (i, p) in posted[..n].iter().enumerate() {
                assert_eq!(p.rkey, (0x100 + i as u32) ^ 0x8000_0000, "a stale key");
                assert_eq!(p.addr, 0x1000 * (i as u64 + 1));
            }
            // Consistent: its check is right, so the reader accepts it.
            let again = encode(&segment::zeroed_fifo(), seq, &posted, got, len).unwrap();
            assert_eq!(again[..len], out[..len]);
        }
    }

    /// `down=3,heal=30,downs=2`: the 3rd WR takes the link down, every WR fails until 30 ms
    /// have passed, then 3 more WRs take it down again, and after the second heal it stays up.
    #[test]
    fn the_link_goes_down_heals_and_goes_down_again() {
        let i = Inject::new(Faults::parse("down=3,heal=30,downs=2").unwrap()).unwrap();
        let fails = |n: usize| (0..n).map(|_| i.on_post().is_some()).collect::<Vec<_>>();
        assert_eq!(fails(2), [false, false]);
        assert_eq!(
            i.on_post(),
            Some(WcStatus::RetryExceeded),
            "down at the 3rd WR"
        );
        assert_eq!(i.link_state(), (1, true));
        assert_eq!(fails(5), [true; 5], "down until healed");
        std::thread::sleep(std::time::Duration::from_millis(40));
        assert_eq!(
            fails(3),
            [false, false, true],
            "healed, down again at the 3rd WR"
        );
        assert_eq!(i.link_state(), (2, true));
        std::thread::sleep(std::time::Duration::from_millis(40));
        assert_eq!(fails(10), [false; 10], "downs=2: up for good");
        assert_eq!(i.link_state(), (2, false));
    }

    #[test]
    fn bytes_that_are_not_elements_are_left_alone() {
        let mut src = wire(3, 2, 0b11);
        src[28] ^= 1; // the first element's mask no longer matches its check
        let mut out = [0u8; ELEM * MAX_RECVS];
        let got = always_corrupt().corrupt_fifo(src.as_ptr() as u64, 2 * ELEM, &mut out);
        assert_eq!(got, None);
    }
}
