//! `IBNET_SOFT_FAULTS`: seeded fault injection for tests (off by default).
//!
//! ```text
//!  IBNET_SOFT_FAULTS = item ("," item)*        item = key "=" value     (whitespace ignored)
//!  seed=N              seed of the fault dice (default 1)
//!  wr_fail=N[:STATUS]  each send WR fails with probability 1/N (1: every WR), completing with
//!                      STATUS (a `WcStatus` name, default RemoteAccessError) without moving
//!                      a byte; the QP goes to the error state as for a real failure, and for a
//!                      responder status (Remote*) the target QP too
//!  cq_delay_us=N       a CQ hands out completions at most once every N µs (0..=1000000)
//!  reorder=0|1         a CQ harvests its QPs in a random order, one completion per QP per round
//!                      (order within a QP is kept, as RC guarantees)
//!  fifo_corrupt=N      each clear-to-send FIFO element this provider writes to a peer (the
//!                      peer's incoming element) is corrupted with probability 1/N: it arrives
//!                      whole and consistent but with a stale rkey, so the peer's data write
//!                      fails with RemoteAccessError (and our receive is flushed); on every
//!                      path: in-process, and into a peer's FIFO ring in its shared segment
//!  reg_fail=N          every N-th `reg_mr` fails (ENOMEM)
//!  kill_after_wrs=N    the process kills itself (SIGKILL) at its N-th posted send WR
//!  down=N              the device's link goes down at its N-th posted send WR (counted from
//!                      the start, then from each heal): that WR and every one posted while
//!                      the link is down fail with RetryExceeded (the QP goes to the error
//!                      state, as when the link's retries ran out); a WR already posted
//!                      completes as it would have
//!  heal=MS             the link comes back MS ms after it went down (0, default: never);
//!                      QPs that went to the error state stay there until they are reset
//!                      (`Provider::reset_qp`), as on hardware; N WRs later it goes down again
//!  downs=K             the link goes down at most K times (0, default: no limit)
//! ```
//! `N` is an integer in NCCL's syntax ([`ibnet_core::params::parse_int`]); 0 turns an item
//! off. A malformed value refuses the whole variable (one [`Error::Param`]; no fault is armed).
//! Example: `IBNET_SOFT_FAULTS=seed=42,wr_fail=100:RemoteAccessError,cq_delay_us=100,reorder=1`.
//!
//! Cost when off: one well-predicted branch on an `Option` in `post_send` and `poll_cq`, one
//! in the copy of a WR; nothing is allocated.

use ibnet_core::params::parse_int;
use ibnet_core::provider::WcStatus;
use ibnet_core::Error;

/// The variable's name.
pub const VAR: &str = "IBNET_SOFT_FAULTS";

/// A parsed `IBNET_SOFT_FAULTS` (see the module doc for each field's meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// Seed of the fault dice.
    pub seed: u64,
    /// A send WR fails with probability 1/`wr_fail` (0: never).
    pub wr_fail: u64,
    /// The status a failed WR completes with.
    pub wr_fail_status: WcStatus,
    /// Least time between two batches of completions of a CQ, µs (0: no delay).
    pub cq_delay_us: u64,
    /// Harvest a CQ's QPs in random order.
    pub reorder: bool,
    /// An outgoing FIFO element is corrupted with probability 1/`fifo_corrupt` (0: never).
    pub fifo_corrupt: u64,
    /// Every `reg_fail`-th registration fails (0: never).
    pub reg_fail: u64,
    /// SIGKILL at the `kill_after_wrs`-th posted send WR (0: never).
    pub kill_after_wrs: u64,
    /// The link goes down at the `down`-th send WR since the start or the last heal (0: never).
    pub down: u64,
    /// Milliseconds the link stays down (0: for good).
    pub heal_ms: u64,
    /// Times the link goes down at most (0: no limit).
    pub downs: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self::OFF
    }
}

const STATUSES: [WcStatus; 11] = [
    WcStatus::LocalLengthError,
    WcStatus::LocalQpOpError,
    WcStatus::LocalProtectionError,
    WcStatus::WrFlushError,
    WcStatus::RemoteInvalidRequest,
    WcStatus::RemoteAccessError,
    WcStatus::RemoteOperationError,
    WcStatus::RetryExceeded,
    WcStatus::RnrRetryExceeded,
    WcStatus::Fatal,
    WcStatus::General,
];

fn bad(reason: &'static str) -> Error {
    Error::Param { name: VAR, reason }
}

fn int(v: &str, max: u64) -> Result<u64, Error> {
    match parse_int(v.trim()) {
        Ok(n) if n >= 0 && n as u64 <= max => Ok(n as u64),
        Ok(_) => Err(bad("a value is out of range")),
        Err(_) => Err(bad("a value is not an integer (NCCL syntax)")),
    }
}

fn status(name: &str) -> Result<WcStatus, Error> {
    let name = name.trim();
    STATUSES
        .into_iter()
        .find(|s| format!("{s:?}") == name)
        .ok_or(bad(
            "wr_fail status is not a WcStatus name (e.g. RemoteAccessError, LocalProtectionError)",
        ))
}

impl Faults {
    /// No fault.
    pub const OFF: Self = Self {
        seed: 1,
        wr_fail: 0,
        wr_fail_status: WcStatus::RemoteAccessError,
        cq_delay_us: 0,
        reorder: false,
        fifo_corrupt: 0,
        reg_fail: 0,
        kill_after_wrs: 0,
        down: 0,
        heal_ms: 0,
        downs: 0,
    };

    /// Is any fault armed?
    pub fn any(&self) -> bool {
        self.wr_fail != 0
            || self.cq_delay_us != 0
            || self.reorder
            || self.fifo_corrupt != 0
            || self.reg_fail != 0
            || self.kill_after_wrs != 0
            || self.down != 0
    }

    /// Parses the variable's value (grammar in the module doc). An empty value is [`Faults::OFF`].
    pub fn parse(s: &str) -> Result<Self, Error> {
        let mut f = Self::OFF;
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or(bad("an item is not key=value"))?;
            match k.trim() {
                "seed" => f.seed = int(v, u64::MAX >> 1)?,
                "wr_fail" => {
                    let (n, st) = v.split_once(':').unwrap_or((v, "RemoteAccessError"));
                    f.wr_fail = int(n, u32::MAX as u64)?;
                    f.wr_fail_status = status(st)?;
                }
                "cq_delay_us" => f.cq_delay_us = int(v, 1_000_000)?,
                "reorder" => f.reorder = int(v, 1)? == 1,
                "fifo_corrupt" => f.fifo_corrupt = int(v, u32::MAX as u64)?,
                "reg_fail" => f.reg_fail = int(v, u32::MAX as u64)?,
                "kill_after_wrs" => f.kill_after_wrs = int(v, u64::MAX >> 1)?,
                "down" => f.down = int(v, u64::MAX >> 1)?,
                "heal" => f.heal_ms = int(v, 3_600_000)?,
                "downs" => f.downs = int(v, u64::MAX >> 1)?,
                _ => return Err(bad(
                    "unknown key (seed, wr_fail, cq_delay_us, reorder, fifo_corrupt, reg_fail, kill_after_wrs, down, heal, downs)",
                )),
            }
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example_and_nccl_integers() {
        let f = Faults::parse(
            " seed=42, wr_fail=100:LocalProtectionError ,cq_delay_us=0x64,reorder=1,\
             fifo_corrupt=1000,reg_fail=5,kill_after_wrs=1000",
        )
        .unwrap();
        assert_eq!(
            f,
            Faults {
                seed: 42,
                wr_fail: 100,
                wr_fail_status: WcStatus::LocalProtectionError,
                cq_delay_us: 100,
                reorder: true,
                fifo_corrupt: 1000,
                reg_fail: 5,
                kill_after_wrs: 1000,
                down: 0,
                heal_ms: 0,
                downs: 0,
            }
        );
        let f = Faults::parse("down=500,heal=20,downs=2").unwrap();
        assert_eq!((f.down, f.heal_ms, f.downs), (500, 20, 2));
        assert!(f.any());
        assert!(f.any());
        assert_eq!(Faults::parse("").unwrap(), Faults::OFF);
        assert!(!Faults::OFF.any());
        assert_eq!(
            Faults::parse("wr_fail=3").unwrap().wr_fail_status,
            WcStatus::RemoteAccessError
        );
    }

    #[test]
    fn malformed_values_are_refused_with_a_reason() {
        for (v, why) in [
            ("wr_fail=0.01", "not an integer"),
            ("wr_fail=-1", "out of range"),
            ("wr_fail=10:Oops", "WcStatus"),
            ("reorder=2", "out of range"),
            ("cq_delay_us=2000000", "out of range"),
            ("heal=3600001", "out of range"),
            ("down=x", "not an integer"),
            ("frobnicate=1", "unknown key"),
            ("seed", "key=value"),
        ] {
            match Faults::parse(v) {
                Err(Error::Param { name, reason }) => {
                    assert_eq!(name, VAR);
                    assert!(reason.contains(why), "{v}: {reason}");
                }
                r => panic!("{v}: {r:?}"),
            }
        }
    }
}
