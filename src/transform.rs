//! The transforms on both sides of every coded linear, shared by the
//! reference and the CPU kernels: the scale fold, the input transform
//! `xh = f16(H128(x * rin_eff) * RS)` and the output transform
//! `y = f16((H128(mid) * RS) * rout_eff)` (+ bias), with the contract's
//! rounding points (`docs/FORMAT.md` §5).
//!
//! f16 conversions go a slice at a time (`half`'s slice conversions: F16C
//! or NEON FP16 8 or 4 values an instruction, checked once a slice), not a
//! value at a time: on a small model the per-value calls were 3% of a
//! token (docs/PERFORMANCE.md). Both round to nearest even, as the
//! contract's f16 does, so the values are the same.

use crate::hadamard::{h128, N, RS};
use half::f16;
use half::slice::HalfFloatSliceExt;

/// `rin_eff = f32(rin) * f32(s_in)`, `rout_eff = f32(rout) * f32(s_out)`;
/// an absent scale leaves the vector as it is. Kept in f32 on purpose.
pub fn fold_scales(rin: &[f16], rout: &[f16], s_in: Option<&[f32]>, s_out: Option<&[f32]>) -> (Vec<f32>, Vec<f32>) {
    (fold(rin, s_in), fold(rout, s_out))
}

/// One side of [`fold_scales`].
pub fn fold(r: &[f16], s: Option<&[f32]>) -> Vec<f32> {
    let mut out = vec![0f32; r.len()];
    fold_into(r, s, &mut out);
    out
}

/// [`fold`] into a caller's buffer (`out.len() == r.len()`).
pub fn fold_into(r: &[f16], s: Option<&[f32]>, out: &mut [f32]) {
    r.convert_to_f32_slice(out);
    if let Some(s) = s {
        out.iter_mut().zip(s).for_each(|(o, s)| *o *= s);
    }
}

/// `xh = f16(H128(x * rin_eff) * RS)` for one row, returned widened to f32
/// (the values are exactly f16).
pub fn input_transform(x: &[f32], rin_eff: &[f32], xh: &mut [f32]) {
    for ((o, &a), &r) in xh.iter_mut().zip(x).zip(rin_eff) {
        *o = a * r;
    }
    h128(xh);
    for v in xh.iter_mut() {
        *v *= RS;
    }
    round_f16_slice(xh);
}

/// `y = f16((H128(mid) * RS) * rout_eff)`, then `y = f16(y + bias)` if a
/// bias is given. `mid` is consumed as scratch.
pub fn output_transform(mid: &mut [f32], rout_eff: &[f32], bias: Option<&[f32]>, y: &mut [f16]) {
    h128(mid);
    for (m, &r) in mid.iter_mut().zip(rout_eff) {
        *m = (*m * RS) * r;
    }
    if let Some(b) = bias {
        round_f16_slice(mid);
        mid.iter_mut().zip(b).for_each(|(m, b)| *m += b);
    }
    y.convert_from_f32_slice(mid);
}

/// f32 -> nearest f16 (RNE) -> f32.
#[inline(always)]
pub fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// [`round_f16`] of every value, a block of [`N`] at a time through a
/// stack buffer.
pub fn round_f16_slice(v: &mut [f32]) {
    let mut h = [f16::ZERO; N];
    for c in v.chunks_mut(N) {
        let h = &mut h[..c.len()];
        h.convert_from_f32_slice(c);
        h.convert_to_f32_slice(c);
    }
}
