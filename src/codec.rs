//! The codec: 16-bit trellis state -> f16 value (codebook "cbA"), the
//! tail-biting bitstream of a tile, the tile order, and `reconstruct`.
//!
//! Everything here is the contract, written for clarity; the SIMD kernels in
//! [`crate::cpu`] are gated against it.

use crate::validate::{LinearShape, MoeShape};
use half::f16;
use std::sync::OnceLock;

pub use crate::format::{TILE, TILE_VALUES};
use crate::format::{CBA_MASK, CBA_MUL, CBA_XOR};

/// The hashed 32-bit word whose two f16 halves add up to the value.
#[inline(always)]
pub fn cb_hash(state: u16) -> u32 {
    (u32::from(state).wrapping_mul(CBA_MUL) & CBA_MASK) ^ CBA_XOR
}

/// Codebook value of a state: `f16(lo) + f16(hi)` with one RNE rounding.
/// Both halves lie in +-[0.125, 2), so their f32 sum is exact and a single
/// f32 -> f16 round-to-nearest-even reproduces the f16 addition.
#[inline]
pub fn cb_half(state: u16) -> f16 {
    let r = cb_hash(state);
    let lo = f16::from_bits(r as u16).to_f32();
    let hi = f16::from_bits((r >> 16) as u16).to_f32();
    f16::from_f32(lo + hi)
}

/// Codebook value as f32 (exact widening of [`cb_half`]).
#[inline]
pub fn cb_value(state: u16) -> f32 {
    cb_half(state).to_f32()
}

/// The whole codebook, 65,536 f16 values indexed by state (built once).
pub fn cb_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(cb_half).collect())
}

/// Number of int16 words in one tile of a K-bit code.
#[inline]
pub const fn tile_words16(k: usize) -> usize {
    16 * k
}

/// The 32-bit little-endian word `m` of a tile: `u16[2m] | u16[2m+1] << 16`.
#[inline(always)]
pub fn tile_word32(tile: &[i16], m: usize) -> u32 {
    (tile[2 * m] as u16 as u32) | ((tile[2 * m + 1] as u16 as u32) << 16)
}

/// State of trellis value `t` (0..256) of a tile of `16*k` int16 words.
///
/// The tile is one circular MSB-first bit string of `256*k` bits (position
/// `p` is bit `31 - p % 32` of 32-bit word `p / 32`); value `t` reads the 16
/// positions `[(t+1)k - 16, (t+1)k)` modulo the length, the first one being
/// the state's most significant bit.
#[inline]
pub fn tile_state(tile: &[i16], k: usize, t: usize) -> u16 {
    debug_assert!(k == 2 || k == 3);
    let nbits = 256 * k;
    let nwords = 8 * k;
    let start = ((t + 1) * k + nbits - 16) % nbits;
    let q = start / 32;
    let off = start % 32;
    // 64-bit window made of words q and q+1 (circular); the 16 bits start
    // `off` positions below its top bit.
    let window = ((tile_word32(tile, q) as u64) << 32) | tile_word32(tile, (q + 1) % nwords) as u64;
    ((window >> (48 - off)) & 0xFFFF) as u16
}

/// `(row, col)` of trellis value `t` inside its 16x16 tile. Values form 32
/// lanes of 8 (`t = 8*lane + j`), which is the tensor-core fragment order.
#[inline]
pub const fn tile_position(t: usize) -> (usize, usize) {
    let lane = t / 8;
    let j = t % 8;
    let row = (lane & 3) * 2 + (j & 1) + ((j >> 1) & 1) * 8;
    let col = 2 * ((lane >> 3) + if j >= 4 { 4 } else { 0 }) + ((lane >> 2) & 1);
    (row, col)
}

/// `row * 16 + col` of each trellis value, for scatter loops.
pub const TILE_POS: [u8; TILE_VALUES] = {
    let mut pos = [0u8; TILE_VALUES];
    let mut t = 0;
    while t < TILE_VALUES {
        let (r, c) = tile_position(t);
        pos[t] = (r * TILE + c) as u8;
        t += 1;
    }
    pos
};

/// The 256 values of one tile, in trellis (storage) order `t`.
pub fn decode_tile(tile: &[i16], k: usize, out: &mut [f16; TILE_VALUES]) {
    assert_eq!(tile.len(), tile_words16(k), "tile must hold 16*K int16 words");
    for (t, v) in out.iter_mut().enumerate() {
        *v = cb_half(tile_state(tile, k, t));
    }
}

/// The tile as a row-major 16x16 block (`[row][col]`, row = input offset).
pub fn decode_tile_rows(tile: &[i16], k: usize, out: &mut [f16; TILE_VALUES]) {
    let mut vals = [f16::ZERO; TILE_VALUES];
    decode_tile(tile, k, &mut vals);
    for (t, &v) in vals.iter().enumerate() {
        out[TILE_POS[t] as usize] = v;
    }
}

/// `W_bare [IC, OC]` (row-major f16) of a dense code `[IC/16, OC/16, 16K]`.
pub fn reconstruct(code: &[i16], shape: LinearShape) -> Vec<f16> {
    let LinearShape { k, ic, oc } = shape;
    let tw = tile_words16(k);
    assert_eq!(code.len(), shape.code_len(), "code length does not match the shape");
    let (kt_n, nt_n) = (ic / TILE, oc / TILE);
    let mut w = vec![f16::ZERO; ic * oc];
    let mut tile_vals = [f16::ZERO; TILE_VALUES];
    for kt in 0..kt_n {
        for nt in 0..nt_n {
            let off = (kt * nt_n + nt) * tw;
            decode_tile_rows(&code[off..off + tw], k, &mut tile_vals);
            for r in 0..TILE {
                let dst = (kt * TILE + r) * oc + nt * TILE;
                w[dst..dst + TILE].copy_from_slice(&tile_vals[r * TILE..(r + 1) * TILE]);
            }
        }
    }
    w
}

/// `W_bare [IC, OC]` of expert `e` of an expert-stacked code.
pub fn reconstruct_expert(code: &[i16], shape: MoeShape, e: usize) -> Vec<f16> {
    assert!(e < shape.e, "expert {e} outside [0, {})", shape.e);
    reconstruct(shape.expert_code(code, e), shape.linear())
}
