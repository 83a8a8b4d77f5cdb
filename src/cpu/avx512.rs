//! AVX-512F path (incl. `vpternlogd` for the codebook's and+xor), the same
//! kernels with the codebook's f16 add done by AVX-512 FP16's `vaddph`
//! (path `avx512fp16`: Sapphire Rapids and later), and a GEMV for CPUs with
//! AVX-512 BW, VBMI and VBMI2 but no FP16 (path `avx512vbmi`: Ice Lake,
//! Zen 4 and 5) that hashes in 16-bit lanes as the FP16 one does and adds
//! in f32 as the AVX2 path does. A vector
//! holds 16 consecutive lanes (lanes 16g..16g+15, g = 0, 1); vector (g, j)
//! holds value j of those lanes: rows `2*(i&3) + rj` with
//! `rj = (j&1) + 8*((j>>1)&1)`, columns `4g + 8*(j>=4) + (i>>2)`, so each
//! quarter of a vector belongs to one column.

// Index loops mirror the lane/group arithmetic of the layout comments.
#![allow(clippy::needless_range_loop)]

use super::batch::{xh_ptrs, KC};
use super::tables::{identity, ring_windows, state_window, RingWindow};
use super::job::{BlockJob, BLOCK_COLS, BLOCK_TILES, PREFETCH_ROWS};
use super::{F16_TO_F32_SCALE, HALF_MASK_F32, HALF_XOR_F32, LOW_HALF_MADD};
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

/// The `vpmultishiftqb` control that cuts the states of values `2p` and
/// `2p + 1` of two lanes out of their [`pair_source`] qword: per dword,
/// bytes `[o, o + 8, o', o' + 8]` (the even lane's in the low dword, the
/// odd lane's in the high one), so each dword becomes the pair
/// `state(2p) | state(2p + 1) << 16`. The qword holds code bits `P..P + 64`
/// with bit `P` at its top, `P` = the even lane's first state bit less K;
/// value j's 16 state bits start K(j + 1) code bits after `P` in the even
/// lane (8K more in the odd one), so they end at qword bit
/// `48 - K(j + 1)` (`48 - K(j + 9)`).
const fn pair_ctrl(k: usize, p: usize) -> i64 {
    let (a, b) = (48 - k * (2 * p + 1), 48 - k * (2 * p + 2));
    let (c, d) = (48 - k * (2 * p + 9), 48 - k * (2 * p + 10));
    let o = [a, a + 8, b, b + 8, c, c + 8, d, d + 8];
    let mut v = 0u64;
    let mut i = 0;
    while i < 8 {
        v |= (o[i] as u64) << (8 * i);
        i += 1;
    }
    v as i64
}

/// Word-permute indices that gather, for lanes `2q` and `2q + 1` of group
/// `g`, the 64 code bits both lanes' states lie in into qword `q`
/// ([`pair_ctrl`]): code bits are read most significant first from 32-bit
/// words made of two int16 (the high one first), so code halfword `h` is
/// int16 `h ^ 1` of the tile. Lane L's first state bit is `(8L + 1)K - 16`,
/// so `P = 8LK - 16` (L even) is halfword `LK/2 - 1`, ring index mod 16K.
const fn pair_source_idx(k: usize, g: usize) -> [i16; 32] {
    let nh = 16 * k;
    let mut idx = [0i16; 32];
    let mut q = 0;
    while q < 8 {
        let l = 16 * g + 2 * q;
        let h0 = (l * k / 2 + nh - 1) % nh;
        let mut slot = 0;
        while slot < 4 {
            // the qword's top halfword (slot 3) comes first in the code
            idx[4 * q + slot] = (((h0 + 3 - slot) % nh) ^ 1) as i16;
            slot += 1;
        }
        q += 1;
    }
    idx
}

static PAIR_SRC: [[[i16; 32]; 2]; 2] = [[pair_source_idx(2, 0), pair_source_idx(2, 1)], [pair_source_idx(3, 0), pair_source_idx(3, 1)]];

/// Group `g`'s lane-pair qwords ([`pair_source_idx`]) in one word permute
/// (two sources for K=3's 48 halfwords), where windows a lane took two
/// dword permutes and a funnel shift (K=2) or three of each (K=3).
///
/// # Safety
/// 1. The CPU supports AVX-512F and BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pair_source<const K: usize>(t: &[__m512i; 2], g: usize) -> __m512i {
    let idx = _mm512_loadu_si512(PAIR_SRC[K - 2][g].as_ptr() as *const _);
    if K == 2 {
        _mm512_permutexvar_epi16(idx, t[0])
    } else {
        _mm512_permutex2var_epi16(t[0], idx, t[1])
    }
}

/// Codebook values `2p` and `2p + 1` of the group's 16 lanes, times 2^-112
/// exactly (for the GEMV), 32 states in 16-bit lanes at once:
/// - one byte-granular multishift cuts both states of each lane out of its
///   lane pair's qword `src` ([`pair_source`]; no shift and mask per state);
/// - the hash `s * CBA_MUL mod 2^32` in halves (low: `s * lo16(MUL)`; high:
///   the high half of that plus `s * hi16(MUL)`), the and+xor one
///   `vpternlogd` per half (the constants' halves are equal), and one
///   `vaddph` adds all 32 pairs of halves, rounding to nearest even exactly
///   as the contract's f16 addition;
/// - value `2p` is then each dword's low half, `2p + 1` its high half; with
///   the f16 sum `v` in a dword's high half, an arithmetic shift by 3 puts
///   its sign at bit 31 and its exponent and mantissa at f32 bits 27..13,
///   which read as f32 are `v * 2^-112` (f32's exponent bias is 112 above
///   f16's) for every `v` that is zero or normal, and a mask clears the
///   rest: no narrowing and no conversion. For the low half a `vpmaddwd`
///   by (2^13, 0) sign-extends and shifts it in one operation where a
///   shift pair took two (14 operations per 32 weights with the two FMAs,
///   from 15). Every codebook sum is zero or
///   normal: both halves have exponent field 12..15, so a nonzero sum is a
///   multiple of 2^-13, above f16's smallest normal
///   (`codebook_sums_scale_exactly` checks all states).
///
/// The GEMV multiplies by inputs scaled by 2^112 (exact: an f16 input is
/// below 2^16, so the scaled one is below f32's largest), so each product
/// is the unscaled one bit for bit.
///
/// # Safety
/// 1. The CPU supports AVX-512F, BW, VBMI and FP16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512fp16")]
unsafe fn pair_fp16_scaled<const K: usize>(src: __m512i, p: usize) -> (__m512, __m512) {
    let (lo, hi) = pair_hash16::<K>(src, p);
    let (m, x) = (_mm512_set1_epi32(CBA_MASK as i32), _mm512_set1_epi32(CBA_XOR as i32));
    let sum = _mm512_add_ph(
        _mm512_castsi512_ph(_mm512_ternarylogic_epi32::<0x6A>(lo, m, x)),
        _mm512_castsi512_ph(_mm512_ternarylogic_epi32::<0x6A>(hi, m, x)),
    );
    let v = _mm512_castph_si512(sum);
    let keep = _mm512_set1_epi32(0x8FFF_E000u32 as i32);
    let a = _mm512_and_si512(_mm512_madd_epi16(v, _mm512_set1_epi32(LOW_HALF_MADD)), keep);
    let b = _mm512_and_si512(_mm512_srai_epi32::<3>(v), keep);
    (_mm512_castsi512_ps(a), _mm512_castsi512_ps(b))
}

/// The pair's states cut by one multishift and hashed in 16-bit lanes
/// (`lo`: each state's low hash half, `hi`: its high half; value `2p` in
/// each dword's low 16 bits, `2p + 1` in its high 16 bits), as
/// [`pair_fp16_scaled`] makes them.
///
/// # Safety
/// 1. The CPU supports AVX-512F, BW and VBMI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair_hash16<const K: usize>(src: __m512i, p: usize) -> (__m512i, __m512i) {
    let s = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(pair_ctrl(K, p)), src);
    let (ml, mh) = (_mm512_set1_epi16(CBA_MUL as u16 as i16), _mm512_set1_epi16((CBA_MUL >> 16) as u16 as i16));
    (_mm512_mullo_epi16(s, ml), _mm512_add_epi16(_mm512_mulhi_epu16(s, ml), _mm512_mullo_epi16(s, mh)))
}

/// Bytes 0 and 1 of every dword: a multishift zero-masked by it leaves a
/// 16-bit state zero-extended in each dword.
const DWORD_LOW_WORDS: u64 = 0x3333_3333_3333_3333;

/// `_mm512_maskz_multishift_epi64_epi8(DWORD_LOW_WORDS, ctrl, src)` as one
/// instruction: LLVM rewrites the intrinsic with a constant mask as an
/// unmasked multishift and an and, one operation more than the saving
/// [`pair_hash32`] is for.
///
/// # Safety
/// 1. The CPU supports AVX-512F, BW and VBMI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn multishift_low_words(ctrl: __m512i, src: __m512i) -> __m512i {
    let out: __m512i;
    // SAFETY: the instruction is VBMI's (1.) and touches only its operands.
    core::arch::asm!(
        "vpmultishiftqb {out}{{{k}}}{{z}}, {ctrl}, {src}",
        out = lateout(zmm_reg) out,
        k = in(kreg) DWORD_LOW_WORDS,
        ctrl = in(zmm_reg) ctrl,
        src = in(zmm_reg) src,
        options(pure, nomem, nostack, preserves_flags),
    );
    out
}

/// The pair's states cut as [`pair_hash16`] cuts them, but one value at a
/// time, each state zero-extended in its lane's dword by a zero-masked
/// multishift (the even value by [`pair_ctrl`], the odd one by its upper
/// half moved down), then hashed whole by one 32-bit multiply: value `2p`'s
/// hash in `.0`, `2p + 1`'s in `.1`, each dword the low hash half in its low
/// 16 bits and the high one above. Four operations for 32 states where the
/// 16-bit lanes take five (a multishift, three multiplies and an add);
/// measured on an AMD Zen 5 in docs/PERFORMANCE.md.
///
/// # Safety
/// 1. The CPU supports AVX-512F, BW and VBMI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair_hash32<const K: usize>(src: __m512i, p: usize) -> (__m512i, __m512i) {
    let ctrl = pair_ctrl(K, p);
    let even = multishift_low_words(_mm512_set1_epi64(ctrl), src);
    let odd = multishift_low_words(_mm512_set1_epi64(((ctrl as u64) >> 16) as i64), src);
    let mul = _mm512_set1_epi32(CBA_MUL as i32);
    (_mm512_mullo_epi32(even, mul), _mm512_mullo_epi32(odd, mul))
}

/// One value per lane from its two hash halves already moved to where an
/// f32 holds them (`lo` by a `vpmaddwd` by (2^13, 0), which sign-extends and
/// shifts by 13; `hi` by an arithmetic shift by 3): the codebook's mask and
/// xor applied there by one `vpternlogd` each (`HALF_MASK_F32`, which also
/// clears what the move brought in), then the two halves' exact f32 sum
/// rounded to f16's 11 significant bits by Veltkamp's split with its last
/// two operations one FMA, as the AVX2 path's `cb8_scaled` does (the
/// contract's f16 add: to nearest even; why the FMA is exact there). No
/// narrowing or f16 conversion, which cost more than simple operations
/// (measured on an AMD Zen 5: 1.5x faster than the avx512 path at batch 1,
/// docs/PERFORMANCE.md). The value is the weight times 2^-112.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn halves_sum_scaled(lo: __m512i, hi: __m512i) -> __m512 {
    let (m, x) = (_mm512_set1_epi32(HALF_MASK_F32 as i32), _mm512_set1_epi32(HALF_XOR_F32 as i32));
    let half = |v: __m512i| _mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0x6A>(v, m, x));
    let v = _mm512_add_ps(half(lo), half(hi));
    let c = _mm512_mul_ps(v, _mm512_set1_ps(8193.0));
    _mm512_fnmadd_ps(v, _mm512_set1_ps(8192.0), c)
}

/// [`pair_fp16_scaled`]'s values without AVX-512 FP16, from
/// [`pair_hash32`]'s whole hashes ([`halves_sum_scaled`]).
///
/// # Safety
/// 1. The CPU supports AVX-512F, BW and VBMI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair_vbmi_scaled<const K: usize>(src: __m512i, p: usize) -> (__m512, __m512) {
    let (even, odd) = pair_hash32::<K>(src, p);
    let k13 = _mm512_set1_epi32(LOW_HALF_MADD);
    let value = |h: __m512i| halves_sum_scaled(_mm512_madd_epi16(h, k13), _mm512_srai_epi32::<3>(h));
    (value(even), value(odd))
}

/// [`pair_vbmi_scaled`] from [`pair_hash16`]'s halves (value `2p`'s in the
/// dwords' low words, `2p + 1`'s in the high ones): one operation more per
/// 32 states, but one multishift control a pair instead of two, which the
/// K=3 GEMV of 3 and 4 rows needs to keep its registers (17408 -> 5120 on
/// a Zen 5, `examples/kernel_timing`: 10.7 and 16.4 ms with [`pair_hash32`],
/// 7.2-7.3 and 8.9-9.1 ms with this).
///
/// # Safety
/// 1. The CPU supports AVX-512F, BW and VBMI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair_vbmi16_scaled<const K: usize>(src: __m512i, p: usize) -> (__m512, __m512) {
    let (lo, hi) = pair_hash16::<K>(src, p);
    let k13 = _mm512_set1_epi32(LOW_HALF_MADD);
    let a = halves_sum_scaled(_mm512_madd_epi16(lo, k13), _mm512_madd_epi16(hi, k13));
    let b = halves_sum_scaled(_mm512_srai_epi32::<3>(lo), _mm512_srai_epi32::<3>(hi));
    (a, b)
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

/// Decodes one tile against R rows' input vectors: `acc[r][g*2 + (j>>2)]`.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tile_fma<const K: usize, const R: usize>(t: &[__m512i; 2], tabs: &Tabs, xv: &[[__m512; 4]; R], acc: &mut [[__m512; 4]; R]) {
    for g in 0..2 {
        let w = group_windows_of::<K>(t, tabs, g);
        for j in 0..8 {
            let v = cb16(states::<K>(&w, j));
            for r in 0..R {
                let a = &mut acc[r][g * 2 + (j >> 2)];
                *a = _mm512_fmadd_ps(v, xv[r][j & 3], *a);
            }
        }
    }
}

/// [`tile_fma`] with the value pairs of `$pair` (weights times 2^-112,
/// against inputs times 2^112), the states cut from [`pair_source`];
/// `$pair_k3_wide` gives the same values where K=3 meets more than 2 rows.
macro_rules! tile_fma_pairs {
    ($name:ident, $feat:literal, $pair:ident, $pair_k3_wide:ident) => {
        /// # Safety
        /// 1. The CPU supports the features `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const K: usize, const R: usize>(t: &[__m512i; 2], _tabs: &Tabs, xv: &[[__m512; 4]; R], acc: &mut [[__m512; 4]; R]) {
            for g in 0..2 {
                let src = pair_source::<K>(t, g);
                for p in 0..4 {
                    let (a, b) = if K == 3 && R > 2 { $pair_k3_wide::<K>(src, p) } else { $pair::<K>(src, p) };
                    for r in 0..R {
                        let c = &mut acc[r][g * 2 + (p >> 1)]; // values 2p, 2p + 1: j >> 2 = p >> 1
                        *c = _mm512_fmadd_ps(a, xv[r][(2 * p) & 3], *c);
                        *c = _mm512_fmadd_ps(b, xv[r][(2 * p + 1) & 3], *c);
                    }
                }
            }
        }
    };
}
tile_fma_pairs!(tile_fma_fp16, "avx512f,avx512bw,avx512vbmi,avx512vbmi2,avx512fp16", pair_fp16_scaled, pair_fp16_scaled);
tile_fma_pairs!(tile_fma_vbmi, "avx512f,avx512bw,avx512vbmi,avx512vbmi2", pair_vbmi_scaled, pair_vbmi16_scaled);

/// The kernels that decode (the GEMV, the tile decode of the batched
/// product) of one path under the features `$feat`, as the functions
/// named: the GEMV decodes with `$tile_fma` against inputs times `$xscale`
/// (its values are the weights times 1 / `$xscale`), the tile decode takes
/// `$values` (exact values); the batched product's `rows_fma` is shared.
macro_rules! decode_paths {
    ($isa:ident, $feat:literal, $values:ident, $tile_fma:ident, $xscale:expr, $gemv:ident, $decode_rows:ident, $gemv_rows:expr) => {
        /// `mid [rows, 128]` of the rows `job.rows` (1 to `$gemv_rows`):
        /// every tile decoded once, in registers, and applied to each row.
        ///
        /// # Safety
        /// 1. The CPU supports the path's features (`$feat`).
        /// 2. `job` is consistent (checked by `Kernel::block_mid`).
        /// 3. `job.rows.len()` is 1 to `$gemv_rows`.
        #[target_feature(enable = $feat)]
        unsafe fn $gemv<const K: usize>(job: &BlockJob, mid: &mut [f32]) {
            /// # Safety
            /// `$gemv`'s, and `job.rows.len() == R`.
            #[target_feature(enable = $feat)]
            unsafe fn rows<const K: usize, const R: usize>(job: &BlockJob, mid: &mut [f32]) {
                debug_assert_eq!(job.rows.len(), R);
                let tabs = if K == 2 { &TAB2 } else { &TAB3 };
                let mut acc = [[[_mm512_setzero_ps(); 4]; R]; BLOCK_TILES];
                for kt in 0..job.kt_n() {
                    job.prefetch_tile_row(kt + PREFETCH_ROWS);
                    // SAFETY: xvecs' 2.: `xh_tile` is a 16-float slice.
                    let xv: [[__m512; 4]; R] = core::array::from_fn(|r| xvecs(job.xh_tile(job.rows[r], kt).as_ptr(), $xscale));
                    for tl in job.tile_range() {
                        let t = tile_words::<K>(job, kt, job.block * BLOCK_TILES + tl);
                        $tile_fma::<K, R>(&t, tabs, &xv, &mut acc[tl]);
                    }
                }
                for tl in job.tile_range() {
                    for (r, ar) in acc[tl].iter().enumerate() {
                        reduce(ar, &mut mid[r * BLOCK_COLS + tl * TILE..][..TILE]);
                    }
                }
            }
            const { assert!($gemv_rows >= 1 && $gemv_rows <= 4, "the arms below cover 1 to 4 rows") };
            // SAFETY: rows' conditions are ours (3. picks the arm).
            match job.rows.len() {
                1 => rows::<K, 1>(job, mid),
                2 => rows::<K, 2>(job, mid),
                3 => rows::<K, 3>(job, mid),
                _ => rows::<K, 4>(job, mid),
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
            let out = &mut out[..256];
            let v = $values::<K>(&tile_words::<K>(job, kt, nt));
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
                let (a0, a1, b0, b1) = (v[0][j], v[1][j], v[0][j + 4], v[1][j + 4]);
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

        super::batch::tile_ops!($isa, $gemv, $decode_rows, rows_fma, $gemv_rows);
    };
}

/// The 16 value vectors of a tile, `v[g][j]` = value j of group g's 16
/// lanes (exact), through the lane windows and a per-vector codebook `$cb`.
macro_rules! values_by_windows {
    ($name:ident, $feat:literal, $cb:ident) => {
        /// # Safety
        /// 1. The CPU supports the features `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $name<const K: usize>(t: &[__m512i; 2]) -> [[__m512; 8]; 2] {
            let tabs = if K == 2 { &TAB2 } else { &TAB3 };
            core::array::from_fn(|g| {
                let w = group_windows_of::<K>(t, tabs, g);
                core::array::from_fn(|j| $cb(states::<K>(&w, j)))
            })
        }
    };
}
values_by_windows!(values_avx512, "avx512f", cb16);
values_by_windows!(values_fp16, "avx512f,avx512fp16", cb16_fp16);

/// [`values_avx512`]'s vectors by the VBMI path's pairs: the cuts of
/// [`pair_source`], the codebook without conversions, times 2^112 (exact:
/// the pairs' values are the weights times 2^-112).
///
/// # Safety
/// 1. The CPU supports AVX-512F, BW, VBMI and VBMI2.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vbmi2")]
unsafe fn values_vbmi<const K: usize>(t: &[__m512i; 2]) -> [[__m512; 8]; 2] {
    let scale = _mm512_set1_ps(F16_TO_F32_SCALE);
    let mut v = [[_mm512_setzero_ps(); 8]; 2];
    for g in 0..2 {
        let src = pair_source::<K>(t, g);
        for p in 0..4 {
            let (a, b) = pair_vbmi_scaled::<K>(src, p);
            v[g][2 * p] = _mm512_mul_ps(a, scale);
            v[g][2 * p + 1] = _mm512_mul_ps(b, scale);
        }
    }
    v
}

decode_paths!(Avx512, "avx512f", values_avx512, tile_fma, 1.0, gemv, decode_rows, GEMV_ROWS);
decode_paths!(Avx512Fp16, "avx512f,avx512bw,avx512vbmi,avx512vbmi2,avx512fp16", values_fp16, tile_fma_fp16, F16_TO_F32_SCALE, gemv_fp16, decode_rows_fp16, GEMV_ROWS);
decode_paths!(Avx512Vbmi, "avx512f,avx512bw,avx512vbmi,avx512vbmi2", values_vbmi, tile_fma_vbmi, F16_TO_F32_SCALE, gemv_vbmi, decode_rows_vbmi, GEMV_ROWS);

/// Rows up to which the GEMVs of the avx512 and avx512vbmi paths, decoding
/// in registers, take a multiply instead of the batched product's decode
/// to memory. On a Zen 5, one thread, 17408 -> 5120 K=2 (docs/PERFORMANCE.md):
/// avx512vbmi 7.4, 8.0-8.4 and 9.4 ms at 2, 3 and 4 rows against the batched
/// product's 14.4-15.8 ms (14.6 at 5 rows); avx512 10.4, 11.6-11.7 and 12.5
/// against 14.7-15.7. The avx512fp16 path's likewise, on a Xeon, 5120 ->
/// 17408 K=2: 7.7, 8.5 and 9.8 ms at 2, 3 and 4 rows against 19.7-23.8.
const GEMV_ROWS: usize = 4;

/// Local rows `i0..i0+R` times the `kc` decoded tile rows `dec`, two rows
/// at a time against all 8 tiles of the block: per input `r`, 8 weight
/// vectors and 2 broadcasts feed 16 FMAs into 16 register accumulators
/// (one tile at a time would load a weight and a broadcast per FMA or two
/// and leave the loads, not the FMAs, the bound). Each output still sums
/// its inputs in ascending order.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `dec` holds `kc * 8 * 256` floats (`kc` decoded tile rows).
/// 4. `mid` holds at least `(i0 + R) * 128` floats.
#[target_feature(enable = "avx512f")]
unsafe fn rows_fma<const R: usize>(job: &BlockJob, i0: usize, kt0: usize, kc: usize, dec: &[f32], mid: &mut [f32]) {
    // SAFETY: `rows_block`'s pointers: `xh_ptrs` gives 16-float tiles of
    // `xh`, and rows i0 + q < i0 + R of `mid` lie inside it (4.).
    let xp = xh_ptrs::<R>(job, i0, kt0, kc);
    let mut q = 0;
    while q + 2 <= R {
        let x: [[*const f32; 2]; KC] = core::array::from_fn(|c| [xp[c][q], xp[c][q + 1]]);
        rows_block::<2>(&x, kc, dec, mid.as_mut_ptr().add((i0 + q) * BLOCK_COLS));
        q += 2;
    }
    if q < R {
        let x: [[*const f32; 1]; KC] = core::array::from_fn(|c| [xp[c][q]]);
        rows_block::<1>(&x, kc, dec, mid.as_mut_ptr().add((i0 + q) * BLOCK_COLS));
    }
}

/// `Q` consecutive rows of `mid` (from `mid`) += their inputs `x[c][q]` times
/// the decoded tile rows.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `x[c][q]` (c < kc) is valid for reads of 16 floats, `dec` holds
///    `kc * 8 * 256` floats, and `mid` is valid for `Q * 128` floats.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rows_block<const Q: usize>(x: &[[*const f32; Q]; KC], kc: usize, dec: &[f32], mid: *mut f32) {
    let mut acc = [[_mm512_setzero_ps(); BLOCK_TILES]; Q];
    for (q, a) in acc.iter_mut().enumerate() {
        for (tl, v) in a.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(mid.add(q * BLOCK_COLS + tl * TILE));
        }
    }
    let dec = &dec[..kc * BLOCK_TILES * 256];
    for c in 0..kc {
        for r in 0..TILE {
            let xb: [__m512; Q] = core::array::from_fn(|q| _mm512_set1_ps(*x[c][q].add(r)));
            for tl in 0..BLOCK_TILES {
                let w = _mm512_loadu_ps(dec.as_ptr().add((c * BLOCK_TILES + tl) * 256 + r * TILE));
                for q in 0..Q {
                    acc[q][tl] = _mm512_fmadd_ps(w, xb[q], acc[q][tl]);
                }
            }
        }
    }
    for (q, a) in acc.iter().enumerate() {
        for (tl, v) in a.iter().enumerate() {
            _mm512_storeu_ps(mid.add(q * BLOCK_COLS + tl * TILE), *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::dispatch::Isa;

    /// Tiles of `W` words for the window checks: each ring bit set alone,
    /// then 256 random tiles (xorshift from `rng`).
    fn window_test_tiles<const W: usize>(mut rng: u64) -> Vec<[u32; W]> {
        let mut tiles: Vec<[u32; W]> = (0..32 * W).map(|b| core::array::from_fn(|w| if w == b / 32 { 1 << (b % 32) } else { 0 })).collect();
        tiles.extend((0..256).map(|_| {
            core::array::from_fn(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u32
            })
        }));
        tiles
    }

    /// The pair path's cut ([`pair_source`], then one multishift by
    /// [`pair_ctrl`]) gives every lane's states of values `2p` and `2p + 1`
    /// as the windows of the avx512 path cut them ([`group_windows_of`],
    /// [`state_window`]), both K, both groups, on tiles with one bit set
    /// (each ring position once) and on random ones.
    fn pair_cuts_match_windows<const K: usize, const W: usize>(test: &str, tabs: &Tabs, rng: u64) {
        if !Isa::Avx512Vbmi.available() {
            println!("{test}: skipped, this CPU cannot run the avx512vbmi path");
            return;
        }
        for (n, words) in window_test_tiles::<W>(rng).iter().enumerate() {
            for g in 0..2 {
                for p in 0..4 {
                    let (mut windows, mut got) = ([[0u32; 16]; 2], [0u32; 16]);
                    // SAFETY: the CPU has AVX-512F, BW and VBMI (checked
                    // above); the loads read 16 and, for K=3, 8 more of the
                    // W = 8K words.
                    unsafe {
                        let t = [
                            _mm512_loadu_si512(words.as_ptr() as *const _),
                            if K == 3 { _mm512_castsi256_si512(_mm256_loadu_si256(words.as_ptr().add(16) as *const __m256i)) } else { _mm512_setzero_si512() },
                        ];
                        let w = group_windows_of::<K>(&t, tabs, g);
                        for h in 0..2 {
                            _mm512_storeu_si512(windows[h].as_mut_ptr() as *mut _, w[h]);
                        }
                        let cut = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(pair_ctrl(K, p)), pair_source::<K>(&t, g));
                        _mm512_storeu_si512(got.as_mut_ptr() as *mut _, cut);
                    }
                    let state = |lane: usize, j: usize| {
                        let (h, sh) = state_window(K, j);
                        (windows[h][lane] >> sh) & 0xFFFF
                    };
                    let want: [u32; 16] = core::array::from_fn(|lane| state(lane, 2 * p) | state(lane, 2 * p + 1) << 16);
                    assert_eq!(got, want, "{test}: tile {n}, group {g}, pair {p}");
                }
            }
        }
    }

    #[test]
    fn pair_cuts_match_windows_k2() {
        pair_cuts_match_windows::<2, 16>("pair_cuts_match_windows_k2", &TAB2, 0x2545_F491_4F6C_DD1D);
    }

    #[test]
    fn pair_cuts_match_windows_k3() {
        pair_cuts_match_windows::<3, 24>("pair_cuts_match_windows_k3", &TAB3, 0x9E37_79B9_7F4A_7C15);
    }

    /// Every one of the 65536 states through `pair` is the C reference's
    /// codebook value (`cref::cb_half`) times 2^-112, bit for bit: the bit
    /// tricks need every such sum to be zero or normal. K=2 pair 3 is
    /// values 6 and 7: in a lane pair's qword ([`pair_ctrl`]) the even
    /// lane's states end at bits 34 and 32, the odd lane's at 18 and 16, so
    /// qword `q` = `a << 32 | b << 16 | c` gives value 7 the states `a` and
    /// `b` and value 6 what the bits above them hold. Skipped, with a note,
    /// where the CPU lacks `isa`, whose features `pair` needs.
    fn pair_sums_scale_exactly(test: &str, isa: Isa, pair: unsafe fn(__m512i, usize) -> (__m512, __m512)) {
        if !isa.available() {
            println!("{test}: skipped, this CPU cannot run the {} path", isa.name());
            return;
        }
        let want = |s: u64| (crate::cref::cb_half(s as u16).to_f32() / F16_TO_F32_SCALE).to_bits();
        let mut rng = 0x5851_F42D_4C95_7F2Du64;
        for s0 in (0..1u64 << 16).step_by(16) {
            let src: [u64; 8] = core::array::from_fn(|q| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng & 0xFFFF_0000_0000_FFFF) | (s0 + 2 * q as u64) << 32 | (s0 + 2 * q as u64 + 1) << 16
            });
            let (mut v6, mut v7) = ([0f32; 16], [0f32; 16]);
            // SAFETY: the CPU has `isa`'s features (checked above), which
            // include AVX-512F and all `pair` needs.
            unsafe {
                let (a, b) = pair(_mm512_loadu_si512(src.as_ptr() as *const _), 3);
                _mm512_storeu_ps(v6.as_mut_ptr(), a);
                _mm512_storeu_ps(v7.as_mut_ptr(), b);
            }
            for lane in 0..16 {
                let (q, end7) = (src[lane / 2], if lane % 2 == 0 { 32 } else { 16 });
                let (s7, s6) = ((q >> end7) & 0xFFFF, (q >> (end7 + 2)) & 0xFFFF);
                assert_eq!(v7[lane].to_bits(), want(s7), "{test}: state {s7:#06x} (value 7): {:e}", v7[lane]);
                assert_eq!(v6[lane].to_bits(), want(s6), "{test}: state {s6:#06x} (value 6): {:e}", v6[lane]);
            }
        }
    }

    #[test]
    fn codebook_sums_scale_exactly() {
        pair_sums_scale_exactly("codebook_sums_scale_exactly", Isa::Avx512Fp16, pair_fp16_scaled::<2>);
    }

    #[test]
    fn codebook_sums_scale_exactly_without_fp16() {
        pair_sums_scale_exactly("codebook_sums_scale_exactly_without_fp16", Isa::Avx512Vbmi, pair_vbmi_scaled::<2>);
    }
}
