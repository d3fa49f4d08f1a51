//! What a soak counted: messages and bytes verified, errors and corruptions, and the first
//! failure of each kind, described.

use serde::{Deserialize, Serialize};

/// Counts of one thread, one process or the whole run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Requests completed (both directions: sends and multi-receives).
    pub requests: u64,
    /// Messages received and verified.
    pub messages: u64,
    /// Bytes received and verified.
    pub bytes: u64,
    /// Plugin errors, wrong reported sizes, timeouts.
    pub errors: u64,
    /// Messages whose content or guard bytes were wrong.
    pub corruptions: u64,
    /// The first error, described.
    pub first_error: Option<String>,
    /// The first corruption, described.
    pub first_corruption: Option<String>,
}

impl Totals {
    /// Counts an error (`why` is kept if it is the first).
    pub fn error(&mut self, why: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(why());
        }
    }
    /// Counts a corruption (`why` is kept if it is the first).
    pub fn corruption(&mut self, why: impl FnOnce() -> String) {
        self.corruptions += 1;
        if self.first_corruption.is_none() {
            self.first_corruption = Some(why());
        }
    }
    /// Adds `o` (first failures: ours win).
    pub fn add(&mut self, o: &Totals) {
        self.requests += o.requests;
        self.messages += o.messages;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.corruptions += o.corruptions;
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
        if self.first_corruption.is_none() {
            self.first_corruption.clone_from(&o.first_corruption);
        }
    }
    /// Whether nothing went wrong.
    pub fn clean(&self) -> bool {
        self.errors == 0 && self.corruptions == 0
    }
}

impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} messages, {:.3} GiB verified ({} requests), {} errors, {} corruptions",
            self.messages,
            self.bytes as f64 / (1u64 << 30) as f64,
            self.requests,
            self.errors,
            self.corruptions
        )
    }
}
