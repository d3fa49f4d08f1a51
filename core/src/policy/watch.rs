//! The dead/stalled-peer state machine of a connected comm's liveness watch (ffi's `watch.rs`
//! holds the socket and the clock and acts on the answers).
//!
//! ```text
//!  progress ──▶ Idle ──not yet──▶ Waiting{since} ──every PROBE_EVERY──▶ probe (peek socket)
//!                                    │   closed: Dead (every later wait fails at once)
//!                                    └── waited stall_warn: Stalled once (a WARN); the wait
//!                                        goes on
//! ```
//! Cost on the data path: a call that made progress resets the wait (stores); a "not yet"
//! counts, and only every [`SPIN_CHECK`]-th one asks the caller for the time ([`Liveness::look`]).
//! Times are a monotonic clock's readings as [`Duration`]s from any fixed origin.

use core::time::Duration;

/// "Not yet" answers between two looks at the clock.
pub const SPIN_CHECK: u32 = 64;
/// Least time between two looks at the socket while a call waits.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);

/// What a "not yet" asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Nothing: keep waiting.
    Spin,
    /// Read the clock and call [`Liveness::look`].
    Look,
    /// The peer is known dead: fail the call.
    Dead,
}

/// What a look found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Keep waiting.
    Waiting,
    /// The peer's socket is closed or failed: the peer is dead (and stays so).
    Dead,
    /// The wait has lasted the stall limit (reported once per wait): how long so far.
    Stalled(Duration),
}

/// The liveness state of one comm (data-path state: NCCL serialises a comm's calls).
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    stall_warn: Option<Duration>,
    spins: u32,
    since: Option<Duration>,
    last_probe: Option<Duration>,
    warned: bool,
    dead: bool,
}

impl Liveness {
    /// A watch that reports a stall after `stall_warn_s` seconds (0: never).
    pub fn new(stall_warn_s: u64) -> Self {
        Self {
            stall_warn: (stall_warn_s > 0).then(|| Duration::from_secs(stall_warn_s)),
            spins: 0,
            since: None,
            last_probe: None,
            warned: false,
            dead: false,
        }
    }

    /// A call made progress: the wait, if any, is over.
    #[inline]
    pub fn progress(&mut self) {
        self.spins = 0;
        self.since = None;
        self.warned = false;
    }

    /// A call returned "not yet".
    #[inline]
    pub fn waiting(&mut self) -> Wait {
        if self.dead {
            return Wait::Dead;
        }
        self.spins = self.spins.wrapping_add(1);
        if self.spins.is_multiple_of(SPIN_CHECK) {
            Wait::Look
        } else {
            Wait::Spin
        }
    }

    /// A look at `now`: `closed` (asked only when [`PROBE_EVERY`] has passed since the last
    /// probe) says whether the peer's end of the socket is closed or failed.
    #[cold]
    pub fn look(&mut self, now: Duration, closed: impl FnOnce() -> bool) -> Look {
        let since = *self.since.get_or_insert(now);
        if self
            .last_probe
            .is_none_or(|t| now.saturating_sub(t) >= PROBE_EVERY)
        {
            self.last_probe = Some(now);
            if closed() {
                self.dead = true;
                return Look::Dead;
            }
        }
        let waited = now.saturating_sub(since);
        match self.stall_warn {
            Some(limit) if !self.warned && waited >= limit => {
                self.warned = true;
                Look::Stalled(waited)
            }
            _ => Look::Waiting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Spins until a look is asked for; how many "not yet"s that took.
    fn spin_to_look(l: &mut Liveness) -> u32 {
        let mut n = 1;
        loop {
            match l.waiting() {
                Wait::Spin => n += 1,
                Wait::Look => return n,
                Wait::Dead => panic!("not dead"),
            }
        }
    }

    #[test]
    fn a_look_every_spin_check_and_a_probe_every_probe_every() {
        let mut l = Liveness::new(0);
        assert_eq!(spin_to_look(&mut l), SPIN_CHECK);
        let mut probes = 0;
        assert_eq!(
            l.look(ms(1000), || {
                probes += 1;
                false
            }),
            Look::Waiting
        );
        assert_eq!(
            l.look(ms(1050), || {
                probes += 1;
                false
            }),
            Look::Waiting
        );
        assert_eq!(probes, 1, "no probe within PROBE_EVERY");
        assert_eq!(
            l.look(ms(1100), || {
                probes += 1;
                false
            }),
            Look::Waiting
        );
        assert_eq!(probes, 2);
    }

    #[test]
    fn a_closed_socket_is_a_dead_peer_for_good() {
        let mut l = Liveness::new(0);
        assert_eq!(l.look(ms(5), || true), Look::Dead);
        assert_eq!(l.waiting(), Wait::Dead);
        l.progress();
        assert_eq!(l.waiting(), Wait::Dead, "progress does not revive it");
    }

    #[test]
    fn a_stall_is_reported_once_per_wait() {
        let mut l = Liveness::new(2);
        assert_eq!(l.look(ms(0), || false), Look::Waiting);
        assert_eq!(l.look(ms(1999), || false), Look::Waiting);
        assert_eq!(l.look(ms(2500), || false), Look::Stalled(ms(2500)));
        assert_eq!(l.look(ms(9000), || false), Look::Waiting, "once");
        l.progress();
        assert_eq!(l.look(ms(10_000), || false), Look::Waiting, "a new wait");
        assert_eq!(l.look(ms(12_000), || false), Look::Stalled(ms(2000)));
        let mut never = Liveness::new(0);
        assert_eq!(never.look(ms(0), || false), Look::Waiting);
        assert_eq!(never.look(ms(1 << 40), || false), Look::Waiting);
    }
}
