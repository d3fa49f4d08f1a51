//! The soak's schedule: what request `k` of a lane is (width, tags, posted and sent sizes, the
//! content seed of each message), derived from the run seed alone, so both processes compute
//! the same plan without exchanging it and a failure is reproducible from the printed seed.

use super::MAX_WIDTH;

/// splitmix64: a small, well-mixed generator (the data pattern and the schedule; not crypto).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n` ≥ 1; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Where a lane is: thread and lane index within the thread (the same on both sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneId {
    /// Thread index.
    pub thread: u32,
    /// Lane index within the thread.
    pub lane: u32,
}

/// One request of a lane: one `irecv` of `n` buffers on the receiver, `n` tagged `isend`s on
/// the sender (in `order`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Width: buffers in the multi-receive (1..=[`MAX_WIDTH`]).
    pub n: usize,
    /// Tags, distinct within the request.
    pub tags: [i32; MAX_WIDTH],
    /// Posted receive sizes.
    pub posted: [usize; MAX_WIDTH],
    /// Sent sizes (each ≤ its posted size).
    pub sent: [usize; MAX_WIDTH],
    /// Content seed of each message.
    pub seeds: [u64; MAX_WIDTH],
    /// The sender's issue order (a permutation of `0..n`).
    pub order: [usize; MAX_WIDTH],
}

/// A random size in `0..=cap`, log-uniform so that small and large messages are both common;
/// one in 16 is empty.
fn size(r: &mut Rng, cap: usize) -> usize {
    if cap == 0 || r.below(16) == 0 {
        return 0;
    }
    let bits = usize::BITS - cap.leading_zeros(); // cap < 2^bits
    let e = r.below(u64::from(bits) + 1) as u32;
    let top = if e >= usize::BITS {
        cap
    } else {
        (1usize << e).min(cap)
    };
    1 + r.below(top as u64) as usize
}

/// Request `k` of lane `id` in run `seed`: width `1..=max_width`, its messages together at
/// most `max_total` bytes (each `0..=max_total / n`).
pub fn request(seed: u64, id: LaneId, k: u64, max_total: usize, max_width: usize) -> Request {
    let lane_seed = (u64::from(id.thread) << 48) ^ (u64::from(id.lane) << 32);
    let mut r = Rng::new(seed ^ Rng::new(lane_seed ^ k).next_u64());
    let n = 1 + r.below(max_width.clamp(1, MAX_WIDTH) as u64) as usize;
    let cap = max_total / n;
    let mut q = Request {
        n,
        tags: [0; MAX_WIDTH],
        posted: [0; MAX_WIDTH],
        sent: [0; MAX_WIDTH],
        seeds: [0; MAX_WIDTH],
        order: [0; MAX_WIDTH],
    };
    for j in 0..n {
        q.tags[j] = loop {
            let t = r.below(i32::MAX as u64) as i32;
            if !q.tags[..j].contains(&t) {
                break t;
            }
        };
        q.posted[j] = size(&mut r, cap);
        q.sent[j] = if r.below(2) == 0 {
            q.posted[j]
        } else {
            r.below(q.posted[j] as u64 + 1) as usize
        };
        q.seeds[j] = r.next_u64();
        q.order[j] = j;
    }
    for j in (1..n).rev() {
        q.order.swap(j, r.below(j as u64 + 1) as usize);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_deterministic_and_within_bounds() {
        let id = LaneId { thread: 1, lane: 3 };
        let mut widths = [0u32; MAX_WIDTH + 1];
        let (mut empty, mut big) = (0, 0);
        for k in 0..4000 {
            let q = request(7, id, k, 16 << 20, 8);
            assert_eq!(q, request(7, id, k, 16 << 20, 8));
            assert!((1..=8).contains(&q.n));
            widths[q.n] += 1;
            let total: usize = q.posted[..q.n].iter().sum();
            assert!(total <= 16 << 20);
            let mut seen = q.order[..q.n].to_vec();
            seen.sort_unstable();
            assert_eq!(seen, (0..q.n).collect::<Vec<_>>());
            for j in 0..q.n {
                assert!(q.sent[j] <= q.posted[j] && q.tags[j] >= 0);
                assert!(!q.tags[..j].contains(&q.tags[j]));
                empty += usize::from(q.sent[j] == 0);
                big += usize::from(q.sent[j] > 4 << 20);
            }
        }
        assert!(
            widths[1..].iter().all(|&w| w > 0),
            "every width occurs: {widths:?}"
        );
        assert!(empty > 0 && big > 0, "empty {empty}, over 4 MiB {big}");
        assert_ne!(request(8, id, 0, 1 << 20, 8), request(7, id, 0, 1 << 20, 8));
    }
}
