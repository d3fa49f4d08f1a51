//! One message cycle — `irecv` + `isend` + `test` on both sides — through ibnet-core's comms
//! over the in-process loopback provider (`ibnet-testkit`), at 8 B and 64 KiB. This measures the
//! protocol's own cost (FIFO post and poll, request pool, WR building, completion handling)
//! plus the double's synchronous copy; no network, no threads.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ibnet_core::comm::{CommConfig, RecvBuf};
use ibnet_testkit::{connect_pair, AlignedBuf, Loopback};

fn cycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("comm_cycle");
    for size in [8usize, 64 << 10] {
        let dev = Loopback::new();
        let (mut s, mut r) = connect_pair(&dev, CommConfig::default()).expect("connect");
        let src = AlignedBuf::new(size);
        let dst = AlignedBuf::new(size);
        let sk = dev.register(src.addr(), size as u64).expect("reg").0;
        let rk = dev.register(dst.addr(), size as u64).expect("reg").0;
        let buf = [RecvBuf {
            addr: dst.addr(),
            size: size as u64,
            tag: 1,
            mr: rk,
        }];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let rid = r.irecv(&buf).expect("irecv").expect("posted");
                let sid = s
                    .isend(src.addr(), size as u64, 1, sk)
                    .expect("isend")
                    .expect("matched");
                while s.test(sid).expect("test").is_none() {}
                while r.test(rid).expect("test").is_none() {}
            })
        });
    }
    g.finish();
}

criterion_group!(benches, cycle);
criterion_main!(benches);
