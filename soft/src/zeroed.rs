//! A QP's send and receive queues in lazily committed memory ([`Zeroed`]): an anonymous
//! mapping whose pages the kernel fills with zeros at first touch, so a queue costs memory
//! only for the entries a QP has used. An idle QP (NCCL opens up to 128 per connection, most of
//! them idle in a small job) then costs no queue memory at all, and a busy one what its
//! traffic has touched, up to the whole queue. Every entry type kept here is valid as all
//! zeros, the state a new entry starts in ([`Zeroable`]).
//!
//! Where the mapping fails (the process's map count or address space exhausted) the queue is
//! built on the heap instead, entry by entry, as before: same contents, memory paid at once.
//! Under `--cfg loom` the queues are always on the heap (loom's atomics are not plain memory).
#![allow(unsafe_code)]

use std::ops::Deref;
use std::ptr::NonNull;

/// A type whose all-zero bit pattern is a valid value, equal to the value its constructor
/// for a new queue entry makes.
///
/// # Safety
/// Every bit of `Self` may be zero: no references, no niches that zero violates; the type is
/// fine with being shared between threads as a plain memory value (atomics); and it has no
/// drop glue (a mapping is unmapped without dropping its entries; `Zeroed::new` checks it).
#[cfg_attr(loom, allow(dead_code))] // loom: the queues are always on the heap
pub unsafe trait Zeroable: Sync {}

// SAFETY: an `AtomicU64` is a `u64` in memory; zero is the value a new receive slot holds.
unsafe impl Zeroable for std::sync::atomic::AtomicU64 {}

/// `n` entries of `T`, zeroed: mapped lazily where possible, else on the heap.
pub struct Zeroed<T> {
    ptr: NonNull<T>,
    len: usize,
    /// Bytes mapped (0: `ptr` is a leaked `Box<[T]>` of `len` entries).
    mapped: usize,
}

// SAFETY: `Zeroed<T>` owns its entries as a `Box<[T]>` would; it is Send/Sync when `T` is.
unsafe impl<T: Send> Send for Zeroed<T> {}
// SAFETY: as above; only shared references to the entries are handed out.
unsafe impl<T: Sync> Sync for Zeroed<T> {}

impl<T: Zeroable> Zeroed<T> {
    /// `n` (> 0) zeroed entries; `new` makes one on the heap fallback (it must make the
    /// all-zero value).
    #[cfg(not(loom))]
    pub fn new(n: usize, new: fn() -> T) -> Self {
        const { assert!(!std::mem::needs_drop::<T>()) };
        let bytes = (n * std::mem::size_of::<T>()).next_multiple_of(page());
        if std::mem::align_of::<T>() <= page() && bytes > 0 {
            // SAFETY: a fresh private anonymous mapping at an address the kernel picks; no
            // existing memory is affected. MAP_NORESERVE: pages are committed when touched.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                if let Some(ptr) = NonNull::new(p.cast::<T>()) {
                    return Self {
                        ptr,
                        len: n,
                        mapped: bytes,
                    };
                }
            }
        }
        Self::heap(n, new)
    }
}

impl<T> Zeroed<T> {
    /// `n` entries on the heap (loom: always).
    #[cfg(loom)]
    pub fn new(n: usize, new: fn() -> T) -> Self {
        Self::heap(n, new)
    }

    fn heap(n: usize, new: fn() -> T) -> Self {
        let b: Box<[T]> = (0..n).map(|_| new()).collect();
        let len = b.len();
        // Box::into_raw never returns NULL.
        let ptr = NonNull::new(Box::into_raw(b).cast::<T>()).unwrap_or(NonNull::dangling());
        Self {
            ptr,
            len,
            mapped: 0,
        }
    }
}

impl<T> Deref for Zeroed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points to `len` initialized entries (zero pages are valid `T`s by
        // `Zeroable`, or the heap box's entries), alive until drop; shared access only.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Zeroed<T> {
    fn drop(&mut self) {
        if self.mapped == 0 {
            let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: `ptr`/`len` came from `Box::into_raw` of a `Box<[T]>` in `heap`, and
            // are reclaimed exactly once, here.
            drop(unsafe { Box::from_raw(raw) });
        } else {
            // SAFETY: `ptr`/`mapped` describe the mapping `new` made, unmapped once, here;
            // no reference into it outlives `self` (they borrow from it). The entries
            // (atomics) need no drop.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        }
    }
}

/// The page size.
#[cfg(not(loom))]
fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(4096)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn entries_start_zero_and_keep_what_is_stored() {
        let z = Zeroed::new(3000, || AtomicU64::new(0));
        assert_eq!(z.len(), 3000);
        assert!(z.mapped >= 3000 * 8, "mapped lazily");
        assert!(z.iter().all(|e| e.load(Ordering::Relaxed) == 0));
        z[2999].store(7, Ordering::Relaxed);
        assert_eq!(z[2999].load(Ordering::Relaxed), 7);
        let h = Zeroed::heap(5, || AtomicU64::new(0));
        assert_eq!((h.len(), h.mapped), (5, 0));
        h[4].store(9, Ordering::Relaxed);
        assert_eq!(h[4].load(Ordering::Relaxed), 9);
    }
}
