//! Fast CPU kernels: decode-and-multiply without materialising W.
//!
//! Work is organised in output blocks of 128 columns (8 tiles), the unit of
//! the output Hadamard transform, so a thread that owns a block can finish
//! it without waiting for anyone:
//!
//! 1. input transform: `xh = f16(H128(x * rin_eff) * RS)` per row
//!    ([`input_transform_row`], split over rows by [`split`]);
//! 2. per output block: `mid = xh @ W_block` by an ISA kernel that decodes
//!    each 16x16 tile once per call and applies it to every row, then the
//!    output transform (+ bias) (`Kernel::run_blocks`, split over blocks).
//!
//! Threads are the caller's (ggml's): every entry point takes `(ith, nth)`
//! or an explicit block range and never spawns anything.
//!
//! ISA paths: AVX-512F (incl. `vpternlogd`), AVX2+FMA+F16C, NEON, and a
//! scalar twin that is bit-exact to the reference. SIMD paths differ from
//! the reference only in the f32 summation order of `mid`.

//! Rooms: [`job`] (the unit of work, a leaf), [`dispatch`] (ISA detection
//! and the [`Kernel`] handle), `batch` (the driver every SIMD path shares),
//! one module of intrinsics per ISA, [`engine`] (slots, experts, scales) and
//! [`linear`] (the dense wrapper).

mod batch;
pub mod dispatch;
pub mod engine;
pub mod job;
pub mod linear;
mod scalar;
pub mod tables;
#[cfg(test)]
mod stage_tests;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

pub use dispatch::{scratch_floats, Isa, Kernel};
pub use engine::{CpuEngine, ExpertGroups, Slots};
pub use job::{split, xh_index, BLOCK_COLS, BLOCK_TILES};
pub use linear::CpuLinear;

use crate::format::{CBA_MASK, CBA_XOR, TILE};
use crate::transform::input_transform;

/// 2^112: f32's exponent bias less f16's. An f16 value's bits placed as
/// f32 exponent and mantissa read as the value times 1 / this; the GEMVs
/// scale their inputs by it instead of converting every weight.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const F16_TO_F32_SCALE: f32 = f32::from_bits((112 + 127) << 23);

/// A hash half's mask and xor (`CBA_MASK`, `CBA_XOR`) where its sign,
/// exponent and mantissa land as an f32's (the AVX2 `cb8_scaled`, the
/// AVX-512 `pair_vbmi_scaled`): sign at bit 31, the other bits 13 up.
/// Applied after the move, they need no masked copy of the hash, and the
/// mask clears what the move brought in (the sign's copies, the other
/// half's bits).
#[cfg(target_arch = "x86_64")]
pub(crate) const HALF_MASK_F32: u32 = ((CBA_MASK & 0x8000) << 16) | ((CBA_MASK & 0x7FFF) << 13);
#[cfg(target_arch = "x86_64")]
pub(crate) const HALF_XOR_F32: u32 = ((CBA_XOR & 0x8000) << 16) | ((CBA_XOR & 0x7FFF) << 13);
/// `vpmaddwd` by this (the words (2^13, 0)) moves each dword's low 16 bits,
/// sign-extended, 13 up: the low hash half to where [`HALF_MASK_F32`] and
/// [`HALF_XOR_F32`] apply, in one operation on the multiplier rather than
/// two shifts.
#[cfg(target_arch = "x86_64")]
pub(crate) const LOW_HALF_MADD: i32 = 1 << 13;
const _: () = assert!(CBA_MASK >> 16 == CBA_MASK & 0xFFFF && CBA_XOR >> 16 == CBA_XOR & 0xFFFF, "both halves take the same mask and xor");

/// Phase 1 for one row: `xh` (tile-row major, `n_rows` rows) gets the
/// f16-rounded transform of `x_row` scaled by `rin_eff`.
///
/// # Safety
/// 1. `xh` is valid for writes of the 16 floats at
///    `xh_index(n_rows, row, kt)` for every `kt < tmp.len() / 16` (IC/16 when
///    `tmp` holds IC floats).
/// 2. No one else reads or writes those floats during the call.
pub unsafe fn input_transform_row(x_row: &[f32], rin_eff: &[f32], xh: *mut f32, n_rows: usize, row: usize, tmp: &mut [f32]) {
    input_transform(x_row, rin_eff, tmp);
    for (kt, chunk) in tmp.chunks_exact(TILE).enumerate() {
        // SAFETY: 1. the destination is valid for 16 writes; 2. it is ours
        // alone, so it cannot overlap `tmp`.
        std::ptr::copy_nonoverlapping(chunk.as_ptr(), xh.add(xh_index(n_rows, row, kt)), TILE);
    }
}
