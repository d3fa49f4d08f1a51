//! The proxy engine's cost: the same transfers through the engine (`ProxyState` + `InProcessNet`)
//! and through the bare comms, over the same provider, in the same run. Two providers:
//! `loop` (the in-process loopback double: a synchronous copy at post time) and `soft`
//! (ibnet-soft, in-process fabric: copies on its engine threads, completions polled).
//!
//! * `bare/<prov>/<size>`: 64 messages of `size` bytes over a send/recv comm pair, with the
//!   engine's pipelining (up to [`STEPS`] receives and sends in flight, 8 slots used in turn:
//!   the same depth and memory footprint as the engine).
//! * `engine/<prov>/<size>`: one send and one receive op of 64 SIMPLE steps of `size` bytes;
//!   the "GPU" of both sides runs inline on the proxy thread (publish size + tail when
//!   credited; consume on tail), so only the engine and the provider are measured.
//!
//! Every buffer is written before measuring: a never-written heap buffer reads from the
//! kernel's shared zero page (always in cache), which made the bare sender look faster than a
//! sender reading real memory.
//!
//! After criterion's runs, a summary (when run with `--bench`; `IBNET_PROXY_SUMMARY=0` skips
//! it) alternates bare and engine batches at 8 B, 64 KiB and 1 MiB per provider and prints
//! the median time per step of each, the throughput ratio engine/bare (= bare time / engine
//! time) and the engine's overhead per step (engine − bare). `IBNET_PROXY_CRITERION=0` skips
//! criterion's runs (summary only).

use std::time::Instant;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use ibnet_benches::rig::{Bare, Engine, MSGS};
use ibnet_core::provider::Provider;
use ibnet_soft::SoftProvider;
use ibnet_testkit::Loopback;

const SIZES: [usize; 3] = [8, 64 << 10, 1 << 20];

fn bench_provider<P: Provider + Clone>(c: &mut Criterion, name: &str, dev: &P) {
    let mut g = c.benchmark_group("proxy");
    for size in SIZES {
        g.throughput(Throughput::Bytes(size as u64 * MSGS));
        let mut bare = Bare::new(dev, size);
        g.bench_function(BenchmarkId::new(format!("bare/{name}"), size), |b| {
            b.iter(|| bare.batch())
        });
        drop(bare);
        let mut eng = Engine::new(dev, size);
        g.bench_function(BenchmarkId::new(format!("engine/{name}"), size), |b| {
            b.iter(|| eng.batch())
        });
    }
    g.finish();
}

/// Median nanoseconds per step of bare and engine batches, measured alternately.
fn summary_one<P: Provider + Clone>(name: &str, dev: &P, size: usize) {
    let mut bare = Bare::new(dev, size);
    let mut eng = Engine::new(dev, size);
    // Warm up both (page faults, caches, the provider's threads).
    for _ in 0..4 {
        bare.batch();
        eng.batch();
    }
    let rounds = if size >= 1 << 20 { 15 } else { 41 };
    let per = if size >= 1 << 20 { 1 } else { 8 };
    let (mut tb, mut te) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..per {
            bare.batch();
        }
        tb.push(t.elapsed().as_nanos() as f64 / (per as u64 * MSGS) as f64);
        let t = Instant::now();
        for _ in 0..per {
            eng.batch();
        }
        te.push(t.elapsed().as_nanos() as f64 / (per as u64 * MSGS) as f64);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, e) = (med(&mut tb), med(&mut te));
    println!(
        "proxy summary {name:>4} {size:>8} B: bare {b:>9.0} ns/step ({:>6.2} GiB/s), engine \
         {e:>9.0} ns/step ({:>6.2} GiB/s), engine/bare throughput {:.2}, engine overhead \
         {:>6.0} ns/step",
        size as f64 / b / 1.073_741_824,
        size as f64 / e / 1.073_741_824,
        b / e,
        e - b,
    );
}

fn summary(loopback: &Loopback, soft: &SoftProvider) {
    for size in SIZES {
        summary_one("loop", loopback, size);
        summary_one("soft", soft, size);
    }
}

fn bench(c: &mut Criterion) {
    let lo = Loopback::new();
    bench_provider(c, "loop", &lo);
    let soft = SoftProvider::open().expect("soft provider");
    bench_provider(c, "soft", &soft);
    soft.shutdown();
}

criterion_group!(benches, bench);

fn main() {
    // IBNET_PROXY_CRITERION=0: only the summary (benches/run-perf-issue.sh).
    if std::env::var("IBNET_PROXY_CRITERION").as_deref() != Ok("0") {
        benches();
    }
    Criterion::default().configure_from_args().final_summary();
    let bench_mode = std::env::args().any(|a| a == "--bench");
    if bench_mode && std::env::var("IBNET_PROXY_SUMMARY").as_deref() != Ok("0") {
        let lo = Loopback::new();
        let soft = SoftProvider::open().expect("soft provider");
        summary(&lo, &soft);
        soft.shutdown();
    }
}
