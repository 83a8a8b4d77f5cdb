//! The layer encoder: a weight `W [OC, IC]` (row c = output channel c, as
//! ggml stores a projection) to an Escha-W2 coded linear.
//!
//! The contract's effective weight is
//! `W_eff = RS^2 * diag(rout) * H * W_bare^T * H * diag(rin)` (H the
//! block-diagonal 128-point Hadamard), so for chosen `rin`, `rout` the tiles
//! must approximate `W_bare^T = RS^2 * H * (W / rout / rin) * H`. `RS*H` is
//! orthonormal, so each 128x128 block of that matrix has the root mean
//! square of the scaled weight block: the scales are chosen so it matches
//! the codebook's spread, with random signs (seeded) to make the rotated
//! values incoherent.

use super::tile::TileEncoder;
use crate::codec::{reconstruct, tile_position, TILE, TILE_VALUES};
use crate::hadamard::{h128, RS};
use crate::rng::Rng;
use crate::validate::LinearShape;
use half::f16;
use std::sync::atomic::{AtomicUsize, Ordering};

/// RMS the rotated weights are scaled to (the codebook's is about 1.244;
/// slightly less trades clipping of the tails for resolution).
pub const TARGET_RMS: f32 = 1.2;

/// One encoded projection.
#[derive(Clone, Debug)]
pub struct EncodedLayer {
    pub shape: LinearShape,
    /// `[IC/16, OC/16, 16K]`.
    pub code: Vec<i16>,
    pub rin: Vec<f16>,
    pub rout: Vec<f16>,
    /// `||W_eff - W||_F / ||W||_F` of the decoded effective weight.
    pub rel_error: f64,
    /// The same with every input channel weighted by its importance (when
    /// one was given): the relative error the layer's outputs see.
    pub weighted_rel_error: Option<f64>,
    /// Channels whose scale hit the largest f16 (weights beyond what the
    /// format can hold: they are clipped, never infinite).
    pub saturated_channels: usize,
    /// Nonzero output channels too small for any f16 scale: coded as
    /// pruned (`rout = 0`), they decode to zero.
    pub zeroed_channels: usize,
}

/// Smallest and largest magnitudes given to `rin`: the f16 normal range,
/// centred so `rout` keeps the rest of f16's range for the row scales.
const RIN_MIN: f64 = 1.0 / 16384.0;
const RIN_MAX: f64 = 32768.0;
/// Largest finite f16: `rout` saturates there instead of rounding to inf.
const F16_MAX: f64 = 65504.0;
/// Smallest normal f16: a smaller `rout` loses precision (or rounds to 0).
const F16_MIN_NORMAL: f64 = 1.0 / 16384.0;
/// Scaled weights are clamped to this before the rotation: only values far
/// outside the codebook's range (about ±4) reach it, and it keeps every
/// rotated target and path cost finite.
const SCALED_CLAMP: f32 = 1e6;

/// f16 of magnitude `m` with the sign drawn for its channel.
fn signed(m: f32, positive: bool) -> f16 {
    f16::from_f32(if positive { m } else { -m })
}

/// Geometric mean of the positive entries (None if there are none).
fn geometric_mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = v.filter(|&m| m > 0.0).fold((0f64, 0usize), |(s, n), m| (s + m.ln(), n + 1));
    (n > 0).then(|| (s / n as f64).exp())
}

/// The per-channel scales `rin [IC]`, `rout [OC]` as stored (f16, signed
/// at random), and how many channels could not be represented:
/// `(saturated, zeroed)`. `rin` follows `in_mags`, `rout` each row's RMS
/// after it over the target spread. Only the product `rin_i * rout_c`
/// matters, so when that leaves f16's range (weights of 1e-20 or 3e38, a
/// column far from the others) the magnitudes are balanced in the log
/// domain around a common centre and clamped: any finite weight gives
/// finite scales. An all-zero row gets `rout = 0`, so it decodes to exactly
/// zero; an all-zero column takes the centre of the others.
fn channel_scales(in_mags: &[f32], w: &[f32], ic: usize, rng: &mut Rng) -> (Vec<f16>, Vec<f16>, usize, usize) {
    let oc = w.len() / ic;
    let sign_in: Vec<bool> = (0..ic).map(|_| rng.next_u32() & 1 == 0).collect();
    let sign_out: Vec<bool> = (0..oc).map(|_| rng.next_u32() & 1 == 0).collect();
    let centre_in = geometric_mean(in_mags.iter().map(|&m| m as f64)).unwrap_or(1.0);
    let a: Vec<f32> = in_mags.iter().map(|&m| if m > 0.0 && m.is_finite() { m } else { centre_in as f32 }).collect();
    let rin: Vec<f16> = a.iter().zip(&sign_in).map(|(&m, &s)| signed(m, s)).collect();
    let b: Vec<f32> = w
        .chunks_exact(ic)
        .map(|row| {
            let s: f64 = row.iter().zip(&rin).map(|(&v, r)| ((v / r.to_f32().abs()) as f64).powi(2)).sum();
            ((s / ic as f64).sqrt() as f32) / TARGET_RMS
        })
        .collect();
    let normal = |m: f32, lo: f64, hi: f64| m.is_finite() && (m as f64) >= lo && (m as f64) <= hi;
    if a.iter().all(|&m| normal(m, RIN_MIN, RIN_MAX)) && b.iter().all(|&m| m == 0.0 || normal(m, F16_MIN_NORMAL, F16_MAX)) {
        let rout = b.iter().zip(&sign_out).map(|(&m, &s)| if m == 0.0 { f16::ZERO } else { signed(m, s) }).collect();
        return (rin, rout, 0, 0);
    }
    // Out of range somewhere: the same choice in f64, balanced and clamped.
    let row_rms = |rin: &[f64]| -> Vec<f64> {
        w.chunks_exact(ic)
            .map(|row| {
                let s: f64 = row.iter().zip(rin).map(|(&v, &r)| (v as f64 / r).powi(2)).sum();
                (s / ic as f64).sqrt() / TARGET_RMS as f64
            })
            .collect()
    };
    let mut a: Vec<f64> = a.iter().map(|&m| m as f64).collect();
    if let Some(centre_out) = geometric_mean(row_rms(&a).into_iter()) {
        let alpha = (centre_out / centre_in).sqrt();
        a.iter_mut().for_each(|m| *m *= alpha);
    }
    let mut saturated = a.iter().filter(|&&m| m > RIN_MAX).count();
    let rin: Vec<f16> = a.iter().zip(&sign_in).map(|(&m, &s)| signed(m.clamp(RIN_MIN, RIN_MAX) as f32, s)).collect();
    let b = row_rms(&rin.iter().map(|v| v.to_f64().abs()).collect::<Vec<_>>());
    saturated += b.iter().filter(|&&m| m > F16_MAX).count();
    let mut zeroed = 0;
    let rout = b
        .iter()
        .zip(&sign_out)
        .map(|(&m, &s)| {
            let r = signed(m.min(F16_MAX) as f32, s);
            if r.to_f32() != 0.0 {
                return r;
            }
            // Below f16's smallest value (or a zero row): a pruned channel.
            zeroed += usize::from(m > 0.0);
            f16::ZERO
        })
        .collect();
    (rin, rout, saturated, zeroed)
}

/// The tile targets: `W_bare [IC, OC]` = transpose of `RS^2 H (W/rout/rin) H`.
/// A row with `rout = 0` is pruned: its targets are zero.
fn rotated(w: &[f32], ic: usize, oc: usize, rin: &[f16], rout: &[f16]) -> Vec<f32> {
    // Scaled weight, rows = outputs; H on the input side (within each row).
    let mut m: Vec<f32> = Vec::with_capacity(oc * ic);
    for c in 0..oc {
        let ro = rout[c].to_f32();
        for i in 0..ic {
            let v = if ro == 0.0 { 0.0 } else { w[c * ic + i] / (ro * rin[i].to_f32()) };
            m.push(v.clamp(-SCALED_CLAMP, SCALED_CLAMP));
        }
    }
    for row in m.chunks_exact_mut(ic) {
        h128(row);
    }
    // H on the output side: transpose to [IC, OC] and transform each row.
    let mut wb = vec![0f32; ic * oc];
    for c in 0..oc {
        for i in 0..ic {
            wb[i * oc + c] = m[c * ic + i];
        }
    }
    for row in wb.chunks_exact_mut(oc) {
        h128(row);
        for v in row.iter_mut() {
            *v *= RS * RS;
        }
    }
    wb
}

/// The effective weight `[OC, IC]` of a coded linear (f32 arithmetic).
pub fn effective_weight(code: &[i16], shape: LinearShape, rin: &[f16], rout: &[f16]) -> Vec<f32> {
    let (ic, oc) = (shape.ic, shape.oc);
    let wb = reconstruct(code, shape);
    // rows of W_bare [IC, OC]: H over outputs, then transpose, H over inputs.
    let mut t = vec![0f32; ic * oc];
    for i in 0..ic {
        let mut row: Vec<f32> = wb[i * oc..(i + 1) * oc].iter().map(|v| v.to_f32()).collect();
        h128(&mut row);
        for c in 0..oc {
            t[c * ic + i] = row[c];
        }
    }
    for (c, row) in t.chunks_exact_mut(ic).enumerate() {
        h128(row);
        let ro = rout[c].to_f32();
        for (i, v) in row.iter_mut().enumerate() {
            *v *= RS * RS * ro * rin[i].to_f32();
        }
    }
    t
}

/// How one projection is encoded.
#[derive(Clone, Copy, Debug)]
pub struct LayerOptions<'a> {
    /// Bits per weight: 2 or 3.
    pub k: usize,
    /// Worker threads for the tiles.
    pub threads: usize,
    /// Fixes the random signs of rin / rout.
    pub seed: u64,
    /// Mean squared activation of each input channel (`IC` values, as in a
    /// llama.cpp imatrix): steers `rin` so error lands on quiet inputs.
    pub importance: Option<&'a [f32]>,
    /// Incremented once per encoded tile (for progress displays).
    pub progress: Option<&'a AtomicUsize>,
}

impl LayerOptions<'_> {
    /// K bits, all cores, seed 0, no importance.
    pub fn new(k: usize) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self { k, threads, seed: 0, importance: None, progress: None }
    }
}

/// Input-channel magnitudes for `rin`. Coding error is roughly white in the
/// rotated domain, so output error for channel c scales with
/// `(sum_i W_ci^2 / rin_i^2) * (sum_i rin_i^2 imp_i)`; by Cauchy-Schwarz
/// that is smallest for `rin_i^2 ~ |W_.i| / sqrt(imp_i)`, i.e.
/// `rin_i = sqrt(colrms_i) * imp_i^(-1/4)` (uniform importance without an
/// imatrix).
fn input_scales(name: &str, w: &[f32], ic: usize, oc: usize, importance: Option<&[f32]>) -> crate::Result<Vec<f32>> {
    let mut sq = vec![0f64; ic];
    for row in w.chunks_exact(ic) {
        for (s, &v) in sq.iter_mut().zip(row) {
            *s += (v as f64) * (v as f64);
        }
    }
    let mut mags: Vec<f32> = sq.iter().map(|&s| ((s / oc as f64).sqrt().sqrt()) as f32).collect();
    if let Some(imp) = importance {
        crate::validate::check_len(name, "importance", imp.len(), ic)?;
        crate::validate::check_finite(name, "importance", imp.iter().copied())?;
        if let Some(i) = imp.iter().position(|&v| v < 0.0) {
            return Err(crate::EschaError::NonFinite { tensor: name.into(), what: "importance (negative)", index: i, value: imp[i] });
        }
        let mean = imp.iter().map(|&v| v as f64).sum::<f64>() / ic as f64;
        if mean > 0.0 {
            // Channels never seen active get the floor, not an infinite scale.
            for (m, &v) in mags.iter_mut().zip(imp) {
                let rel = (v as f64 / mean).max(1e-4);
                *m = (*m as f64 * rel.powf(-0.25)) as f32;
            }
        }
    }
    Ok(mags)
}

/// Encodes `w [OC, IC]` (both multiples of 128) as a coded linear.
///
/// # Errors
/// Those of [`LinearShape::new`] for `opts.k`, IC and OC;
/// [`crate::EschaError::Shape`] when `IC * OC` overflows;
/// [`crate::EschaError::BadLength`] when `w` does not hold `IC * OC`
/// values or the importance `IC`; [`crate::EschaError::NonFinite`] for a
/// NaN or infinity in `w` or the importance, or a negative importance.
pub fn encode_layer(name: &str, w: &[f32], ic: usize, oc: usize, opts: &LayerOptions) -> crate::Result<EncodedLayer> {
    let k = opts.k;
    let shape = LinearShape::new(name, k, ic, oc)?;
    let n = ic.checked_mul(oc).ok_or_else(|| crate::EschaError::Shape { tensor: name.into(), detail: format!("{ic} x {oc} weights overflow") })?;
    crate::validate::check_len(name, "weight", w.len(), n)?;
    crate::validate::check_finite(name, "weight", w.iter().copied())?;
    let mut rng = Rng::new(opts.seed);
    // Input scales from the columns (and importance); output scales: each
    // row's RMS after that, divided by the target spread.
    let (rin, rout, saturated, zeroed) = channel_scales(&input_scales(name, w, ic, oc, opts.importance)?, w, ic, &mut rng);
    let wb = rotated(w, ic, oc, &rin, &rout);
    // Finite by construction (finite weights, clamped scaled values); the
    // tile search must never see anything else.
    crate::validate::check_finite(name, "rotated weight", wb.iter().copied())?;

    let (ktn, ntn) = shape.tiles();
    let tw = 16 * k;
    let mut code = vec![0i16; shape.code_len()];
    let n_tiles = ktn * ntn;
    let threads = opts.threads.max(1).min(n_tiles);
    let progress = opts.progress;
    std::thread::scope(|s| {
        for (ci, chunk) in code.chunks_mut(n_tiles.div_ceil(threads) * tw).enumerate() {
            let wb = &wb;
            s.spawn(move || {
                let mut enc = TileEncoder::new(k);
                let mut target = [0f32; TILE_VALUES];
                let first = ci * n_tiles.div_ceil(threads);
                for (j, out) in chunk.chunks_mut(tw).enumerate() {
                    let (kt, nt) = ((first + j) / ntn, (first + j) % ntn);
                    for (t, v) in target.iter_mut().enumerate() {
                        let (r, c) = tile_position(t);
                        *v = wb[(kt * TILE + r) * oc + nt * TILE + c];
                    }
                    out.copy_from_slice(&enc.encode(&target, None).code);
                    if let Some(p) = progress {
                        p.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let weff = effective_weight(&code, shape, &rin, &rout);
    let rel = |imp: Option<&[f32]>| {
        let (mut num, mut den) = (0f64, 0f64);
        for (we, wr) in weff.chunks_exact(ic).zip(w.chunks_exact(ic)) {
            for (i, (&a, &b)) in we.iter().zip(wr).enumerate() {
                let q = imp.map_or(1.0, |v| v[i] as f64);
                num += q * (a as f64 - b as f64).powi(2);
                den += q * (b as f64).powi(2);
            }
        }
        (num / den.max(f64::MIN_POSITIVE)).sqrt()
    };
    Ok(EncodedLayer {
        shape,
        code,
        rin,
        rout,
        rel_error: rel(None),
        weighted_rel_error: opts.importance.map(|v| rel(Some(v))),
        saturated_channels: saturated,
        zeroed_channels: zeroed,
    })
}
