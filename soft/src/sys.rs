//! Thin, checked wrappers over the Linux calls the provider needs.
//!
//! This module and [`crate::segment`] are the only places with `unsafe` code. Every wrapper
//! returns `io::Result` with the OS error; callers map errors to completion statuses.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `memfd_create(name, MFD_CLOEXEC)`.
pub fn memfd_create(name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string; the call has no other preconditions.
    let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ftruncate(fd, len)`.
pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `fd` is a live descriptor borrowed for the call.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(drop)
}

/// `fstat(fd).st_size`.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is writable storage of the right type; `fd` is live for the call.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() }.st_size as u64)
}

/// A shared, read-write mapping of a file; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics
// (see `segment`), so it may be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read-write.
    pub fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(Self { ptr, len })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value created and nobody else unmaps;
        // every reference into it borrows from the `Segment` that owns this `Mapping`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// `fallocate(fd, PUNCH_HOLE | KEEP_SIZE, off, len)`: the range reads as zeros again, in every
/// mapping of the file, and its pages are freed.
pub fn punch_hole(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<()> {
    let (off, len) = (
        libc::off_t::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
    );
    // SAFETY: `fd` is a live descriptor borrowed for the call; no memory is passed.
    cvt(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    })
    .map(drop)
}

/// Opens `/proc/<pid>/fd/<fd>` read-write: another process's memfd.
pub fn open_peer_fd(pid: i32, fd: i32) -> io::Result<OwnedFd> {
    let path = format!("/proc/{pid}/fd/{fd}\0");
    let c = CStr::from_bytes_with_nul(path.as_bytes()).map_err(io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let r = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })?;
    // SAFETY: `r` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// `pidfd_open(pid, 0)`: a descriptor that becomes readable when the process exits.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Polls `fds` for readability without blocking; sets `ready[i]` for each readable (exited)
/// pidfd. Returns how many are ready.
pub fn poll_readable(fds: &[RawFd], ready: &mut Vec<bool>) -> io::Result<usize> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd entries; timeout 0 never blocks.
    let n = cvt(unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 0) })?;
    ready.clear();
    ready.extend(
        pfds.iter()
            .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0),
    );
    Ok(n as usize)
}

/// Direction of a cross-memory-attach copy, seen from this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Local → remote (`process_vm_writev`; RDMA WRITE).
    Write,
    /// Remote → local (`process_vm_readv`; RDMA READ).
    Read,
}

/// Cross-memory attach of one contiguous range: `len` bytes between `local` in this process and
/// `remote` in process `pid` (`process_vm_writev` for [`Dir::Write`], `process_vm_readv` for
/// [`Dir::Read`]). Returns the bytes moved (short on a fault part-way). `pid` may be our own:
/// then it is a memory copy that fails with `EFAULT` instead of faulting.
///
/// # Safety
/// For [`Dir::Read`], `[local, local + len)` must be memory of this process that nothing reads
/// or writes non-atomically during the call (the caller checked it against a registration).
/// The kernel validates both ranges and fails with `EFAULT` rather than touching unmapped
/// memory, so a bad range is never a memory-safety issue in itself.
pub unsafe fn vm_copy(
    dir: Dir,
    pid: i32,
    local: u64,
    remote: u64,
    len: usize,
) -> io::Result<usize> {
    let l = libc::iovec {
        iov_base: local as *mut libc::c_void,
        iov_len: len,
    };
    let r = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: the iovecs are valid for the call; the kernel validates both address ranges and
    // fails with EFAULT instead of touching unmapped memory; the caller vouches that a local
    // destination may be written.
    let n = unsafe {
        match dir {
            Dir::Write => libc::process_vm_writev(pid, &l, 1, &r, 1, 0),
            Dir::Read => libc::process_vm_readv(pid, &l, 1, &r, 1, 0),
        }
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Copies `len` bytes from `src` to `dst` inside this process with atomic word accesses: an
/// 8-byte `AtomicU64` per aligned word when both addresses agree modulo 8, `AtomicU8` for the
/// unaligned head and tail (or for everything when they disagree). Ascending addresses.
///
/// Why atomics: the destination may be memory another thread reads with atomic loads at the
/// same time (a [`FifoRing`](ibnet_core::fifo::FifoRing) whose owner polls `idx`); a plain
/// `memmove` would be a data race. Overlapping ranges give an unspecified result (as on a NIC).
///
/// # Safety
/// Both ranges must be mapped, `dst` writable and `src` readable, for the whole call (the
/// caller holds leases on registrations that were probed at `reg_mr`, and the owners promise
/// the memory stays mapped until deregistered). Concurrent *non-atomic* access to the same
/// bytes is a data race the RDMA contract already forbids.
pub unsafe fn atomic_copy(dst: u64, src: u64, len: usize) {
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
    let (mut d, mut s, mut n) = (dst as usize, src as usize, len);
    let byte = |d: usize, s: usize| {
        // Relaxed: the source was written before the WR was posted, which happens-before.
        // SAFETY: in range and mapped (caller); any address is aligned for `u8`.
        let v = unsafe { AtomicU8::from_ptr(s as *mut u8) }.load(Ordering::Relaxed);
        // Release: pairs with the Acquire load by which a reader of the destination (a FIFO
        // owner polling `idx`) learns the word is written: every earlier byte is visible too.
        // SAFETY: as above; `dst` is writable (caller).
        unsafe { AtomicU8::from_ptr(d as *mut u8) }.store(v, Ordering::Release);
    };
    if (d ^ s) & 7 == 0 {
        while n > 0 && d & 7 != 0 {
            byte(d, s);
            (d, s, n) = (d + 1, s + 1, n - 1);
        }
        let word = |d: usize, s: usize, i: usize| {
            let (d, s) = ((d + 8 * i) as *mut u64, (s + 8 * i) as *mut u64);
            // Relaxed: as in `byte`.
            // SAFETY: in range and mapped (caller); `d` and `s` are 8-byte aligned here.
            let v = unsafe { AtomicU64::from_ptr(s) }.load(Ordering::Relaxed);
            (d, v)
        };
        let put = |(d, v): (*mut u64, u64)| {
            // Release: as in `byte`; pairs with the reader's Acquire load of this word.
            // SAFETY: as in `word`; `dst` is writable (caller).
            unsafe { AtomicU64::from_ptr(d) }.store(v, Ordering::Release);
        };
        // Four loads, then four stores (ascending): lets the CPU overlap them, ~2x faster
        // than one word at a time at 4-16 KiB.
        while n >= 32 {
            let w = [word(d, s, 0), word(d, s, 1), word(d, s, 2), word(d, s, 3)];
            w.into_iter().for_each(put);
            (d, s, n) = (d + 32, s + 32, n - 32);
        }
        while n >= 8 {
            put(word(d, s, 0));
            (d, s, n) = (d + 8, s + 8, n - 8);
        }
    }
    while n > 0 {
        byte(d, s);
        (d, s, n) = (d + 1, s + 1, n - 1);
    }
}

/// Copies `len` bytes from `src` to `dst` in one opaque block: on x86-64 one `rep movsb`
/// (fast-string copy, as the platform's `memcpy` uses at these sizes: wide, cache-line-sized
/// moves instead of [`atomic_copy`]'s 8-byte ones, ~2-3× fewer cycles at 4 KiB), elsewhere
/// [`atomic_copy`]. For bounce payloads (`segment::write_bounce`/`read_bounce`), whose readers
/// learn of the bytes through a later Release store (the ring entry's `seq`, the QP head's
/// `bounce_done`), never by watching the bytes themselves.
///
/// Why it is sound against a racing peer: the copy is inline assembly, opaque to the compiler
/// (it declares that it reads and writes memory, so no Rust access is moved across it), and
/// its accesses are hardware ones, not Rust accesses that could form a data race in the
/// language's sense; bytes a misbehaving peer writes meanwhile are at worst torn, which the
/// receiver tolerates (a peer-written payload is copied, never interpreted). Ordering: on
/// x86-64 the stores of a fast-string operation may be reordered among themselves but "string
/// operations are not reordered with other store operations" (Intel SDM vol. 3A, "Out-of-Order
/// Stores For String Operations", which prescribes exactly this: a separate flag stored after
/// the string operation), so the caller's later Release store publishes every byte, as after
/// [`atomic_copy`]; the loads are ordered after the caller's earlier Acquire load likewise.
///
/// Overlapping ranges give an unspecified result (as on a NIC, and as [`atomic_copy`]).
///
/// # Safety
/// As [`atomic_copy`]: both ranges mapped for the whole call, `dst` writable, `src` readable.
pub unsafe fn bulk_copy(dst: u64, src: u64, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    {
        // SAFETY: the caller's contract: `len` bytes readable at `src` and writable at `dst`;
        // `rep movsb` touches exactly those (upwards: the direction flag is clear, as the ABI
        // guarantees at every asm block), and clobbers only rdi, rsi and rcx, declared here; no
        // stack use. An overlap only garbles bytes (hardware accesses, no Rust-level UB).
        unsafe {
            std::arch::asm!(
                "rep movsb",
                inout("rcx") len => _,
                inout("rdi") dst => _,
                inout("rsi") src => _,
                options(nostack, preserves_flags)
            );
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    // SAFETY: the caller's contract, which is `atomic_copy`'s.
    unsafe {
        atomic_copy(dst, src, len)
    };
}

/// Checks that `[addr, addr + len)` is mapped with the access a registration needs (`write`:
/// writable, else readable), by prefaulting it: `madvise(MADV_POPULATE_WRITE/READ)`, which
/// fails with `ENOMEM` on a hole and `EINVAL`/`EFAULT` on a mapping that may not be accessed so
/// (`PROT_NONE`, read-only for write, device memory, beyond a file's end). Like a verbs
/// registration pinning its pages, it populates every page. On kernels older than 5.14 (no
/// `MADV_POPULATE_*`) it reads one byte of every page through `process_vm_readv` instead
/// (readability only). Any failure is reported as `EFAULT`.
pub fn probe_range(addr: u64, len: u64, write: bool) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let efault = || io::Error::from_raw_os_error(libc::EFAULT);
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or_else(efault)?
        & !(page - 1);
    if populate_supported() {
        let advice = if write {
            libc::MADV_POPULATE_WRITE
        } else {
            libc::MADV_POPULATE_READ
        };
        loop {
            // SAFETY: MADV_POPULATE_* only prefaults page tables as an access would (it never
            // changes contents or mappings); it fails instead of raising a signal.
            let r = unsafe {
                libc::madvise(start as *mut libc::c_void, (end - start) as usize, advice)
            };
            if r == 0 {
                return Ok(());
            }
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return Err(efault());
            }
        }
    }
    // Old kernel: one byte of every page, up to 512 pages a call.
    let mut sink = [0u8; 512];
    let mut p = start;
    while p < end {
        let k = ((end - p) / page).min(sink.len() as u64) as usize;
        let remote: Vec<libc::iovec> = (0..k)
            .map(|i| libc::iovec {
                iov_base: (p + i as u64 * page) as *mut libc::c_void,
                iov_len: 1,
            })
            .collect();
        let local = libc::iovec {
            iov_base: sink.as_mut_ptr().cast(),
            iov_len: k,
        };
        // SAFETY: `local` is our exclusive stack buffer of `k` bytes; the kernel validates the
        // remote (our own) addresses and fails with EFAULT on an unreadable one.
        let n = unsafe { libc::process_vm_readv(getpid(), &local, 1, remote.as_ptr(), k as _, 0) };
        if n != k as isize {
            return Err(efault());
        }
        p += k as u64 * page;
    }
    Ok(())
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 && (p as u64).is_power_of_two() {
        p as u64
    } else {
        4096
    }
}

/// Whether the kernel knows `MADV_POPULATE_READ` (5.14+); asked once.
fn populate_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let page = page_size() as usize;
        let probe = vec![0u8; 2 * page];
        let a = (probe.as_ptr() as usize + page - 1) & !(page - 1);
        // SAFETY: `a` is a page of `probe`, mapped and readable; POPULATE_READ changes nothing.
        unsafe { libc::madvise(a as *mut libc::c_void, page, libc::MADV_POPULATE_READ) == 0 }
    })
}

/// `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`: lets any process of this user attach (and so
/// use cross-memory attach) to this one under Yama `ptrace_scope = 1`.
pub fn set_ptracer_any() -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) }).map(drop)
}

/// This process's id.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// The raw descriptor number of `fd` (what the peer opens under `/proc/<pid>/fd/`).
pub fn raw(fd: &OwnedFd) -> i32 {
    fd.as_raw_fd()
}

/// Reads 8 bytes of this process through `process_vm_readv`: tells whether the syscall is
/// allowed at all (seccomp, kernel support). Self-access needs no ptrace permission.
pub fn cma_self_test() -> io::Result<bool> {
    let src = 0x5a5a_5a5a_u64;
    let mut dst = 0u64;
    // SAFETY: `dst` is an exclusive 8-byte local and `src` a live 8-byte local of this frame.
    let n = unsafe {
        vm_copy(
            Dir::Read,
            getpid(),
            &mut dst as *mut u64 as u64,
            &src as *const u64 as u64,
            8,
        )
    }?;
    Ok(n == 8 && dst == src)
}

/// Reads one `u64` at `remote` in process `pid` through `process_vm_readv`.
pub fn cma_read_u64(pid: i32, remote: u64, out: &mut u64) -> io::Result<()> {
    // SAFETY: `out` is an exclusive 8-byte location of this process; the kernel validates the
    // remote range.
    let n = unsafe { vm_copy(Dir::Read, pid, out as *mut u64 as u64, remote, 8) }?;
    if n == 8 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}

/// `kill(pid, 0)` does not fail with ESRCH (fallback liveness check without pidfd).
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// `madvise(MADV_REMOVE)`: frees the pages of `[ptr, ptr + len)` of a shared file mapping
/// (the memfd segment); they read as zeros afterwards, in every process that maps the file.
pub fn punch(ptr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller passes a page-aligned range of one of its own shared mappings, whose
    // contents are atomics only (zero is a valid value for each); no mapping changes.
    cvt(unsafe { libc::madvise(ptr.cast(), len, libc::MADV_REMOVE) }).map(drop)
}

/// Has process `pid` exited (a zombie, or reaped)? `false` when that cannot be told (no
/// permission): the caller then keeps waiting, as before.
pub fn pid_exited(pid: i32) -> bool {
    match pidfd_open(pid) {
        // A pidfd turns readable when the process exits (also while it is a zombie).
        Ok(fd) => {
            let mut ready = Vec::with_capacity(1);
            poll_readable(&[fd.as_raw_fd()], &mut ready).is_ok_and(|_| ready[0])
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => true,
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => !pid_alive(pid),
        Err(_) => false,
    }
}

/// Reads `out.len()` bytes at `addr` of this process through the kernel
/// (`process_vm_readv` on our own pid): an unmapped address fails with `EFAULT`, never faults.
pub fn read_self(addr: u64, out: &mut [u8]) -> io::Result<()> {
    // SAFETY: the local side is `out`, exclusive for the call; the kernel validates `addr`.
    let n = unsafe {
        vm_copy(
            Dir::Read,
            getpid(),
            out.as_mut_ptr() as u64,
            addr,
            out.len(),
        )
    }?;
    if n == out.len() {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}

/// `kill(getpid(), SIGKILL)`: the fault injector's "kill the peer" (never returns normally).
pub fn kill_self() {
    // SAFETY: plain syscall with integer arguments.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
}
