//! Where a comm is in its life.

use crate::error::ErrorKind;

/// A comm's lifecycle, whatever its rail count.
///
/// ```text
///  Connecting ──connect (every rail)──▶ Ready ◀──rail returns (failback)──┐
///                                        │                               │
///                                        └──a rail out of use──▶ RailDegraded
///  any ──a failure no rail can mend (or the last rail's)──▶ Failed(kind)
/// ```
/// Data calls need `Ready` or `RailDegraded`; a `Failed` comm refuses every later call,
/// reported with the first failure's kind. A comm of one rail is never `RailDegraded`: its
/// rail's failure is the comm's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Made; its rails' QPs are not all connected to the peer yet.
    Connecting,
    /// Every rail connected and in use.
    Ready,
    /// Connected; at least one rail is out of use (failed over), at least one still carries
    /// data. With failback the comm returns to `Ready` when every rail is back.
    RailDegraded,
    /// A failure the comm cannot survive, of this kind: every later call is refused.
    Failed(ErrorKind),
}

impl Lifecycle {
    /// Whether data calls are allowed.
    pub fn moves_data(self) -> bool {
        matches!(self, Self::Ready | Self::RailDegraded)
    }
}
