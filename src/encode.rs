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

/// Extra closed passes with the seam moved (each one never worsens the code).
const CLOSING_ROUNDS: usize = 2;

/// Viterbi workspace for one K (reuse it across tiles: it owns ~1-4 MB).
pub struct TileEncoder {
    k: usize,
    cb: Vec<f32>,
    cost: Vec<f32>,
    next: Vec<f32>,
    best_pred: Vec<f32>,
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
            back: vec![0; TILE_VALUES * q],
        }
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
        let mut seam = 0;
        let overlap = u32::from(free[TILE_VALUES - 1]) & low_mask;
        let (mut states, mut cost) = self.pass(target, weights, seam, Some(overlap));
        // Closed passes with the seam moved: each one's feasible set holds
        // the previous path, so the cost can only go down.
        for _ in 0..CLOSING_ROUNDS {
            seam = (seam + half) % TILE_VALUES;
            let o = u32::from(states[(seam + TILE_VALUES - 1) % TILE_VALUES]) & low_mask;
            let (s2, c2) = self.pass(target, weights, seam, Some(o));
            if c2 >= cost {
                break;
            }
            (states, cost) = (s2, c2);
        }
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
        let k = self.k;
        let nq = 1usize << (16 - k);
        let nb = 1usize << k;
        let w = |t: usize| weights.map_or(1.0, |w| w[t]);
        // t = 0: only the error (and the start restriction).
        let (x0, w0) = (target[0], w(0));
        for (s, c) in self.cost.iter_mut().enumerate() {
            let admissible = overlap.is_none_or(|o| (s >> k) as u32 == o);
            let d = self.cb[s] - x0;
            *c = if admissible { w0 * d * d } else { f32::INFINITY };
        }
        for t in 1..TILE_VALUES {
            // best_pred[q] = min_h cost[(h << (16-K)) | q]
            let (head, rest) = self.cost.split_at(nq);
            self.best_pred.copy_from_slice(head);
            let back = &mut self.back[t * nq..(t + 1) * nq];
            back.fill(0);
            // Branch-free so the compiler vectorises it.
            for (h, chunk) in rest.chunks_exact(nq).enumerate() {
                let hv = (h + 1) as u8;
                for ((m, b), &c) in self.best_pred.iter_mut().zip(back.iter_mut()).zip(chunk) {
                    let take = c < *m;
                    *b = if take { hv } else { *b };
                    *m = if take { c } else { *m };
                }
            }
            // next[(q << K) | b] = best_pred[q] + w (cb - x)^2
            let (x, wt) = (target[t], w(t));
            for (q, (row, &m)) in self.next.chunks_exact_mut(nb).zip(&self.best_pred).enumerate() {
                let cb = &self.cb[q * nb..(q + 1) * nb];
                for (o, &v) in row.iter_mut().zip(cb) {
                    let d = v - x;
                    *o = m + wt * d * d;
                }
            }
            std::mem::swap(&mut self.cost, &mut self.next);
        }
        let low_mask = (1u32 << (16 - k)) - 1;
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
