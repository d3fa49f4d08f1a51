//! The proxy engine with its "GPU" in another process (NCCL's PXN path): this test binary
//! re-executes itself (`xproc_helper`, role in `IBNET_XPROC_ROLE`) and the two processes talk
//! over the helper's stdin/stdout (lines starting with `XPROC `).
//!
//! * Proxy here, simulated GPU in the helper: the engine (soft provider, `ProxyMem` banks in
//!   POSIX shared memory) decides `same_process = 0` from the pids, exports each connection's
//!   map; the helper validates and maps every bank, runs the testkit's sending and receiving
//!   GPU over its own mappings (1,000 operations, two subs, every byte verified), unmaps.
//!   SIMPLE, LL and LL128 over dedicated buffers; SIMPLE (shared pool) and LL (its dedicated
//!   LL buffer) over shared-buffer connections. The proxy's progress over ops 1..1000
//!   allocates nothing (counted by a global allocator).
//! * A killed GPU process: the proxy's progress fails with "the peer process exited".
//! * A killed proxy process: the GPU side's watch fails the same way, its waits end.
//!
//! No timing assertions: waits are bounded only by generous limits against hangs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use crate::util;

use ibnet_core::Error;
use ibnet_proxy::attach::Attached;
use ibnet_proxy::capi::{PeerWatch, ProxyMem};
use ibnet_proxy::xmap::XMap;
use ibnet_proxy::{ConnId, DeviceView, Dir, Protocol, ProxyConfig};
use ibnet_soft::SoftProvider;
use ibnet_testkit::proxy::{
    cfg, connect_pairs, drive_op, gpu_recv, gpu_send, new_px_with, op_payload, slice_payload, OpIo,
    PxWith, Scenario,
};

struct Counting;
thread_local!(static COUNT: Cell<Option<usize>> = const { Cell::new(None) });

// SAFETY: forwards to the system allocator; counts calls made on a thread that asked for it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get().map(|n| n + 1)));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ROLE: &str = "IBNET_XPROC_ROLE";
const CASE: &str = "IBNET_XPROC_CASE";
/// Generous bound on any one wait for the other process (a hang guard, not a timing check).
const PATIENCE: Duration = Duration::from_secs(300);

type Px = PxWith<SoftProvider, ProxyMem>;

/// The cases: (protocol, shared buffers).
const CASES: [(Protocol, bool); 5] = [
    (Protocol::Simple, false),
    (Protocol::Ll, false),
    (Protocol::Ll128, false),
    (Protocol::Simple, true),
    (Protocol::Ll, true),
];

fn scenario(i: usize) -> Scenario {
    let (proto, shared) = CASES[i];
    Scenario {
        proto,
        shared,
        nsubs: 2,
        ops: 1000,
        ..Scenario::simple()
    }
}

fn engine_cfg() -> ProxyConfig {
    ProxyConfig {
        process_id: std::process::id() as u64,
        alloc_p2p_ll_buffers: true,
        ..cfg()
    }
}

fn big_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|t| {
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn_scoped(t, f)
            .unwrap()
            .join()
            .unwrap()
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Lines starting with `XPROC ` from `r`, on a thread (so waits on them are bounded).
fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if let Some(x) = l.strip_prefix("XPROC ") {
                if tx.send(x.to_owned()).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

fn expect(rx: &Receiver<String>, what: &str) -> String {
    let l = rx
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
    assert!(l.starts_with(what), "expected {what}, got {l}");
    l
}

fn say(w: &mut impl Write, l: &str) {
    writeln!(w, "XPROC {l}").expect("write to the other process");
    w.flush().expect("flush");
}

fn spawn(role: &str, case: usize) -> (Child, ChildStdin, Receiver<String>) {
    let helper = util::test_path(module_path!(), "xproc_helper");
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            helper.as_str(),
            "--include-ignored",
            "--nocapture",
        ])
        .env(ROLE, role)
        .env(CASE, case.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the helper process");
    let stdin = c.stdin.take().unwrap();
    let rx = lines(c.stdout.take().unwrap());
    (c, stdin, rx)
}

/// An engine whose GPU side runs in process `gpu_pid`, with its connections.
fn proxy_for(gpu_pid: u32, case: usize) -> (Px, Scenario, Vec<ConnId>, Vec<ConnId>) {
    let sc = Scenario {
        gpu_process: gpu_pid as u64,
        ..scenario(case)
    };
    let dev = SoftProvider::open().expect("open soft0");
    let mut px = new_px_with(dev, ProxyMem::host(), &sc, false, engine_cfg());
    let (s, r) = connect_pairs(&mut px, &sc).expect("connect");
    for &c in s.iter().chain(&r) {
        assert_eq!(px.map(c).unwrap().same_process, 0, "decided from the pids");
    }
    (px, sc, s, r)
}

/// Sends every connection's map (sends first) to the GPU process.
fn send_maps(px: &Px, conns: &[ConnId], w: &mut impl Write) {
    for &c in conns {
        say(
            w,
            &format!("MAP {}", hex(px.export_map(c).unwrap().as_bytes())),
        );
    }
}

fn free_all(mut px: Px, conns: &[ConnId]) {
    for &c in conns {
        px.free(c).expect("free");
    }
    assert_eq!(
        px.live(),
        (0, 0, 0),
        "connections, pools, shared comms left"
    );
    assert_eq!(px.mem().live(), 0, "shared banks left mapped");
    px.net().provider().shutdown();
}

/// Reads `n` maps and attaches them; returns the attachments and their views.
fn attach(rx: &Receiver<String>, n: usize, mem: &mut ProxyMem) -> Vec<Attached> {
    (0..n)
        .map(|_| {
            let l = expect(rx, "MAP ");
            let x = XMap::from_bytes(&unhex(&l[4..])).expect("a valid map");
            Attached::attach(mem, &x).expect("attach")
        })
        .collect()
}

/// The simulated GPU over attached connections, watched: returns the bytes verified, or the
/// watch's error (the proxy died; the GPU threads were stopped).
fn run_gpu(
    sc: Scenario,
    att: &[Attached],
    watch: &PeerWatch,
    mut on_tick: impl FnMut(&[DeviceView]),
) -> Result<u64, Error> {
    let views: Vec<DeviceView> = att.iter().map(Attached::view).collect();
    let (sv, rv) = views.split_at(sc.nsubs);
    assert!(sv.iter().all(|v| v.dir == Dir::Send) && rv.iter().all(|v| v.dir == Dir::Recv));
    let stop = AtomicBool::new(false);
    let none = vec![0u64; sc.nsubs];
    std::thread::scope(|t| {
        let (sv, rv, n1, n2, stop) = (sv.to_vec(), rv.to_vec(), none.clone(), none, &stop);
        let gs = t.spawn(move || gpu_send(sc, sv, n1, stop));
        let gr = t.spawn(move || gpu_recv(sc, rv, n2, stop));
        let mut dead = Ok(());
        while !(gs.is_finished() && gr.is_finished()) {
            if dead.is_ok() {
                dead = watch.check();
                if dead.is_err() {
                    // Bounded waits: the GPU threads stop instead of waiting on a dead proxy.
                    // Relaxed: a bare flag `gpu_send`/`gpu_recv` poll; nothing is published
                    // through it (the joins below order what they did).
                    stop.store(true, Ordering::Relaxed);
                }
            }
            on_tick(&views);
            std::thread::sleep(Duration::from_millis(2));
        }
        gs.join().unwrap();
        let v = gr.join().unwrap();
        dead.map(|()| v)
    })
}

/// The helper process; does nothing unless spawned with a role.
#[test]
#[ignore = "helper role: spawned by the cross-process tests with IBNET_XPROC_ROLE"]
fn xproc_helper() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let case: usize = std::env::var(CASE).unwrap().parse().unwrap();
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() } as u32;
    let watch = PeerWatch::new(parent).expect("watch the parent");
    let rx = lines(std::io::stdin());
    let mut out = std::io::stdout();
    match role.as_str() {
        "gpu" | "gpu-idle" => {
            let sc = scenario(case);
            let mut mem = ProxyMem::host();
            let att = attach(&rx, 2 * sc.nsubs, &mut mem);
            say(&mut out, "ATTACHED");
            if role == "gpu-idle" {
                // Waits (bounded) to be killed.
                std::thread::sleep(PATIENCE);
                return;
            }
            let r = run_gpu(sc, &att, &watch, |_| {});
            for a in att {
                a.detach(&mut mem).expect("detach");
            }
            assert_eq!(mem.live(), 0, "mappings left");
            say(&mut out, &format!("DONE {}", r.expect("the proxy lives")));
            // Lives until the proxy has finished its side of the last op: its progress checks
            // that this process is alive, so exiting earlier would fail the proxy's last op.
            expect(&rx, "EXIT");
        }
        "proxy" => big_stack(move || {
            let (mut px, sc, s, r) = proxy_for(parent, case);
            let all: Vec<ConnId> = s.iter().chain(&r).copied().collect();
            send_maps(&px, &all, &mut out);
            expect(&rx, "GO");
            let per = slice_payload(&sc, &px.device_view(s[0]).unwrap());
            let io = OpIo {
                sends: &s,
                recvs: &r,
                su: &[],
                ru: &[],
            };
            for op in 0..sc.ops {
                let np = &mut ibnet_proxy::NoProfiler;
                if drive_op(&mut px, &sc, op, per, io, np, &mut || watch.check()).is_err() {
                    break;
                }
            }
        }),
        r => panic!("unknown role {r}"),
    }
}

/// Total payload bytes of a scenario's receiving GPU.
fn expected_bytes(sc: &Scenario, per: usize) -> u64 {
    (0..sc.ops)
        .flat_map(|op| (0..sc.nsubs).map(move |s| (op, s)))
        .map(|(op, s)| op_payload(sc, per, op, s) as u64)
        .sum()
}

fn gpu_in_another_process(case: usize) {
    big_stack(|| {
        let (mut child, mut stdin, rx) = spawn("gpu", case);
        let watch = PeerWatch::new(child.id()).unwrap();
        let (mut px, sc, s, r) = proxy_for(child.id(), case);
        let all: Vec<ConnId> = s.iter().chain(&r).copied().collect();
        send_maps(&px, &all, &mut stdin);
        expect(&rx, "ATTACHED");
        let per = slice_payload(&sc, &px.device_view(s[0]).unwrap());
        let io = OpIo {
            sends: &s,
            recvs: &r,
            su: &[],
            ru: &[],
        };
        let np = &mut ibnet_proxy::NoProfiler;
        let mut check = || watch.check();
        drive_op(&mut px, &sc, 0, per, io, np, &mut check).expect("op 0");
        COUNT.with(|c| c.set(Some(0)));
        for op in 1..sc.ops {
            if let Err(e) = drive_op(&mut px, &sc, op, per, io, np, &mut check) {
                COUNT.with(|c| c.set(None));
                panic!("op {op}: {e}");
            }
        }
        let n = COUNT.with(|c| c.replace(None));
        assert_eq!(n, Some(0), "allocations in the proxy over ops 1..1000");
        let done = expect(&rx, "DONE ");
        say(&mut stdin, "EXIT");
        let bytes: u64 = done[5..].parse().unwrap();
        assert_eq!(
            bytes,
            expected_bytes(&sc, per),
            "bytes the GPU process verified"
        );
        eprintln!(
            "{:?} shared={}: {bytes} bytes verified",
            sc.proto, sc.shared
        );
        assert!(child.wait().unwrap().success(), "GPU process failed");
        free_all(px, &all);
    })
}

#[test]
fn simple_dedicated_gpu_in_another_process() {
    gpu_in_another_process(0);
}

#[test]
fn ll_dedicated_gpu_in_another_process() {
    gpu_in_another_process(1);
}

#[test]
fn ll128_dedicated_gpu_in_another_process() {
    gpu_in_another_process(2);
}

#[test]
fn simple_shared_buffers_gpu_in_another_process() {
    gpu_in_another_process(3);
}

#[test]
fn ll_on_shared_buffer_connections_gpu_in_another_process() {
    gpu_in_another_process(4);
}

#[test]
fn killed_gpu_process_fails_the_proxy_progress() {
    big_stack(|| {
        let (mut child, mut stdin, rx) = spawn("gpu-idle", 0);
        let watch = PeerWatch::new(child.id()).unwrap();
        let (mut px, sc, s, r) = proxy_for(child.id(), 0);
        let all: Vec<ConnId> = s.iter().chain(&r).copied().collect();
        send_maps(&px, &all, &mut stdin);
        expect(&rx, "ATTACHED");
        child.kill().unwrap();
        child.wait().unwrap();
        let per = slice_payload(&sc, &px.device_view(s[0]).unwrap());
        let io = OpIo {
            sends: &s,
            recvs: &r,
            su: &[],
            ru: &[],
        };
        let np = &mut ibnet_proxy::NoProfiler;
        let e = drive_op(&mut px, &sc, 0, per, io, np, &mut || watch.check())
            .expect_err("an op with a dead GPU process");
        assert!(
            matches!(
                e,
                Error::BadState {
                    state: "the peer process exited",
                    ..
                }
            ),
            "{e:?}"
        );
        // Teardown with a dead peer releases everything.
        free_all(px, &all);
    })
}

#[test]
fn killed_proxy_process_fails_the_gpu_side() {
    let (mut child, mut stdin, rx) = spawn("proxy", 0);
    let watch = PeerWatch::new(child.id()).unwrap();
    let sc = scenario(0);
    let mut mem = ProxyMem::host();
    let att = attach(&rx, 2 * sc.nsubs, &mut mem);
    say(&mut stdin, "GO");
    let mut killed = false;
    let r = run_gpu(sc, &att, &watch, |views| {
        // Kill the proxy once some steps have landed on the receiving GPU.
        let tail = views[sc.nsubs].tail;
        // SAFETY: the receive connection's tail word, mapped by `att` for this whole run.
        // Acquire: pairs with the proxy process's Release `store_step` of the recv `tail`;
        // stronger than needed, as only a kill threshold is read from it.
        let landed = unsafe { &*(tail as *const AtomicU64) }.load(Ordering::Acquire);
        if !killed && landed >= 20 {
            child.kill().unwrap();
            killed = true;
        }
    });
    assert!(killed, "the proxy was killed mid-run");
    eprintln!("proxy killed mid-run; GPU side: {r:?}");
    let e = r.expect_err("a GPU run with a dead proxy");
    assert!(
        matches!(
            e,
            Error::BadState {
                state: "the peer process exited",
                ..
            }
        ),
        "{e:?}"
    );
    child.wait().unwrap();
    for a in att {
        a.detach(&mut mem).expect("detach");
    }
    assert_eq!(mem.live(), 0);
}
