//! The proxy engine with its banks in GPU memory: one send and one receive connection
//! (SIMPLE, GPU-direct: both buffers in device memory from [`CudaProxyMem`], `SendMem` /
//! `RecvMem` in pinned host memory), the [`CopyNet`] moving slots device to device through
//! the driver, and two host threads standing in for the kernels:
//!
//! ```text
//!  "send kernel" thread           proxy (this thread)               "recv kernel" thread
//!  wait credit (head, host)       ProxyOp send/recv per op          wait tail > k (host)
//!  pattern ─cuMemcpyHtoD─▶ slot   isend/irecv ─cuMemcpyDtoD─▶       slot ─cuMemcpyDtoH─▶ check
//!  size, tail                     progress until both done          every byte; head = k+1
//! ```
//! [`run`] returns what was verified; every failure is an error naming what differed. Used
//! by the `proxy_gpu_probe` example on a GPU host and by the fake-driver test.
#![allow(unsafe_code)] // the host "kernels" over raw views, the copy net's copies: SAFETY below.

use std::sync::atomic::{AtomicBool, Ordering};

use ibnet_proxy::map::Side;
use ibnet_proxy::{
    DeviceRecv, DeviceSend, DeviceView, Dir, Protocol, ProxyConfig, ProxyOp, ProxyState, SetupReq,
    SubArgs, STEPS,
};

use crate::copy_net::CopyNet;
use crate::proxy_mem::{CudaProxyMem, DeviceCopier};
use crate::runtime::GpuRuntime;

/// Ring steps per operation.
pub const STEPS_PER_OP: u64 = 4;
/// Bytes of one SIMPLE slot.
pub const SLOT: usize = 64 << 10;

/// What a probe run verified.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeReport {
    /// Operations completed.
    pub ops: usize,
    /// Steps verified by the receiving "kernel".
    pub steps: u64,
    /// Payload bytes verified byte for byte.
    pub bytes: u64,
    /// Bytes the net copied device to device.
    pub copied: u64,
}

/// Payload bytes of ring step `k` (1..=SLOT, deterministic).
pub fn step_len(k: u64) -> usize {
    if k % 5 == 2 {
        return SLOT;
    }
    1 + ((k.wrapping_mul(2_654_435_761) >> 7) % SLOT as u64) as usize
}

/// The payload of step `k`.
fn pattern(k: u64, len: usize) -> Vec<u8> {
    let mut x = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

type Px<'a, 'rt> = ProxyState<CopyNet<'a>, CudaProxyMem<'rt>, 4>;

/// The view with its counters at their host (`cpu`) addresses, which the host threads use.
fn host_view<'a, 'rt>(px: &Px<'a, 'rt>, c: ibnet_proxy::ConnId) -> Result<DeviceView, String> {
    let e = |e: ibnet_core::Error| e.to_string();
    let mut v = px.device_view(c).map_err(e)?;
    let m = px.map(c).map_err(e)?;
    let host = |o| m.pointer(o, Side::Cpu).ok_or("host bank not mapped");
    let (send_mem, recv_mem) = (host(m.send_mem)?, host(m.recv_mem)?);
    v.head = send_mem;
    v.tail = recv_mem;
    v.recv_mem = recv_mem;
    Ok(v)
}

fn send_kernel(
    rt: &GpuRuntime,
    dev: i32,
    v: DeviceView,
    steps: u64,
    stop: &AtomicBool,
) -> Result<(), String> {
    let cp = DeviceCopier::new(rt, dev).map_err(|e| e.to_string())?;
    // SAFETY: the connection stays connected until the proxy joins this thread; the
    // counters are host addresses of pinned host memory (host_view).
    let d = unsafe { DeviceSend::from_view(&v) }.map_err(|e| e.to_string())?;
    let slot = v.buff_sizes[Protocol::Simple.index()] / STEPS;
    for k in 0..steps {
        while !d.has_credit(k) {
            // Relaxed: a bare flag; nothing is published through it (the scope's join orders
            // the rest), so it only has to be seen eventually.
            if stop.load(Ordering::Relaxed) {
                return Err("stopped".into());
            }
            std::thread::yield_now();
        }
        let data = pattern(k, step_len(k));
        let at = v.buffs[Protocol::Simple.index()] + (k % STEPS as u64) * slot as u64;
        cp.write(at, &data)
            .map_err(|e| format!("step {k}: write: {e}"))?;
        d.publish(k, data.len() as u64);
        d.advance(k + 1);
    }
    Ok(())
}

fn recv_kernel(
    rt: &GpuRuntime,
    dev: i32,
    v: DeviceView,
    steps: u64,
    stop: &AtomicBool,
) -> Result<u64, String> {
    let cp = DeviceCopier::new(rt, dev).map_err(|e| e.to_string())?;
    // SAFETY: as in `send_kernel`.
    let d = unsafe { DeviceRecv::from_view(&v) }.map_err(|e| e.to_string())?;
    let slot = v.buff_sizes[Protocol::Simple.index()] / STEPS;
    let mut bytes = 0u64;
    let mut got = vec![0u8; slot];
    for k in 0..steps {
        while !d.arrived(k) {
            // Relaxed: a bare flag, as in `send_kernel`.
            if stop.load(Ordering::Relaxed) {
                return Err("stopped".into());
            }
            std::thread::yield_now();
        }
        let want = pattern(k, step_len(k));
        let at = v.buffs[Protocol::Simple.index()] + (k % STEPS as u64) * slot as u64;
        cp.read(at, &mut got[..want.len()])
            .map_err(|e| format!("step {k}: read: {e}"))?;
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            return Err(format!(
                "step {k}: byte {i} is {:#x}, want {:#x}",
                got[i], want[i]
            ));
        }
        bytes += want.len() as u64;
        d.consume(k + 1);
    }
    Ok(bytes)
}

/// The proxy's side: `ops` send and receive operations over `s` and `r`, each progressed to
/// completion (an error when the kernels stopped first); returns the operations done.
fn drive(
    px: &mut Px<'_, '_>,
    s: ibnet_proxy::ConnId,
    r: ibnet_proxy::ConnId,
    ops: usize,
    kernels_done: impl Fn() -> bool,
) -> Result<usize, String> {
    let e = |e: ibnet_core::Error| e.to_string();
    for op in 0..ops {
        let mut so = ProxyOp::new(Dir::Send, Protocol::Simple, 1, 1).map_err(e)?;
        let mut ro = ProxyOp::new(Dir::Recv, Protocol::Simple, 1, 1).map_err(e)?;
        let base = op as u64 * STEPS_PER_OP;
        let n: usize = (base..base + STEPS_PER_OP).map(step_len).sum();
        so.push(SubArgs::new(s, STEPS_PER_OP, n)).map_err(e)?;
        ro.push(SubArgs::new(r, STEPS_PER_OP, n)).map_err(e)?;
        let (mut sd, mut rd, mut spins) = (false, false, 0u64);
        while !(sd && rd) {
            sd = sd || px.progress(&mut so).map_err(e)?.done;
            rd = rd || px.progress(&mut ro).map_err(e)?.done;
            spins += 1;
            if spins % 64 == 0 {
                if kernels_done() && !(sd && rd) {
                    return Err(format!("op {op}: the kernels stopped early"));
                }
                std::thread::yield_now();
            }
        }
        if so.bytes(0) != n as u64 {
            return Err(format!("op {op}: {} bytes sent, want {n}", so.bytes(0)));
        }
    }
    Ok(ops)
}

/// Runs `ops` operations of [`STEPS_PER_OP`] steps on GPU `dev` (see the module doc).
pub fn run(rt: &GpuRuntime, dev: i32, ops: usize) -> Result<ProbeReport, String> {
    let e = |e: ibnet_core::Error| e.to_string();
    let net_copier = DeviceCopier::new(rt, dev).map_err(|e| e.to_string())?;
    let net = CopyNet::new(Box::new(move |d, dd, s, sd, n| {
        // SAFETY: host ranges here are the engine's registered buffers (valid while
        // registered); device ranges are checked by the driver.
        unsafe { net_copier.copy(d, dd, s, sd, n) }.map_err(|_| ibnet_core::Error::Provider {
            call: "cuMemcpy (copy net)",
            errno: 0,
        })
    }));
    let mem = CudaProxyMem::new(rt, dev).map_err(|e| e.to_string())?;
    let cfg = ProxyConfig {
        buff_sizes: [8 * 2048, 8 * 4096, STEPS * SLOT],
        ..ProxyConfig::default()
    };
    let mut px: Px<'_, '_> = ProxyState::new(net, mem, cfg);
    let req = SetupReq {
        use_gdr: true,
        conn_index: 0,
        ..SetupReq::default()
    };
    let (r, h) = px
        .setup(Dir::Recv, SetupReq { tp_rank: 1, ..req })
        .map_err(e)?;
    let (s, _) = px
        .setup(
            Dir::Send,
            SetupReq {
                tp_remote_rank: 1,
                ..req
            },
        )
        .map_err(e)?;
    let h = h.ok_or("no handle")?;
    px.connect_send(s, &h)
        .map_err(e)?
        .ok_or("send not connected")?;
    px.connect_recv(r, 0)
        .map_err(e)?
        .ok_or("recv not connected")?;
    let (sv, rv) = (host_view(&px, s)?, host_view(&px, r)?);
    if px.map(s).map_err(e)?.buffs[Protocol::Simple.index()].is_dev()
        && px.map(r).map_err(e)?.buffs[Protocol::Simple.index()].is_dev()
    {
        // Both SIMPLE buffers in device memory, as intended.
    } else {
        return Err("SIMPLE buffers not in device memory".into());
    }
    let steps = ops as u64 * STEPS_PER_OP;
    let stop = AtomicBool::new(false);
    let mut report = ProbeReport::default();
    let result = std::thread::scope(|t| {
        let stop = &stop;
        let gs = t.spawn(move || send_kernel(rt, dev, sv, steps, stop));
        let gr = t.spawn(move || recv_kernel(rt, dev, rv, steps, stop));
        let drive = drive(&mut px, s, r, ops, || gs.is_finished() && gr.is_finished());
        if let Ok(n) = drive {
            report.ops = n;
        }
        if drive.is_err() {
            // Relaxed: a bare flag the kernel threads poll; nothing is published through it
            // (the joins below order what they did).
            stop.store(true, Ordering::Relaxed);
        }
        let sent = gs.join().map_err(|_| "send kernel panicked".to_string())?;
        let got = gr.join().map_err(|_| "recv kernel panicked".to_string())?;
        drive?;
        sent?;
        report.bytes = got?;
        report.steps = steps;
        Ok::<(), String>(())
    });
    report.copied = px.net().copied;
    let freed = px.free(s).and(px.free(r)).map_err(e);
    result?;
    freed?;
    if px.mem().live() != 0 {
        return Err(format!("{} GPU allocations left", px.mem().live()));
    }
    Ok(report)
}

/// Bytes of the IPC check's buffer.
pub const IPC_LEN: usize = 1 << 20;

/// The IPC check's exporting side: a device bank of [`IPC_LEN`] bytes on GPU `dev` filled
/// with a pattern, and its descriptor (CUDA IPC). Keep `mem` alive (and the region allocated)
/// until the importing process is done; free the region with `mem` afterwards.
pub fn ipc_export(
    mem: &mut CudaProxyMem<'_>,
    rt: &GpuRuntime,
) -> Result<(ibnet_proxy::Region, ibnet_proxy::BankDesc), String> {
    use ibnet_proxy::{MemKind, MemProvider};
    let r = mem
        .alloc(MemKind::Device, IPC_LEN)
        .map_err(|e| e.to_string())?;
    let cp = DeviceCopier::new(rt, mem.device()).map_err(|e| e.to_string())?;
    let done = cp
        .write(r.cpu(), &pattern(0x1bc, IPC_LEN))
        .map_err(|e| e.to_string())
        .and_then(|()| mem.export(&r).map_err(|e| e.to_string()));
    match done {
        Ok(d) => Ok((r, d)),
        Err(e) => {
            let _ = mem.free(r);
            Err(e)
        }
    }
}

/// The IPC check's importing side (another process, or the fake driver's): maps `d` on GPU
/// `dev`, reads it back through the driver, compares every byte, unmaps it.
pub fn ipc_import_and_verify(
    rt: &GpuRuntime,
    dev: i32,
    d: &ibnet_proxy::BankDesc,
) -> Result<(), String> {
    use ibnet_proxy::MemProvider;
    let mut mem = CudaProxyMem::new(rt, dev).map_err(|e| e.to_string())?;
    let r = mem.import(d).map_err(|e| e.to_string())?;
    let cp = DeviceCopier::new(rt, dev).map_err(|e| e.to_string())?;
    let mut got = vec![0u8; IPC_LEN];
    let read = cp.read(r.gpu(), &mut got).map_err(|e| e.to_string());
    let unmapped = mem.unimport(r).map_err(|e| e.to_string());
    read?;
    unmapped?;
    let want = pattern(0x1bc, IPC_LEN);
    match (0..IPC_LEN).find(|&i| got[i] != want[i]) {
        Some(i) => Err(format!(
            "imported byte {i} is {:#x}, want {:#x}",
            got[i], want[i]
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_lengths_cover_one_byte_to_a_full_slot() {
        let l: Vec<usize> = (0..1000).map(step_len).collect();
        assert!(l.iter().all(|&n| (1..=SLOT).contains(&n)));
        assert!(l.contains(&SLOT));
        assert!(l.iter().any(|&n| n < 4096));
        assert_eq!(pattern(3, 100), pattern(3, 100));
        assert_ne!(pattern(3, 100), pattern(4, 100));
    }
}
