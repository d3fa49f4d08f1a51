//! The CUDA path end to end against a fake driver (`tests/fake_cuda.c`, built with `cc`):
//! symbol resolution and prototypes, context handling, pointer kinds, device copies, the
//! DMA-BUF decision chain and fd export (page-aligned window, whole-allocation fallback).
//!
//! Needs a C compiler (`cc`), which CI installs; no GPU.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use ibnet_hip::proxy_probe::{self, step_len, STEPS_PER_OP};
use ibnet_hip::{CudaProxyMem, DeviceCopier, Env, Error, GpuRuntime, Host, PointerKind, Vendor};
use ibnet_proxy::{BankDesc, HandleKind, MemKind, MemProvider};

/// Compiles the fake driver once per test binary; returns the `.so` path.
fn build_fake() -> PathBuf {
    static SO: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SO.get_or_init(build_fake_once).clone()
}

fn build_fake_once() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ibnet-hip-fakecuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let so = dir.join("libcuda.so.1");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda.c");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-lpthread")
        .output()
        .expect("a C compiler (cc) is needed to build the fake CUDA driver");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

/// The host page size, from `getconf` (keeps this test free of `unsafe`).
fn page_size() -> u64 {
    let out = Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("page size")
}

fn fstat_len(fd: std::os::fd::OwnedFd) -> u64 {
    File::from(fd).metadata().expect("fstat").len()
}

#[test]
fn cuda_path_against_fake_driver() {
    let so = build_fake();
    let so_str = so.to_str().expect("utf-8 path");
    let host = |extra: &[(&str, &str)]| {
        let mut vars = vec![("IBNET_GPU", "cuda"), ("IBNET_CUDA_LIB", so_str)];
        vars.extend_from_slice(extra);
        Host::system().with_env(Env::fixed(vars))
    };

    let rt = GpuRuntime::detect_on(host(&[])).expect("fake driver detected");
    assert_eq!(rt.vendor(), Vendor::Nvidia);
    assert_eq!(rt.device_count(), 2);
    assert_eq!(rt.describe(), "CUDA driver 12080, 2 GPU(s)");
    assert!(rt.gpu_direct_rdma_attribute(0).unwrap());
    assert!(
        rt.gpu_direct_rdma_attribute(7).is_err(),
        "bad ordinal is an error"
    );

    // DMA-BUF decisions: the attribute decides per GPU; the env var switches it off.
    let d0 = rt.dmabuf_support(0);
    assert!(d0.enabled, "{d0}");
    assert!(d0.reason.contains("DMA_BUF_SUPPORTED=1 on GPU 0"), "{d0}");
    let d1 = rt.dmabuf_support(1);
    assert!(!d1.enabled && d1.reason.contains("=0 on GPU 1"), "{d1}");
    let off = GpuRuntime::detect_on(host(&[("NCCL_DMABUF_ENABLE", "0")])).unwrap();
    assert!(!off.dmabuf_support(0).enabled);

    // Allocation, copies, bounds.
    let buf = rt.alloc(0, 1 << 20).expect("alloc");
    let pattern: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    buf.write(0, &pattern).unwrap();
    let mut back = vec![0u8; pattern.len()];
    buf.read(0, &mut back).unwrap();
    assert_eq!(back, pattern);
    let mut tail = [0u8; 16];
    buf.read((1 << 20) - 16, &mut tail).unwrap();
    assert_eq!(&tail[..], &pattern[(1 << 20) - 16..]);
    assert!(matches!(
        buf.write((1 << 20) - 1, &[1, 2]),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        buf.read(usize::MAX, &mut [0u8; 1]),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(rt.alloc(0, 0), Err(Error::InvalidArgument { .. })));

    // Pointer kinds: device (with its ordinal, also inside), host, NULL.
    let on1 = rt.alloc(1, 4096).unwrap();
    assert_eq!(
        rt.pointer_kind(buf.as_ptr()).unwrap(),
        PointerKind::Device { device: 0 }
    );
    let inner = buf.as_ptr().cast::<u8>().wrapping_add(12345).cast();
    assert_eq!(
        rt.pointer_kind(inner).unwrap(),
        PointerKind::Device { device: 0 }
    );
    assert_eq!(
        rt.pointer_kind(on1.as_ptr()).unwrap(),
        PointerKind::Device { device: 1 }
    );
    assert_eq!(
        rt.pointer_kind(pattern.as_ptr().cast()).unwrap(),
        PointerKind::Unregistered
    );
    assert_eq!(
        rt.pointer_kind(std::ptr::null()).unwrap(),
        PointerKind::Unregistered
    );

    // Export: whole buffer, unaligned sub-range (widened to pages), bad inputs.
    let page = page_size();
    let whole = rt
        .export_dmabuf(buf.as_ptr(), 1 << 20)
        .expect("export whole");
    assert_eq!((whole.offset, whole.len), (0, 1 << 20));
    assert_eq!(fstat_len(whole.fd), 1 << 20);
    let sub = rt
        .export_dmabuf(buf.as_ptr().cast::<u8>().wrapping_add(5000).cast(), 100)
        .unwrap();
    assert_eq!(sub.offset, 5000 % page);
    assert_eq!(fstat_len(sub.fd), page);
    assert!(matches!(
        rt.export_dmabuf(pattern.as_ptr().cast(), 64),
        Err(Error::InvalidArgument {
            what: "not CUDA device memory"
        })
    ));
    assert!(matches!(
        rt.export_dmabuf(std::ptr::null(), 64),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        rt.export_dmabuf(buf.as_ptr(), 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        rt.export_dmabuf(buf.as_ptr(), (1 << 20) + 1),
        Err(Error::InvalidArgument {
            what: "range is not inside one device allocation"
        })
    ));

    // An allocation whose size is not a page multiple: the widened window would end off-page,
    // the fake refuses it, and the export falls back to the whole allocation.
    let odd = rt.alloc(0, 10_000).unwrap();
    let near_end = odd.as_ptr().cast::<u8>().wrapping_add(9000).cast();
    let e = rt.export_dmabuf(near_end, 500).expect("fallback export");
    assert_eq!(e.offset, 9000);
    assert_eq!(fstat_len(e.fd), 10_000);

    drop((buf, on1, odd));
    let _ = std::fs::remove_dir_all(so.parent().unwrap());
}

#[test]
fn wrong_library_is_reported_not_loaded() {
    // A library that exists but is not a CUDA driver: the missing symbol is named.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("a libc.so.6 to load");
    let h = Host::system().with_env(Env::fixed([
        ("IBNET_GPU", "cuda"),
        ("IBNET_CUDA_LIB", libc),
    ]));
    match GpuRuntime::detect_on(h) {
        Err(Error::NotPresent { reason }) => {
            assert!(reason.contains("lacks symbol cuInit"), "{reason}")
        }
        other => panic!("expected NotPresent, got {other:?}"),
    }
}

fn fake_runtime() -> GpuRuntime {
    let so = build_fake();
    let vars = vec![
        ("IBNET_GPU", "cuda"),
        ("IBNET_CUDA_LIB", so.to_str().expect("utf-8 path")),
    ];
    GpuRuntime::detect_on(Host::system().with_env(Env::fixed(vars))).expect("fake driver")
}

/// The GPU probe's whole path (engine, device banks, copy net, host "kernels") against the
/// fake driver: every step verified, every allocation given back.
#[test]
fn proxy_probe_against_fake_driver() {
    let rt = fake_runtime();
    let r = proxy_probe::run(&rt, 0, 250).expect("probe");
    let steps = 250 * STEPS_PER_OP;
    let want: u64 = (0..steps).map(|k| step_len(k) as u64).sum();
    assert_eq!((r.ops, r.steps, r.bytes), (250, steps, want));
    assert_eq!(
        r.copied, want,
        "every byte crossed the net device to device"
    );
}

#[test]
fn cuda_proxy_mem_allocates_exports_and_imports() {
    let rt = fake_runtime();
    let mut m = CudaProxyMem::new(&rt, 0).expect("provider");
    let d = m.alloc(MemKind::Device, 10_000).expect("device bank");
    assert_eq!(d.cpu() % 4096, 0);
    let mut back = vec![1u8; 10_000];
    let cp = DeviceCopier::new(&rt, 0).unwrap();
    cp.read(d.cpu(), &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "device banks are zeroed");
    let h = m.alloc(MemKind::Host, 5000).expect("host bank");
    assert_eq!(
        (h.cpu() % 4096, h.gpu()),
        (0, h.cpu()),
        "mapped pinned memory"
    );

    let desc = m.export(&d).expect("IPC export");
    assert_eq!(desc.kind().unwrap(), HandleKind::CudaIpc);
    assert_eq!((desc.size, desc.offset), (10_000, 0));
    assert!(m.export(&h).is_err(), "host banks go through shared memory");

    let mut other = CudaProxyMem::new(&rt, 0).unwrap();
    let i = other.import(&desc).expect("IPC import");
    assert_eq!((i.cpu(), i.size()), (d.cpu(), 10_000));
    cp.write(d.cpu() + 100, b"seen").unwrap();
    let mut w = [0u8; 4];
    cp.read(i.cpu() + 100, &mut w).unwrap();
    assert_eq!(&w, b"seen");
    assert!(other.free(i).is_err(), "an import is not freed");
    assert!(m.unimport(d).is_err(), "an allocation is not unimported");
    other.unimport(i).expect("unimport");
    assert_eq!(other.live(), 0);
    let fd = BankDesc::new(HandleKind::ProcessFd, 4096, 0, 1, &[0; 24]).unwrap();
    assert!(other.import(&fd).is_err(), "not a CUDA IPC handle");

    m.free(d).unwrap();
    m.free(h).unwrap();
    assert_eq!(m.live(), 0);
}
