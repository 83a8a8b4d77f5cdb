//! NEON path (AArch64). A vector holds 4 consecutive lanes (lanes
//! 4g..4g+3, g = 0..8); vector (g, j) holds value j of those lanes: rows
//! `2*i + rj` with `rj = (j&1) + 8*((j>>1)&1)` and one column,
//! `2*(g>>1) + 8*(j>=4) + (g&1)`, so each accumulator is one column.
//!
//! The f16 <-> f32 conversions are `fcvtl`/`fcvtn` through inline assembly
//! (the f16 vector intrinsics are not stable Rust); `fcvtn` rounds to
//! nearest-even under the default FPCR, as the contract requires.
//!
//! Path `neonfp16` (ARMv8.2-A FP16: Apple M-series, Graviton 2 and later)
//! adds the codebook's two halves with one `fadd .8h` for 8 states, which is
//! the contract's f16 add (round to nearest even; FPCR.FZ16 is clear on
//! Linux and macOS, so no subnormal is flushed), instead of two widenings,
//! an f32 add and a round trip through f16 per 4 states.

// Index loops mirror the lane/group arithmetic of the layout comments.
#![allow(clippy::needless_range_loop)]

use super::batch::{lanes_to_rows, xh_ptrs};
use super::tables::{group_windows, identity, lane_to_rowmajor, state_window, GroupWindow, EXT_WORDS};
use super::job::{BlockJob, BLOCK_COLS, BLOCK_TILES};
use crate::format::{CBA_MASK, CBA_MUL, CBA_XOR, TILE};
use core::arch::aarch64::*;
use core::arch::asm;

type Tabs = [[GroupWindow<4>; 8]; 2];
static TAB2: Tabs = group_windows::<4, 8>(2, &identity());
static TAB3: Tabs = group_windows::<4, 8>(3, &identity());
static LANES_TO_ROWS: [u8; 256] = lane_to_rowmajor::<4>(&identity());

/// Byte indices for `vqtbl2q_u8` picking words `idx` out of 8 loaded words.
const fn byte_index(idx: [i32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (idx[i / 4] * 4) as u8 + (i % 4) as u8;
        i += 1;
    }
    out
}

/// Per group: byte indices of `w[q]` and `w[q+1]`, and the shift vectors
/// (left by `off`, right by `32 - off` as a negative left shift).
#[derive(Clone, Copy)]
struct NeonWindow {
    base: usize,
    ia: [u8; 16],
    ib: [u8; 16],
    shl: [i32; 4],
    shr: [i32; 4],
}

const fn neon_windows(t: &Tabs) -> [[NeonWindow; 8]; 2] {
    const EMPTY: NeonWindow = NeonWindow { base: 0, ia: [0; 16], ib: [0; 16], shl: [0; 4], shr: [0; 4] };
    let mut out = [[EMPTY; 8]; 2];
    let mut h = 0;
    while h < 2 {
        let mut g = 0;
        while g < 8 {
            let gw = &t[h][g];
            let mut shl = [0i32; 4];
            let mut shr = [0i32; 4];
            let mut i = 0;
            while i < 4 {
                shl[i] = gw.shl[i] as i32;
                shr[i] = -(gw.shr[i] as i32);
                i += 1;
            }
            out[h][g] = NeonWindow { base: gw.base, ia: byte_index(gw.idx_a), ib: byte_index(gw.idx_b), shl, shr };
            g += 1;
        }
        h += 1;
    }
    out
}

static NW2: [[NeonWindow; 8]; 2] = neon_windows(&TAB2);
static NW3: [[NeonWindow; 8]; 2] = neon_windows(&TAB3);

/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
/// 2. `nw.base + 8 <= EXT_WORDS`: 32 bytes are loaded (true of every entry
///    of `NW2` and `NW3`).
#[inline(always)]
unsafe fn window(ext: &[u32; EXT_WORDS], nw: &NeonWindow) -> uint32x4_t {
    let p = ext.as_ptr().add(nw.base) as *const u8;
    let t = uint8x16x2_t(vld1q_u8(p), vld1q_u8(p.add(16)));
    let a = vreinterpretq_u32_u8(vqtbl2q_u8(t, vld1q_u8(nw.ia.as_ptr())));
    let b = vreinterpretq_u32_u8(vqtbl2q_u8(t, vld1q_u8(nw.ib.as_ptr())));
    // USHL by a negative count shifts right; by -32 it gives 0 (off == 0).
    vorrq_u32(vshlq_u32(a, vld1q_s32(nw.shl.as_ptr())), vshlq_u32(b, vld1q_s32(nw.shr.as_ptr())))
}

/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
#[inline(always)]
unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    asm!("fcvtl {o:v}.4s, {i:v}.4h", o = out(vreg) out, i = in(vreg) h, options(pure, nomem, nostack));
    out
}

/// f32 -> nearest-even f16 -> f32.
///
/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
#[inline(always)]
unsafe fn round_f16(v: float32x4_t) -> float32x4_t {
    let out: float32x4_t;
    asm!("fcvtn {o:v}.4h, {i:v}.4s", "fcvtl {o:v}.4s, {o:v}.4h", o = out(vreg) out, i = in(vreg) v, options(pure, nomem, nostack));
    out
}

/// The codebook hash of 4 states: `(s * MUL & MASK) ^ XOR`, two f16
/// halves a lane.
///
/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
#[inline(always)]
unsafe fn hash4(s: uint32x4_t) -> uint32x4_t {
    let r = vmulq_u32(s, vdupq_n_u32(CBA_MUL));
    veorq_u32(vandq_u32(r, vdupq_n_u32(CBA_MASK)), vdupq_n_u32(CBA_XOR))
}

/// Codebook values of 4 states.
///
/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
#[inline(always)]
unsafe fn cb4(s: uint32x4_t) -> float32x4_t {
    let r = hash4(s);
    let lo = f16x4_to_f32(vmovn_u32(r));
    let hi = f16x4_to_f32(vshrn_n_u32::<16>(r));
    round_f16(vaddq_f32(lo, hi))
}

/// How a path turns 8 states (two vectors of 4) into their codebook values.
trait Codebook {
    /// # Safety
    /// 1. The CPU supports the path's features (checked by `Isa::available`).
    unsafe fn cb8(a: uint32x4_t, b: uint32x4_t) -> [float32x4_t; 2];
}

/// Plain NEON: an f32 add of the widened halves, rounded through f16.
struct CbNeon;
impl Codebook for CbNeon {
    #[inline(always)]
    unsafe fn cb8(a: uint32x4_t, b: uint32x4_t) -> [float32x4_t; 2] {
        // SAFETY: NEON is baseline on AArch64.
        [cb4(a), cb4(b)]
    }
}

/// FP16: the halves of 8 hashes gathered by two unzips, one f16 add.
struct CbFp16;
impl Codebook for CbFp16 {
    #[inline(always)]
    unsafe fn cb8(a: uint32x4_t, b: uint32x4_t) -> [float32x4_t; 2] {
        let (ra, rb) = (vreinterpretq_u16_u32(hash4(a)), vreinterpretq_u16_u32(hash4(b)));
        let lo = vuzp1q_u16(ra, rb); // low halves: a's 4 states, then b's
        let hi = vuzp2q_u16(ra, rb);
        let (va, vb): (float32x4_t, float32x4_t);
        // SAFETY: the caller's 1. (FP16 arithmetic); registers only.
        asm!(
            "fadd {s:v}.8h, {l:v}.8h, {h:v}.8h",
            "fcvtl {a:v}.4s, {s:v}.4h",
            "fcvtl2 {b:v}.4s, {s:v}.8h",
            s = out(vreg) _, l = in(vreg) lo, h = in(vreg) hi, a = out(vreg) va, b = out(vreg) vb,
            options(pure, nomem, nostack)
        );
        [va, vb]
    }
}

/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
#[inline(always)]
unsafe fn states<const K: usize>(w: &[uint32x4_t; 2], j: usize) -> uint32x4_t {
    let (h, sh) = state_window(K, j);
    vandq_u32(vshlq_u32(w[h], vdupq_n_s32(-(sh as i32))), vdupq_n_u32(0xFFFF))
}

/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
#[inline(always)]
unsafe fn group_windows_of<const K: usize>(ext: &[u32; EXT_WORDS], g: usize) -> [uint32x4_t; 2] {
    let nw = if K == 2 { &NW2 } else { &NW3 };
    let w0 = window(ext, &nw[0][g]);
    [w0, if K == 3 { window(ext, &nw[1][g]) } else { w0 }]
}

/// `xv[j&3]`: inputs of rows `2*i + rj`, i = 0..4.
///
/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
/// 2. `x` is valid for reads of 16 floats.
#[inline(always)]
unsafe fn xvecs(x: *const f32) -> [float32x4_t; 4] {
    let lo = vld2q_f32(x); // (even, odd) of x[0..8]
    let hi = vld2q_f32(x.add(8));
    [lo.0, lo.1, hi.0, hi.1]
}

/// # Safety
/// 1. The CPU supports `C`'s features (checked by `Isa::available`).
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[inline(always)]
unsafe fn gemv_with<C: Codebook, const K: usize>(job: &BlockJob, mid: &mut [f32]) {
    // acc[tile][column]
    let mut acc = [[vdupq_n_f32(0.0); TILE]; BLOCK_TILES];
    let mut ext = [0u32; EXT_WORDS];
    for kt in 0..job.kt_n() {
        // SAFETY: xvecs' 2.: `xh_tile` is a 16-float slice.
        let xv = xvecs(job.xh_tile(job.rows[0], kt).as_ptr());
        for tl in job.tile_range() {
            let a = &mut acc[tl];
            job.load_ext::<K>(kt, job.block * BLOCK_TILES + tl, &mut ext);
            for g in 0..8 {
                let w = group_windows_of::<K>(&ext, g);
                // Values j and j + 1 share a column (j even).
                for j in (0..8).step_by(2) {
                    let col = 2 * (g >> 1) + 8 * (j >> 2) + (g & 1);
                    let [c0, c1] = C::cb8(states::<K>(&w, j), states::<K>(&w, j + 1));
                    a[col] = vfmaq_f32(a[col], c0, xv[j & 3]);
                    a[col] = vfmaq_f32(a[col], c1, xv[(j + 1) & 3]);
                }
            }
        }
    }
    for tl in job.tile_range() {
        for (c, v) in acc[tl].iter().enumerate() {
            mid[tl * TILE + c] += vaddvq_f32(*v);
        }
    }
}

/// # Safety
/// 1. The CPU supports `C`'s features (checked by `Isa::available`).
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[inline(always)]
unsafe fn decode_rows_with<C: Codebook, const K: usize>(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32]) {
    let mut ext = [0u32; EXT_WORDS];
    let mut lanes = [0f32; 256];
    job.load_ext::<K>(kt, nt, &mut ext);
    for g in 0..8 {
        let w = group_windows_of::<K>(&ext, g);
        for j in (0..8).step_by(2) {
            let [c0, c1] = C::cb8(states::<K>(&w, j), states::<K>(&w, j + 1));
            vst1q_f32(lanes.as_mut_ptr().add((g * 8 + j) * 4), c0);
            vst1q_f32(lanes.as_mut_ptr().add((g * 8 + j + 1) * 4), c1);
        }
    }
    lanes_to_rows(&lanes, &LANES_TO_ROWS, out);
}

/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
unsafe fn gemv<const K: usize>(job: &BlockJob, mid: &mut [f32]) {
    gemv_with::<CbNeon, K>(job, mid)
}

/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
unsafe fn decode_rows<const K: usize>(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32]) {
    decode_rows_with::<CbNeon, K>(job, kt, nt, out)
}

/// # Safety
/// 1. The CPU supports FP16 arithmetic (checked by `Isa::available`).
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[target_feature(enable = "fp16")]
unsafe fn gemv_fp16<const K: usize>(job: &BlockJob, mid: &mut [f32]) {
    gemv_with::<CbFp16, K>(job, mid)
}

/// # Safety
/// 1. The CPU supports FP16 arithmetic (checked by `Isa::available`).
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
#[target_feature(enable = "fp16")]
unsafe fn decode_rows_fp16<const K: usize>(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32]) {
    decode_rows_with::<CbFp16, K>(job, kt, nt, out)
}

super::batch::tile_ops!(Neon);
super::batch::tile_ops!(NeonFp16, gemv_fp16, decode_rows_fp16, rows_fma);

/// # Safety
/// 1. The CPU supports NEON (checked by `Isa::available`; baseline on AArch64).
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `dec` holds `kc * 8 * 256` floats (`kc` decoded tile rows).
/// 4. `mid` holds at least `(i0 + R) * 128` floats.
unsafe fn rows_fma<const R: usize>(job: &BlockJob, i0: usize, kt0: usize, kc: usize, dec: &[f32], mid: &mut [f32]) {
    // SAFETY: every raw access below is inside `dec` (3.), `mid` (4.) or a
    // 16-float tile of `xh` (`xh_ptrs`).
    let xp = xh_ptrs::<R>(job, i0, kt0, kc);
    for tl in 0..BLOCK_TILES {
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        for (q, a) in acc.iter_mut().enumerate() {
            let mp = mid.as_ptr().add((i0 + q) * BLOCK_COLS + tl * TILE);
            for (v, p) in a.iter_mut().enumerate() {
                *p = vld1q_f32(mp.add(4 * v));
            }
        }
        for c in 0..kc {
            let d = dec.as_ptr().add((c * BLOCK_TILES + tl) * 256);
            for r in 0..TILE {
                let w = [vld1q_f32(d.add(r * TILE)), vld1q_f32(d.add(r * TILE + 4)), vld1q_f32(d.add(r * TILE + 8)), vld1q_f32(d.add(r * TILE + 12))];
                for q in 0..R {
                    let b = vdupq_n_f32(*xp[c][q].add(r));
                    for v in 0..4 {
                        acc[q][v] = vfmaq_f32(acc[q][v], w[v], b);
                    }
                }
            }
        }
        for (q, a) in acc.iter().enumerate() {
            let mp = mid.as_mut_ptr().add((i0 + q) * BLOCK_COLS + tl * TILE);
            for (v, p) in a.iter().enumerate() {
                vst1q_f32(mp.add(4 * v), *p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::dispatch::Isa;

    /// Every one of the 65536 states through both codebooks is the C
    /// reference's value (`cref::cb_half`), bit for bit.
    #[test]
    fn codebooks_match_the_reference_on_every_state() {
        let fp16 = Isa::NeonFp16.available();
        if !fp16 {
            println!("codebooks_match_the_reference_on_every_state: the FP16 codebook skipped, this CPU lacks FP16 arithmetic");
        }
        for s0 in (0..1u32 << 16).step_by(8) {
            let st: [u32; 8] = core::array::from_fn(|i| s0 + i as u32);
            let mut got = [[0f32; 8]; 2];
            // SAFETY: NEON is baseline; CbFp16 runs only where FP16 is available (checked above).
            unsafe {
                let (a, b) = (vld1q_u32(st.as_ptr()), vld1q_u32(st.as_ptr().add(4)));
                let mut put = |p: usize, v: [float32x4_t; 2]| {
                    vst1q_f32(got[p].as_mut_ptr(), v[0]);
                    vst1q_f32(got[p].as_mut_ptr().add(4), v[1]);
                };
                put(0, CbNeon::cb8(a, b));
                if fp16 {
                    put(1, fp16_cb8(a, b));
                }
            }
            for (i, &s) in st.iter().enumerate() {
                let want = crate::cref::cb_half(s as u16).to_f32().to_bits();
                assert_eq!(got[0][i].to_bits(), want, "neon codebook, state {s:#06x}: {:e}", got[0][i]);
                if fp16 {
                    assert_eq!(got[1][i].to_bits(), want, "neonfp16 codebook, state {s:#06x}: {:e}", got[1][i]);
                }
            }
        }
    }

    /// # Safety
    /// 1. The CPU supports FP16 arithmetic.
    #[target_feature(enable = "fp16")]
    unsafe fn fp16_cb8(a: uint32x4_t, b: uint32x4_t) -> [float32x4_t; 2] {
        CbFp16::cb8(a, b)
    }
}
