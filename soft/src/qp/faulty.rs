//! The QP's hooks of `IBNET_SOFT_FAULTS` ([`crate::faults`]): a WR failed at post, and a FIFO
//! element corrupted in its copy. Reached only when a fault is armed.

use super::{QpShared, Remote};
use crate::segment::{self, Lease};
use crate::sq::SqEntry;

impl QpShared {
    /// `post_send`, per WR: `true` when an injected fault failed WR `seq` (it moves no byte,
    /// and fails like a WR whose copy failed).
    #[cold]
    pub(super) fn inject_post(&self, seq: u64, e: &SqEntry) -> bool {
        let Some(st) = self.faults.as_ref().and_then(|f| f.on_post()) else {
            return false;
        };
        e.arm(seq, self.chunk, false); // nothing to copy: landed
        e.set_err(st, 0);
        self.err_seq.note(seq);
        self.mark_responder(st);
        true
    }

    /// The copy of `n` bytes from `la` to `ra` under `rl`: `Some` when the fault injector
    /// wrote a corrupted FIFO element instead.
    #[cold]
    pub(super) fn inject_copy(
        &self,
        r: &Remote,
        rl: &Lease<'_>,
        la: u64,
        ra: u64,
        n: u64,
    ) -> Option<std::io::Result<()>> {
        let f = self.faults.as_ref()?;
        let mut buf = [0u8; 64 * ibnet_core::fifo::MAX_RECVS];
        let len = f.corrupt_fifo(la, n as usize, &mut buf)?;
        Some(segment::write_leased(r.peer.fabric, rl, ra, &buf[..len]))
    }
}
