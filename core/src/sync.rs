//! The one facade for atomics and spin hints.
//!
//! Every atomic in `ibnet-core` is imported from here. A normal build re-exports
//! `core::sync::atomic`; a build with `RUSTFLAGS="--cfg loom"` re-exports loom's instrumented
//! types, so the loom models in `tests/loom` explore every interleaving of the real code.
//!
//! Spin loops call [`spin_hint`]: a CPU pause normally, a `yield_now` under loom (loom requires
//! spinning threads to yield, or the model never terminates).

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// A hint inside a spin loop: `core::hint::spin_loop` normally, `loom::thread::yield_now` under
/// loom.
#[inline]
pub fn spin_hint() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// An `UnsafeCell` with loom's `with`/`with_mut` API in both builds.
#[derive(Debug, Default)]
pub struct UnsafeCell<T>(
    #[cfg(not(loom))] core::cell::UnsafeCell<T>,
    #[cfg(loom)] loom::cell::UnsafeCell<T>,
);

impl<T> UnsafeCell<T> {
    /// Wraps `v`.
    #[cfg(not(loom))]
    pub const fn new(v: T) -> Self {
        Self(core::cell::UnsafeCell::new(v))
    }
    /// Wraps `v`.
    #[cfg(loom)]
    pub fn new(v: T) -> Self {
        Self(loom::cell::UnsafeCell::new(v))
    }
    /// Runs `f` with a shared raw pointer to the contents.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(not(loom))]
        return f(self.0.get());
        #[cfg(loom)]
        return self.0.with(f);
    }
    /// Runs `f` with an exclusive raw pointer to the contents.
    #[inline]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(not(loom))]
        return f(self.0.get());
        #[cfg(loom)]
        return self.0.with_mut(f);
    }
}
