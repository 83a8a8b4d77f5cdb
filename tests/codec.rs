//! Stage "decode": codebook, bitstream, tile order and reconstruct, Rust
//! against the C reference and against independent formulas.

#![allow(clippy::needless_range_loop)]

mod common;

use escha_ggml::codec::*;
use escha_ggml::cref;
use escha_ggml::testutil::Rng;
use escha_ggml::{LinearShape, MoeShape};
use half::f16;
use std::collections::HashSet;

#[test]
fn codebook_all_states_match_c() {
    for s in 0..=u16::MAX {
        assert_eq!(cb_half(s).to_bits(), cref::cb_half(s).to_bits(), "state {s}");
    }
}

#[test]
fn codebook_known_values() {
    // Published values; state 3 is where truncating instead of rounding shows.
    assert_eq!(cb_half(3).to_bits(), 0x3AB8);
    assert_eq!(cb_half(6).to_bits(), 0xBEA4);
    assert_eq!(cb_half(7).to_bits(), 0xBC71);
}

#[test]
fn codebook_properties() {
    let table = cb_table();
    let distinct: HashSet<u16> = table.iter().map(|v| v.to_bits()).collect();
    assert_eq!(distinct.len(), 10_746);
    let mut sum2 = 0f64;
    for &v in table {
        let k = v.to_f64() * 8192.0;
        assert_eq!(k, k.round(), "{v} is not a multiple of 2^-13");
        assert!(k.abs() <= 32352.0);
        sum2 += v.to_f64() * v.to_f64();
    }
    let std = (sum2 / 65536.0).sqrt();
    assert!((std - 1.244).abs() < 0.005, "std {std}");
}

#[test]
fn codebook_is_rounded_not_truncated() {
    // Independent: add the halves in f64 and round to nearest-even by hand.
    for s in 0..=u16::MAX {
        let r = ((s as u32).wrapping_mul(0xCBAC1FED) & 0x8FFF8FFF) ^ 0x3B603B60;
        let sum = f16::from_bits(r as u16).to_f64() + f16::from_bits((r >> 16) as u16).to_f64();
        let e = sum.abs().log2().floor() as i32;
        let q = 2f64.powi(e - 10);
        let n = sum / q;
        let mut rn = n.round();
        if (n - n.trunc()).abs() == 0.5 && rn % 2.0 != 0.0 {
            rn -= n.signum();
        }
        let want = if sum == 0.0 { 0.0 } else { rn * q };
        assert_eq!(cb_half(s).to_f64(), want, "state {s}");
    }
}

#[test]
fn tile_order_is_a_bijection_and_matches_c() {
    let mut seen = [false; 256];
    for t in 0..256 {
        let (r, c) = tile_position(t);
        assert_eq!((r, c), cref::tile_position(t), "t={t}");
        assert!(r < 16 && c < 16);
        assert!(!seen[r * 16 + c], "cell ({r},{c}) hit twice");
        seen[r * 16 + c] = true;
        assert_eq!(TILE_POS[t] as usize, r * 16 + c);
    }
    assert!(seen.iter().all(|&s| s));
}

/// The vendor's lane decode (two-word windows), written out independently.
fn vendor_state(tile: &[i16], k: usize, t: usize) -> u16 {
    let w: Vec<u64> = (0..8 * k).map(|m| tile_word32(tile, m) as u64).collect();
    let (lane, j) = (t / 8, t % 8);
    let t_off = lane * 8;
    if k == 2 {
        let i1 = t_off >> 4;
        let i0 = (i1 + 15) & 15;
        let merged = (w[i0] << 32) | w[i1];
        let shift = ((!t_off) & 8) << 1;
        let win = (merged >> shift) & 0xFFFF_FFFF;
        ((win >> (2 * (7 - j))) & 0xFFFF) as u16
    } else {
        let b1 = (t_off + 257) * 3;
        let (b0, b2) = (b1 - 16, b1 + 21);
        let (i0, i2) = (b0 >> 5, (b2 - 1) >> 5);
        let s2 = ((i2 + 1) << 5) - b2;
        let merged = (w[i0 % 24] << 32) | w[i2 % 24];
        let w7 = (merged >> s2) & 0xFFFF_FFFF;
        let w3 = (merged >> (s2 + 12)) & 0xFFFF_FFFF;
        let win = if j < 4 { w3 } else { w7 };
        ((win >> (3 * (3 - (j & 3)))) & 0xFFFF) as u16
    }
}

#[test]
fn tile_states_match_c_and_vendor_decode() {
    let mut rng = Rng::new(11);
    for k in [2, 3] {
        for _ in 0..500 {
            let tile = rng.code(16 * k);
            for t in 0..256 {
                let s = tile_state(&tile, k, t);
                assert_eq!(s, cref::tile_state(&tile, k, t), "k={k} t={t}");
                assert_eq!(s, vendor_state(&tile, k, t), "k={k} t={t}");
            }
        }
    }
}

#[test]
fn tail_biting_wraps() {
    // Value 0 of a K=2 tile reads stream positions 498..511 and 0..1: only
    // the top 2 bits of word 0 and the low 14 bits of word 15.
    let mut tile = vec![0i16; 32];
    tile[1] = 0xC000u16 as i16; // top two bits of w32[0]
    assert_eq!(tile_state(&tile, 2, 0), 0b11);
    tile[1] = 0;
    tile[30] = 0x3FFF; // low 14 bits of w32[15]
    assert_eq!(tile_state(&tile, 2, 0), 0xFFFC);
}

#[test]
fn reconstruct_matches_c_on_rectangular_shapes() {
    let mut rng = Rng::new(5);
    for k in [2, 3] {
        for (ic, oc) in [(256, 384), (384, 256), (128, 128)] {
            let shape = LinearShape::new("t", k, ic, oc).unwrap();
            let code = rng.code(shape.code_len());
            let w = reconstruct(&code, shape);
            assert_eq!(common::bits(&w), common::bits(&cref::reconstruct(&code, shape)), "k={k} {ic}x{oc}");
            // Tile (kt, nt) lands at rows kt*16.., columns nt*16.. (IC/OC
            // confusion would show on these rectangular shapes).
            let (ktn, ntn) = shape.tiles();
            for (kt, nt) in [(0, 0), (ktn - 1, 0), (0, ntn - 1), (ktn - 1, ntn - 1), (1, 2)] {
                let off = (kt * ntn + nt) * 16 * k;
                let mut tile = [f16::ZERO; 256];
                decode_tile(&code[off..off + 16 * k], k, &mut tile);
                for (t, v) in tile.iter().enumerate() {
                    let (r, c) = tile_position(t);
                    assert_eq!(w[(kt * 16 + r) * oc + nt * 16 + c].to_bits(), v.to_bits());
                }
            }
        }
    }
}

#[test]
fn reconstruct_expert_uses_the_right_slice() {
    let mut rng = Rng::new(9);
    let shape = MoeShape::new("t", 2, 3, 256, 128).unwrap();
    let code = rng.code(shape.code_len());
    let per = shape.linear().code_len();
    let mut outs = Vec::new();
    for e in 0..3 {
        let w = reconstruct_expert(&code, shape, e);
        let c = cref::reconstruct(&code[e * per..(e + 1) * per], shape.linear());
        assert_eq!(common::bits(&w), common::bits(&c), "expert {e}");
        outs.push(common::bits(&w));
    }
    assert_ne!(outs[0], outs[1]);
    assert_ne!(outs[1], outs[2]);
}
