//! Stages "GEMV" and "output transform": the forward of a dense linear,
//! reference vs C (bit-exact), CPU kernels vs reference (scalar bit-exact,
//! SIMD within the summation-order bound), and the contract's properties.

mod common;

use common::*;
use escha_ggml::cpu::{CpuLinear, Isa, Kernel};
use escha_ggml::reference::{self, Linear};
use escha_ggml::transform::input_transform;
use escha_ggml::{cref, EschaError};
use half::f16;

const SHAPES: [(usize, usize, usize); 4] = [(2, 256, 384), (3, 384, 256), (2, 128, 128), (3, 512, 384)];

#[test]
fn reference_matches_c_bit_exact() {
    for (i, &(k, ic, oc)) in SHAPES.iter().enumerate() {
        for (scales, bias) in [(false, false), (true, false), (true, true)] {
            let p = Problem::new(100 + i as u64, k, ic, oc, scales, bias);
            for m in [1, 17, 31, 33] {
                let x = p.input(7, m);
                let r = reference::linear(&p.linear(), &x, m).unwrap();
                let c = cref::linear(&p.linear(), &x, m).unwrap();
                assert_eq!(bits(&r), bits(&c), "k={k} {ic}x{oc} m={m} scales={scales} bias={bias}");
            }
        }
    }
}

#[test]
fn scalar_kernel_is_bit_exact() {
    let kern = Kernel::with_isa(Isa::Scalar).unwrap();
    for (i, &(k, ic, oc)) in SHAPES.iter().enumerate() {
        let p = Problem::new(200 + i as u64, k, ic, oc, true, true);
        for m in [1, 17, 33] {
            let x = p.input(8, m);
            let want = reference::linear(&p.linear(), &x, m).unwrap();
            let got = CpuLinear::new(&p.linear(), kern).unwrap().forward(&x, m).unwrap();
            assert_eq!(f32_bits_of(&got), bits(&want), "k={k} {ic}x{oc} m={m}");
        }
    }
}

#[test]
fn simd_kernels_within_order_bound() {
    let isas = Isa::all_available();
    eprintln!("ISA paths on this machine: {isas:?}");
    for isa in isas {
        let kern = Kernel::with_isa(isa).unwrap();
        for (i, &(k, ic, oc)) in SHAPES.iter().enumerate() {
            let p = Problem::new(300 + i as u64, k, ic, oc, true, true);
            for m in [1, 2, 17, 31, 33] {
                let x = p.input(9, m);
                let want = reference::linear(&p.linear(), &x, m).unwrap();
                let got = CpuLinear::new(&p.linear(), kern).unwrap().forward(&x, m).unwrap();
                let bound = order_bound(&p.linear(), &x, m);
                assert_within(&format!("{isa:?} k={k} {ic}x{oc} m={m}"), &got, &want, &bound);
            }
        }
    }
}

#[test]
fn threads_split_gives_the_same_result() {
    // 640 outputs, 5 blocks: at 2 and 3 threads the blocks left over are
    // split by rows (every share above the GEMV's rows: 16 rows for the
    // paths whose GEMV takes up to 4, 40 for the AMX path's 8), at 7 they
    // go whole. Row 5 of the 40 overflows the input transform (inf), which
    // the AMX product hands to the FMA product: the other rows' sums must
    // not depend on it.
    let p = Problem::new(400, 2, 256, 640, true, true);
    for m in [16, 40] {
        let mut x = p.input(1, m);
        if m == 40 {
            x[5 * 256..6 * 256].fill(1e9);
        }
        threads_split_case(&p, &x, m);
    }
}

fn threads_split_case(p: &Problem, x: &[f32], m: usize) {
    for isa in Isa::all_available() {
        let lin = CpuLinear::new(&p.linear(), Kernel::with_isa(isa).unwrap()).unwrap();
        let whole = lin.forward(x, m).unwrap();
        for nth in [2, 3, 7] {
            let mut xh = vec![0f32; m * 256];
            for ith in 0..nth {
                lin.transform_input(x, m, &mut xh, ith, nth);
            }
            let mut y = vec![f32::NAN; m * 640];
            let yp = y.as_mut_ptr() as usize;
            std::thread::scope(|s| {
                for ith in 0..nth {
                    let (lin, xh) = (&lin, &xh);
                    s.spawn(move || {
                        let mut scratch = vec![0f32; lin.scratch_floats(m)];
                        // SAFETY: distinct ith, same nth, y outlives the scope.
                        unsafe { lin.compute_shared(xh, m, yp as *mut f32, ith, nth, &mut scratch) };
                    });
                }
            });
            assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{isa:?} m={m} nth={nth}");
        }
    }
}

/// Every path a test property must hold on: reference, C, each CPU ISA.
fn all_paths(l: &Linear, x: &[f32], m: usize) -> Vec<(String, Vec<f32>)> {
    let mut out = vec![
        ("reference".to_string(), reference::linear(l, x, m).unwrap().iter().map(|v| v.to_f32()).collect()),
        ("C".to_string(), cref::linear(l, x, m).unwrap().iter().map(|v| v.to_f32()).collect()),
    ];
    for isa in Isa::all_available() {
        out.push((format!("{isa:?}"), CpuLinear::new(l, Kernel::with_isa(isa).unwrap()).unwrap().forward(x, m).unwrap()));
    }
    out
}

#[test]
fn pruned_channels_are_exactly_zero() {
    let mut p = Problem::new(500, 3, 256, 384, true, false);
    let pruned: Vec<usize> = (0..384).filter(|c| c % 3 == 1 || *c > 300).collect();
    for &c in &pruned {
        p.rout[c] = f16::ZERO;
    }
    let x = p.input(2, 3);
    for (path, y) in all_paths(&p.linear(), &x, 3) {
        for row in 0..3 {
            for c in 0..384 {
                let v = y[row * 384 + c];
                if pruned.contains(&c) {
                    assert_eq!(v.to_bits() & 0x7FFF_FFFF, 0, "{path}: row {row} col {c} = {v}");
                } else {
                    assert_ne!(v, 0.0, "{path}: unpruned col {c} is zero");
                }
            }
        }
    }
}

#[test]
fn nan_input_propagates() {
    let p = Problem::new(501, 2, 256, 128, false, false);
    let mut x = p.input(3, 2);
    x[256 + 5] = f32::NAN; // row 1, first Hadamard block
    for (path, y) in all_paths(&p.linear(), &x, 2) {
        assert!(y[..128].iter().all(|v| v.is_finite()), "{path}: row 0 must stay finite");
        assert!(y[128..].iter().all(|v| v.is_nan()), "{path}: NaN in row 1 must reach every output");
    }
}

#[test]
fn zero_activations_give_signed_zeros() {
    // An all-zero input makes every product +-0 and every f32 sum +0 (from
    // +0 accumulators, in any order, fused or not), so each output is
    // exactly (+0 * RS) * rout: a zero with the sign of rout, on every path.
    let p = Problem::new(502, 2, 256, 128, false, false);
    let x = vec![0f32; 256];
    let want: Vec<u32> = p.rout.iter().map(|r| (0f32 * escha_ggml::hadamard::RS * r.to_f32()).to_bits()).collect();
    assert!(want.contains(&0) && want.contains(&0x8000_0000), "the problem has rout of both signs");
    for (path, y) in all_paths(&p.linear(), &x, 1) {
        let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{path}");
    }
}

#[test]
fn bias_moves_the_output_exactly_as_specified() {
    let with = Problem::new(503, 2, 256, 256, true, true);
    let mut without = Problem::new(503, 2, 256, 256, true, true);
    without.bias = None;
    let x = with.input(4, 3);
    let y0 = reference::linear(&without.linear(), &x, 3).unwrap();
    let bias = with.bias.as_ref().unwrap();
    for (path, y1) in all_paths(&with.linear(), &x, 3) {
        let mut moved = 0;
        for (i, (&a, b)) in y1.iter().zip(&y0).enumerate() {
            let want = f16::from_f32(b.to_f32() + bias[i % 256]).to_f32();
            // SIMD paths may differ by their order bound before the add; the
            // reference and C must be exact.
            if path == "reference" || path == "C" || path == "Scalar" {
                assert_eq!(a, want, "{path}[{i}]");
            }
            moved += usize::from(a != b.to_f32());
        }
        assert!(moved > y1.len() / 2, "{path}: bias moved only {moved} outputs");
    }
}

#[test]
fn scales_enter_where_the_contract_says() {
    // s_in multiplies the inputs before the input Hadamard, s_out the
    // outputs after the output Hadamard (docs/FORMAT.md §5). The f64
    // contract below folds them by hand; every path must match it to f16
    // rounding, and must not match it with the scales swapped or dropped.
    let (ic, oc, m) = (256, 256, 2);
    let mut p = Problem::new(504, 3, ic, oc, true, false);
    let mut rng = escha_ggml::rng::Rng::new(44);
    p.s_in = Some(rng.f32s(ic, 1.0, 0.5));
    p.s_out = Some(rng.f32s(oc, 1.0, 0.5));
    let x = p.input(5, m);
    let forward = |s_in: &[f32], s_out: &[f32]| -> Vec<f64> {
        let rin_eff: Vec<f64> = p.rin.iter().zip(s_in).map(|(r, &s)| r.to_f64() * s as f64).collect();
        let rout_eff: Vec<f64> = p.rout.iter().zip(s_out).map(|(r, &s)| r.to_f64() * s as f64).collect();
        x.chunks_exact(ic).flat_map(|row| forward_f64_with(&p, row, &rin_eff, &rout_eff, true, true)).collect()
    };
    let (s_in, s_out) = (p.s_in.clone().unwrap(), p.s_out.clone().unwrap());
    let ones = vec![1f32; ic];
    let right = forward(&s_in, &s_out);
    let wrong = [("swapped", forward(&s_out, &s_in)), ("no s_in", forward(&ones, &s_out)), ("no s_out", forward(&s_in, &ones))];
    let rel = |y: &[f32], v: &[f64]| -> f64 {
        let num: f64 = y.iter().zip(v).map(|(a, b)| (*a as f64 - b).powi(2)).sum();
        (num / v.iter().map(|b| b * b).sum::<f64>()).sqrt()
    };
    for (path, y) in all_paths(&p.linear(), &x, m) {
        let r = rel(&y, &right);
        assert!(r < 2e-3, "{path}: {r:e} from the f64 contract");
        for (what, v) in &wrong {
            let e = rel(&y, v);
            assert!(e > 0.05, "{path}: only {e:e} from the contract with the scales {what}");
        }
    }
}

/// f64 evaluation of the contract on one row with the effective scales
/// given, in a selectable (possibly wrong) order of scale and Hadamard on
/// each side.
fn forward_f64_with(p: &Problem, x: &[f32], ri: &[f64], ro: &[f64], in_scale_first: bool, out_scale_last: bool) -> Vec<f64> {
    let (ic, oc) = (p.shape.ic, p.shape.oc);
    let w = escha_ggml::codec::reconstruct(&p.code, p.shape);
    let h = h128_f64;
    let rs = escha_ggml::hadamard::RS as f64;
    let mut xh: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    if in_scale_first {
        xh.iter_mut().zip(ri).for_each(|(v, &r)| *v *= r);
        h(&mut xh);
    } else {
        h(&mut xh);
        xh.iter_mut().zip(ri).for_each(|(v, &r)| *v *= r);
    }
    let mut mid = vec![0f64; oc];
    for r in 0..ic {
        for c in 0..oc {
            mid[c] += xh[r] * rs * w[r * oc + c].to_f64();
        }
    }
    if out_scale_last {
        h(&mut mid);
        mid.iter_mut().zip(ro).for_each(|(v, &r)| *v *= rs * r);
    } else {
        mid.iter_mut().zip(ro).for_each(|(v, &r)| *v *= rs * r);
        h(&mut mid);
    }
    mid
}

/// [`forward_f64_with`] with the crate's fold of `p`'s scales.
fn forward_f64(p: &Problem, x: &[f32], in_scale_first: bool, out_scale_last: bool) -> Vec<f64> {
    let (ri, ro) = p.linear().folded();
    let wide = |v: Vec<f32>| -> Vec<f64> { v.into_iter().map(f64::from).collect() };
    forward_f64_with(p, x, &wide(ri), &wide(ro), in_scale_first, out_scale_last)
}

#[test]
fn scale_and_hadamard_order_is_checked_on_both_sides() {
    let p = Problem::new(505, 2, 256, 256, false, false);
    let x = p.input(6, 1);
    let y = reference::linear(&p.linear(), &x, 1).unwrap();
    let rel = |v: &[f64]| -> f64 {
        let num: f64 = y.iter().zip(v).map(|(a, b)| (a.to_f64() - b).powi(2)).sum();
        let den: f64 = v.iter().map(|b| b * b).sum();
        (num / den).sqrt()
    };
    let right = rel(&forward_f64(&p, &x, true, true));
    let in_swapped = rel(&forward_f64(&p, &x, false, true));
    let out_swapped = rel(&forward_f64(&p, &x, true, false));
    eprintln!("relative error: right order {right:e}, input side swapped {in_swapped:e}, output side swapped {out_swapped:e}");
    // Right order: only f16 rounding of xh and y (~1e-3 relative).
    assert!(right < 2e-3, "reference disagrees with the f64 contract: {right}");
    assert!(in_swapped > 0.3 && out_swapped > 0.3);
}

#[test]
fn xh_and_y_are_f16_values() {
    let p = Problem::new(506, 2, 128, 128, true, false);
    let x = p.input(7, 1);
    let (ri, _) = p.linear().folded();
    let mut xh = vec![0f32; 128];
    input_transform(&x, &ri, &mut xh);
    assert!(xh.iter().all(|&v| f16::from_f32(v).to_f32() == v));
    for (path, y) in all_paths(&p.linear(), &x, 1) {
        assert!(y.iter().all(|&v| f16::from_f32(v).to_f32() == v), "{path}");
    }
}

#[test]
fn bad_lengths_are_named() {
    let p = Problem::new(507, 2, 256, 128, true, true);
    let mut l = p.linear();
    let short = &p.rin[..255];
    l.rin = short;
    match reference::linear(&l, &p.input(1, 1), 1) {
        Err(EschaError::BadLength { what: "rin", got: 255, expected: 256, .. }) => {}
        other => panic!("{other:?}"),
    }
    let x = p.input(1, 1);
    for (what, expect) in [("rout", 127usize), ("s_in", 255), ("s_out", 127), ("bias", 129), ("code", 10)] {
        let mut l = p.linear();
        let (f16v, f32v, codev) = (vec![f16::ONE; expect], vec![1f32; expect], vec![0i16; expect]);
        match what {
            "rout" => l.rout = &f16v,
            "s_in" => l.s_in = Some(&f32v),
            "s_out" => l.s_out = Some(&f32v),
            "bias" => l.bias = Some(&f32v),
            _ => l.code = &codev,
        }
        match reference::linear(&l, &x, 1) {
            Err(EschaError::BadLength { what: w, got, .. }) => assert_eq!((w, got), (what, expect)),
            other => panic!("{what}: {other:?}"),
        }
    }
    match reference::linear(&p.linear(), &x[..100], 1) {
        Err(EschaError::BadLength { what: "x", .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn non_finite_scales_are_rejected() {
    let mut p = Problem::new(508, 2, 128, 128, true, false);
    p.s_in.as_mut().unwrap()[3] = f32::NAN;
    let e = CpuLinear::new(&p.linear(), Kernel::best()).err().unwrap();
    assert!(matches!(e, EschaError::NonFinite { what: "s_in", index: 3, .. }), "{e}");
    let mut p = Problem::new(508, 2, 128, 128, false, false);
    p.rout[7] = f16::INFINITY;
    let e = reference::linear(&p.linear(), &p.input(1, 1), 1).err().unwrap();
    assert!(matches!(e, EschaError::NonFinite { what: "rout", index: 7, .. }), "{e}");
    assert!(e.to_string().contains("test"), "error must name the tensor: {e}");
}

#[test]
fn a_path_the_cpu_lacks_cannot_be_selected() {
    use escha_ggml::cpu::{Isa, Kernel};
    for isa in Isa::ALL {
        assert_eq!(Kernel::with_isa(isa).is_some(), isa.available(), "{}", isa.name());
    }
    // The other architecture's SIMD path is never available here, however asked for.
    let foreign = if cfg!(target_arch = "x86_64") { [Isa::Neon] } else { [Isa::Avx2] };
    for isa in foreign {
        assert!(!isa.available() && Kernel::with_isa(isa).is_none(), "{}", isa.name());
    }
    assert!(Kernel::best().isa().available());
    // Constructing one by hand does not compile: the compile_fail example on `Kernel`.
}
