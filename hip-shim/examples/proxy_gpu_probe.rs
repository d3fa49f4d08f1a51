//! The proxy engine with its banks in GPU memory, on a real GPU:
//! 1. `ibnet_hip::proxy_probe::run`: SIMPLE send + receive connections with GPU-direct buffers
//!    from `cuMemAlloc`, `SendMem` / `RecvMem` in pinned mapped host memory, a loopback net
//!    copying device to device with `cuMemcpyDtoD`, two host threads standing in for the
//!    kernels and writing / reading the device slots with `cuMemcpyHtoD` / `cuMemcpyDtoH`;
//!    every byte of every step verified;
//! 2. the provider's cross-process export: a 1 MiB device bank filled with a pattern,
//!    exported as a CUDA IPC descriptor, imported by a second process (this binary re-executed
//!    with `--import <descriptor>`), read back through the driver and compared byte for byte.
//!
//! ```text
//! cargo run --release -p ibnet-hip --example proxy_gpu_probe            # GPU 0, 2,500 ops
//! cargo run --release -p ibnet-hip --example proxy_gpu_probe -- 1 100   # GPU 1, 100 ops
//! ```
//! The last line is `proxy_gpu_probe: PASS` or `proxy_gpu_probe: FAIL ...`. Exit status: 0
//! pass, 1 fail, 2 no CUDA runtime.

use std::process::{Command, ExitCode};

use ibnet_hip::{proxy_probe, CudaProxyMem, GpuRuntime};
use ibnet_proxy::{BankDesc, MemProvider};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; BankDesc::BYTES]> {
    let mut out = [0u8; BankDesc::BYTES];
    if s.len() != 2 * out.len() {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The importing process: `--import DEV HEX`.
fn import(rt: &GpuRuntime, dev: i32, hex: &str) -> ExitCode {
    let r = unhex(hex)
        .ok_or_else(|| "malformed descriptor".to_string())
        .and_then(|b| BankDesc::from_bytes(&b).map_err(|e| e.to_string()))
        .and_then(|d| proxy_probe::ipc_import_and_verify(rt, dev, &d));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("proxy_gpu_probe: importer: {e}");
            ExitCode::from(1)
        }
    }
}

/// Step 2 (see the module doc).
fn ipc_check(rt: &GpuRuntime, dev: i32) -> Result<(), String> {
    let mut mem = CudaProxyMem::new(rt, dev).map_err(|e| e.to_string())?;
    let (region, desc) = proxy_probe::ipc_export(&mut mem, rt)?;
    let out = std::env::current_exe()
        .map_err(|e| e.to_string())
        .and_then(|exe| {
            Command::new(exe)
                .args(["--import", &dev.to_string(), &hex(&desc.to_bytes())])
                .output()
                .map_err(|e| e.to_string())
        });
    let freed = mem.free(region).map_err(|e| e.to_string());
    let out = out?;
    freed?;
    if !out.status.success() {
        return Err(format!(
            "the importing process failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match GpuRuntime::detect_on(
        ibnet_hip::Host::system().with_env(ibnet_hip::Env::Lookup(|k| std::env::var(k).ok())),
    ) {
        Ok(rt) => rt,
        Err(e) => {
            println!("proxy_gpu_probe: FAIL no GPU runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if args.first().map(String::as_str) == Some("--import") {
        let dev = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
        return import(&rt, dev, args.get(2).map_or("", String::as_str));
    }
    let dev: i32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(0);
    let ops: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2500);
    println!("proxy_gpu_probe: {}", rt.describe());
    let mut failed = false;
    match proxy_probe::run(&rt, dev, ops) {
        Ok(r) => println!(
            "proxy_gpu_probe: engine PASS on GPU {dev}: {} ops, {} steps, {} bytes verified \
             byte for byte, {} bytes copied device to device by the net",
            r.ops, r.steps, r.bytes, r.copied
        ),
        Err(e) => {
            println!("proxy_gpu_probe: engine FAIL on GPU {dev}: {e}");
            failed = true;
        }
    }
    match ipc_check(&rt, dev) {
        Ok(()) => println!(
            "proxy_gpu_probe: IPC PASS: a {} byte device bank exported (CUDA IPC), imported by \
             a second process, verified byte for byte",
            proxy_probe::IPC_LEN
        ),
        Err(e) => {
            println!("proxy_gpu_probe: IPC FAIL: {e}");
            failed = true;
        }
    }
    if failed {
        println!("proxy_gpu_probe: FAIL");
        ExitCode::from(1)
    } else {
        println!("proxy_gpu_probe: PASS");
        ExitCode::SUCCESS
    }
}
