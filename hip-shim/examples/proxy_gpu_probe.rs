//! The proxy engine with its banks in GPU memory, on a real GPU: `ibnet_hip::proxy_probe`
//! (SIMPLE send + receive connections with GPU-direct buffers from `cuMemAlloc`, `SendMem` /
//! `RecvMem` in pinned host memory, a loopback net copying device to device with
//! `cuMemcpyDtoD`, two host threads standing in for the kernels and writing / reading the
//! device slots with `cuMemcpyHtoD` / `cuMemcpyDtoH`; every byte of every step verified).
//!
//! ```text
//! cargo run --release -p ibnet-hip --example proxy_gpu_probe            # GPU 0, 2,500 ops
//! cargo run --release -p ibnet-hip --example proxy_gpu_probe -- 1 100   # GPU 1, 100 ops
//! ```
//! Prints one `proxy_gpu_probe: PASS ...` or `proxy_gpu_probe: FAIL ...` line. Exit status: 0
//! pass, 1 fail, 2 no CUDA runtime.

use std::process::ExitCode;

use ibnet_hip::{proxy_probe, GpuRuntime};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let dev: i32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let ops: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2500);
    let rt = match GpuRuntime::detect() {
        Ok(rt) => rt,
        Err(e) => {
            println!("proxy_gpu_probe: FAIL no GPU runtime: {e}");
            return ExitCode::from(2);
        }
    };
    println!("proxy_gpu_probe: {}", rt.describe());
    match proxy_probe::run(&rt, dev, ops) {
        Ok(r) => {
            println!(
                "proxy_gpu_probe: PASS GPU {dev}: {} ops, {} steps, {} bytes verified byte for \
                 byte, {} bytes copied device to device by the net",
                r.ops, r.steps, r.bytes, r.copied
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("proxy_gpu_probe: FAIL GPU {dev}: {e}");
            ExitCode::from(1)
        }
    }
}
