//! Memory safety of registrations and copies: an unmapped (or inaccessible) range is a
//! registration error, copies at every alignment move exactly the right bytes (the atomic word
//! copy of the in-process fabric), and a copy over memory made inaccessible after registration
//! completes with an error instead of faulting.
#![allow(unsafe_code)]

mod common;

use common::*;
use ibnet_core::provider::{Access, Provider, RegKind, WcStatus, WrOpcode};
use ibnet_core::Error;

/// An anonymous private mapping, unmapped on drop.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(len: usize, prot: i32) -> Self {
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Self { ptr: p.cast(), len }
    }
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn protect(&self, prot: i32) {
        // SAFETY: our own mapping; no Rust reference into it is live.
        assert_eq!(
            unsafe { libc::mprotect(self.ptr.cast(), self.len, prot) },
            0
        );
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: created in `new` with this length; no reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;
const PAGE: usize = 4096;

fn efault(r: ibnet_core::Result<ibnet_soft::SoftMr>) {
    match r {
        Err(Error::Provider { errno, .. }) => assert_eq!(errno, libc::EFAULT),
        Err(e) => panic!("expected Provider/EFAULT, got {e:?}"),
        Ok(_) => panic!("registration of an inaccessible range succeeded"),
    }
}

#[test]
fn reg_mr_of_unmapped_protnone_or_readonly_memory_is_efault() {
    let p = provider();
    let reg = |a: u64, l: usize, acc: Access| p.reg_mr(a, l as u64, acc, RegKind::Plain);
    // A hole in the middle of an otherwise mapped range.
    let m = Map::new(3 * PAGE, RW);
    // SAFETY: the middle page of our own mapping; nothing refers to it.
    assert_eq!(
        unsafe { libc::munmap(m.ptr.add(PAGE).cast(), PAGE) },
        0,
        "munmap"
    );
    efault(reg(m.addr(), 3 * PAGE, Access::ALL));
    efault(reg(m.addr() + PAGE as u64 + 17, 10, Access::ALL));
    // The mapped pages around it are fine.
    drop(reg(m.addr(), PAGE, Access::ALL).unwrap());
    drop(reg(m.addr() + 2 * PAGE as u64, PAGE, Access::ALL).unwrap());
    // A bogus address from C.
    efault(reg(0x10, 64, Access::ALL));
    // PROT_NONE (a guard page).
    let g = Map::new(2 * PAGE, libc::PROT_NONE);
    efault(reg(g.addr(), 2 * PAGE, Access::ALL));
    let ro_access = Access {
        local_write: false,
        remote_write: false,
        remote_read: true,
        relaxed_ordering: false,
    };
    efault(reg(g.addr(), 8, ro_access));
    // Read-only memory: readable registrations only.
    let ro = Map::new(2 * PAGE, libc::PROT_READ);
    efault(reg(ro.addr(), 2 * PAGE, Access::ALL));
    drop(reg(ro.addr(), 2 * PAGE, ro_access).unwrap());
    // Zero-length registrations touch nothing.
    drop(reg(0x10, 0, Access::ALL).unwrap());
}

#[test]
fn copies_at_every_alignment_byte_for_byte() {
    let (pa, pb) = (provider(), provider());
    let (mut a, b) = pair(&pa, &pb);
    const N: usize = 64 << 10;
    let mut la = Region::new(N + 64);
    let mut rb = Region::new(N + 64);
    let (ma, mb) = (a.reg(&la), b.reg(&rb));
    let (ka, kb) = (a.key(&ma), b.key(&mb));
    let mut id = 0;
    for len in [
        1usize,
        7,
        8,
        9,
        15,
        63,
        64,
        65,
        4095,
        16 << 10,
        (16 << 10) + 1,
        N,
    ] {
        for (lo, ro) in [(0usize, 0usize), (1, 1), (3, 0), (0, 5), (7, 9), (8, 16)] {
            for op in [WrOpcode::Write, WrOpcode::Read] {
                id += 1;
                la.fill(id);
                rb.fill(id + 1_000_000);
                let (lb, rbb) = (la.bytes().to_vec(), rb.bytes().to_vec());
                let w = wr(
                    id,
                    op,
                    la.addr() + lo as u64,
                    len as u32,
                    ka,
                    rb.addr() + ro as u64,
                    kb,
                    0,
                    true,
                );
                a.post(&[w]).unwrap();
                let c = a.wait(1);
                assert_eq!(c[0].status, WcStatus::Success, "{len} {lo} {ro} {op:?}");
                // Exactly the target bytes changed, to exactly the source bytes.
                let (mut want_l, mut want_r) = (lb.clone(), rbb.clone());
                if op == WrOpcode::Write {
                    want_r[ro..ro + len].copy_from_slice(&lb[lo..lo + len]);
                } else {
                    want_l[lo..lo + len].copy_from_slice(&rbb[ro..ro + len]);
                }
                assert!(la.bytes() == &want_l[..], "local {len} {lo} {ro} {op:?}");
                assert!(rb.bytes() == &want_r[..], "remote {len} {lo} {ro} {op:?}");
            }
        }
    }
    drop((ma, mb));
}

#[test]
fn copy_over_memory_made_inaccessible_fails_instead_of_faulting() {
    // Breaking the contract (memory must stay accessible while registered) on purpose: the
    // kernel-checked copy (above the word-copy limit) completes with an error, the process
    // lives. PROT_NONE rather than munmap, so the range cannot be reused by the allocator.
    const LEN: usize = 1 << 20;
    for op in [WrOpcode::Write, WrOpcode::Read] {
        let (pa, pb) = (provider(), provider());
        let (mut a, b) = pair(&pa, &pb);
        let local = Map::new(LEN, RW);
        let remote = Map::new(LEN, RW);
        let ml = pa
            .reg_mr(local.addr(), LEN as u64, Access::ALL, RegKind::Plain)
            .unwrap();
        let mr = pb
            .reg_mr(remote.addr(), LEN as u64, Access::ALL, RegKind::Plain)
            .unwrap();
        remote.protect(libc::PROT_NONE);
        let w = wr(
            1,
            op,
            local.addr(),
            LEN as u32,
            a.key(&ml),
            remote.addr(),
            b.key(&mr),
            0,
            true,
        );
        a.post(&[w]).unwrap();
        let c = a.wait(1);
        assert_eq!(c[0].status, WcStatus::RemoteAccessError, "{op:?}");
        assert_eq!(c[0].vendor_err, libc::EFAULT as u32);
        // The QP is in the error state now: later work is flushed, not executed.
        a.post(&[wr(
            2,
            op,
            local.addr(),
            8,
            a.key(&ml),
            remote.addr(),
            b.key(&mr),
            0,
            true,
        )])
        .unwrap();
        assert_eq!(a.wait(1)[0].status, WcStatus::WrFlushError);
        remote.protect(RW);
        drop((ml, mr));
    }
}
