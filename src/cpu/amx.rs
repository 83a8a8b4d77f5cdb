//! The batched product on AMX-BF16 tiles (Intel Sapphire Rapids and later).
//!
//! A `tdpbf16ps` multiplies bf16 pairs into f32 accumulators, 16 x 16
//! outputs over 32 inputs an instruction, many times the f32 FMA rate. The
//! contract's products are f16 x f16 (11 significant bits each), so each
//! operand is split exactly into a bf16 high part (its top 8 bits) and a
//! bf16 low part (the other 3): `w x = wh xh + wh xl + wl xh + wl xl`, four
//! exact products. The splits have the same sign as their value, so the
//! four terms' magnitudes sum to `|x w|`. This needs `xh` to hold f16
//! values, as the input transform makes it (the contract rounds it so).
//!
//! Accuracy: per chunk of KB inputs (256, or IC below that) each of the
//! four is summed in its own f32 accumulator (`tdpbf16ps` rounds once per
//! product, in two chains of the even and odd inputs that it then adds:
//! the same count of roundings), the four are added smallest first, and
//! that is added to the running sum: within `(KB + 1 + chunks) u S` of the
//! exact sum (u = 2^-24, S the sum of |x w|), where an FMA order is within
//! `(IC - 1) u S`. docs/FORMAT.md and tests/common/mod.rs take the larger.
//!
//! No subnormal arises (AMX flushes them): every product is 0 or at least
//! 2^-48 in magnitude (f16's smallest step is 2^-24), and every partial sum
//! is a multiple of 2^-48. A non-finite input (an f16 overflow in the input
//! transform) would meet `inf - inf` in its split, so a row with one is
//! summed by the FMA product instead (its sums, like every row's, do not
//! depend on the other rows of the call).
//!
//! Loops: the inputs go in chunks of [`KB_TILES`] tile rows; each chunk's
//! weights of up to [`NB`] output blocks are decoded once
//! (`TileOps::decode_rows`) into bf16 tile pairs in AMX's pair-interleaved
//! layout, then every group of 16 rows has its inputs split once and runs
//! the blocks' output tiles, each one asm block over the chunk's steps.
//!
//! Using AMX makes Linux save 8 KiB more state per thread on a signal, for
//! the whole process once [`available`] has asked for it.

use super::batch::{self, TileOps};
use super::job::{BlockJob, BLOCK_COLS, BLOCK_TILES};
use crate::format::{TILE, TILE_VALUES};
use core::arch::asm;
use core::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

/// Tile rows (16 inputs each) per chunk: a block's decoded weights of a
/// chunk are 8 output tiles x 8 steps x 2 parts x 1 KiB = 128 KiB.
const KB_TILES: usize = 16;
/// `tdpbf16ps` steps (32 inputs) per chunk.
const STEPS: usize = KB_TILES / 2;
/// Rows of an A tile (a row group).
const GROUP: usize = 16;

/// Whether this CPU has AMX-BF16 and the kernel lets this process use its
/// tile data (Linux asks each process to request it once; the request is
/// process-wide and kept). Checked once.
pub(crate) fn available() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| cpu_has_amx_bf16() && request_tile_data())
}

fn cpu_has_amx_bf16() -> bool {
    // CPUID leaf 7 is valid where the maximum leaf is 7 or more.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    const AMX_BF16: u32 = 1 << 22;
    const AMX_TILE: u32 = 1 << 24;
    edx & AMX_BF16 != 0 && edx & AMX_TILE != 0
}

#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_GET_XCOMP_PERM: i64 = 0x1022;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let rc: i64;
    let mut perm: u64 = 0;
    // SAFETY: arch_prctl(2) with these codes only reads its arguments and
    // writes the permitted feature mask to `perm`, a live u64; the syscall
    // clobbers rcx and r11, declared.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => rc, in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
             lateout("rcx") _, lateout("r11") _, options(nostack));
        if rc != 0 {
            return false;
        }
        let rc2: i64;
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => rc2, in("rdi") ARCH_GET_XCOMP_PERM, in("rsi") &mut perm as *mut u64,
             lateout("rcx") _, lateout("r11") _, options(nostack));
        rc2 == 0 && perm & (1 << XFEATURE_XTILEDATA) != 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false // no AMX path outside Linux (each OS grants tile data its own way)
}

/// 64 bytes, 64-aligned: the buffers' unit, so every tile row is one line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u16; 32]);

const ZERO_LINE: Line = Line([0; 32]);

/// The per-thread buffers of the product.
struct Buffers {
    /// Decoded weights of a chunk: `[tile 8][step][part 2]` tiles of 16 lines.
    b: Vec<Line>,
    /// A row group's split inputs of a chunk: `[step][part 2]` tiles.
    a: Vec<Line>,
    /// The four accumulators of one output tile, stored: `[part 4][16][16]`
    /// f32 in lines.
    c: Vec<Line>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = const { RefCell::new(Buffers { b: Vec::new(), a: Vec::new(), c: Vec::new() }) };
}

/// `ldtilecfg`'s 64-byte operand: palette 1, tiles 0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    reserved2: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
    reserved2: [0; 16],
};

/// Output blocks a call of [`blocks_mid`] takes at most: each row group's
/// split inputs serve this many blocks (1 MiB of decoded weights a chunk;
/// on a Xeon, 8 ran 5120 -> 17408 at 512 rows in 275 ms, 4 in 317, 16 in
/// 392).
pub(crate) const NB: usize = 8;

/// Rows up to which the AMX path takes the GEMV (`T::GEMV_ROWS` rows a
/// call). An AMX product costs 16 rows' time for 1 to 16 rows; on a Xeon,
/// 5120 -> 17408 K=2: 22.9-24.4 ms at 5-16 rows, against the FP16 GEMV's
/// 6.5, 7.7, 8.5 and 9.8 ms at 1-4 rows a call (so 16-20 ms for 5-8).
pub(crate) const GEMV_ROWS: usize = 8;

/// `mid [rows, 128]` += the rows of `job` times its block: up to
/// [`GEMV_ROWS`] rows the GEMV (`T::GEMV_ROWS` rows a call: a row's sums
/// do not depend on the others), above that [`blocks_mid`].
///
/// # Safety
/// 1. The CPU supports the ISA of `T` (AVX-512 F and BW at least) and
///    [`available`] returned true.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `mid` holds `job.rows.len() * 128` floats and `scratch` at least
///    [`batch::DECODED_FLOATS`].
pub(crate) unsafe fn block_mid<T: TileOps>(job: &BlockJob, mid: &mut [f32], scratch: &mut [f32]) {
    if job.rows.len() <= GEMV_ROWS {
        for (i, rows) in job.rows.chunks(T::GEMV_ROWS).enumerate() {
            let part = &mut mid[i * T::GEMV_ROWS * BLOCK_COLS..][..rows.len() * BLOCK_COLS];
            // SAFETY: batch::block_mid's list is ours for the chunk's rows;
            // 1 to T::GEMV_ROWS of them, so it takes the GEMV.
            batch::block_mid::<T>(&BlockJob { rows, ..*job }, part, scratch);
        }
    } else {
        // SAFETY: blocks_mid's list is ours, for the one block.
        blocks_mid::<T>(job, job.block..job.block + 1, mid, scratch);
    }
}

/// `out [b - blocks.start][rows][128]` += the rows of `job` times output
/// blocks `blocks` (at most [`NB`]; `job.block` is not read) on AMX tiles;
/// a row with a non-finite input by the FMA product.
///
/// # Safety
/// 1. As [`block_mid`]'s, and every block of `blocks` is inside OC.
/// 2. `out` holds `blocks.len() * job.rows.len() * 128` floats, and
///    `scratch` at least [`batch::DECODED_FLOATS`].
pub(crate) unsafe fn blocks_mid<T: TileOps>(job: &BlockJob, blocks: core::ops::Range<usize>, out: &mut [f32], scratch: &mut [f32]) {
    // SAFETY: gemm's list is ours.
    let bad = match job.k {
        2 => gemm::<T, 2>(job, blocks.clone(), out),
        _ => gemm::<T, 3>(job, blocks.clone(), out),
    };
    if bad.is_empty() {
        return;
    }
    // The rows with a non-finite input, again by the FMA product, whose
    // sums of a row do not depend on the other rows of its call.
    let m = job.rows.len();
    let rows: Vec<usize> = bad.iter().map(|&i| job.rows[i]).collect();
    let mut mid = vec![0f32; rows.len() * BLOCK_COLS];
    for (bi, block) in blocks.enumerate() {
        mid.fill(0.0);
        // SAFETY: block_mid_batched's 1. is ours, 2.: the job's rows are
        // a subset of a consistent job's, 3.: `mid` holds them.
        batch::block_mid_batched::<T>(&BlockJob { rows: &rows, block, ..*job }, &mut mid, scratch);
        for (j, &i) in bad.iter().enumerate() {
            out[(bi * m + i) * BLOCK_COLS..][..BLOCK_COLS].copy_from_slice(&mid[j * BLOCK_COLS..][..BLOCK_COLS]);
        }
    }
}

/// The AMX product of [`blocks_mid`] for a K known at compile time; the
/// local indices of the rows with a non-finite input, whose sums it leaves
/// undefined.
///
/// # Safety
/// [`blocks_mid`]'s 1., and `out` holds `blocks.len() * job.rows.len() * 128` floats.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gemm<T: TileOps, const K: usize>(job: &BlockJob, blocks: core::ops::Range<usize>, out: &mut [f32]) -> Vec<usize> {
    let m = job.rows.len();
    let nb = blocks.len();
    let kt_n = job.kt_n();
    assert!(nb <= NB && out.len() >= nb * m * BLOCK_COLS, "amx: {nb} blocks of {m} rows");
    assert!(kt_n >= 2 && kt_n % 2 == 0, "amx: IC {} is not a multiple of 32", job.ic);
    let groups = m.div_ceil(GROUP);
    let mut bad = vec![0u16; groups]; // per row group, a bit per row
    let out = out.as_mut_ptr();
    BUFFERS.with(|buf| {
        let buf = &mut *buf.borrow_mut();
        buf.b.resize(NB * BLOCK_TILES * STEPS * 2 * 16, ZERO_LINE);
        buf.a.resize(STEPS * 2 * 16, ZERO_LINE);
        buf.c.resize(4 * GROUP * TILE / 16, ZERO_LINE);
        let (b, a, c) = (buf.b.as_mut_ptr(), buf.a.as_mut_ptr(), buf.c.as_mut_ptr() as *mut f32);
        // Tile pair (block bi, tile tl, step s): high part, then the low part's 16 lines.
        let bt = |bi: usize, tl: usize, s: usize| b.add(((bi * BLOCK_TILES + tl) * STEPS + s) * 2 * 16);
        // SAFETY: CONFIG is a valid palette-1 configuration (1.: the CPU
        // has AMX and the process may use it); it zeroes the tiles.
        asm!("ldtilecfg [{}]", in(reg) &CONFIG, out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
             out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _, options(nostack, readonly));
        let mut dec = [0f32; TILE_VALUES];
        let mut kb0 = 0;
        while kb0 < kt_n {
            let steps = STEPS.min((kt_n - kb0) / 2);
            for (bi, block) in blocks.clone().enumerate() {
                for tl in 0..BLOCK_TILES {
                    for t in 0..2 * steps {
                        // SAFETY: decode_rows' 1. and 2. are ours; the tile is
                        // inside the block (1.) and IC.
                        T::decode_rows::<K>(job, kb0 + t, block * BLOCK_TILES + tl, &mut dec);
                        // SAFETY: the tile pair lies inside `b`.
                        weights_to_pairs(&dec, bt(bi, tl, t / 2), t % 2);
                    }
                }
            }
            for g in 0..groups {
                // SAFETY: `a` holds STEPS * 2 tiles; the rows are the job's.
                bad[g] |= split_inputs(job, g, kb0, steps, a);
                let rows = GROUP.min(m - g * GROUP);
                for bi in 0..nb {
                    for tl in 0..BLOCK_TILES {
                        // One output tile over the chunk: tmm0 += xh wh,
                        // tmm1 += xh wl, tmm2 += xl wh, tmm3 += xl wl; each
                        // step's A and B pairs are 2 KiB apart, the low
                        // part 1 KiB after the high; then the four stored
                        // to `c` (1 KiB apart, rows of 64 bytes).
                        // SAFETY: `a` and `bt(bi, tl, ..)` hold `steps`
                        // tile pairs each and `c` four tiles (the buffers'
                        // sizes above); the tiles are configured and only
                        // this block uses them.
                        asm!(
                            "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                            "2:",
                            "tileloadd tmm4, [{a} + {s}*1]",
                            "tileloadd tmm6, [{b} + {s}*1]",
                            "tileloadd tmm5, [{a} + {s}*1 + 1024]",
                            "tileloadd tmm7, [{b} + {s}*1 + 1024]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            "add {a}, 2048",
                            "add {b}, 2048",
                            "dec {n}",
                            "jnz 2b",
                            "tilestored [{c} + {s}*1], tmm0",
                            "tilestored [{c} + {s}*1 + 1024], tmm1",
                            "tilestored [{c} + {s}*1 + 2048], tmm2",
                            "tilestored [{c} + {s}*1 + 3072], tmm3",
                            a = inout(reg) a => _, b = inout(reg) bt(bi, tl, 0) => _, n = inout(reg) steps => _,
                            c = in(reg) c, s = in(reg) 64usize,
                            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
                            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
                            options(nostack),
                        );
                        for i in 0..rows {
                            let part = |p: usize| _mm512_load_ps(c.add(p * GROUP * TILE + i * TILE));
                            // Smallest first: ll, then the cross terms, then hh.
                            let sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(part(3), part(2)), part(1)), part(0));
                            let o = out.add((bi * m + g * GROUP + i) * BLOCK_COLS + tl * TILE);
                            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), sum));
                        }
                    }
                }
            }
            kb0 += 2 * steps;
        }
        asm!("tilerelease", out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
             out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _, options(nostack, nomem));
    });
    (0..m).filter(|&i| bad[i / GROUP] & (1 << (i % GROUP)) != 0).collect()
}

/// The bf16 parts of f16-valued f32s: high = the top 16 bits (the value's
/// top 8 significant bits), low = the value less that (at most 3
/// significant bits, so its own top 16 bits are it exactly).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn parts(v: __m512) -> (__m512i, __m512i) {
    let hi = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0xFFFF_0000u32 as i32));
    let lo = _mm512_sub_ps(v, _mm512_castsi512_ps(hi));
    (hi, _mm512_castps_si512(lo))
}

/// Writes one decoded tile (`dec[r * 16 + c]`: input r, output c) into
/// half `half` (inputs 0-15 or 16-31 of the step) of a tile pair at `dst`
/// (the high part's 16 lines, then the low part's): line p holds, for
/// each output c, the pair (input 2p, input 2p + 1) as two bf16.
///
/// # Safety
/// 1. The CPU supports AVX-512F.
/// 2. `dst` is valid for writes of 32 lines.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn weights_to_pairs(dec: &[f32; TILE_VALUES], dst: *mut Line, half: usize) {
    for p in 0..8 {
        let r0 = _mm512_loadu_ps(dec.as_ptr().add(2 * p * TILE));
        let r1 = _mm512_loadu_ps(dec.as_ptr().add((2 * p + 1) * TILE));
        let (h0, l0) = parts(r0);
        let (h1, l1) = parts(r1);
        // Each 32-bit lane: input 2p's part in the low half, 2p + 1's in the high.
        let hi = _mm512_or_si512(h1, _mm512_srli_epi32::<16>(h0));
        let lo = _mm512_or_si512(l1, _mm512_srli_epi32::<16>(l0));
        let line = half * 8 + p;
        _mm512_store_si512(dst.add(line) as *mut __m512i, hi);
        _mm512_store_si512(dst.add(16 + line) as *mut __m512i, lo);
    }
}

/// Splits the inputs of row group `g` over the chunk's tile rows
/// `kb0..kb0 + 2 * steps` into A tiles at `a` (`[step][part]`, 16 lines
/// each: line i holds row i's 32 inputs of the step as bf16), rows past
/// the job's as zeros. Returns a bit per row of the group whose inputs
/// here are not all finite.
///
/// # Safety
/// 1. The CPU supports AVX-512 F and BW.
/// 2. `job` is consistent; `a` is valid for writes of `steps * 2` tiles.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn split_inputs(job: &BlockJob, g: usize, kb0: usize, steps: usize, a: *mut Line) -> u16 {
    // The high 16 bits of 32 dwords of two vectors, in order.
    let odd_words = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
    );
    let exp = _mm512_set1_epi32(0x7F80_0000);
    let mut bad = 0u16;
    for i in 0..GROUP {
        let q = g * GROUP + i;
        for s in 0..steps {
            let (hi, lo) = if q < job.rows.len() {
                let row = job.rows[q];
                let x0 = _mm512_loadu_ps(job.xh_tile(row, kb0 + 2 * s).as_ptr());
                let x1 = _mm512_loadu_ps(job.xh_tile(row, kb0 + 2 * s + 1).as_ptr());
                // Exponent all ones: inf or NaN.
                let e0 = _mm512_and_si512(_mm512_castps_si512(x0), exp);
                let e1 = _mm512_and_si512(_mm512_castps_si512(x1), exp);
                if (_mm512_cmpeq_epi32_mask(e0, exp) | _mm512_cmpeq_epi32_mask(e1, exp)) != 0 {
                    bad |= 1 << i;
                }
                let (h0, l0) = parts(x0);
                let (h1, l1) = parts(x1);
                (_mm512_permutex2var_epi16(h0, odd_words, h1), _mm512_permutex2var_epi16(l0, odd_words, l1))
            } else {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            };
            _mm512_store_si512(a.add(s * 2 * 16 + i) as *mut __m512i, hi);
            _mm512_store_si512(a.add((s * 2 + 1) * 16 + i) as *mut __m512i, lo);
        }
    }
    bad
}
