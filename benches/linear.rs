//! Criterion benches of the CPU kernels on the 27B-class shapes:
//! 5120x17408 K=2 (gate/up-like) and 17408x5120 K=3 (down-like), at M = 1,
//! 8 and 64 rows, single thread. Throughput is reported in weights
//! (IC * OC * M multiply-adds per call), so "elements/s" reads as weights/s.
//!
//! `cargo bench --bench linear` (set ESCHA_CPU_ISA to pin a path).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use escha_ggml::cpu::{CpuLinear, Kernel};
use escha_ggml::testutil::{RandomLinear, Rng};
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let kernel = Kernel::best();
    let mut g = c.benchmark_group(format!("escha_linear_{}", kernel.isa().name()));
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for (k, ic, oc) in [(2usize, 5120usize, 17408usize), (3, 17408, 5120)] {
        let mut rng = Rng::new(1);
        let problem = RandomLinear::new(1, k, ic, oc, false, false);
        let lin = CpuLinear::new(&problem.linear(), kernel).unwrap();
        for m in [1usize, 8, 64] {
            let x = rng.f32s(m * ic, 0.0, 1.0);
            let mut xh = vec![0f32; m * ic];
            let mut y = vec![0f32; m * oc];
            let mut scratch = vec![0f32; lin.scratch_floats(m)];
            g.throughput(Throughput::Elements((ic * oc * m) as u64));
            g.bench_with_input(BenchmarkId::new(format!("{ic}x{oc}_k{k}"), format!("m{m}")), &m, |b, &m| {
                b.iter(|| {
                    lin.forward_into(&x, m, &mut xh, &mut y, &mut scratch);
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
