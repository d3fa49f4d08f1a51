//! Failback with four rails and four messages in flight: a fused NIC over soft0..soft3 whose
//! soft2 link goes down and heals 40 ms later, twice (`IBNET_SOFT_FAULTS=down=…,heal=40,
//! downs=2` on soft2). Messages are in flight at every failure and every return; each one
//! arrives exactly once with its exact size and bytes, nothing is written past it, and rail 2
//! carries traffic again after each heal.

use crate::util;

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use ibnet_nccl::types::{ncclNetVDeviceProps_t, ncclResult_t};
use nccl_net_ibnet::api::{self, Sizes};
use util::*;

const WINDOW: usize = 4;
const CAP: usize = 48 * 1024;

struct Slot {
    src: Vec<u8>,
    dst: Vec<u8>,
    mh: (*mut c_void, *mut c_void),
    req: (*mut c_void, *mut c_void),
    n: usize,
    m: u32,
    done: (bool, bool),
}

fn irecv(r: *mut c_void, s: &mut Slot) -> *mut c_void {
    let mut req = core::ptr::null_mut();
    let mut data = [s.dst.as_mut_ptr() as *mut c_void];
    let (sizes, tags, mut mhs) = ([s.dst.len()], [3 as c_int], [s.mh.1]);
    let rc = api::irecv(
        r,
        1,
        data.as_mut_ptr(),
        Sizes::Size(sizes.as_ptr()),
        tags.as_ptr(),
        mhs.as_mut_ptr(),
        core::ptr::null_mut(),
        &mut req,
    );
    assert_eq!(rc, ncclResult_t::Success, "irecv: {:?}", take_log());
    req
}

/// Starts message `m` in `s`: pattern, receive posted (the send goes from `drive`).
fn start(r: *mut c_void, s: &mut Slot, m: u32) {
    s.n = 1 + (m as usize * 7907) % CAP;
    s.m = m;
    for (i, b) in s.src[..s.n].iter_mut().enumerate() {
        *b = (i as u32 ^ m.rotate_left(11)).wrapping_mul(2246822519) as u8 | 1;
    }
    s.dst.fill(0);
    s.req = (core::ptr::null_mut(), irecv(r, s));
    s.done = (false, false);
}

/// Posts message `s`'s send if not yet; `false` while the receive is not matched yet.
fn send(sc: *mut c_void, s: &mut Slot) -> bool {
    if s.req.0.is_null() {
        let p = s.src.as_mut_ptr().cast();
        let rc = api::isend(
            sc,
            p,
            s.n as u64,
            3,
            s.mh.0,
            core::ptr::null_mut(),
            &mut s.req.0,
        );
        assert_eq!(rc, ncclResult_t::Success, "isend {}: {:?}", s.m, take_log());
    }
    !s.req.0.is_null()
}

/// Tests message `s` (its send posted); `true` once both ends are done (bytes checked then).
fn drive(s: &mut Slot) -> bool {
    if !s.done.0 {
        let mut x = 0;
        let rc = api::test(s.req.0, &mut x, core::ptr::null_mut());
        assert_eq!(rc, ncclResult_t::Success, "send {}: {:?}", s.m, take_log());
        s.done.0 = x != 0;
    }
    if !s.done.1 {
        let (mut x, mut got) = (0, 0 as c_int);
        let rc = api::test(s.req.1, &mut x, &mut got);
        assert_eq!(rc, ncclResult_t::Success, "recv {}: {:?}", s.m, take_log());
        if x != 0 {
            s.done.1 = true;
            assert_eq!(got, s.n as c_int, "message {}: exact size", s.m);
        }
    }
    if s.done == (true, true) {
        if s.dst[..s.n] != s.src[..s.n] {
            let bad: Vec<usize> = (0..s.n).filter(|&i| s.dst[i] != s.src[i]).collect();
            panic!(
                "message {}: bytes: n {} bad {} first {:?} last {:?} zero {}",
                s.m,
                s.n,
                bad.len(),
                bad.first(),
                bad.last(),
                bad.iter().all(|&i| s.dst[i] == 0)
            );
        }
        assert!(
            s.dst[s.n..].iter().all(|&b| b == 0),
            "message {}: nothing past it",
            s.m
        );
        return true;
    }
    false
}

#[test]
fn four_rails_with_messages_in_flight_fail_back_twice() {
    if util::ran_in_child() {
        return;
    }
    let env = [
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("IBNET_SOFT_DEVICES", "4"),
        ("IBNET_SOFT_FAULTS", "down=800,heal=40,downs=2"),
        ("IBNET_SOFT_FAULTS_DEV", "2"),
        ("NCCL_IB_RESILIENCY_PORT_RECOVERY", "1"),
        ("NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY", "15"),
        ("NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX", "1000"),
    ];
    if !init_soft(&env) {
        return;
    }
    let mut d = -1;
    let p = ncclNetVDeviceProps_t {
        ndevs: 4,
        devs: [0, 1, 2, 3],
    };
    assert_eq!(api::make_vdevice(&mut d, &p), ncclResult_t::Success);
    let (mut h, l) = listen_on(d);
    let (sc, rc, _) = establish_on(d, &mut h, l, Duration::from_secs(30));
    let mut slots: Vec<Slot> = (0..WINDOW)
        .map(|_| {
            let (mut src, mut dst) = (vec![0u8; CAP], vec![0u8; CAP + 4096]);
            let mh = (reg(sc, &mut src), reg(rc, &mut dst));
            Slot {
                src,
                dst,
                mh,
                req: (core::ptr::null_mut(), core::ptr::null_mut()),
                n: 0,
                m: 0,
                done: (true, true),
            }
        })
        .collect();
    let (mut next, mut outages, mut returns, mut live) = (0u32, 0, 0, true);
    let (mut bytes_at_return, mut after) = (0, 0);
    // Slots in message order: receives posted WINDOW ahead, sends posted in order (the
    // sender matches receives in order), completions taken in any order.
    let mut order = std::collections::VecDeque::new();
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "stuck: {:?}",
            take_log()
        );
        while order.len() < WINDOW {
            let i = (0..WINDOW).find(|i| !order.contains(i)).unwrap();
            start(rc, &mut slots[i], next);
            next += 1;
            order.push_back(i);
        }
        for &i in &order {
            if !send(sc, &mut slots[i]) {
                break;
            }
        }
        let sent: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| !slots[i].req.0.is_null())
            .collect();
        for i in sent {
            if drive(&mut slots[i]) {
                order.retain(|&j| j != i);
            }
        }
        let st = api::rail_stats(sc).unwrap();
        if live && !st.live[2] {
            (live, outages) = (false, outages + 1);
        } else if !live && st.live[2] {
            (live, returns, bytes_at_return) = (true, returns + 1, st.rail_bytes[2]);
        }
        if returns == 2 {
            after += 1;
            if after == 2000 {
                assert!(
                    st.rail_bytes[2] > bytes_at_return,
                    "rail 2 carries traffic again"
                );
                break;
            }
        }
        assert!(
            next < 30_000,
            "outages {outages}, returns {returns}: {:?}",
            take_log()
        );
    }
    assert_eq!((outages, returns), (2, 2), "fail → heal → fail → heal");
    assert!(next >= 2000, "thousands of messages: {next}");
    let log = take_log();
    let back = |side: &str| {
        log.iter()
            .filter(|(_, t)| {
                t.contains(side) && t.contains("rail 2 (soft2)") && t.contains("healthy again")
            })
            .count()
    };
    assert_eq!(
        (back("send comm"), back("receive comm")),
        (2, 2),
        "one INFO per return and side"
    );
    println!("{next} messages, {:?}", t0.elapsed());
}
