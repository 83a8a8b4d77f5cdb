//! AVX-512F path (incl. `vpternlogd` for the codebook's and+xor). A vector
//! holds 16 consecutive lanes (lanes 16g..16g+15, g = 0, 1); vector (g, j)
//! holds value j of those lanes: rows `2*(i&3) + rj` with
//! `rj = (j&1) + 8*((j>>1)&1)`, columns `4g + 8*(j>=4) + (i>>2)`, so each
//! quarter of a vector belongs to one column.

// Index loops mirror the lane/group arithmetic of the layout comments.
#![allow(clippy::needless_range_loop)]

use super::batch::{lanes_to_rows, xh_ptrs};
use super::tables::{group_windows, identity, lane_to_rowmajor, state_window, GroupWindow, EXT_WORDS};
use super::job::{BlockJob, BLOCK_COLS, BLOCK_TILES, PREFETCH_ROWS};
use crate::format::{CBA_MASK, CBA_MUL, CBA_XOR, TILE};
use core::arch::x86_64::*;

type Tabs = [[GroupWindow<16>; 2]; 2];
static TAB2: Tabs = group_windows::<16, 2>(2, &identity());
static TAB3: Tabs = group_windows::<16, 2>(3, &identity());
static LANES_TO_ROWS: [u8; 256] = lane_to_rowmajor::<16>(&identity());

/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn ld16(v: &[u32; 16]) -> __m512i {
    _mm512_loadu_si512(v.as_ptr() as *const _)
}

/// The 16 lane windows of group `gw`.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `gw.base + 16 <= EXT_WORDS` (true of every entry of `TAB2` and
///    `TAB3`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn window(ext: &[u32; EXT_WORDS], gw: &GroupWindow<16>) -> __m512i {
    let v = _mm512_loadu_si512(ext.as_ptr().add(gw.base) as *const _);
    let a = _mm512_permutexvar_epi32(_mm512_loadu_si512(gw.idx_a.as_ptr() as *const _), v);
    let b = _mm512_permutexvar_epi32(_mm512_loadu_si512(gw.idx_b.as_ptr() as *const _), v);
    _mm512_or_si512(_mm512_sllv_epi32(a, ld16(&gw.shl)), _mm512_srlv_epi32(b, ld16(&gw.shr)))
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

/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn states<const K: usize>(w: &[__m512i; 2], j: usize) -> __m512i {
    let (h, sh) = state_window(K, j);
    _mm512_and_si512(_mm512_srl_epi32(w[h], _mm_cvtsi32_si128(sh as i32)), _mm512_set1_epi32(0xFFFF))
}

/// `xv[j&3]`: inputs of rows `2*(i&3) + rj` for the 16 lanes.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `x` is valid for reads of 16 floats.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn xvecs(x: *const f32) -> [__m512; 4] {
    let v = _mm512_loadu_ps(x);
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
/// 2. Every window of `tabs` lies inside `ext` (true of `TAB2` and `TAB3`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn group_windows_of<const K: usize>(ext: &[u32; EXT_WORDS], tabs: &Tabs, g: usize) -> [__m512i; 2] {
    let w0 = window(ext, &tabs[0][g]);
    [w0, if K == 3 { window(ext, &tabs[1][g]) } else { w0 }]
}

/// Decodes one tile against one row's input vectors: `acc[g*2 + (j>>2)]`.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. Every window of `tabs` lies inside `ext` (true of `TAB2` and `TAB3`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tile_fma<const K: usize>(ext: &[u32; EXT_WORDS], tabs: &Tabs, xv: &[__m512; 4], acc: &mut [__m512; 4]) {
    for g in 0..2 {
        let w = group_windows_of::<K>(ext, tabs, g);
        for j in 0..8 {
            let a = &mut acc[g * 2 + (j >> 2)];
            *a = _mm512_fmadd_ps(cb16(states::<K>(&w, j)), xv[j & 3], *a);
        }
    }
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

/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[target_feature(enable = "avx512f")]
unsafe fn gemv<const K: usize>(job: &BlockJob, mid: &mut [f32]) {
    let tabs = if K == 2 { &TAB2 } else { &TAB3 };
    let mut acc = [[_mm512_setzero_ps(); 4]; BLOCK_TILES];
    let mut ext = [0u32; EXT_WORDS];
    for kt in 0..job.kt_n() {
        job.prefetch_tile_row(kt + PREFETCH_ROWS);
        // SAFETY: xvecs' 2.: `xh_tile` is a 16-float slice.
        let xv = xvecs(job.xh_tile(job.rows[0], kt).as_ptr());
        for (tl, a) in acc.iter_mut().enumerate() {
            job.load_ext(kt, job.block * BLOCK_TILES + tl, &mut ext);
            tile_fma::<K>(&ext, tabs, &xv, a);
        }
    }
    for (tl, a) in acc.iter().enumerate() {
        reduce(a, &mut mid[tl * TILE..(tl + 1) * TILE]);
    }
}

super::batch::tile_ops!(Avx512);

/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[target_feature(enable = "avx512f")]
unsafe fn decode_rows<const K: usize>(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32]) {
    let tabs = if K == 2 { &TAB2 } else { &TAB3 };
    let mut ext = [0u32; EXT_WORDS];
    let mut lanes = [0f32; 256];
    job.load_ext(kt, nt, &mut ext);
    for g in 0..2 {
        let w = group_windows_of::<K>(&ext, tabs, g);
        for j in 0..8 {
            _mm512_storeu_ps(lanes.as_mut_ptr().add((g * 8 + j) * 16), cb16(states::<K>(&w, j)));
        }
    }
    lanes_to_rows(&lanes, &LANES_TO_ROWS, out);
}

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
