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

#[test]
fn fold_keeps_f32_products() {
    let rin = [f16::from_f32(0.7), f16::from_f32(-1.3)];
    let rout = [f16::from_f32(0.02)];
    let s_in = [1.0123457f32, 0.99];
    let (ri, ro) = fold_scales(&rin, &rout, Some(&s_in), None);
    assert_eq!(ri[0], f16::from_f32(0.7).to_f32() * 1.0123457);
    assert_ne!(ri[0], f16::from_f32(ri[0]).to_f32(), "fold must not round to f16");
    assert_eq!(ro[0], f16::from_f32(0.02).to_f32());
}
