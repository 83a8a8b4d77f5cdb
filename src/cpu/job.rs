//! The unit of CPU work and how it is split: one output block (128 columns,
//! 8 tiles) of a dense code for a set of rows (`BlockJob`), the layout of
//! the transformed inputs it reads ([`xh_index`]), and the balanced split of
//! work over the caller's threads ([`split`]). A leaf: the ISA paths, the
//! dispatcher and the engine all read it, and it reads none of them.

use super::tables;
use crate::format::{HBLOCK, TILE};
use std::ops::Range;

/// Tile rows the GEMVs prefetch ahead of use.
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_ROWS: usize = 8;

/// Output columns per work unit (one Hadamard block = 8 tiles).
pub const BLOCK_COLS: usize = HBLOCK;
/// Tiles per output block.
pub const BLOCK_TILES: usize = BLOCK_COLS / TILE;

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
    /// The block's tiles to multiply, `tiles.0..tiles.1` (all:
    /// [`ALL_TILES`]); the others' outputs are left at 0. A tile's sums do
    /// not depend on which other tiles share the call. Below all tiles, only
    /// the GEMVs and the scalar path take a job (`Kernel::block_mid`).
    pub tiles: (usize, usize),
}

/// Every tile of a block ([`BlockJob::tiles`]).
pub const ALL_TILES: (usize, usize) = (0, BLOCK_TILES);

impl BlockJob<'_> {
    #[inline]
    pub fn kt_n(&self) -> usize {
        self.ic / TILE
    }
    /// The tiles of the block to multiply ([`Self::tiles`]).
    #[inline]
    pub fn tile_range(&self) -> Range<usize> {
        self.tiles.0..self.tiles.1
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
    /// Tile `(kt, nt)`'s words into the kernels' extended buffer. `K` (the
    /// job's `k`) as a constant makes the copy a few vector moves instead
    /// of a `memcpy` call per tile.
    #[inline(always)]
    pub fn load_ext<const K: usize>(&self, kt: usize, nt: usize, ext: &mut [u32; tables::EXT_WORDS]) {
        debug_assert_eq!(K, self.k);
        let off = self.tile_offset(kt, nt);
        tables::fill_ext(&self.code[off..off + 16 * K], K, ext);
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
