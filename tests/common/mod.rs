//! Shared test fixtures: random coded linears and an independent error
//! bound for paths whose f32 summation order differs from the reference.
#![allow(dead_code)]

use escha_ggml::codec::reconstruct;
use escha_ggml::reference::Linear;
use escha_ggml::transform::input_transform;
use half::f16;

#[allow(unused_imports)]
pub use escha_ggml::testutil::RandomLinear as Problem;

pub mod cli;
#[cfg(feature = "ggml")]
pub mod files;
pub mod shim;

/// The unnormalised 128-point Hadamard on each 128-block, in f64.
pub fn h128_f64(v: &mut [f64]) {
    for blk in v.chunks_exact_mut(128) {
        let mut h = 1;
        while h < 128 {
            for i in (0..128).filter(|i| i & h == 0) {
                let (a, b) = (blk[i], blk[i + h]);
                blk[i] = a + b;
                blk[i + h] = a - b;
            }
            h *= 2;
        }
    }
}

/// f16 unit in the last place at magnitude |v|.
pub fn ulp16(v: f64) -> f64 {
    let v = v.abs().max(6.103515625e-05); // normal range floor
    2f64.powi(v.log2().floor() as i32 - 10)
}

/// Per-output bound on |y_a - y_b| for two evaluations of the contract that
/// differ only in the f32 summation order of `mid` (derivation in
/// docs/FORMAT.md, "Accuracy of paths that sum in another order"): an
/// order's sum is within (IC-1) u S[c] of the exact one, the AMX product's
/// (four exact products per product, chunks of 256 inputs) within
/// (min(IC, 256) + 1 + ceil(IC/256)) u S[c], so
///   |dmid[c]| <= (IC-1 + max(IC-1, min(IC, 256) + 1 + ceil(IC/256))) u S[c],
///   S[c] = sum_r |xh[r] W[r,c]|
///   D[c] = RS |rout_eff[c]| (sum_{c' in blk} |dmid[c']| + 14 u sum |mid|) (1 + 4u) + 4u |v[c]|
///   |y_a - y_b| <= D[c] + ulp16(|v[c]| + D[c])  (+ ulp16 of the biased value)
pub fn order_bound(l: &Linear, x: &[f32], m: usize) -> Vec<f64> {
    let (ic, oc) = (l.shape.ic, l.shape.oc);
    let w = reconstruct(l.code, l.shape);
    let (rin_eff, rout_eff) = l.folded();
    let u = 2f64.powi(-24);
    let rs = escha_ggml::hadamard::RS as f64;
    let mut out = Vec::with_capacity(m * oc);
    let mut xh = vec![0f32; ic];
    for row in 0..m {
        input_transform(&x[row * ic..(row + 1) * ic], &rin_eff, &mut xh);
        let mut s = vec![0f64; oc];
        let mut mid = vec![0f64; oc];
        for r in 0..ic {
            for c in 0..oc {
                let pr = xh[r] as f64 * w[r * oc + c].to_f64();
                s[c] += pr.abs();
                mid[c] += pr;
            }
        }
        for blk in 0..oc / 128 {
            let cols = blk * 128..(blk + 1) * 128;
            let amx = (ic.min(256) + 1 + ic.div_ceil(256)) as f64;
            let n_err = ic as f64 - 1.0 + (ic as f64 - 1.0).max(amx);
            let dmid: f64 = cols.clone().map(|c| n_err * u * s[c]).sum();
            let absmid: f64 = cols.clone().map(|c| mid[c].abs()).sum();
            let mut hm: Vec<f64> = cols.clone().map(|c| mid[c]).collect();
            h128_f64(&mut hm);
            for c in cols {
                let v = rs * (rout_eff[c] as f64 * hm[c % 128]).abs();
                let d = rs * (rout_eff[c] as f64).abs() * (dmid + 14.0 * u * absmid) * (1.0 + 4.0 * u) + 4.0 * u * v;
                let mut b = d + ulp16(v + d);
                if let Some(bias) = l.bias {
                    b += ulp16(v + d + bias[c].abs() as f64);
                }
                out.push(b);
            }
        }
    }
    out
}

/// Asserts `got` (f32 values) within `bound` of the reference `want`.
pub fn assert_within(what: &str, got: &[f32], want: &[f16], bound: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f64;
    for (i, ((&g, w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        let w = w.to_f32();
        if g.is_nan() || w.is_nan() {
            assert!(g.is_nan() && w.is_nan(), "{what}[{i}]: {g} vs {w}");
            continue;
        }
        let d = (g as f64 - w as f64).abs();
        assert!(d <= b, "{what}[{i}]: got {g}, reference {w}, |diff| {d:e} > bound {b:e}");
        worst = worst.max(d / b);
    }
    eprintln!("{what}: worst |diff|/bound = {worst:.3}");
}

pub fn bits(v: &[f16]) -> Vec<u16> {
    v.iter().map(|h| h.to_bits()).collect()
}

pub fn f32_bits_of(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}
