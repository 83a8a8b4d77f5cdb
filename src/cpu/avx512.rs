//! AVX-512F path (incl. `vpternlogd` for the codebook's and+xor), and the
//! same kernels with the codebook's f16 add done by AVX-512 FP16's `vaddph`
//! (path `avx512fp16`: Sapphire Rapids and later). A vector
//! holds 16 consecutive lanes (lanes 16g..16g+15, g = 0, 1); vector (g, j)
//! holds value j of those lanes: rows `2*(i&3) + rj` with
//! `rj = (j&1) + 8*((j>>1)&1)`, columns `4g + 8*(j>=4) + (i>>2)`, so each
//! quarter of a vector belongs to one column.

// Index loops mirror the lane/group arithmetic of the layout comments.
#![allow(clippy::needless_range_loop)]

use super::batch::xh_ptrs;
use super::tables::{identity, ring_windows, state_window, RingWindow};
use super::job::{BlockJob, BLOCK_COLS, BLOCK_TILES, PREFETCH_ROWS};
use crate::format::{CBA_MASK, CBA_MUL, CBA_XOR, TILE};
use core::arch::x86_64::*;

type Tabs = [[RingWindow<16>; 2]; 2];
static TAB2: Tabs = ring_windows::<16, 2>(2, &identity());
static TAB3: Tabs = ring_windows::<16, 2>(3, &identity());

/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn ld16<T: Copy>(v: &[T; 16]) -> __m512i {
    const { assert!(core::mem::size_of::<T>() == 4) };
    _mm512_loadu_si512(v.as_ptr() as *const _)
}

/// Tile `(kt, nt)`'s `8K` words in registers: words 0-15, and 16-23 for K=3
/// (read exactly, never past the tile). Windows index them mod `8K`, so the
/// ring needs no extended copy: a copy's narrow stores followed by a wide
/// load would stall store forwarding on every tile.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tile_words<const K: usize>(job: &BlockJob, kt: usize, nt: usize) -> [__m512i; 2] {
    let t = &job.code[job.tile_offset(kt, nt)..][..16 * K];
    // SAFETY: `t` holds 16K int16 (64 bytes for K=2, 96 for K=3), which is
    // what is read.
    let w0 = _mm512_loadu_si512(t.as_ptr() as *const _);
    let w1 = if K == 3 { _mm512_castsi256_si512(_mm256_loadu_si256(t.as_ptr().add(32) as *const __m256i)) } else { w0 };
    [w0, w1]
}

/// The 16 lane windows of group `rw`.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn window<const K: usize>(t: &[__m512i; 2], rw: &RingWindow<16>) -> __m512i {
    let (ia, ib) = (ld16(&rw.idx_a), ld16(&rw.idx_b));
    // K=2: 16 words, one register; K=3: 24, index bit 4 picks the second.
    let (a, b) = if K == 2 {
        (_mm512_permutexvar_epi32(ia, t[0]), _mm512_permutexvar_epi32(ib, t[0]))
    } else {
        (_mm512_permutex2var_epi32(t[0], ia, t[1]), _mm512_permutex2var_epi32(t[0], ib, t[1]))
    };
    _mm512_or_si512(_mm512_sllv_epi32(a, ld16(&rw.shl)), _mm512_srlv_epi32(b, ld16(&rw.shr)))
}

/// Codebook values of 16 states.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn cb16(s: __m512i) -> __m512 {
    let r = _mm512_mullo_epi32(s, _mm512_set1_epi32(CBA_MUL as i32));
    // (r & MASK) ^ XOR in one vpternlogd: truth table 0x6A.
    let r = _mm512_ternarylogic_epi32::<0x6A>(r, _mm512_set1_epi32(CBA_MASK as i32), _mm512_set1_epi32(CBA_XOR as i32));
    let lo = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(r));
    let hi = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(r)));
    // Exact f32 sum, one RNE rounding to f16 (the contract's f16 addition).
    _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_add_ps(lo, hi)))
}

/// Codebook values of 16 states with AVX-512 FP16: each 32-bit hash plus
/// itself rotated by 16 puts `lo + hi` in its low half as `vaddph` rounds it
/// (to nearest even: exactly the contract's f16 addition), in 4 operations
/// fewer than the f32 round trip of [`cb16`].
///
/// # Safety
/// 1. The CPU supports AVX-512F and AVX-512 FP16.
#[inline]
#[target_feature(enable = "avx512f,avx512fp16")]
unsafe fn cb16_fp16(s: __m512i) -> __m512 {
    let r = _mm512_mullo_epi32(s, _mm512_set1_epi32(CBA_MUL as i32));
    let r = _mm512_ternarylogic_epi32::<0x6A>(r, _mm512_set1_epi32(CBA_MASK as i32), _mm512_set1_epi32(CBA_XOR as i32));
    let sum = _mm512_add_ph(_mm512_castsi512_ph(r), _mm512_castsi512_ph(_mm512_ror_epi32::<16>(r)));
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_castph_si512(sum)))
}

/// 2^112: f32's exponent bias less f16's.
const F16_TO_F32_SCALE: f32 = f32::from_bits((112 + 127) << 23);

/// [`cb16_fp16`]'s values times 2^-112, exactly, without a pack and a
/// conversion: the rotate makes both halves of a lane the f16 sum `v`, and
/// an arithmetic shift by 3 then puts its sign at bit 31 and its exponent
/// and mantissa at f32 bits 27..13, which read as f32 are `v * 2^-112` for
/// every `v` that is zero or normal. Every codebook sum is: both halves have
/// exponent field 12..15, so a nonzero sum is a multiple of 2^-13, above
/// f16's smallest normal (`codebook_sums_scale_exactly` checks all states).
/// The GEMV multiplies by inputs scaled by 2^112 (exact: an f16 input is
/// below 2^16), so each product is the unscaled one bit for bit.
///
/// # Safety
/// 1. The CPU supports AVX-512F and AVX-512 FP16.
#[inline]
#[target_feature(enable = "avx512f,avx512fp16")]
unsafe fn cb16_fp16_scaled(s: __m512i) -> __m512 {
    let r = _mm512_mullo_epi32(s, _mm512_set1_epi32(CBA_MUL as i32));
    let r = _mm512_ternarylogic_epi32::<0x6A>(r, _mm512_set1_epi32(CBA_MASK as i32), _mm512_set1_epi32(CBA_XOR as i32));
    let sum = _mm512_add_ph(_mm512_castsi512_ph(r), _mm512_castsi512_ph(_mm512_ror_epi32::<16>(r)));
    let bits = _mm512_and_si512(_mm512_srai_epi32::<3>(_mm512_castph_si512(sum)), _mm512_set1_epi32(0x8FFF_E000u32 as i32));
    _mm512_castsi512_ps(bits)
}

/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn states<const K: usize>(w: &[__m512i; 2], j: usize) -> __m512i {
    let (h, sh) = state_window(K, j);
    _mm512_and_si512(_mm512_srl_epi32(w[h], _mm_cvtsi32_si128(sh as i32)), _mm512_set1_epi32(0xFFFF))
}

/// `xv[j&3]`: inputs of rows `2*(i&3) + rj` for the 16 lanes, times `scale`
/// (a power of two that keeps them finite).
///
/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `x` is valid for reads of 16 floats.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn xvecs(x: *const f32, scale: f32) -> [__m512; 4] {
    let v = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(scale));
    let idx = |rj: i32| _mm512_setr_epi32(rj, rj + 2, rj + 4, rj + 6, rj, rj + 2, rj + 4, rj + 6, rj, rj + 2, rj + 4, rj + 6, rj, rj + 2, rj + 4, rj + 6);
    [
        _mm512_permutexvar_ps(idx(0), v),
        _mm512_permutexvar_ps(idx(1), v),
        _mm512_permutexvar_ps(idx(8), v),
        _mm512_permutexvar_ps(idx(9), v),
    ]
}

/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn group_windows_of<const K: usize>(t: &[__m512i; 2], tabs: &Tabs, g: usize) -> [__m512i; 2] {
    let w0 = window::<K>(t, &tabs[0][g]);
    [w0, if K == 3 { window::<K>(t, &tabs[1][g]) } else { w0 }]
}

/// Each quarter of `acc[g*2 + jh]` sums into column `4g + 8jh + quarter`.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce(acc: &[__m512; 4], mid: &mut [f32]) {
    let mut q = [0f32; 16];
    for g in 0..2 {
        for jh in 0..2 {
            _mm512_storeu_ps(q.as_mut_ptr(), acc[g * 2 + jh]);
            for (quarter, v) in q.chunks_exact(4).enumerate() {
                mid[4 * g + 8 * jh + quarter] += v.iter().sum::<f32>();
            }
        }
    }
}

/// The kernels that decode (the GEMV, the tile decode of the batched
/// product) of one codebook variant under the features `$feat`, as the
/// functions named: the GEMV decodes with `$cb_gemv` against inputs times
/// `$xscale` (its values times 1 / `$xscale`), the tile decode with `$cb`
/// (exact values); the batched product's `rows_fma` is shared.
macro_rules! decode_paths {
    ($isa:ident, $feat:literal, $cb:ident, $cb_gemv:ident, $xscale:expr, $tile_fma:ident, $gemv:ident, $decode_rows:ident) => {
        /// Decodes one tile against one row's input vectors: `acc[g*2 + (j>>2)]`.
        ///
        /// # Safety
        /// 1. The CPU supports the path's features (`$feat`).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $tile_fma<const K: usize>(t: &[__m512i; 2], tabs: &Tabs, xv: &[__m512; 4], acc: &mut [__m512; 4]) {
            for g in 0..2 {
                let w = group_windows_of::<K>(t, tabs, g);
                for j in 0..8 {
                    let a = &mut acc[g * 2 + (j >> 2)];
                    *a = _mm512_fmadd_ps($cb_gemv(states::<K>(&w, j)), xv[j & 3], *a);
                }
            }
        }

        /// # Safety
        /// 1. The CPU supports the path's features (`$feat`).
        /// 2. `job` is consistent (checked by `Kernel::block_mid`).
        #[target_feature(enable = $feat)]
        unsafe fn $gemv<const K: usize>(job: &BlockJob, mid: &mut [f32]) {
            let tabs = if K == 2 { &TAB2 } else { &TAB3 };
            let mut acc = [[_mm512_setzero_ps(); 4]; BLOCK_TILES];
            for kt in 0..job.kt_n() {
                job.prefetch_tile_row(kt + PREFETCH_ROWS);
                // SAFETY: xvecs' 2.: `xh_tile` is a 16-float slice.
                let xv = xvecs(job.xh_tile(job.rows[0], kt).as_ptr(), $xscale);
                for (tl, a) in acc.iter_mut().enumerate() {
                    let t = tile_words::<K>(job, kt, job.block * BLOCK_TILES + tl);
                    $tile_fma::<K>(&t, tabs, &xv, a);
                }
            }
            for (tl, a) in acc.iter().enumerate() {
                reduce(a, &mut mid[tl * TILE..(tl + 1) * TILE]);
            }
        }

        /// Decodes tile `(kt, nt)` straight to row-major f32 with in-register
        /// transposes. Vector (g, j) is a 4x4 block, lane `4*col + k` holding row
        /// `2k + rj` of column `4g + 8*(j>=4) + col`; values j and j + 4 share rj,
        /// so the four vectors (g = 0, 1; j, j + 4) hold rows `2k + rj` (k = 0..3)
        /// whole: two 2-source permutes pair the groups' columns for rows (k, k+1),
        /// two more join the column halves, and each row is one 16-float store.
        ///
        /// # Safety
        /// 1. The CPU supports the path's features (`$feat`).
        /// 2. `job` is consistent (checked by `Kernel::block_mid`).
        #[target_feature(enable = $feat)]
        unsafe fn $decode_rows<const K: usize>(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32]) {
            let tabs = if K == 2 { &TAB2 } else { &TAB3 };
            let out = &mut out[..256];
            let t = tile_words::<K>(job, kt, nt);
            let w = [group_windows_of::<K>(&t, tabs, 0), group_windows_of::<K>(&t, tabs, 1)];
            // Rows (k0, k0 + 1) of two 4x4 blocks a (columns 0-3) and b (4-7): lanes
            // 0-7 row k0, 8-15 row k0 + 1.
            let pair = |k0: i32| {
                let c = |t: i32| if t < 4 { 4 * t + k0 } else { 16 + 4 * (t - 4) + k0 };
                _mm512_setr_epi32(c(0), c(1), c(2), c(3), c(4), c(5), c(6), c(7),
                                  c(0) + 1, c(1) + 1, c(2) + 1, c(3) + 1, c(4) + 1, c(5) + 1, c(6) + 1, c(7) + 1)
            };
            let (p01, p23) = (pair(0), pair(2));
            let lo = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
            let hi = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
            for j in 0..4 {
                let rj = (j & 1) + 8 * ((j >> 1) & 1);
                let v = |g: usize, jj: usize| $cb(states::<K>(&w[g], jj));
                let (a0, a1, b0, b1) = (v(0, j), v(1, j), v(0, j + 4), v(1, j + 4));
                // columns 0-7 (a) and 8-15 (b) of rows (0, 1) and (2, 3)
                let (a01, a23) = (_mm512_permutex2var_ps(a0, p01, a1), _mm512_permutex2var_ps(a0, p23, a1));
                let (b01, b23) = (_mm512_permutex2var_ps(b0, p01, b1), _mm512_permutex2var_ps(b0, p23, b1));
                let rows = [
                    _mm512_permutex2var_ps(a01, lo, b01),
                    _mm512_permutex2var_ps(a01, hi, b01),
                    _mm512_permutex2var_ps(a23, lo, b23),
                    _mm512_permutex2var_ps(a23, hi, b23),
                ];
                for (k, r) in rows.iter().enumerate() {
                    _mm512_storeu_ps(out.as_mut_ptr().add((2 * k + rj) * TILE), *r);
                }
            }
        }

        super::batch::tile_ops!($isa, $gemv, $decode_rows, rows_fma);
    };
}

decode_paths!(Avx512, "avx512f", cb16, cb16, 1.0, tile_fma, gemv, decode_rows);
decode_paths!(Avx512Fp16, "avx512f,avx512fp16", cb16_fp16, cb16_fp16_scaled, F16_TO_F32_SCALE, tile_fma_fp16, gemv_fp16, decode_rows_fp16);

/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `dec` holds `kc * 8 * 256` floats (`kc` decoded tile rows).
/// 4. `mid` holds at least `(i0 + R) * 128` floats.
#[target_feature(enable = "avx512f")]
unsafe fn rows_fma<const R: usize>(job: &BlockJob, i0: usize, kt0: usize, kc: usize, dec: &[f32], mid: &mut [f32]) {
    // SAFETY: every raw access below is inside `dec` (3.), `mid` (4.) or a
    // 16-float tile of `xh` (`xh_ptrs`).
    let xp = xh_ptrs::<R>(job, i0, kt0, kc);
    for tl in 0..BLOCK_TILES {
        let mut acc = [_mm512_setzero_ps(); R];
        for (q, a) in acc.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(mid.as_ptr().add((i0 + q) * BLOCK_COLS + tl * TILE));
        }
        for c in 0..kc {
            let d = dec.as_ptr().add((c * BLOCK_TILES + tl) * 256);
            for r in 0..TILE {
                let w = _mm512_loadu_ps(d.add(r * TILE));
                for q in 0..R {
                    acc[q] = _mm512_fmadd_ps(w, _mm512_set1_ps(*xp[c][q].add(r)), acc[q]);
                }
            }
        }
        for (q, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(mid.as_mut_ptr().add((i0 + q) * BLOCK_COLS + tl * TILE), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::dispatch::Isa;
    use half::f16;

    /// Every one of the 65536 states through [`cb16_fp16_scaled`] is the
    /// contract's codebook value (the two f16 halves of the hash added with
    /// one rounding, here by the `half` crate) times 2^-112, bit for bit:
    /// the bit trick needs every such sum to be zero or normal.
    #[test]
    fn codebook_sums_scale_exactly() {
        if !Isa::Avx512Fp16.available() {
            println!("codebook_sums_scale_exactly: skipped, this CPU has no AVX-512 FP16");
            return;
        }
        let scale = 1.0 / F16_TO_F32_SCALE;
        for s0 in (0..1u32 << 16).step_by(16) {
            let states: [u32; 16] = core::array::from_fn(|i| s0 + i as u32);
            let mut got = [0f32; 16];
            // SAFETY: the CPU has AVX-512F and AVX-512 FP16 (checked above).
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), cb16_fp16_scaled(ld16(&states))) };
            for (s, g) in states.iter().zip(got) {
                let r = (s.wrapping_mul(CBA_MUL) & CBA_MASK) ^ CBA_XOR;
                let v = f16::from_bits(r as u16) + f16::from_bits((r >> 16) as u16);
                let want = v.to_f32() * scale;
                assert_eq!(g.to_bits(), want.to_bits(), "state {s:#06x}: {g:e}, want {v} * 2^-112 = {want:e}");
            }
        }
    }
}
