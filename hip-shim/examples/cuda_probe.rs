//! GPU probe for `ibnet-hip`: prints what the plugin would decide and exercises DMA-BUF export.
//!
//! Builds anywhere (no CUDA at build time); run it on a GPU machine:
//!
//! ```text
//! cargo run -p ibnet-hip --example cuda_probe            # IBNET_GPU=cuda to insist on CUDA
//! ```
//!
//! Steps: detect → decisions (GDR, GPU_DIRECT_RDMA attribute, DMA-BUF per GPU) → allocate 8 MiB
//! on GPU 0 → write/read back a pattern → pointer kinds (device and host) → export the whole
//! buffer and an unaligned sub-range as DMA-BUF fds, `fstat` each, close them.
//!
//! Exit status: 0 all checks passed, 1 a check failed, 2 no GPU runtime.

use std::fs::File;
use std::process::ExitCode;

use ibnet_hip::{DmaBuf, GpuRuntime, PointerKind};

const LEN: usize = 8 << 20;

struct Checks {
    failed: u32,
}

impl Checks {
    fn ok(&mut self, what: &str, cond: bool, detail: impl std::fmt::Display) {
        println!(
            "cuda_probe: {} {what}: {detail}",
            if cond { "PASS" } else { "FAIL" }
        );
        if !cond {
            self.failed += 1;
        }
    }
}

/// fstat()s the DMA-BUF (consuming, hence closing, the fd) and returns its size.
fn fstat_and_close(buf: DmaBuf) -> std::io::Result<u64> {
    let f = File::from(buf.fd);
    let m = f.metadata()?;
    Ok(m.len())
}

fn main() -> ExitCode {
    let rt = match GpuRuntime::detect_on(
        ibnet_hip::Host::system().with_env(ibnet_hip::Env::Lookup(|k| std::env::var(k).ok())),
    ) {
        Ok(rt) => rt,
        Err(e) => {
            println!("cuda_probe: {e}");
            return ExitCode::from(2);
        }
    };
    println!("cuda_probe: runtime: {}", rt.describe());
    println!("cuda_probe: gdr (peer memory): {}", rt.gdr_support());
    let mut c = Checks { failed: 0 };
    let mut dmabuf_ok = Vec::new();
    for dev in 0..rt.device_count() {
        match rt.gpu_direct_rdma_attribute(dev) {
            Ok(v) => println!(
                "cuda_probe: GPU {dev} GPU_DIRECT_RDMA_SUPPORTED={}",
                u8::from(v)
            ),
            Err(e) => println!("cuda_probe: GPU {dev} GPU_DIRECT_RDMA_SUPPORTED: {e}"),
        }
        let d = rt.dmabuf_support(dev);
        println!("cuda_probe: GPU {dev} dmabuf: {d}");
        dmabuf_ok.push(d.enabled);
    }

    let buf = match rt.alloc(0, LEN) {
        Ok(b) => b,
        Err(e) => {
            c.ok("alloc 8 MiB on GPU 0", false, e);
            return ExitCode::from(1);
        }
    };
    c.ok("alloc", true, format!("{buf:?}"));

    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; LEN];
    let rw = buf.write(0, &pattern).and_then(|()| buf.read(0, &mut back));
    c.ok(
        "write+read back 8 MiB",
        rw.is_ok() && back == pattern,
        format!("{rw:?}"),
    );
    c.ok(
        "copy past the end is refused",
        buf.write(LEN - 1, &[0, 0]).is_err(),
        "InvalidArgument expected",
    );

    let kind = rt.pointer_kind(buf.as_ptr());
    c.ok(
        "pointer_kind(device)",
        matches!(kind, Ok(PointerKind::Device { device: 0 })),
        format!("{kind:?}"),
    );
    let host = pattern.as_ptr().cast();
    let hkind = rt.pointer_kind(host);
    c.ok(
        "pointer_kind(host Vec)",
        matches!(hkind, Ok(PointerKind::Unregistered)),
        format!("{hkind:?}"),
    );

    let export_host = rt.export_dmabuf(host, 4096);
    c.ok(
        "export of host memory is refused",
        export_host.is_err(),
        format!("{export_host:?}"),
    );

    if !dmabuf_ok.first().copied().unwrap_or(false) {
        println!("cuda_probe: SKIP DMA-BUF export: GPU 0 reports no DMA-BUF support");
    } else {
        match rt.export_dmabuf(buf.as_ptr(), LEN) {
            Ok(d) => {
                let (off, len) = (d.offset, d.len);
                let size = fstat_and_close(d);
                let good = matches!(size, Ok(s) if off + len as u64 <= s);
                c.ok(
                    "export whole buffer + fstat",
                    good,
                    format!("offset={off} len={len} fstat={size:?}"),
                );
            }
            Err(e) => c.ok("export whole buffer", false, e),
        }
        let sub = buf.as_ptr().cast::<u8>().wrapping_add(5000).cast();
        match rt.export_dmabuf(sub, 100) {
            Ok(d) => {
                let (off, len) = (d.offset, d.len);
                let size = fstat_and_close(d);
                let good = off > 0 && matches!(size, Ok(s) if off + len as u64 <= s);
                c.ok(
                    "export unaligned sub-range + fstat",
                    good,
                    format!("offset={off} len={len} fstat={size:?}"),
                );
            }
            Err(e) => c.ok("export unaligned sub-range", false, e),
        }
    }
    drop(buf);
    println!("cuda_probe: done, {} failed check(s)", c.failed);
    if c.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
