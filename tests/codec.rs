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

/// cb(s) straight from FORMAT.md §3: the 3-instruction hash on 32-bit
/// words, its halves read as f16, added exactly (in f64) and rounded once
/// to f16 (RNE, by the `half` crate).
fn cb_spec(s: u16) -> f16 {
    let r = ((s as u32).wrapping_mul(0xCBAC1FED) & 0x8FFF8FFF) ^ 0x3B603B60;
    let lo = f16::from_bits((r & 0xFFFF) as u16).to_f64();
    let hi = f16::from_bits((r >> 16) as u16).to_f64();
    f16::from_f64(lo + hi)
}

/// w32[m] = u16[2m] | (u16[2m+1] << 16) (FORMAT.md §2).
fn word_spec(tile: &[i16], m: usize) -> u32 {
    (tile[2 * m] as u16 as u32) | ((tile[2 * m + 1] as u16 as u32) << 16)
}

/// The state of value t (FORMAT.md §2): the 16 stream positions
/// (t+1)K-16 .. (t+1)K-1 mod N, first one most significant; position p is
/// bit 31 - (p mod 32) of w32[p / 32].
fn state_spec(tile: &[i16], k: usize, t: usize) -> u16 {
    let n = 256 * k;
    let mut s = 0u32;
    for q in 0..16 {
        let p = ((t + 1) * k + n - 16 + q) % n;
        s = (s << 1) | ((word_spec(tile, p / 32) >> (31 - p % 32)) & 1);
    }
    s as u16
}

/// (row, col) of value t = 8L + j, the two formulas of FORMAT.md §4 as written.
fn position_spec(t: usize) -> (usize, usize) {
    let (l, j) = (t / 8, t % 8);
    let row = (l & 3) * 2 + (j & 1) + ((j >> 1) & 1) * 8;
    let col = 2 * ((l >> 3) + if j >= 4 { 4 } else { 0 }) + ((l >> 2) & 1);
    (row, col)
}

#[test]
fn codebook_all_states_match_c() {
    for s in 0..=u16::MAX {
        assert_eq!(cb_half(s).to_bits(), cref::cb_half(s).to_bits(), "state {s}");
    }
}

#[test]
fn codebook_matches_the_definition() {
    let table = cb_table();
    assert_eq!(table.len(), 65536);
    for s in 0..=u16::MAX {
        let want = cb_spec(s).to_bits();
        assert_eq!(cb_half(s).to_bits(), want, "state {s}: cb_half against FORMAT.md §3");
        assert_eq!(table[s as usize].to_bits(), want, "state {s}: cb_table against FORMAT.md §3");
        assert_eq!(cb_value(s), f16::from_bits(want).to_f32(), "state {s}: cb_value");
    }
}

#[test]
fn codebook_worked_examples() {
    // The three rows of the table in FORMAT.md §3, worked by hand from the
    // definition (f16 value of bits: sign, exponent e (bits 14..10), mantissa
    // m: (1 + m/1024) * 2^(e-15)).
    //
    // s = 3: 3 * 0xCBAC1FED = 0x2_6304_5FC7 -> mod 2^32 0x63045FC7;
    //   & 0x8FFF8FFF = 0x03040FC7; ^ 0x3B603B60 = 0x386434A7.
    //   lo 0x34A7: e 13, m 0x0A7 = 167 -> 1.1630859375 / 4 = 0.290771484375
    //   hi 0x3864: e 14, m 0x064 = 100 -> 1.09765625 / 2   = 0.548828125
    //   sum 0.839599609375 in [0.5, 1): ulp 2^-11, sum * 2048 = 1719.5, a tie,
    //   to even 1720 -> m = 1720 - 1024 = 696 = 0x2B8, e 14 -> 0x3AB8
    //   (truncating keeps 1719 -> 0x3AB7).
    // s = 6: 6 * 0xCBAC1FED = 0x4_C608_BF8E -> 0xC608BF8E; & mask 0x86088F8E;
    //   ^ 0x3B603B60 = 0xBD68B4EE.
    //   lo 0xB4EE: -, e 13, m 0x0EE = 238 -> -1.232421875 / 4 = -0.30810546875
    //   hi 0xBD68: -, e 15, m 0x168 = 360 -> -1.3515625
    //   sum -1.65966796875 in [1, 2): ulp 2^-10, * 1024 = 1699.5, a tie, to even
    //   1700 -> m 676 = 0x2A4, e 15, sign -> 0xBEA4 (truncated: 0xBEA3).
    // s = 7: 7 * 0xCBAC1FED = 0x5_91B4_DF7B -> 0x91B4DF7B; & mask 0x81B48F7B;
    //   ^ 0x3B603B60 = 0xBAD4B41B.
    //   lo 0xB41B: -, e 13, m 0x01B = 27  -> -1.0263671875 / 4 = -0.256591796875
    //   hi 0xBAD4: -, e 14, m 0x2D4 = 724 -> -1.70703125 / 2   = -0.853515625
    //   sum -1.110107421875: * 1024 = 1136.75 -> 1137 -> m 113 = 0x71 -> 0xBC71
    //   (truncated: 0xBC70).
    for (s, r, lo, hi, sum, bits) in [
        (3u16, 0x386434A7u32, 0.290771484375f64, 0.548828125f64, 0.839599609375f64, 0x3AB8u16),
        (6, 0xBD68B4EE, -0.30810546875, -1.3515625, -1.65966796875, 0xBEA4),
        (7, 0xBAD4B41B, -0.256591796875, -0.853515625, -1.110107421875, 0xBC71),
    ] {
        assert_eq!(cb_hash(s), r, "state {s}: r");
        assert_eq!(f16::from_bits(r as u16).to_f64(), lo, "state {s}: lo");
        assert_eq!(f16::from_bits((r >> 16) as u16).to_f64(), hi, "state {s}: hi");
        assert_eq!(lo + hi, sum, "state {s}: exact sum");
        assert_eq!(cb_half(s).to_bits(), bits, "state {s}");
        assert_eq!(cb_spec(s).to_bits(), bits, "state {s}: the in-test definition");
    }
}

#[test]
fn codebook_properties() {
    // The table properties FORMAT.md §3 states, on the table built from the
    // definition in this file (codebook_matches_the_definition ties the
    // crate's table to it).
    let table: Vec<f16> = (0..=u16::MAX).map(cb_spec).collect();
    let distinct: HashSet<u16> = table.iter().map(|v| v.to_bits()).collect();
    assert_eq!(distinct.len(), 10_746);
    let (mut sum, mut sum2) = (0f64, 0f64);
    for &v in &table {
        let k = v.to_f64() * 8192.0;
        assert_eq!(k, k.round(), "{v} is not a multiple of 2^-13");
        assert!(k.abs() <= 32352.0);
        sum += v.to_f64();
        sum2 += v.to_f64() * v.to_f64();
    }
    assert!((sum / 65536.0).abs() < 0.01, "mean {}", sum / 65536.0);
    let std = (sum2 / 65536.0).sqrt();
    assert!((std - 1.244).abs() < 0.005, "std {std}");
    // The wrong variants the spec warns about differ on about 25%
    // (truncating) and 50% (keeping the f32 sum) of the states.
    let (mut trunc, mut unrounded) = (0usize, 0usize);
    for s in 0..=u16::MAX {
        let r = ((s as u32).wrapping_mul(0xCBAC1FED) & 0x8FFF8FFF) ^ 0x3B603B60;
        let sum = f16::from_bits(r as u16).to_f64() + f16::from_bits((r >> 16) as u16).to_f64();
        let want = table[s as usize].to_f64();
        unrounded += (sum != want) as usize;
        // Truncation toward zero at f16 precision (sum is a normal f16-range value).
        let q = 2f64.powi(sum.abs().log2().floor() as i32 - 10);
        trunc += (sum != 0.0 && (sum / q).trunc() * q != want) as usize;
    }
    assert!((0.20..0.30).contains(&(trunc as f64 / 65536.0)), "truncation changes {trunc} states");
    assert!((0.45..0.55).contains(&(unrounded as f64 / 65536.0)), "skipping the rounding changes {unrounded} states");
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
fn tile_order_is_a_bijection_and_matches_the_spec_and_c() {
    let mut seen = [false; 256];
    for t in 0..256 {
        let (r, c) = tile_position(t);
        assert_eq!((r, c), position_spec(t), "t={t}: FORMAT.md §4");
        assert_eq!((r, c), cref::tile_position(t), "t={t}");
        // The simplified column formula of §4 agrees.
        let (l, j) = (t / 8, t % 8);
        assert_eq!(c, (l >> 2) + if j >= 4 { 8 } else { 0 }, "t={t}");
        assert!(r < 16 && c < 16);
        assert!(!seen[r * 16 + c], "cell ({r},{c}) hit twice");
        seen[r * 16 + c] = true;
        assert_eq!(TILE_POS[t] as usize, r * 16 + c);
    }
    assert!(seen.iter().all(|&s| s));
    // Hand-worked from §4: t = 0 (L 0, j 0) -> (0, 0); t = 7 (L 0, j 7):
    // row 0 + 1 + 8 = 9, col 2 * (0 + 4) + 0 = 8; t = 13 (L 1, j 5): row 2 + 1
    // + 0 = 3, col 8; t = 36 (L 4, j 4): row 0, col 2 * 4 + 1 = 9; t = 255
    // (L 31, j 7): row 6 + 1 + 8 = 15, col 2 * (3 + 4) + 1 = 15.
    for (t, want) in [(0, (0, 0)), (7, (9, 8)), (13, (3, 8)), (36, (0, 9)), (255, (15, 15))] {
        assert_eq!(tile_position(t), want, "t={t}");
    }
}

/// The vendor's lane decode (two-word windows), written out independently.
fn vendor_state(tile: &[i16], k: usize, t: usize) -> u16 {
    let w: Vec<u64> = (0..8 * k).map(|m| word_spec(tile, m) as u64).collect();
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
fn tile_states_match_the_spec_c_and_vendor_decode() {
    let mut rng = Rng::new(11);
    for k in [2, 3] {
        for _ in 0..500 {
            let tile = rng.code(16 * k);
            for m in 0..8 * k {
                assert_eq!(tile_word32(&tile, m), word_spec(&tile, m), "k={k} word {m}");
            }
            for t in 0..256 {
                let s = tile_state(&tile, k, t);
                assert_eq!(s, state_spec(&tile, k, t), "k={k} t={t}: FORMAT.md §2");
                assert_eq!(s, cref::tile_state(&tile, k, t), "k={k} t={t}");
                assert_eq!(s, vendor_state(&tile, k, t), "k={k} t={t}");
            }
        }
    }
}

#[test]
fn tail_biting_wraps() {
    // FORMAT.md §2, K = 2 (N = 512): value t reads positions 2(t+1)-16 ..
    // 2(t+1)-1 mod 512. Value 0: 498..511 then 0, 1. Positions 498..511 are
    // bits 31-18 = 13 .. 31-31 = 0 of w32[15] = u16[30] | u16[31] << 16, i.e.
    // the low 14 bits of u16[30], as state bits 15..2; positions 0, 1 are
    // bits 31, 30 of w32[0], the top two bits of u16[1], as state bits 1, 0.
    let mut tile = vec![0i16; 32];
    tile[1] = 0xC000u16 as i16; // top two bits of w32[0]
    assert_eq!(tile_state(&tile, 2, 0), 0b11);
    tile[1] = 0;
    tile[30] = 0x3FFF; // low 14 bits of w32[15]
    assert_eq!(tile_state(&tile, 2, 0), 0x3FFF << 2);
    // The worked example's other rows: value 7 reads 0..15 = bits 31..16 of
    // w32[0] = u16[1]; value 255 reads 496..511 = bits 15..0 of w32[15] = u16[30].
    let tile: Vec<i16> = (0..32).map(|i| (0x1111u16.wrapping_mul(i as u16 + 1) ^ 0x8421) as i16).collect();
    assert_eq!(tile_state(&tile, 2, 7), tile[1] as u16);
    assert_eq!(tile_state(&tile, 2, 255), tile[30] as u16);
    let (u1, u30) = (tile[1] as u16, tile[30] as u16);
    assert_eq!(tile_state(&tile, 2, 0), ((u30 & 0x3FFF) << 2) | (u1 >> 14));
    // K = 3 (N = 768): value 4 reads 15-16 = -1 = 767, then 0..14: the low bit
    // of w32[23] (bit 0 of u16[46]) then bits 31..17 of w32[0] (u16[1] >> 1).
    let tile: Vec<i16> = (0..48).map(|i| (0x0F0Fu16.wrapping_mul(i as u16 + 3) ^ 0x5A5A) as i16).collect();
    let (u1, u46) = (tile[1] as u16, tile[46] as u16);
    assert_eq!(tile_state(&tile, 3, 4), ((u46 & 1) << 15) | (u1 >> 1));
    // Value 5 reads 2..17: the first value that does not wrap.
    assert_eq!(tile_state(&tile, 3, 5), (((u1 as u32) << 16 | tile[0] as u16 as u32) >> 14) as u16);
}

#[test]
fn reconstruct_matches_c_on_rectangular_shapes() {
    let mut rng = Rng::new(5);
    for k in [2, 3] {
        for (ic, oc) in [(256, 384), (384, 256), (128, 128)] {
            let shape = LinearShape::new("t", k, ic, oc).unwrap();
            let code = rng.code(shape.code_len());
            let w = reconstruct(&code, shape);
            // Every weight from FORMAT.md alone: tile (kt, nt) is code entry
            // [kt, nt, :], its value t lands at (kt*16 + row, nt*16 + col) of
            // §4 and equals cb(state(t)) of §3 and §2.
            let (ktn, ntn) = shape.tiles();
            for kt in 0..ktn {
                for nt in 0..ntn {
                    let off = (kt * ntn + nt) * 16 * k;
                    let tile = &code[off..off + 16 * k];
                    for t in 0..256 {
                        let (r, c) = position_spec(t);
                        let want = cb_spec(state_spec(tile, k, t));
                        assert_eq!(w[(kt * 16 + r) * oc + nt * 16 + c].to_bits(), want.to_bits(), "k={k} {ic}x{oc} tile ({kt},{nt}) t={t}");
                    }
                }
            }
            assert_eq!(common::bits(&w), common::bits(&cref::reconstruct(&code, shape)), "k={k} {ic}x{oc}");
            // Tile (kt, nt) lands at rows kt*16.., columns nt*16.. (IC/OC
            // confusion would show on these rectangular shapes).
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
