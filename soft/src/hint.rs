//! Cache hints for the small-WR path: start a cross-core cache-line transfer early, so that
//! it overlaps the poster's own work (leases, payload capture) instead of stalling it later.
//!
//! A hint never changes memory, never faults, and is not ordered with anything (fences and
//! locked instructions do not wait for it): the protocols stay exactly as written, only the
//! time at which a line arrives moves. Where a hint is wrong (the line changes again before
//! it is used) the cost is one wasted transfer off the critical path.
//!
//! Where they pay (two processes ping-ponging, each line written by one side and then read or
//! written by the other):
//! * a plain small WRITE into the peer's FIFO area (a clear-to-send element): the line was last
//!   read by the peer; the poster's stores need it exclusive, and the lease release after the
//!   copy (a locked instruction) waits for that. [`write`] at the start of `post_send`
//!   overlaps the transfer with the receive post's own store (its `recv_posted`, which the
//!   first lease waits for) instead of running after it.
//! * a WRITE_WITH_IMM whose credits ran out (the target posts one receive at a time, as a comm
//!   does): the combiner must read the target's `recv_posted`, a line the target has just
//!   written. [`read`] at the start of `post_send` overlaps it with the leases and the payload
//!   capture.
#![allow(unsafe_code)]

/// Whether this CPU has `prefetchw` (CPUID 8000_0001h ECX bit 8); read once.
#[cfg(target_arch = "x86_64")]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    /// 0: not read yet; 1: no; 2: yes.
    static HAS: AtomicU8 = AtomicU8::new(0);
    // Relaxed: a cached CPUID bit; every thread computes the same value.
    match HAS.load(Ordering::Relaxed) {
        0 => {
            // CPUID leaf 8000_0001h exists on every x86-64 CPU (long mode is reported there).
            let yes = core::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0;
            HAS.store(1 + yes as u8, Ordering::Relaxed); // Relaxed: as above
            yes
        }
        v => v == 2,
    }
}

/// Hints that the line at `p` will be read soon.
#[inline(always)]
pub fn read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch hint accesses no memory architecturally: it never faults (any
    // address), writes nothing and has no effect on the program's semantics.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints that the line at `p` will be written soon (fetched exclusive where the CPU can; a
/// read hint otherwise).
#[inline(always)]
pub fn write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_prefetchw() {
            // SAFETY: `prefetchw` is a hint (this CPU has it: CPUID above): it never faults,
            // changes no memory and has no effect on the program's semantics.
            unsafe {
                core::arch::asm!(
                    "prefetchw [{p}]",
                    p = in(reg) p,
                    options(nostack, preserves_flags, readonly)
                )
            };
        } else {
            read(p);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
