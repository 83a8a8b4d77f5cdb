//! Stage "input/output transform": H128 order, scale folding.

use escha_ggml::cref;
use escha_ggml::hadamard::{h128, RS};
use escha_ggml::transform::fold_scales;
use escha_ggml::testutil::Rng;
use half::f16;

#[test]
fn h128_matches_c_bit_exact() {
    let mut rng = Rng::new(3);
    let x = rng.f32s(384, 0.0, 3.0);
    let (mut a, mut b) = (x.clone(), x);
    h128(&mut a);
    cref::h128(&mut b);
    assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
}

#[test]
fn h128_is_the_sylvester_matrix() {
    // H[i][j] = (-1)^popcount(i & j): natural (Sylvester) order, computed in f64.
    let mut rng = Rng::new(4);
    let x = rng.f32s(256, 0.0, 1.0);
    let mut y = x.clone();
    h128(&mut y);
    for blk in 0..2 {
        for i in 0..128usize {
            let want: f64 = (0..128)
                .map(|j| if (i & j).count_ones().is_multiple_of(2) { 1.0 } else { -1.0 } * x[blk * 128 + j] as f64)
                .sum();
            assert!((y[blk * 128 + i] as f64 - want).abs() < 1e-4, "block {blk} row {i}");
        }
    }
}

#[test]
fn h128_scaled_is_an_involution() {
    let mut rng = Rng::new(6);
    let x = rng.f32s(128, 0.0, 1.0);
    let mut y = x.clone();
    h128(&mut y);
    h128(&mut y);
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b * RS * RS).abs() < 1e-5);
    }
}

/// FORMAT.md §5: `rin_eff[i] = f32(rin[i]) * f32(s_in[i])` (and `rout_eff`
/// with `s_out`), one f32 multiply with RNE; the product of an f16 (11-bit
/// significand) and an f32 (24 bits) is exact in f64, so f64 then one
/// rounding to f32 is the correctly rounded f32 product.
fn fold_spec(r: f16, s: Option<f32>) -> f32 {
    match s {
        Some(s) => (r.to_f64() * s as f64) as f32,
        None => r.to_f32(),
    }
}

#[test]
fn fold_keeps_f32_products() {
    let mut rng = Rng::new(21);
    let (ic, oc) = (256, 128);
    // rin/rout f16 values of either sign; s_in, s_out near 1 as in dense
    // exports (1 +- 0.02 and 0.99 +- 0.03), different from each other and of
    // different lengths, so a swap cannot go unnoticed.
    let rin: Vec<f16> = rng.f32s(ic, 0.0, 1.0).iter().map(|&v| f16::from_f32(v)).collect();
    let rout: Vec<f16> = rng.f32s(oc, 0.0, 0.05).iter().map(|&v| f16::from_f32(v)).collect();
    let s_in: Vec<f32> = (0..ic).map(|_| 1.0 + 0.02 * rng.uniform()).collect();
    let s_out: Vec<f32> = (0..oc).map(|_| 0.99 + 0.03 * rng.uniform()).collect();
    let (ri, ro) = fold_scales(&rin, &rout, Some(&s_in), Some(&s_out));
    assert_eq!((ri.len(), ro.len()), (ic, oc));
    for i in 0..ic {
        assert_eq!(ri[i].to_bits(), fold_spec(rin[i], Some(s_in[i])).to_bits(), "rin_eff[{i}] = f32(rin) * s_in");
    }
    for o in 0..oc {
        assert_eq!(ro[o].to_bits(), fold_spec(rout[o], Some(s_out[o])).to_bits(), "rout_eff[{o}] = f32(rout) * s_out");
    }
    // The expectation is sensitive to the precision: rounding the fold to
    // f16 (or the scale to f16 first) would change most entries.
    let f16_fold = (0..ic).filter(|&i| f16::from_f32(fold_spec(rin[i], Some(s_in[i]))).to_f32() != fold_spec(rin[i], Some(s_in[i]))).count();
    let f16_scale = (0..ic).filter(|&i| (rin[i].to_f64() * f16::from_f32(s_in[i]).to_f64()) as f32 != fold_spec(rin[i], Some(s_in[i]))).count();
    assert!(f16_fold > ic / 2 && f16_scale > ic / 2, "test values too coarse: {f16_fold}, {f16_scale}");
    // An absent scale leaves the side as it is (exactly f32(r)); each side
    // takes only its own scale.
    let (ri, ro) = fold_scales(&rin, &rout, Some(&s_in), None);
    assert!(ri.iter().zip(&rin).zip(&s_in).all(|((&a, &r), &s)| a.to_bits() == fold_spec(r, Some(s)).to_bits()));
    assert!(ro.iter().zip(&rout).all(|(&a, &r)| a.to_bits() == r.to_f32().to_bits()), "rout_eff without s_out");
    let (ri, ro) = fold_scales(&rin, &rout, None, Some(&s_out));
    assert!(ri.iter().zip(&rin).all(|(&a, &r)| a.to_bits() == r.to_f32().to_bits()), "rin_eff without s_in");
    assert!(ro.iter().zip(&rout).zip(&s_out).all(|((&a, &r), &s)| a.to_bits() == fold_spec(r, Some(s)).to_bits()));
    // A hand-worked entry: f16(0.7) = 0x399A = 1434/2048 = 0.7001953125;
    // times s = 1.25 (exact) is 0.875244140625 = 1792.5/2048, exact in f32 but
    // a tie at f16 precision (rounds to 0.875).
    let (ri, _) = fold_scales(&[f16::from_f32(0.7)], &[f16::ONE], Some(&[1.25]), None);
    assert_eq!(f16::from_f32(0.7).to_bits(), 0x399A);
    assert_eq!(ri[0], 0.875244140625);
}
