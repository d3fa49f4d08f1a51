//! [`RailEvent`]: a rail taken out of use, as a fused comm reports it.

use crate::error::Error;

/// A rail taken out of use, reported once so the caller can log it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailEvent {
    /// The rail (index in the vNIC).
    pub rail: u8,
    /// What failed.
    pub error: Error,
    /// The rail that carries its traffic from now on (`None`: none left; the comm failed).
    pub to: Option<u8>,
}
