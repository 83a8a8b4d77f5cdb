//! AVX2 + FMA + F16C path. A vector holds 8 lanes of a tile (lanes
//! 8g..8g+7 for group g = 0..3, in the order `LANE_PERM`); vector (g, j)
//! holds value j of those lanes. Its rows are `[0,2,0,2,4,6,4,6] + rj` with
//! `rj = (j&1) + 8*((j>>1)&1)`, its columns `2g + 8*(j>=4) + [0,0,1,1,0,0,1,1]`,
//! so products accumulate in 8 "lane-layout" vectors per tile, reduced to
//! 16 columns once at the end.

// Index loops mirror the lane/group arithmetic of the layout comments.
#![allow(clippy::needless_range_loop)]

use super::batch::xh_ptrs;
use super::tables::{group_windows, state_window, GroupWindow, EXT_WORDS};
use super::{F16_TO_F32_SCALE, HALF_MASK_F32, HALF_XOR_F32, LOW_HALF_MADD};
use super::job::{BlockJob, BLOCK_COLS, BLOCK_TILES, PREFETCH_ROWS};
use crate::format::{CBA_MUL, TILE};
use core::arch::x86_64::*;

type Tabs = [[GroupWindow<8>; 4]; 2];
/// Vector position p of group g holds lane `8g + LANE_PERM[p]`: the order
/// the reduction and the row-major transpose below take (lanes 8g..8g+3,
/// the tile's even column of the group, at positions 0, 1, 4, 5; lanes
/// 8g+4..8g+7, its odd column, at 2, 3, 6, 7). The windows put the states
/// in that order, and the decode keeps it.
const LANE_PERM: [usize; 8] = [0, 1, 4, 5, 2, 3, 6, 7];
static TAB2: Tabs = group_windows::<8, 4>(2, &LANE_PERM);
static TAB3: Tabs = group_windows::<8, 4>(3, &LANE_PERM);

/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld8(v: &[u32; 8]) -> __m256i {
    _mm256_loadu_si256(v.as_ptr() as *const __m256i)
}

/// The 8 lane windows of group `gw`.
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
/// 2. `gw.base + 8 <= EXT_WORDS` (true of every entry of `TAB2` and
///    `TAB3`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn window(ext: &[u32; EXT_WORDS], gw: &GroupWindow<8>) -> __m256i {
    let v = _mm256_loadu_si256(ext.as_ptr().add(gw.base) as *const __m256i);
    let a = _mm256_permutevar8x32_epi32(v, _mm256_loadu_si256(gw.idx_a.as_ptr() as *const __m256i));
    let b = _mm256_permutevar8x32_epi32(v, _mm256_loadu_si256(gw.idx_b.as_ptr() as *const __m256i));
    _mm256_or_si256(_mm256_sllv_epi32(a, ld8(&gw.shl)), _mm256_srlv_epi32(b, ld8(&gw.shr)))
}


/// Codebook values of 8 states (in the low 16 bits of each lane) times
/// 2^-112, exactly, in integer and f32 operations alone (no f16
/// conversion, whose round trip cost most of the decode):
/// - the hash `(s * CBA_MUL & CBA_MASK) ^ CBA_XOR` holds the two f16
///   halves; with a half's bits at the top of a dword, an arithmetic shift
///   by 3 leaves its sign at bit 31 and its exponent and mantissa at f32
///   bits 27..13, which read as f32 are the half times 2^-112 (f32's
///   exponent bias is 112 above f16's; both halves are normal). The high
///   half is there already; `vpmaddwd` by (2^13, 0) sign-extends the low
///   half and shifts it by 13 in one operation, on the multiplier rather
///   than the shifter. The mask and xor then follow the bits' move
///   (`HALF_MASK_F32`, which also clears what the shift brought in);
/// - the two halves' f32 sum is exact (both are multiples of 2^-13 below 2
///   in magnitude, times 2^-112);
/// - Veltkamp's split by 2^13 + 1 rounds it to f16's 11 significant bits,
///   to nearest even, as the contract's f16 addition does, with the default
///   rounding mode: `c = x * 8193`, then `c - 8192 x` in one FMA, one
///   operation fewer than `c - (c - x)`. The FMA's result is always exact;
///   it is the split's high part (x rounded to 11 bits) because x has at
///   most 15 significant bits (a multiple of 2^-13 below 4, scaled): for x
///   with all 24, within 2^-13 of its binade's top, it could come out an
///   11-bit ulp low. The result is zero or normal, as a nonzero sum is a
///   multiple of 2^-125.
///
/// `codebook_scaled_is_exact` checks all 65536 states.
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cb8_scaled(s: __m256i) -> __m256 {
    let h = _mm256_mullo_epi32(s, _mm256_set1_epi32(CBA_MUL as i32));
    let (m, x) = (_mm256_set1_epi32(HALF_MASK_F32 as i32), _mm256_set1_epi32(HALF_XOR_F32 as i32));
    let hi = _mm256_xor_si256(_mm256_and_si256(_mm256_srai_epi32::<3>(h), m), x);
    let lo = _mm256_xor_si256(_mm256_and_si256(_mm256_madd_epi16(h, _mm256_set1_epi32(LOW_HALF_MADD)), m), x);
    let x = _mm256_add_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi));
    let c = _mm256_mul_ps(x, _mm256_set1_ps(8193.0));
    _mm256_fnmadd_ps(x, _mm256_set1_ps(8192.0), c)
}

/// Codebook values of 8 states, exact ([`cb8_scaled`] times 2^112).
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cb8(s: __m256i) -> __m256 {
    _mm256_mul_ps(cb8_scaled(s), _mm256_set1_ps(F16_TO_F32_SCALE))
}

/// State vector (g, j) from the group's windows.
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn states<const K: usize>(w: &[__m256i; 2], j: usize) -> __m256i {
    let (h, sh) = state_window(K, j);
    _mm256_and_si256(_mm256_srl_epi32(w[h], _mm_cvtsi32_si128(sh as i32)), _mm256_set1_epi32(0xFFFF))
}

/// The 4 input vectors of one 16-row tile row: `xv[j&3]` pairs with state
/// j. Times 2^112, against [`cb8_scaled`]'s values: exact, as an f16 input
/// is below 2^16, so each product is the unscaled one bit for bit.
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
/// 2. `x` is valid for reads of 16 floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn xvecs(x: *const f32) -> [__m256; 4] {
    let scale = _mm256_set1_ps(F16_TO_F32_SCALE);
    let lo = _mm256_mul_ps(_mm256_loadu_ps(x), scale);
    let hi = _mm256_mul_ps(_mm256_loadu_ps(x.add(8)), scale);
    // Rows 2*(lane&3) + rj for the lanes in LANE_PERM order.
    let ev = _mm256_setr_epi32(0, 2, 0, 2, 4, 6, 4, 6);
    let od = _mm256_setr_epi32(1, 3, 1, 3, 5, 7, 5, 7);
    [
        _mm256_permutevar8x32_ps(lo, ev),
        _mm256_permutevar8x32_ps(lo, od),
        _mm256_permutevar8x32_ps(hi, ev),
        _mm256_permutevar8x32_ps(hi, od),
    ]
}

/// Decodes one tile and accumulates it against `R` rows' input vectors
/// (each decoded vector serves every row).
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
/// 2. Every window of `tabs` lies inside `ext` (true of `TAB2` and `TAB3`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_fma<const K: usize, const R: usize>(ext: &[u32; EXT_WORDS], tabs: &Tabs, xv: &[[__m256; 4]; R], acc: &mut [[__m256; 8]; R]) {
    for g in 0..4 {
        let w0 = window(ext, &tabs[0][g]);
        let w = [w0, if K == 3 { window(ext, &tabs[1][g]) } else { w0 }];
        for j in 0..8 {
            let v = cb8_scaled(states::<K>(&w, j));
            for r in 0..R {
                let a = &mut acc[r][g * 2 + (j >> 2)];
                *a = _mm256_fmadd_ps(v, xv[r][j & 3], *a);
            }
        }
    }
}

/// Sums each accumulator's lanes 0..4 (positions 0,1,4,5 in LANE_PERM
/// order) and 4..8 (positions 2,3,6,7) into the tile's 16 columns.
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reduce(acc: &[__m256; 8], mid: &mut [f32]) {
    for g in 0..4 {
        for jh in 0..2 {
            let v = acc[g * 2 + jh];
            // [p0+p1, p2+p3, .., | p4+p5, p6+p7, ..]
            let s = _mm256_hadd_ps(v, v);
            let lo = _mm256_castps256_ps128(s);
            let hi = _mm256_extractf128_ps::<1>(s);
            let t = _mm_add_ps(lo, hi); // [A, B, A, B]
            let c = 2 * g + 8 * jh;
            mid[c] += _mm_cvtss_f32(t);
            mid[c + 1] += _mm_cvtss_f32(_mm_shuffle_ps::<1>(t, t));
        }
    }
}

/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemv<const K: usize>(job: &BlockJob, mid: &mut [f32]) {
    // SAFETY: gemv_rows' 1. and 2. are ours; 3. holds in every arm.
    match job.rows.len() {
        1 => gemv_rows::<K, 1>(job, mid),
        2 => gemv_rows::<K, 2>(job, mid),
        _ => gemv_rows::<K, 3>(job, mid),
    }
}

/// `mid [R, 128]` of the rows `job.rows`: every tile decoded once, in
/// registers, and applied to each row.
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `job.rows.len() == R`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemv_rows<const K: usize, const R: usize>(job: &BlockJob, mid: &mut [f32]) {
    debug_assert_eq!(job.rows.len(), R);
    let tabs = if K == 2 { &TAB2 } else { &TAB3 };
    let mut acc = [[[_mm256_setzero_ps(); 8]; R]; BLOCK_TILES];
    // Each tile's words are copied one tile ahead of their use: a window
    // load that reads a copy still in the store queue cannot be forwarded
    // from the several stores that made it, and stalls.
    let mut ext = [[0u32; EXT_WORDS]; 2];
    let nt0 = job.block * BLOCK_TILES;
    let tiles = job.tile_range();
    job.load_ext::<K>(0, nt0 + tiles.start, &mut ext[0]);
    let mut cur_slot = 0; // which copy holds the current tile
    for kt in 0..job.kt_n() {
        job.prefetch_tile_row(kt + PREFETCH_ROWS);
        // SAFETY: xvecs' 2.: `xh_tile` is a 16-float slice.
        let xv: [[__m256; 4]; R] = core::array::from_fn(|r| xvecs(job.xh_tile(job.rows[r], kt).as_ptr()));
        for tl in tiles.clone() {
            let [e0, e1] = &mut ext;
            let (cur, next) = if cur_slot == 0 { (&*e0, e1) } else { (&*e1, e0) };
            if tl + 1 < tiles.end {
                job.load_ext::<K>(kt, nt0 + tl + 1, next);
            } else if kt + 1 < job.kt_n() {
                job.load_ext::<K>(kt + 1, nt0 + tiles.start, next);
            }
            tile_fma::<K, R>(cur, tabs, &xv, &mut acc[tl]);
            cur_slot ^= 1;
        }
    }
    for tl in tiles {
        let a = &acc[tl];
        for (r, ar) in a.iter().enumerate() {
            reduce(ar, &mut mid[r * BLOCK_COLS + tl * TILE..][..TILE]);
        }
    }
}

super::batch::tile_ops!(Avx2, gemv_rows = GEMV_ROWS);

/// Rows up to which the GEMV, decoding in registers, beats the batched
/// product's decode to memory (on Zen 3, 5120 -> 17408 K=2: 26.0 against
/// 44.8 ms at 2 rows, 28.7 against 45.9 at 3; at 4 rows its accumulators
/// spill and it loses, 47.5 against 42.9).
const GEMV_ROWS: usize = 3;
const _: () = assert!(GEMV_ROWS == 3, "gemv's arms cover 1 to GEMV_ROWS rows");

/// Decodes tile `(kt, nt)` straight to row-major f32 with in-register
/// transposes. For value j, vectors g = 0..3 hold (in LANE_PERM order)
/// rows `2k + rj` (k = 0..3) of columns `8*(j>>2) + 2g + {0, 1}`; pairing
/// positions (0,2), (1,3), (4,6), (5,7) gives row k's two columns of each
/// g, and a 4x4 transpose of those 64-bit pairs gives row k's 8 columns.
///
/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_rows<const K: usize>(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32]) {
    let tabs = if K == 2 { &TAB2 } else { &TAB3 };
    let out = &mut out[..256];
    let mut ext = [0u32; EXT_WORDS];
    job.load_ext::<K>(kt, nt, &mut ext);
    let mut w = [[_mm256_setzero_si256(); 2]; 4];
    for (g, wg) in w.iter_mut().enumerate() {
        let w0 = window(&ext, &tabs[0][g]);
        *wg = [w0, if K == 3 { window(&ext, &tabs[1][g]) } else { w0 }];
    }
    for j in 0..8 {
        let rj = (j & 1) + 8 * ((j >> 1) & 1);
        let c0 = 8 * (j >> 2);
        let v: [__m256d; 4] = core::array::from_fn(|g| {
            // [e0, e2, e1, e3 | e4, e6, e5, e7] as four (row k) pairs.
            _mm256_castps_pd(_mm256_permute_ps::<0b11_01_10_00>(cb8(states::<K>(&w[g], j))))
        });
        let lo01 = _mm256_unpacklo_pd(v[0], v[1]);
        let hi01 = _mm256_unpackhi_pd(v[0], v[1]);
        let lo23 = _mm256_unpacklo_pd(v[2], v[3]);
        let hi23 = _mm256_unpackhi_pd(v[2], v[3]);
        let rows = [
            _mm256_permute2f128_pd::<0x20>(lo01, lo23),
            _mm256_permute2f128_pd::<0x20>(hi01, hi23),
            _mm256_permute2f128_pd::<0x31>(lo01, lo23),
            _mm256_permute2f128_pd::<0x31>(hi01, hi23),
        ];
        for (k, r) in rows.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add((2 * k + rj) * TILE + c0), _mm256_castpd_ps(*r));
        }
    }
}

/// # Safety
/// 1. The CPU supports AVX2, FMA and F16C.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `dec` holds `kc * 8 * 256` floats (`kc` decoded tile rows).
/// 4. `mid` holds at least `(i0 + R) * 128` floats.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_fma<const R: usize>(job: &BlockJob, i0: usize, kt0: usize, kc: usize, dec: &[f32], mid: &mut [f32]) {
    // SAFETY: every raw access below is inside `dec` (3.), `mid` (4.) or a
    // 16-float tile of `xh` (`xh_ptrs`).
    let xp = xh_ptrs::<R>(job, i0, kt0, kc);
    for tl in 0..BLOCK_TILES {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for (q, a) in acc.iter_mut().enumerate() {
            let mp = mid.as_ptr().add((i0 + q) * BLOCK_COLS + tl * TILE);
            *a = [_mm256_loadu_ps(mp), _mm256_loadu_ps(mp.add(8))];
        }
        for c in 0..kc {
            let d = dec.as_ptr().add((c * BLOCK_TILES + tl) * 256);
            for r in 0..TILE {
                let w0 = _mm256_loadu_ps(d.add(r * TILE));
                let w1 = _mm256_loadu_ps(d.add(r * TILE + 8));
                for q in 0..R {
                    let b = _mm256_broadcast_ss(&*xp[c][q].add(r));
                    acc[q][0] = _mm256_fmadd_ps(w0, b, acc[q][0]);
                    acc[q][1] = _mm256_fmadd_ps(w1, b, acc[q][1]);
                }
            }
        }
        for (q, a) in acc.iter().enumerate() {
            let mp = mid.as_mut_ptr().add((i0 + q) * BLOCK_COLS + tl * TILE);
            _mm256_storeu_ps(mp, a[0]);
            _mm256_storeu_ps(mp.add(8), a[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;

    /// Every one of the 65536 states through [`cb8_scaled`] is the C
    /// reference's codebook value (`cref::cb_half`) times 2^-112, bit for
    /// bit, and through [`cb8`] the value itself.
    #[test]
    fn codebook_scaled_is_exact() {
        if !Isa::Avx2.available() {
            println!("codebook_scaled_is_exact: skipped, this CPU lacks AVX2, FMA or F16C");
            return;
        }
        for s0 in (0..1u32 << 16).step_by(8) {
            let states: [u32; 8] = core::array::from_fn(|i| s0 + i as u32);
            let (mut scaled, mut exact) = ([0f32; 8], [0f32; 8]);
            // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
            unsafe {
                let s = ld8(&states);
                _mm256_storeu_ps(scaled.as_mut_ptr(), cb8_scaled(s));
                _mm256_storeu_ps(exact.as_mut_ptr(), cb8(s));
            }
            for (i, &s) in states.iter().enumerate() {
                let want = crate::cref::cb_half(s as u16).to_f32();
                assert_eq!(scaled[i].to_bits(), (want / F16_TO_F32_SCALE).to_bits(), "state {s:#06x} scaled: {:e}, want {want:e} * 2^-112", scaled[i]);
                assert_eq!(exact[i].to_bits(), want.to_bits(), "state {s:#06x}: {:e}, want {want:e}", exact[i]);
            }
        }
    }
}
