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

/// `process_vm_writev` of one contiguous range: `len` bytes from `local` in this process to
/// `remote` in process `pid`. Returns the bytes written (short on a fault part-way).
///
/// # Safety
/// `[local, local + len)` must be readable memory of this process for the duration of the call
/// (the kernel reports a bad *remote* range as `EFAULT`, but a bad local range is also only an
/// `EFAULT`, so this is not a memory-safety requirement in practice; it documents intent).
pub unsafe fn vm_write(pid: i32, local: u64, remote: u64, len: usize) -> io::Result<usize> {
    let l = libc::iovec {
        iov_base: local as *mut libc::c_void,
        iov_len: len,
    };
    let r = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: the iovecs are valid for the call; the kernel validates both address ranges and
    // fails with EFAULT instead of touching unmapped memory.
    let n = unsafe { libc::process_vm_writev(pid, &l, 1, &r, 1, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `process_vm_readv` of one contiguous range: `len` bytes from `remote` in process `pid` into
/// `local` in this process. Returns the bytes read.
///
/// # Safety
/// `[local, local + len)` must be memory of this process that nothing else reads or writes
/// non-atomically during the call (the caller checked it against a registration).
pub unsafe fn vm_read(pid: i32, local: u64, remote: u64, len: usize) -> io::Result<usize> {
    let l = libc::iovec {
        iov_base: local as *mut libc::c_void,
        iov_len: len,
    };
    let r = libc::iovec {
        iov_base: remote as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: as in `vm_write`; the kernel validates both ranges.
    let n = unsafe { libc::process_vm_readv(pid, &l, 1, &r, 1, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Copies `len` bytes inside this process (`memmove`): the in-process fabric.
///
/// # Safety
/// Both ranges must be mapped, and the caller must hold registrations (leases) covering them,
/// so the owner promised they stay mapped; concurrent access by the application to the same
/// bytes is a data race the RDMA contract already forbids.
pub unsafe fn local_copy(dst: u64, src: u64, len: usize) {
    // SAFETY: the caller guarantees both ranges are mapped and registered.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
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
        vm_read(
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
    let n = unsafe { vm_read(pid, out as *mut u64 as u64, remote, 8) }?;
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
