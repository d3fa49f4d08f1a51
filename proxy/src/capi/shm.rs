//! POSIX shared memory for the proxy's host banks, so a GPU process other than the proxy's can
//! map them (the OS side of [`crate::xmap`]).
//!
//! ```text
//!  proxy process                              GPU process
//!  ShmBank::create(size): memfd_create,       ShmBank::import(desc): open
//!    ftruncate, mmap MAP_SHARED (zeroed)        /proc/<owner>/fd/<fd>, check inode+device,
//!  export(): BankDesc { ProcessFd,              mmap MAP_SHARED, close the fd
//!    owner = pid, fd, inode, device }         ShmBank::drop: munmap
//!  ShmBank::drop: munmap + close
//! ```
//! A memfd has no name in any namespace, so a killed process leaks nothing: the memory goes
//! with the last mapping. The importer opens the exporter's fd through `/proc` (same user,
//! `PTRACE_MODE_READ`), and checks inode and device so a reused fd number is refused.
//!
//! [`PeerWatch`] tells a survivor that the other process died (a pidfd, polled without
//! waiting), so neither side waits forever on counters a dead process will never move.

use core::ffi::c_void;

use crate::{BankDesc, HandleKind};
use ibnet_core::{Error, Result};

/// One mapping of a shared-memory object: created here (owning its fd) or imported.
#[derive(Debug)]
pub struct ShmBank {
    addr: u64,
    len: usize,
    /// The memfd (exporter only).
    fd: Option<i32>,
}

fn os_err(call: &'static str) -> Error {
    Error::Provider {
        call,
        errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
    }
}

fn map_shared(fd: i32, len: usize, offset: u64) -> Result<u64> {
    // SAFETY: a fresh shared mapping of `len` bytes of `fd` (open read-write) at an address the
    // kernel chooses; nothing else is affected.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap (proxy bank)"));
    }
    Ok(p as u64)
}

/// The inode and device of `fd`.
fn identity(fd: i32) -> Result<(u64, u64, u64)> {
    // SAFETY: `stat` is plain data; fstat fills it for a valid fd.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_err("fstat (proxy bank)"));
    }
    Ok((st.st_ino as u64, st.st_dev as u64, st.st_size as u64))
}

fn close(fd: i32) {
    // SAFETY: an fd this module opened and owns, closed once.
    unsafe { libc::close(fd) };
}

impl ShmBank {
    /// `len` zeroed bytes of fresh shared memory (page-aligned), mapped here.
    pub fn create(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::OutOfRange {
                what: "shared bank size",
                value: 0,
                min: 1,
                max: i64::MAX,
            });
        }
        // SAFETY: a NUL-terminated name; flags are valid.
        let fd = unsafe { libc::memfd_create(c"ibnet-proxy-bank".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_err("memfd_create (proxy bank)"));
        }
        // SAFETY: our fresh memfd.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = os_err("ftruncate (proxy bank)");
            close(fd);
            return Err(e);
        }
        match map_shared(fd, len, 0) {
            Ok(addr) => Ok(Self {
                addr,
                len,
                fd: Some(fd),
            }),
            Err(e) => {
                close(fd);
                Err(e)
            }
        }
    }

    /// The descriptor another process imports this bank with (exporter only).
    pub fn export(&self) -> Result<BankDesc> {
        let fd = self.fd.ok_or(Error::BadState {
            op: "export proxy bank",
            state: "imported, not owned",
        })?;
        let (ino, dev, _) = identity(fd)?;
        let mut h = [0u8; 24];
        h[..4].copy_from_slice(&fd.to_le_bytes());
        h[8..16].copy_from_slice(&ino.to_le_bytes());
        h[16..24].copy_from_slice(&dev.to_le_bytes());
        BankDesc::new(
            HandleKind::ProcessFd,
            self.len as u64,
            0,
            std::process::id() as u64,
            &h,
        )
    }

    /// Maps the bank `d` describes (exported by another process of this user).
    pub fn import(d: &BankDesc) -> Result<Self> {
        d.check()?;
        let bad = |state| Error::BadState {
            op: "import proxy bank",
            state,
        };
        if d.kind()? != HandleKind::ProcessFd {
            return Err(bad("not a shared-memory (process fd) handle"));
        }
        let h = &d.handle;
        let fd = i32::from_le_bytes(h[..4].try_into().unwrap_or_default());
        let ino = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
        let dev = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
        let pid = i32::try_from(d.owner).ok().filter(|&p| p > 0);
        if fd < 0 || h[4..8] != [0; 4] || h[24..].iter().any(|&b| b != 0) {
            return Err(bad("malformed process fd handle"));
        }
        let pid = pid.ok_or(bad("owner is not a process id"))?;
        let path = format!("/proc/{pid}/fd/{fd}\0");
        // SAFETY: a NUL-terminated path; flags are valid.
        let f = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if f < 0 {
            return Err(os_err("open /proc/<owner>/fd (proxy bank)"));
        }
        let r = (|| {
            let (i, v, size) = identity(f)?;
            if (i, v) != (ino, dev) {
                return Err(bad("the owner's fd names another object"));
            }
            if d.offset.checked_add(d.size).is_none_or(|e| e > size) {
                return Err(bad("bank larger than the shared object"));
            }
            map_shared(f, d.size as usize, d.offset)
        })();
        close(f);
        Ok(Self {
            addr: r?,
            len: d.size as usize,
            fd: None,
        })
    }

    /// Where it is mapped here.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it maps nothing (never: sizes are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for ShmBank {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, unmapped once; no reference into it outlives
        // the bank (the engine frees a region only after its last use, the importer detaches
        // after the GPU side stopped).
        unsafe { libc::munmap(self.addr as *mut c_void, self.len) };
        if let Some(fd) = self.fd {
            close(fd);
        }
    }
}

/// Watches another process: [`PeerWatch::check`] fails once it has exited.
#[derive(Debug)]
pub struct PeerWatch {
    pid: i32,
    /// A pidfd (Linux ≥ 5.3), or `None`: then `kill(pid, 0)` (subject to pid reuse).
    fd: Option<i32>,
}

impl PeerWatch {
    /// Starts watching `pid` (which must be alive now).
    pub fn new(pid: u32) -> Result<Self> {
        let pid = i32::try_from(pid)
            .ok()
            .filter(|&p| p > 0)
            .ok_or(Error::OutOfRange {
                what: "peer process id",
                value: pid as i64,
                min: 1,
                max: i32::MAX as i64,
            })?;
        // SAFETY: pidfd_open takes a pid and flags, and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        let w = Self {
            pid,
            fd: (fd >= 0).then_some(fd),
        };
        w.check()?;
        Ok(w)
    }

    /// The watched process id.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// `Ok` while the process lives; an error naming the event once it has exited. Never
    /// waits, never allocates (one `poll` with a zero timeout).
    pub fn check(&self) -> Result<()> {
        let gone = match self.fd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout (no wait).
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n > 0 && p.revents & libc::POLLIN != 0
            }
            None => {
                // SAFETY: signal 0 only checks existence.
                let r = unsafe { libc::kill(self.pid, 0) };
                r != 0
            }
        };
        if gone {
            return Err(Error::BadState {
                op: "cross-process proxy",
                state: "the peer process exited",
            });
        }
        Ok(())
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_export_import_share_bytes() {
        let a = ShmBank::create(3 * 4096 + 100).unwrap();
        let d = a.export().unwrap();
        let b = ShmBank::import(&d).unwrap();
        assert_ne!(a.addr(), b.addr());
        // SAFETY: both map at least 4 bytes of the same object.
        unsafe {
            *(a.addr() as *mut u32) = 0xfeed_beef;
            assert_eq!(*(b.addr() as *const u32), 0xfeed_beef);
        }
        assert!(b.export().is_err(), "an import is not re-exported");
    }

    #[test]
    fn import_refuses_bad_handles() {
        let a = ShmBank::create(4096).unwrap();
        let d = a.export().unwrap();
        let mut h = d.handle;
        h[8] ^= 1; // wrong inode
        let bad = BankDesc::new(HandleKind::ProcessFd, 4096, 0, d.owner, &h).unwrap();
        assert!(matches!(ShmBank::import(&bad), Err(Error::BadState { .. })));
        let big = BankDesc::new(HandleKind::ProcessFd, 8192, 0, d.owner, &d.handle).unwrap();
        assert!(ShmBank::import(&big).is_err(), "larger than the object");
        let ipc = BankDesc::new(HandleKind::CudaIpc, 4096, 0, d.owner, &[1; 64]).unwrap();
        assert!(ShmBank::import(&ipc).is_err());
        let mut h = d.handle;
        h[30] = 1;
        let junk = BankDesc::new(HandleKind::ProcessFd, 4096, 0, d.owner, &h).unwrap();
        assert!(ShmBank::import(&junk).is_err());
    }

    #[test]
    fn peer_watch_sees_an_exit() {
        let me = PeerWatch::new(std::process::id()).unwrap();
        assert!(me.check().is_ok());
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let w = PeerWatch::new(c.id());
        c.wait().unwrap();
        // Exited (and reaped): the pidfd reports it; or it was gone before we looked.
        assert!(w.is_err() || w.unwrap().check().is_err());
        assert!(PeerWatch::new(0).is_err());
    }
}
