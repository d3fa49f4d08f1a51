//! Every exported table through the one foreign loader: for each of `ncclNetPlugin_v12` …
//! `_v6` of the built plugin, `ForeignPlugin` loads that version, inits it, reads the
//! properties, connects a loopback pair on the soft provider and moves verified bytes through
//! `regMr`/`irecv`/`isend`/`test`/`deregMr`/close. This covers each version's export shims
//! (`int`/`size_t` sizes, ctx, device handles, profiler handles) and the loader's matching
//! call arm. v12's `railId`/`planeId` come from `NCCL_IB_HCA` (`soft0:1:3:2`); older tables
//! have none.

use core::ffi::c_void;
use std::path::Path;

use ibnet_nccl::foreign::calls::Buf;
use ibnet_nccl::foreign::{ForeignPlugin, Version};
use ibnet_nccl::types::{NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_HOST};

fn so_path() -> String {
    if let Ok(p) = std::env::var("IBNET_TEST_PLUGIN_SO") {
        return p;
    }
    // Cargo builds the cdylib next to this test: target/<profile>/deps/libnccl_net_ibnet.so.
    let exe = std::env::current_exe().expect("current exe");
    let so = exe.parent().expect("deps dir").join("libnccl_net_ibnet.so");
    assert!(so.exists(), "{} not built", so.display());
    so.to_str().expect("UTF-8 path").to_owned()
}

type V = *mut c_void;

/// Connects a loopback pair on device 0: (listen, send, recv) comms.
fn pair(p: &ForeignPlugin) -> (V, V, V) {
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let l = p.listen(0, &mut h).expect("listen");
    assert!(!l.is_null());
    let (mut s, mut r) = (None, None);
    for _ in 0..1_000_000 {
        if s.is_none() {
            s = p.connect(0, &mut h).expect("connect");
        }
        if r.is_none() {
            r = p.accept(l).expect("accept");
        }
        if let (Some(s), Some(r)) = (s, r) {
            return (l, s, r);
        }
        std::thread::yield_now();
    }
    panic!("loopback connect did not finish");
}

/// Sends `n` patterned bytes from `s` to `r` and checks them and the reported size.
fn transfer(p: &ForeignPlugin, s: V, r: V, n: usize) {
    let mut src: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; n];
    // SAFETY: both buffers outlive their registrations (deregistered below).
    let (ms, mr) = unsafe {
        (
            p.reg_mr(s, src.as_mut_ptr().cast(), n, NCCL_PTR_HOST)
                .expect("regMr send"),
            p.reg_mr(r, dst.as_mut_ptr().cast(), n, NCCL_PTR_HOST)
                .expect("regMr recv"),
        )
    };
    let buf = Buf {
        data: dst.as_mut_ptr().cast(),
        size: n,
        tag: 5,
        mh: mr,
    };
    let (mut rq, mut sq) = (None, None);
    for _ in 0..1_000_000 {
        if rq.is_none() {
            // SAFETY: `dst` lies inside `mr` and is not touched until the test below.
            rq = unsafe { p.irecv(r, &[buf]) }.expect("irecv");
        }
        if sq.is_none() {
            // SAFETY: `src` lies inside `ms` and is not touched until the test below.
            sq = unsafe { p.isend(s, src.as_mut_ptr().cast(), n, 5, ms) }.expect("isend");
        }
        if rq.is_some() && sq.is_some() {
            break;
        }
        std::thread::yield_now();
    }
    let (rq, sq) = (rq.expect("irecv posted"), sq.expect("isend posted"));
    let (mut rdone, mut sdone) = (None, None);
    for _ in 0..10_000_000 {
        if rdone.is_none() {
            rdone = p.test(rq).expect("test recv");
        }
        if sdone.is_none() {
            sdone = p.test(sq).expect("test send");
        }
        if rdone.is_some() && sdone.is_some() {
            break;
        }
        std::thread::yield_now();
    }
    assert!(sdone.is_some(), "send completed");
    assert!(
        rdone.expect("receive completed")[0] > 0,
        "reported as received"
    );
    assert_eq!(dst, src, "bytes verified");
    p.dereg_mr(s, ms).expect("deregMr send");
    p.dereg_mr(r, mr).expect("deregMr recv");
}

#[test]
fn every_exported_version_through_the_foreign_loader() {
    std::env::set_var("IBNET_PROVIDER", "soft");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    // NCCL 2.30's dev:port:rail:plane, with a malformed entry that must not undo it.
    std::env::set_var("NCCL_IB_HCA", "soft0:1:3:2,soft1:x");
    let path = so_path();
    for v in Version::ALL {
        let mut p = ForeignPlugin::open_version(Path::new(&path), v).expect("load");
        assert_eq!(p.version(), v);
        assert_eq!(p.name().and_then(|n| n.to_str().ok()), Some("IBNet"));
        p.init(None, 42).expect("init");
        assert!(p.devices().expect("devices") >= 1, "{v:?}: soft0");
        let props = p.properties(0).expect("properties");
        assert_eq!(props.max_recvs, 8, "{v:?}");
        assert_eq!(props.ptr_support, NCCL_PTR_HOST, "{v:?}");
        let ids = if v == Version::V12 { (3, 2) } else { (-1, -1) };
        assert_eq!((props.rail, props.plane), ids, "{v:?}: railId/planeId");
        let old = matches!(v, Version::V6 | Version::V7 | Version::V8);
        assert_eq!(props.vprops.ndevs, if old { 0 } else { 1 }, "{v:?}");
        let (l, s, r) = pair(&p);
        transfer(&p, s, r, 4096 + 3);
        p.close_send(s).expect("closeSend");
        p.close_recv(r).expect("closeRecv");
        p.close_listen(l).expect("closeListen");
        p.finalize().expect("finalize");
        eprintln!("{v:?} ({}): verified", v.symbol());
    }
    // The newest table is the one `open` picks.
    let p = ForeignPlugin::open(Path::new(&path)).expect("load");
    assert_eq!(p.version(), Version::V12);
}
