//! Quick single-thread timing of the CPU kernels over several shapes and
//! batch sizes (best of 3 runs of about 2e9 multiply-adds each); a faster,
//! rougher companion to `cargo bench --bench linear`.
//!
//! `cargo run --release --example kernel_timing` (ESCHA_CPU_ISA caps the path;
//! ESCHA_TIMING_M=1,8 picks the batch sizes,
//! ESCHA_TIMING_SKIP=2 skips the first shapes, ESCHA_TIMING_SHAPE=K,IC,OC times
//! that one shape instead)

use escha_ggml::cpu::{CpuLinear, Kernel};
use escha_ggml::testutil::{RandomLinear, Rng};
fn main() {
    let kernel = Kernel::best();
    let ms: Vec<usize> = match std::env::var("ESCHA_TIMING_M") {
        Ok(v) => v.split(',').map(|m| m.trim().parse().expect("ESCHA_TIMING_M: batch sizes, e.g. 1,8")).collect(),
        Err(_) => vec![1, 8, 64],
    };
    let mut shapes = vec![(2usize, 1024usize, 1024usize), (3, 1024, 1024), (2, 5120, 17408), (3, 17408, 5120), (3, 5120, 17408), (2, 17408, 5120)];
    if let Ok(v) = std::env::var("ESCHA_TIMING_SHAPE") {
        let d: Vec<usize> = v.split(',').map(|d| d.trim().parse().expect("ESCHA_TIMING_SHAPE: K,IC,OC")).collect();
        assert!(d.len() == 3, "ESCHA_TIMING_SHAPE: K,IC,OC");
        shapes = vec![(d[0], d[1], d[2])];
    }
    let skip = std::env::var("ESCHA_TIMING_SKIP").map_or(0, |v| v.parse().expect("ESCHA_TIMING_SKIP: a number of shapes"));
    if skip >= shapes.len() {
        eprintln!("ESCHA_TIMING_SKIP={skip} skips all {} shape(s) to time", shapes.len());
        std::process::exit(2);
    }
    for &(k, ic, oc) in &shapes[skip..] {
        let mut rng = Rng::new(1);
        let problem = RandomLinear::new(1, k, ic, oc, false, false);
        let lin = CpuLinear::new(&problem.linear(), kernel).unwrap();
        for &m in &ms {
            let x = rng.f32s(m * ic, 0.0, 1.0);
            let mut xh = vec![0f32; m * ic];
            let mut y = vec![0f32; m * oc];
            let mut scratch = vec![0f32; lin.scratch_floats(m)];
            let iters = (2e9 / (ic * oc * m) as f64).max(2.0) as usize;
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = std::time::Instant::now();
                for _ in 0..iters {
                    lin.forward_into(&x, m, &mut xh, &mut y, &mut scratch);
                }
                best = best.min(t.elapsed().as_secs_f64() / iters as f64);
            }
            println!("k{k} {ic}x{oc} m{m}: {:.2} G weights/s  ({:.1} us/call)", (ic * oc * m) as f64 / best / 1e9, best * 1e6);
        }
    }
}
