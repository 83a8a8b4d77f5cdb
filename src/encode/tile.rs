//! The tile encoder: for 256 target values (in trellis order), the K-bit
//! tail-biting bitstream whose decoded values minimise the (optionally
//! importance-weighted) squared error, by Viterbi over all 65,536 states.
//!
//! The trellis: state `s_t` (value t) is the 16 stream bits ending at
//! position `(t+1)K`, so `s_{t+1} = ((s_t << K) | b) & 0xFFFF` for the next
//! K bits `b`, and the predecessors of a state `s` are
//! `(h << (16-K)) | (s >> K)` for the `2^K` values of `h`: a min over `2^K`
//! candidates per state and step. The stream is circular (tail-biting):
//! `s_0`'s top `16-K` bits are `s_255`'s low `16-K` bits.
//!
//! Tail-biting is handled as QTIP does, and the result is always a valid
//! circular code: pass 1 runs an unconstrained Viterbi on the tile rotated
//! by 128 values and reads the overlap `o` (the low `16-K` bits) of the state
//! it gives value 255, which sits mid-path there; pass 2 runs on the tile
//! with `s_0` restricted to states whose top bits are `o` and `s_255` to
//! states whose low bits are `o`, so the chosen path closes on itself
//! exactly.

// The Viterbi steps index several per-step arrays by t.
#![allow(clippy::needless_range_loop)]

use crate::codec::{cb_table, TILE_VALUES};

/// Viterbi workspace for one K (reuse it across tiles: it owns ~1-4 MB).
pub struct TileEncoder {
    k: usize,
    cb: Vec<f32>,
    cost: Vec<f32>,
    next: Vec<f32>,
    best_pred: Vec<f32>,
    back_idx: Vec<u32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx2: bool,
    /// Per step and per `q = s >> K`: the chosen predecessor's top bits `h`.
    back: Vec<u8>,
}

/// One encoded tile.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedTile {
    /// `16*K` int16 words in the codec's layout.
    pub code: Vec<i16>,
    /// The state of each value (trellis order).
    pub states: Vec<u16>,
    /// Weighted squared error of the decoded values against the target.
    pub error: f64,
}

impl TileEncoder {
    pub fn new(k: usize) -> Self {
        assert!(k == 2 || k == 3, "K must be 2 or 3");
        let q = 1usize << (16 - k);
        Self {
            k,
            cb: cb_table().iter().map(|v| v.to_f32()).collect(),
            cost: vec![0.0; 1 << 16],
            next: vec![0.0; 1 << 16],
            best_pred: vec![0.0; q],
            back_idx: vec![0; q],
            #[cfg(target_arch = "x86_64")]
            avx2: is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(not(target_arch = "x86_64"))]
            avx2: false,
            back: vec![0; TILE_VALUES * q],
        }
    }

    /// The same encoder without the SIMD steps (the path of non-x86 targets).
    pub fn portable(k: usize) -> Self {
        Self { avx2: false, ..Self::new(k) }
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Encodes `target` (256 values in trellis order `t`; see
    /// [`crate::codec::tile_position`]) with optional per-value weights.
    pub fn encode(&mut self, target: &[f32], weights: Option<&[f32]>) -> EncodedTile {
        assert_eq!(target.len(), TILE_VALUES, "a tile has 256 values");
        if let Some(w) = weights {
            assert_eq!(w.len(), TILE_VALUES, "one weight per value");
        }
        let low_mask = (1u32 << (16 - self.k)) - 1;
        // Pass 1, unconstrained, on the tile rotated by half: the state it
        // gives value 255 is chosen with context on both sides of the seam.
        let half = TILE_VALUES / 2;
        let free = self.pass(target, weights, half, None).0;
        let overlap = u32::from(free[TILE_VALUES - 1]) & low_mask;
        // Further closed passes with the seam moved, or closed passes from
        // other rotations, measured no better than this one (to 1e-4 in
        // normalised MSE): the second pass is the tail-biting optimum here.
        let (states, _) = self.pass(target, weights, 0, Some(overlap));
        let code = pack(&states, self.k);
        let error = states
            .iter()
            .enumerate()
            .map(|(t, &s)| {
                let d = (self.cb[s as usize] - target[t]) as f64;
                weights.map_or(1.0, |w| w[t] as f64) * d * d
            })
            .sum();
        EncodedTile { code, states, error }
    }

    /// A Viterbi pass over the tile rotated to start at value `seam`; returns
    /// the state path in the tile's own order and its cost.
    fn pass(&mut self, target: &[f32], weights: Option<&[f32]>, seam: usize, overlap: Option<u32>) -> (Vec<u16>, f32) {
        let rot = |v: &[f32]| -> Vec<f32> { (0..TILE_VALUES).map(|t| v[(t + seam) % TILE_VALUES]).collect() };
        let (rt, rw) = (rot(target), weights.map(rot));
        let (last, cost) = self.viterbi(&rt, rw.as_deref(), overlap);
        let path = self.backtrack(last);
        ((0..TILE_VALUES).map(|t| path[(t + TILE_VALUES - seam) % TILE_VALUES]).collect(), cost)
    }

    /// One Viterbi pass; with `overlap`, start and end states are restricted
    /// so the path closes. Returns the best admissible final state.
    fn viterbi(&mut self, target: &[f32], weights: Option<&[f32]>, overlap: Option<u32>) -> (u32, f32) {
        match self.k {
            2 => self.viterbi_k::<2>(target, weights, overlap),
            _ => self.viterbi_k::<3>(target, weights, overlap),
        }
    }

    /// The pass for a compile-time K, written as flat loops over
    /// fixed-width chunks so the compiler vectorises them.
    fn viterbi_k<const K: usize>(&mut self, target: &[f32], weights: Option<&[f32]>, overlap: Option<u32>) -> (u32, f32) {
        let nq = 1usize << (16 - K);
        let w = |t: usize| weights.map_or(1.0, |w| w[t]);
        // t = 0: only the error (and the start restriction).
        let (x0, w0) = (target[0], w(0));
        for (s, c) in self.cost.iter_mut().enumerate() {
            let admissible = overlap.is_none_or(|o| (s >> K) as u32 == o);
            let d = self.cb[s] - x0;
            *c = if admissible { w0 * d * d } else { f32::INFINITY };
        }
        for t in 1..TILE_VALUES {
            let (x, wt) = (target[t], w(t));
            let back = &mut self.back[t * nq..(t + 1) * nq];
            #[cfg(target_arch = "x86_64")]
            if self.avx2 {
                // SAFETY (step's list): 1. `self.avx2` is set only when AVX2 and
            // FMA are detected (`new`); 2. K is 2 or 3 (asserted in `new`).
                unsafe {
                    if weights.is_some() {
                        simd::step::<K, true>(&self.cost, &self.cb, x, wt, &mut self.next, back)
                    } else {
                        simd::step::<K, false>(&self.cost, &self.cb, x, wt, &mut self.next, back)
                    }
                }
                std::mem::swap(&mut self.cost, &mut self.next);
                continue;
            }
            // best_pred[q] = min_h cost[(h << (16-K)) | q], arg in back_idx.
            let (head, rest) = self.cost.split_at(nq);
            self.best_pred.copy_from_slice(head);
            self.back_idx.fill(0);
            for (h, chunk) in rest.chunks_exact(nq).enumerate() {
                let hv = (h + 1) as u32;
                for ((m, b), &c) in self.best_pred.iter_mut().zip(self.back_idx.iter_mut()).zip(chunk) {
                    let take = c < *m;
                    *b = if take { hv } else { *b };
                    *m = if take { c } else { *m };
                }
            }
            for (d, &b) in back.iter_mut().zip(&self.back_idx) {
                *d = b as u8;
            }
            // next[(q << K) | b] = best_pred[q] + w (cb - x)^2
            for ((row, cb), &m) in self.next.chunks_exact_mut(1 << K).zip(self.cb.chunks_exact(1 << K)).zip(&self.best_pred) {
                for (o, &v) in row.iter_mut().zip(cb) {
                    let d = v - x;
                    *o = m + wt * d * d;
                }
            }
            std::mem::swap(&mut self.cost, &mut self.next);
        }
        let low_mask = (1u32 << (16 - K)) - 1;
        let mut best = (u32::MAX, f32::INFINITY);
        for (s, &c) in self.cost.iter().enumerate() {
            let admissible = overlap.is_none_or(|o| s as u32 & low_mask == o);
            if admissible && c < best.1 {
                best = (s as u32, c);
            }
        }
        assert!(best.0 != u32::MAX, "no admissible path (non-finite targets or weights?)");
        best
    }

    /// The state sequence ending in `last`, from the back pointers.
    fn backtrack(&self, last: u32) -> Vec<u16> {
        let k = self.k;
        let nq = 1usize << (16 - k);
        let mut states = vec![0u16; TILE_VALUES];
        let mut s = last as usize;
        states[TILE_VALUES - 1] = s as u16;
        for t in (1..TILE_VALUES).rev() {
            let q = s >> k;
            let h = self.back[t * nq + q] as usize;
            s = (h << (16 - k)) | q;
            states[t - 1] = s as u16;
        }
        states
    }
}

/// The stream of a tail-biting state path: value t contributes its low K
/// bits at stream positions `[tK, (t+1)K)`, MSB first; position `p` is bit
/// `31 - p % 32` of 32-bit word `p / 32`, stored as two little-endian int16.
pub fn pack(states: &[u16], k: usize) -> Vec<i16> {
    assert_eq!(states.len(), TILE_VALUES);
    let mut w32 = vec![0u32; 8 * k];
    for (t, &s) in states.iter().enumerate() {
        for i in 0..k {
            let bit = (u32::from(s) >> (k - 1 - i)) & 1;
            let p = t * k + i;
            w32[p / 32] |= bit << (31 - p % 32);
        }
    }
    w32.iter().flat_map(|&w| [w as u16 as i16, (w >> 16) as u16 as i16]).collect()
}

/// AVX2 versions of the two steps of a Viterbi stage. They follow the
/// portable loops (a strict `<` keeps the first minimum) except that FMA
/// fuses `w*d*d + m`: path costs only steer the search, so this can change
/// which of two near-equal paths wins, never the validity of the code.
#[cfg(target_arch = "x86_64")]
mod simd {
    use core::arch::x86_64::*;

    /// One Viterbi stage, fused: for each block of 8 `q`, the best of the
    /// `2^K` predecessors (`back[q]` = the first minimising h), then
    /// `next[(q << K) | b] = best[q] + w (cb[(q << K) | b] - x)^2` for the
    /// `8 << K` successors while `best` is still in registers.
    ///
    /// # Safety
    /// 1. The CPU supports AVX2 and FMA.
    /// 2. `K <= 13` (the encoder uses 2 and 3), so `2^16 >> K` is a multiple
    ///    of 8 and every 8-wide access stays inside the slices, whose lengths
    ///    are asserted.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn step<const K: usize, const WEIGHTED: bool>(cost: &[f32], cb: &[f32], x: f32, w: f32, next: &mut [f32], back: &mut [u8]) {
        let n = 1usize << 16;
        let nq = n >> K;
        assert!(cost.len() >= n && cb.len() >= n && next.len() >= n && back.len() >= nq);
        let (c, cbp, np) = (cost.as_ptr(), cb.as_ptr(), next.as_mut_ptr());
        // Low byte of each 32-bit lane to the lane's first four bytes.
        let pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        let (xv, wv) = (_mm256_set1_ps(x), _mm256_set1_ps(w));
        for q in (0..nq).step_by(8) {
            let mut m = _mm256_loadu_ps(c.add(q));
            let mut idx = _mm256_setzero_si256();
            for h in 1..(1usize << K) {
                let v = _mm256_loadu_ps(c.add(h * nq + q));
                let lt = _mm256_cmp_ps::<_CMP_LT_OQ>(v, m);
                m = _mm256_blendv_ps(m, v, lt);
                idx = _mm256_blendv_epi8(idx, _mm256_set1_epi32(h as i32), _mm256_castps_si256(lt));
            }
            let b = _mm256_shuffle_epi8(idx, pick);
            let lo = _mm256_extract_epi32::<0>(b) as u32;
            let hi = _mm256_extract_epi32::<4>(b) as u32;
            std::ptr::write_unaligned(back.as_mut_ptr().add(q) as *mut u64, (lo as u64) | ((hi as u64) << 32));
            // Successor vector j holds states (q << K) + 8j .. + 8j + 8, whose
            // predecessor minimum is lane 8j >> K (+1 for the upper half at K=2).
            for j in 0..(1usize << K) {
                let sel = if K == 3 { _mm256_set1_epi32(j as i32) } else { _mm256_setr_epi32(2 * j as i32, 2 * j as i32, 2 * j as i32, 2 * j as i32, 2 * j as i32 + 1, 2 * j as i32 + 1, 2 * j as i32 + 1, 2 * j as i32 + 1) };
                let mj = _mm256_permutevar8x32_ps(m, sel);
                let s = (q << K) + 8 * j;
                let d = _mm256_sub_ps(_mm256_loadu_ps(cbp.add(s)), xv);
                let wd = if WEIGHTED { _mm256_mul_ps(wv, d) } else { d };
                _mm256_storeu_ps(np.add(s), _mm256_fmadd_ps(wd, d, mj));
            }
        }
    }
}
