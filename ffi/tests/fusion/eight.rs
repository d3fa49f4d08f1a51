//! Shared by the 8-device vNIC tests (`fused_eight.rs`, `fused_eight_failover.rs`): the
//! `NCCL_IB_HCA` they set, the v12 properties through the exported table, making the vNIC of
//! all 8 soft devices, and one byte-verified message.

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::props::Props12;
use ibnet_nccl::types::{ncclNetVDeviceProps_v12_t, ncclResult_t};
use nccl_net_ibnet::abi::exports::ncclNetPlugin_v12;
use nccl_net_ibnet::api;

use crate::util::{post_recv, reg, take_log};

/// Rail 0 for every device, plane `i % 4` for soft`i` (planes 0..3 are NCCL's plane indices
/// 1..4; index 0 is "unset").
pub const HCA: &str = "soft0:1:0:0,soft1:1:0:1,soft2:1:0:2,soft3:1:0:3,\
                   soft4:1:0:0,soft5:1:0:1,soft6:1:0:2,soft7:1:0:3";

/// The v12 properties of device `dev`, through the exported table.
pub fn props12(dev: c_int) -> Props12 {
    let mut p = core::mem::MaybeUninit::<Props12>::zeroed();
    let f = ncclNetPlugin_v12.get_properties.expect("getProperties");
    // SAFETY: the exported v12 entry with a writable v12 struct.
    assert_eq!(unsafe { f(dev, p.as_mut_ptr()) }, ncclResult_t::Success);
    // SAFETY: all-zero is a valid Props12 and the entry filled it in.
    unsafe { p.assume_init() }
}

/// Sends `len` patterned bytes (pattern `seed`) from `s` to `r`, with the receive buffer
/// larger than the message: bytes, the reported size and the untouched tail are checked.
pub fn message(s: *mut c_void, r: *mut c_void, len: usize, seed: u8) {
    let mut src: Vec<u8> = (0..len.max(1))
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect();
    let mut dst = vec![0xEEu8; len + 4096];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let rreq = post_recv(r, &mut dst, mr, 9);
    let mut sreq: *mut c_void = core::ptr::null_mut();
    let t0 = Instant::now();
    while sreq.is_null() {
        assert!(t0.elapsed() < Duration::from_secs(30), "isend never posted");
        let p = src.as_mut_ptr() as *mut c_void;
        let rc = api::isend(s, p, len as u64, 9, ms, core::ptr::null_mut(), &mut sreq);
        assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
    }
    let (mut sd, mut rd, mut got) = (false, false, -1 as c_int);
    let t0 = Instant::now();
    while !(sd && rd) {
        assert!(t0.elapsed() < Duration::from_secs(60), "{len} B: not done");
        let mut d: c_int = 0;
        if !sd {
            let rc = api::test(sreq, &mut d, core::ptr::null_mut());
            assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
            sd = d != 0;
        }
        if !rd {
            let rc = api::test(rreq, &mut d, &mut got);
            assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
            rd = d != 0;
        }
    }
    assert_eq!(got, len as c_int, "size of a {len}-byte message");
    assert_eq!(&dst[..len], &src[..len], "{len} bytes");
    assert!(
        dst[len..].iter().all(|&b| b == 0xEE),
        "{len}: no byte past it"
    );
    assert_eq!(api::dereg_mr(s, ms), ncclResult_t::Success);
    assert_eq!(api::dereg_mr(r, mr), ncclResult_t::Success);
}

/// Makes the vNIC of soft0..soft7 through the v12 table; its device number.
pub fn fuse_eight() -> c_int {
    let mut d = -1;
    let mut all = ncclNetVDeviceProps_v12_t {
        ndevs: 8,
        devs: [0, 1, 2, 3, 4, 5, 6, 7],
    };
    let mk12 = ncclNetPlugin_v12.make_vdevice.expect("v12 makeVDevice");
    // SAFETY: the exported v12 entry with valid pointers.
    let rc = unsafe { mk12(&mut d, &mut all) };
    assert_eq!(rc, ncclResult_t::Success, "{:?}", take_log());
    d
}
