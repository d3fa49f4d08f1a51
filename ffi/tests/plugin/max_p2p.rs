//! `maxP2pBytes` is what one `isend` really moves (issue 28, point 3): the advertised maximum
//! (2 GiB − 128, bounded by `test`'s `int` sizes; see `ibnet_core::comm::MAX_MSG_SIZE`) goes
//! through `api` over the soft provider in one `isend`, every byte verified, both ends
//! reporting the whole size; one byte more is refused.
//!
//! Memory: the send buffer is one memfd of `PERIOD` bytes mapped 32 times back to back (a
//! 2 GiB virtual buffer over 64 MiB of pages), holding a position-dependent pattern whose
//! period (64 MiB + 4 KiB, an odd number of pages) is no multiple of the chunks the soft
//! provider or a split cuts (powers of two), so a chunk landing at the wrong place is seen.
//! The receive buffer is real memory (anonymous, touched only by the copy). The maximum is
//! opt-in (`--ignored`: 2 GiB of receive memory); by default a send just past the old 1 GiB
//! limit runs.
#![allow(unsafe_code)]

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_core::comm::MAX_MSG_SIZE;
use ibnet_nccl::props::{Props12, VersionProps};
use ibnet_nccl::types::ncclResult_t;
use nccl_net_ibnet::api;
use util::*;

/// The send pattern's period: 64 MiB + one page.
const PERIOD: usize = (64 << 20) + 4096;

/// An anonymous or memfd mapping, unmapped on drop.
struct Map(*mut u8, usize);

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: a mapping this test made, of this length, unmapped once.
        unsafe { libc::munmap(self.0 as *mut c_void, self.1) };
    }
}

/// `len` bytes of address space whose byte `i` is byte `i % PERIOD` of one memfd (filled
/// with [`pattern`]); and that memfd's bytes.
fn aliased_source(len: usize) -> (Map, Map) {
    // SAFETY: plain syscalls; every result is checked before use.
    unsafe {
        let fd = libc::memfd_create(c"ibnet-max-p2p".as_ptr(), 0);
        assert!(fd >= 0, "memfd_create");
        assert_eq!(libc::ftruncate(fd, PERIOD as libc::off_t), 0);
        let copies = len.div_ceil(PERIOD);
        let total = copies * PERIOD;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let base = libc::mmap(core::ptr::null_mut(), total, libc::PROT_NONE, flags, -1, 0);
        assert_ne!(base, libc::MAP_FAILED, "reserve {total} bytes");
        let base = base as *mut u8;
        for c in 0..copies {
            let at = base.add(c * PERIOD) as *mut c_void;
            let m = libc::mmap(at, PERIOD, prot, libc::MAP_SHARED | libc::MAP_FIXED, fd, 0);
            assert_eq!(m, at, "alias {c}");
        }
        let one = libc::mmap(core::ptr::null_mut(), PERIOD, prot, libc::MAP_SHARED, fd, 0);
        assert_ne!(one, libc::MAP_FAILED);
        libc::close(fd);
        let one = Map(one as *mut u8, PERIOD);
        pattern(core::slice::from_raw_parts_mut(one.0, PERIOD));
        (Map(base, total), one)
    }
}

/// A position-dependent pattern: every 8-byte word is a hash of its index.
fn pattern(b: &mut [u8]) {
    for (i, w) in b.chunks_exact_mut(8).enumerate() {
        let mut x = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        w.copy_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
}

/// `len` bytes of fresh anonymous memory (pages committed as they are written).
fn anon(len: usize) -> Map {
    // SAFETY: a plain mmap, checked.
    unsafe {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let p = libc::mmap(core::ptr::null_mut(), len, prot, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED, "map {len} bytes");
        Map(p as *mut u8, len)
    }
}

fn reg_raw(c: *mut c_void, p: *mut u8, len: usize) -> *mut c_void {
    let mut mh = core::ptr::null_mut();
    let rc = api::reg_mr(c, p as *mut c_void, len as u64, 0, None, &mut mh);
    assert_eq!(
        rc,
        ncclResult_t::Success,
        "regMr of {len} bytes: {:?}",
        take_log()
    );
    mh
}

fn test_until_done(req: *mut c_void, what: &str) -> c_int {
    let t0 = Instant::now();
    let (mut done, mut size): (c_int, c_int) = (0, -1);
    while done == 0 {
        assert!(t0.elapsed() < Duration::from_secs(300), "{what} not done");
        let rc = api::test(req, &mut done, &mut size);
        assert_eq!(rc, ncclResult_t::Success, "{what}: {:?}", take_log());
    }
    size
}

/// The advertised maximum in one `isend`, byte for byte. Opt-in (`cargo test -p ibnet-ffi
/// --test plugin -- --ignored max_p2p`): 2 GiB of real receive memory, a peak RSS of about 4.3 GB
/// (the 32 aliases of the send memfd count in RSS once each, though they share 64 MiB of
/// pages), about 11 s in a debug build.
#[test]
#[ignore = "2 GiB receive buffer; run with --ignored"]
fn the_advertised_max_p2p_bytes_moves_in_one_isend_byte_for_byte() {
    if util::ran_in_child() {
        return;
    }
    if !init_soft(&[("NCCL_SOCKET_IFNAME", "lo")]) {
        return;
    }
    let max = Props12::from_props(&api::properties(0).unwrap(), 0).max_p2p_bytes;
    assert_eq!(max as u64, MAX_MSG_SIZE, "maxP2pBytes is the core's limit");
    one_isend(max, true);
}

/// By default: one `isend` just past the 1 GiB ibnet advertised (and refused) before, byte
/// for byte (1 GiB of real receive memory, a peak RSS of about 2.2 GB); and the advertised
/// maximum is the core's, past that 1 GiB.
#[test]
fn a_send_past_the_old_1_gib_limit_moves_byte_for_byte() {
    if util::ran_in_child() {
        return;
    }
    if !init_soft(&[("NCCL_SOCKET_IFNAME", "lo")]) {
        return;
    }
    let max = Props12::from_props(&api::properties(0).unwrap(), 0).max_p2p_bytes;
    assert_eq!(max as u64, MAX_MSG_SIZE, "maxP2pBytes is the core's limit");
    assert!(
        max > (1 << 30) + 4096,
        "past the 1 GiB ibnet advertised before"
    );
    one_isend((1 << 30) + 4096 + 40, false);
}

/// One `isend` of `len` bytes from the aliased pattern into real memory, verified; with
/// `refuse_more`, one byte more is refused first (`len` is then the maximum).
fn one_isend(len: usize, refuse_more: bool) {
    let (src, one) = aliased_source(len + 1);
    let dst = anon(len + 4096);
    let (mut h, l) = listen();
    let (s, r, _) = establish(&mut h, l, Duration::from_secs(30));
    let ms = reg_raw(s, src.0, len + 1);
    let mr = reg_raw(r, dst.0, len + 4096);
    let _ = take_log();
    let mut req: *mut c_void = core::ptr::null_mut();
    let p = src.0 as *mut c_void;
    if refuse_more {
        // One byte more than advertised is refused, before any clear-to-send is looked at.
        let rc = api::isend(s, p, len as u64 + 1, 7, ms, core::ptr::null_mut(), &mut req);
        assert_eq!(rc, ncclResult_t::InvalidArgument);
        assert!(req.is_null());
        let _ = take_log();
    }
    // SAFETY: `dst` maps `len + 4096` bytes; nothing else uses it.
    let dbuf = unsafe { core::slice::from_raw_parts_mut(dst.0, len + 4096) };
    let rreq = post_recv(r, &mut dbuf[..len], mr, 7);
    let t0 = Instant::now();
    while req.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30), "isend never posted");
        let rc = api::isend(s, p, len as u64, 7, ms, core::ptr::null_mut(), &mut req);
        assert_eq!(rc, ncclResult_t::Success, "isend: {:?}", take_log());
    }
    let rsize = test_until_done(rreq, "receive");
    let ssize = test_until_done(req, "send");
    assert_eq!(
        (rsize as usize, ssize as usize),
        (len, len),
        "sizes reported"
    );
    // SAFETY: the memfd's one mapping, `PERIOD` bytes.
    let period = unsafe { core::slice::from_raw_parts(one.0, PERIOD) };
    for (k, got) in dbuf[..len].chunks(PERIOD).enumerate() {
        if got != &period[..got.len()] {
            let i = got.iter().zip(period).position(|(a, b)| a != b).unwrap();
            panic!("byte {} differs", k * PERIOD + i);
        }
    }
    assert!(
        dbuf[len..].iter().all(|&b| b == 0),
        "nothing past the receive"
    );
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(r, mr), ncclResult_t::Success);
    close(s, r, l);
}
