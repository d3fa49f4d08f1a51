//! ibnet-perf's loopback core against raw baselines, side by side.
//!
//! For a few sizes: bandwidth of ibnet's plugin (loaded by path through its C API, exactly as
//! `ibnet-perf` does; both endpoints in this process on two threads, so the soft provider's
//! in-process fabric when there is no RDMA NIC), next to `memcpy` and `process_vm_writev` (the
//! cross-memory-attach copy the soft provider uses between processes) of the same size, and
//! the ratios. Run: `cargo bench -p ibnet-benches --bench perf_loopback` (about 10 s).

use std::sync::mpsc;
use std::time::Instant;

use ibnet_tools::buf::AlignedBuf;
use ibnet_tools::net::Plugin;
use ibnet_tools::sweep::{drive_step, respond_step, Endpoint, RunConfig};

const SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

fn plugin_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    ibnet_tools::locate::find_near(&exe)
        .expect("libnccl_net_ibnet.so next to the bench (built with ibnet-tools)")
}

fn open(path: &std::path::Path) -> Plugin {
    let mut p = Plugin::open(path).expect("open plugin");
    p.init().expect("init");
    assert!(p.devices().expect("devices") > 0, "plugin has no device");
    p
}

/// ibnet bandwidth (GB/s) per size, driver and responder on two threads.
fn ibnet(cfg: &RunConfig) -> Vec<f64> {
    let path = plugin_path();
    let (to_resp, from_drv) = mpsc::channel::<Vec<u8>>();
    let (to_drv, from_resp) = mpsc::channel::<Vec<u8>>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let timeout = std::time::Duration::from_secs(cfg.timeout_s);
    std::thread::scope(|s| {
        let c2 = cfg.clone();
        let p2 = path.clone();
        s.spawn(move || {
            let p = open(&p2);
            let ep = Endpoint::establish(&p, 0, timeout, |h| {
                to_drv
                    .send(h)
                    .map_err(|e| ibnet_tools::Error(e.to_string()))?;
                from_drv
                    .recv()
                    .map_err(|e| ibnet_tools::Error(e.to_string()))
            })
            .expect("responder establish");
            for &size in &c2.sizes {
                let st = c2.step(size);
                let t = respond_step(&ep, &st, || {
                    ready_tx
                        .send(())
                        .map_err(|e| ibnet_tools::Error(e.to_string()))
                })
                .expect("respond");
                assert_eq!(t.bad, 0, "{:?}", t.first);
            }
            ep.close().expect("close");
        });
        let p = open(&path);
        let ep = Endpoint::establish(&p, 0, timeout, |h| {
            to_resp
                .send(h)
                .map_err(|e| ibnet_tools::Error(e.to_string()))?;
            from_resp
                .recv()
                .map_err(|e| ibnet_tools::Error(e.to_string()))
        })
        .expect("driver establish");
        let mut out = Vec::new();
        for &size in &cfg.sizes {
            let st = cfg.step(size);
            ready_rx.recv().expect("responder ready");
            let (_, secs, t) = drive_step(&ep, &st).expect("drive");
            assert_eq!(t.bad, 0, "{:?}", t.first);
            out.push(ibnet_tools::sweep::row(&st, None, secs, 0).bw_gbps);
        }
        ep.close().expect("close");
        out
    })
}

/// GB/s of `f` copying `size` bytes, repeated to about `budget` bytes.
fn rate(size: usize, budget: u64, mut f: impl FnMut()) -> f64 {
    let n = (budget / size as u64).clamp(3, 100_000);
    f();
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    n as f64 * size as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` probing
    }
    if std::env::var_os("IBNET_PROVIDER").is_none()
        && !std::path::Path::new("/sys/class/infiniband")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some())
    {
        // No RDMA NIC: the soft provider (set before the plugin's init reads it).
        std::env::set_var("IBNET_PROVIDER", "soft");
    }
    let budget = 256u64 << 20;
    let cfg = RunConfig {
        sizes: SIZES.to_vec(),
        iters: 2000,
        warmup: 8,
        budget,
        ..RunConfig::default()
    };
    let ib = ibnet(&cfg);
    println!(
        "perf_loopback (provider {}): bandwidth GB/s",
        std::env::var("IBNET_PROVIDER").unwrap_or_else(|_| "auto".into())
    );
    println!(
        "{:>8} {:>10} {:>10} {:>12} {:>12} {:>14}",
        "size", "ibnet", "memcpy", "vm_writev", "ibnet/memcpy", "ibnet/vm_writev"
    );
    for (i, &size) in SIZES.iter().enumerate() {
        let src = AlignedBuf::new(size).expect("alloc");
        let mut dst = AlignedBuf::new(size).expect("alloc");
        let s = src.slice(0, size);
        let mc = rate(size, budget, || dst.slice_mut(0, size).copy_from_slice(s));
        let dp = dst.as_ptr();
        let vm = rate(size, budget, || {
            let local = libc::iovec {
                iov_base: s.as_ptr() as *mut libc::c_void,
                iov_len: size,
            };
            let remote = libc::iovec {
                iov_base: dp.cast(),
                iov_len: size,
            };
            // SAFETY: both iovecs describe live buffers of `size` bytes in this process.
            let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
            assert_eq!(n, size as isize, "process_vm_writev");
        });
        println!(
            "{:>8} {:>10.3} {:>10.3} {:>12.3} {:>12.2} {:>14.2}",
            ibnet_tools::fmt_bytes(size as u64),
            ib[i],
            mc,
            vm,
            ib[i] / mc,
            ib[i] / vm
        );
    }
}
