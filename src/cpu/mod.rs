//! Fast CPU kernels: decode-and-multiply without materialising W.
//!
//! Work is organised in output blocks of 128 columns (8 tiles), the unit of
//! the output Hadamard transform, so a thread that owns a block can finish
//! it without waiting for anyone:
//!
//! 1. input transform: `xh = f16(H128(x * rin_eff) * RS)` per row
//!    ([`input_transform_row`], split over rows);
//! 2. per output block: `mid = xh @ W_block` by an ISA kernel that decodes
//!    each 16x16 tile once per call and applies it to every row, then the
//!    output transform (+ bias) ([`Kernel::run_blocks`], split over blocks).
//!
//! Threads are the caller's (ggml's): every entry point takes `(ith, nth)`
//! or an explicit block range and never spawns anything.
//!
//! ISA paths: AVX-512F (incl. `vpternlogd`), AVX2+FMA+F16C, NEON, and a
//! scalar twin that is bit-exact to the reference. SIMD paths differ from
//! the reference only in the f32 summation order of `mid`.

mod batch;
mod scalar;
pub mod tables;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

pub mod linear;
pub mod moe;

pub use linear::CpuLinear;
pub use moe::{CpuMoe, ExpertGroups, Slots};


use crate::codec::TILE;
use crate::hadamard::N as HBLOCK;
use crate::reference::{input_transform, output_transform};

use std::ops::Range;

/// Tile rows the GEMVs prefetch ahead of use.
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_ROWS: usize = 4;

/// Output columns per work unit (one Hadamard block = 8 tiles).
pub const BLOCK_COLS: usize = HBLOCK;
/// Tiles per output block.
pub const BLOCK_TILES: usize = BLOCK_COLS / TILE;

/// An instruction-set path of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
    Neon,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// Whether this machine can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every path this machine can run.
    pub fn all_available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The best available path, optionally capped by the environment
    /// variable `ESCHA_CPU_ISA` (`scalar`, `avx2`, `avx512`, `neon`).
    pub fn detect() -> Isa {
        if let Ok(name) = std::env::var("ESCHA_CPU_ISA") {
            if let Some(isa) = Isa::from_name(&name).filter(|i| i.available()) {
                return isa;
            }
        }
        [Isa::Avx512, Isa::Avx2, Isa::Neon].into_iter().find(|i| i.available()).unwrap_or(Isa::Scalar)
    }

    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name.trim().to_ascii_lowercase())
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

/// The contiguous share `ith` of `nth` of `0..n` (balanced to within one).
pub fn split(n: usize, ith: usize, nth: usize) -> Range<usize> {
    assert!(nth > 0 && ith < nth, "thread {ith} of {nth}");
    let (q, r) = (n / nth, n % nth);
    let start = ith * q + ith.min(r);
    start..start + q + usize::from(ith < r)
}

/// Transformed inputs (`xh`) are stored tile-row major: the 16 values of
/// input tile row `kt` of row `row` start at `(kt * n_rows + row) * 16`.
/// All rows of a batch for one tile row are then contiguous, so the batched
/// kernels stream them whatever IC is.
#[inline(always)]
pub fn xh_index(n_rows: usize, row: usize, kt: usize) -> usize {
    (kt * n_rows + row) * TILE
}

/// Phase 1 for one row: `xh` (tile-row major, `n_rows` rows) gets the
/// f16-rounded transform of `x_row` scaled by `rin_eff`.
///
/// # Safety
/// `xh` must be valid for writes at every `xh_index(n_rows, row, kt) + 0..16`,
/// `kt < IC/16`, and no one else may access those floats meanwhile.
pub unsafe fn input_transform_row(x_row: &[f32], rin_eff: &[f32], xh: *mut f32, n_rows: usize, row: usize, tmp: &mut [f32]) {
    input_transform(x_row, rin_eff, tmp);
    for (kt, chunk) in tmp.chunks_exact(TILE).enumerate() {
        std::ptr::copy_nonoverlapping(chunk.as_ptr(), xh.add(xh_index(n_rows, row, kt)), TILE);
    }
}

/// One block product: rows `rows` of `xh [*, IC]` times the tiles of output
/// block `block` of a dense code; writes `mid [rows.len(), 128]`.
#[derive(Clone, Copy)]
pub(crate) struct BlockJob<'a> {
    pub k: usize,
    pub ic: usize,
    pub oc: usize,
    pub code: &'a [i16],
    /// Tile-row-major transformed inputs of `n_xrows` rows (see [`xh_index`]).
    pub xh: &'a [f32],
    pub n_xrows: usize,
    pub rows: &'a [usize],
    pub block: usize,
}

impl BlockJob<'_> {
    #[inline]
    pub fn kt_n(&self) -> usize {
        self.ic / TILE
    }
    #[inline]
    pub fn nt_n(&self) -> usize {
        self.oc / TILE
    }
    /// The 16 transformed inputs of tile row `kt` of xh row `row`.
    #[inline(always)]
    pub fn xh_tile(&self, row: usize, kt: usize) -> &[f32] {
        &self.xh[xh_index(self.n_xrows, row, kt)..][..TILE]
    }
    /// Tile `(kt, nt)`'s words into the kernels' extended buffer.
    #[inline(always)]
    pub fn load_ext(&self, kt: usize, nt: usize, ext: &mut [u32; tables::EXT_WORDS]) {
        let off = self.tile_offset(kt, nt);
        tables::fill_ext(&self.code[off..off + 16 * self.k], self.k, ext);
    }

    /// Starts fetching tile row `kt` of this job's block. Successive tile
    /// rows of a block are a whole code row apart, a stride the hardware
    /// prefetchers do not follow, so the GEMVs ask a few rows ahead.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub fn prefetch_tile_row(&self, kt: usize) {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if kt >= self.kt_n() {
            return;
        }
        let row = &self.code[self.tile_offset(kt, self.block * BLOCK_TILES)..][..BLOCK_TILES * 16 * self.k];
        for line in row.chunks(32) {
            // SAFETY: prefetch of an address inside the slice; SSE is baseline on x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr() as *const i8) };
        }
    }

    /// int16 offset of tile `(kt, nt)`.
    #[inline]
    pub fn tile_offset(&self, kt: usize, nt: usize) -> usize {
        (kt * self.nt_n() + nt) * 16 * self.k
    }
}

/// f32 scratch each caller of a block kernel must provide for `m` rows:
/// `mid [m, 128]` plus the batched path's decoded tiles.
pub fn scratch_floats(m: usize) -> usize {
    m * BLOCK_COLS + batch::DECODED_FLOATS
}

/// A dispatching handle over one ISA path. It can only be made by
/// [`Kernel::best`] or [`Kernel::with_isa`], which check the CPU, so safe
/// code never reaches a `#[target_feature]` path this machine lacks:
///
/// ```compile_fail
/// use escha_ggml::cpu::{Isa, Kernel};
/// let k = Kernel { isa: Isa::Avx512 }; // private field: does not compile
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    isa: Isa,
}

impl Kernel {
    /// The path this handle runs.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The best path of this machine.
    pub fn best() -> Self {
        Kernel { isa: Isa::detect() }
    }

    /// A specific path; `None` if this machine cannot run it.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        isa.available().then_some(Kernel { isa })
    }

    /// `mid [rows, 128]` of one block (scratch from [`scratch_floats`]).
    pub(crate) fn block_mid(&self, job: &BlockJob, mid: &mut [f32], scratch: &mut [f32]) {
        assert!(job.block * BLOCK_TILES < job.nt_n());
        assert!(job.code.len() >= job.tile_offset(job.kt_n() - 1, job.nt_n() - 1) + 16 * job.k);
        assert!(job.rows.iter().all(|&r| r < job.n_xrows) && job.xh.len() >= job.n_xrows * job.ic);
        mid.fill(0.0);
        match self.isa {
            // SAFETY: a Kernel of a SIMD ISA only exists when the CPU has it
            // (see `with_isa`), and the slices were checked above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::block_mid(job, mid, scratch) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512::block_mid(job, mid, scratch) },
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe { neon::block_mid(job, mid, scratch) },
            _ => scalar::block_mid(job, mid),
        }
    }

    /// Phase 2 for output blocks `blocks`: for each, the product and the
    /// output transform of every row in `rows`; `write(row, col0, vals)`
    /// receives the 128 finished f16-valued outputs of one row.
    pub(crate) fn run_blocks(
        &self,
        job: BlockJob,
        blocks: Range<usize>,
        rout_eff: &[f32],
        bias: Option<&[f32]>,
        scratch: &mut [f32],
        mut write: impl FnMut(usize, usize, &[f32]),
    ) {
        let m = job.rows.len();
        let (mid, rest) = scratch.split_at_mut(m * BLOCK_COLS);
        let mut y16 = [half::f16::ZERO; BLOCK_COLS];
        let mut out = [0f32; BLOCK_COLS];
        for block in blocks {
            let c0 = block * BLOCK_COLS;
            let cols = c0..c0 + BLOCK_COLS;
            self.block_mid(&BlockJob { block, ..job }, mid, rest);
            for (i, &row) in job.rows.iter().enumerate() {
                let mrow = &mut mid[i * BLOCK_COLS..(i + 1) * BLOCK_COLS];
                output_transform(mrow, &rout_eff[cols.clone()], bias.map(|b| &b[cols.clone()]), &mut y16);
                for (o, v) in out.iter_mut().zip(&y16) {
                    *o = v.to_f32();
                }
                write(row, c0, &out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_once() {
        for n in [0, 1, 7, 8, 136] {
            for nth in 1..6 {
                let mut next = 0;
                for ith in 0..nth {
                    let r = split(n, ith, nth);
                    assert_eq!(r.start, next);
                    assert!(r.len() <= n / nth + 1);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
