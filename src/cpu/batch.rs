//! The batched product shared by the SIMD paths: each tile of a block is
//! decoded once per call into row-major f32 and applied to every row, `RB`
//! rows per loaded weight vector. Columns are summed in ascending input
//! order, like the reference (with fused multiply-adds).
//!
//! The driver is plain Rust, and so is the choice between the one-row GEMV
//! and the batched product ([`block_mid`]); the ISA modules supply the
//! intrinsics through [`TileOps`] (each call does enough work that it need
//! not inline), implemented by [`tile_ops!`].

// Index loops mirror the lane/group arithmetic of the layout comments.
#![allow(clippy::needless_range_loop)]

use super::job::{BlockJob, BLOCK_TILES};
use crate::format::TILE_VALUES;

/// Tile rows of the block decoded per pass (then applied to every row).
pub(crate) const KC: usize = 2;
/// Rows sharing each loaded weight vector.
pub(crate) const RB: usize = 4;

/// Floats of decoded tiles the driver keeps in scratch.
pub(crate) const DECODED_FLOATS: usize = KC * BLOCK_TILES * TILE_VALUES;

pub(crate) trait TileOps {
    /// Rows up to which [`block_mid`] takes the GEMV.
    const GEMV_ROWS: usize;

    /// `mid [rows, 128]` += the rows `job.rows` (1 to `GEMV_ROWS` of them)
    /// times the block.
    ///
    /// # Safety
    /// 1. The CPU supports the ISA.
    /// 2. `job` is consistent (checked by `Kernel::block_mid`).
    /// 3. `job.rows.len()` is 1 to `GEMV_ROWS`.
    unsafe fn gemv<const K: usize>(job: &BlockJob, mid: &mut [f32]);

    /// Row-major f32 values (`out[r*16 + c]`) of tile `(kt, nt)`.
    ///
    /// # Safety
    /// 1. The CPU supports the ISA.
    /// 2. `job` is consistent (checked by `Kernel::block_mid`).
    unsafe fn decode_rows<const K: usize>(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32]);

    /// Local rows `i0..i0+R` times the `kc` decoded tile rows `dec` that
    /// start at tile row `kt0`, accumulated into `mid [rows, 128]`.
    ///
    /// # Safety
    /// 1. The CPU supports the ISA.
    /// 2. `job` is consistent (checked by `Kernel::block_mid`).
    /// 3. `dec` holds `kc * 8` decoded tiles (`kc * 8 * 256` floats).
    /// 4. `mid` holds at least `(i0 + R) * 128` floats (`job.rows.len() * 128`
    ///    with `i0 + R <= job.rows.len()`).
    unsafe fn rows_fma<const R: usize>(job: &BlockJob, i0: usize, kt0: usize, kc: usize, dec: &[f32], mid: &mut [f32]);
}

/// Implements [`TileOps`] for `$isa` by the invoking module's free
/// functions `gemv`, `decode_rows` and `rows_fma` (or the three named),
/// which carry the ISA's `#[target_feature]`s; the GEMV takes one row
/// unless `gemv_rows = N` says more.
macro_rules! tile_ops {
    ($isa:ident) => {
        super::batch::tile_ops!($isa, gemv, decode_rows, rows_fma, 1);
    };
    ($isa:ident, gemv_rows = $rows:expr) => {
        super::batch::tile_ops!($isa, gemv, decode_rows, rows_fma, $rows);
    };
    ($isa:ident, $gemv:ident, $decode_rows:ident, $rows_fma:ident) => {
        super::batch::tile_ops!($isa, $gemv, $decode_rows, $rows_fma, 1);
    };
    ($isa:ident, $gemv:ident, $decode_rows:ident, $rows_fma:ident, $rows:expr) => {
        pub(super) struct $isa;

        impl super::batch::TileOps for $isa {
            const GEMV_ROWS: usize = $rows;
            /// # Safety
            /// 1. The CPU supports this ISA.
            /// 2. `job` is consistent (checked by `Kernel::block_mid`).
            /// 3. `job.rows.len()` is 1 to `GEMV_ROWS`.
            #[inline]
            unsafe fn gemv<const K: usize>(job: &super::job::BlockJob, mid: &mut [f32]) {
                // SAFETY: the free function's 1. and 2. (and 3., where it
                // takes several rows) are ours.
                $gemv::<K>(job, mid)
            }
            /// # Safety
            /// 1. The CPU supports this ISA.
            /// 2. `job` is consistent (checked by `Kernel::block_mid`).
            #[inline]
            unsafe fn decode_rows<const K: usize>(job: &super::job::BlockJob, kt: usize, nt: usize, out: &mut [f32]) {
                // SAFETY: the free function's 1. and 2. are ours.
                $decode_rows::<K>(job, kt, nt, out)
            }
            /// # Safety
            /// 1. The CPU supports this ISA.
            /// 2. `job` is consistent (checked by `Kernel::block_mid`).
            /// 3. `dec` holds `kc * 8 * 256` floats.
            /// 4. `mid` holds at least `(i0 + R) * 128` floats.
            #[inline]
            unsafe fn rows_fma<const R: usize>(
                job: &super::job::BlockJob,
                i0: usize,
                kt0: usize,
                kc: usize,
                dec: &[f32],
                mid: &mut [f32],
            ) {
                // SAFETY: the free function's 1. to 4. are ours.
                $rows_fma::<R>(job, i0, kt0, kc, dec, mid)
            }
        }
    };
}
pub(crate) use tile_ops;

/// `mid [rows, 128]` of one block on the ISA `T`: the GEMV for up to
/// `T::GEMV_ROWS` rows, the batched product for more (`mid` zeroed by the
/// caller).
///
/// # Safety
/// 1. The CPU supports the ISA of `T`.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `mid` holds `job.rows.len() * 128` floats and `scratch` at least
///    [`DECODED_FLOATS`].
pub(crate) unsafe fn block_mid<T: TileOps>(job: &BlockJob, mid: &mut [f32], scratch: &mut [f32]) {
    // SAFETY: 1. and 2. pass on to `gemv` and `gemm`; `gemv`'s 3. is the
    // guard; 3. is `gemm`'s 3.
    let few = (1..=T::GEMV_ROWS).contains(&job.rows.len());
    match (job.k, few) {
        (2, true) => T::gemv::<2>(job, mid),
        (3, true) => T::gemv::<3>(job, mid),
        _ => block_mid_batched::<T>(job, mid, scratch),
    }
}

/// The batched product of one block on the ISA `T`, whatever the rows
/// (`mid` zeroed by the caller).
///
/// # Safety
/// [`block_mid`]'s 1. to 3.
pub(crate) unsafe fn block_mid_batched<T: TileOps>(job: &BlockJob, mid: &mut [f32], scratch: &mut [f32]) {
    // SAFETY: gemm's 1. to 3. are ours.
    match job.k {
        2 => gemm::<T, 2>(job, mid, scratch),
        _ => gemm::<T, 3>(job, mid, scratch),
    }
}

/// The batched product of one block (`mid` zeroed by the caller).
///
/// # Safety
/// 1. The CPU supports the ISA of `T`.
/// 2. `job` is consistent (checked by `Kernel::block_mid`).
/// 3. `mid` holds `job.rows.len() * 128` floats and `scratch` at least
///    [`DECODED_FLOATS`].
unsafe fn gemm<T: TileOps, const K: usize>(job: &BlockJob, mid: &mut [f32], scratch: &mut [f32]) {
    let m = job.rows.len();
    let dec = &mut scratch[..DECODED_FLOATS];
    let kt_n = job.kt_n();
    let mut kt0 = 0;
    while kt0 < kt_n {
        let kc = KC.min(kt_n - kt0);
        for c in 0..kc {
            for tl in 0..BLOCK_TILES {
                let out = &mut dec[(c * BLOCK_TILES + tl) * TILE_VALUES..][..TILE_VALUES];
                // SAFETY: decode_rows' 1. and 2. are ours.
                T::decode_rows::<K>(job, kt0 + c, job.block * BLOCK_TILES + tl, out);
            }
        }
        // SAFETY (rows_fma's list): 1. and 2. are ours; 3. `dec` holds
        // KC * 8 tiles and kc <= KC; 4. i + R <= m and `mid` holds m * 128.
        let mut i = 0;
        while i + RB <= m {
            T::rows_fma::<RB>(job, i, kt0, kc, dec, mid);
            i += RB;
        }
        while i < m {
            T::rows_fma::<1>(job, i, kt0, kc, dec, mid);
            i += 1;
        }
        kt0 += kc;
    }
}

/// `xp[c][q]`: the 16 inputs of tile row `kt0 + c` of local row `i0 + q`.
#[inline(always)]
pub(crate) fn xh_ptrs<const R: usize>(job: &BlockJob, i0: usize, kt0: usize, kc: usize) -> [[*const f32; R]; KC] {
    let mut xp = [[core::ptr::null::<f32>(); R]; KC];
    for (c, xc) in xp.iter_mut().enumerate().take(kc) {
        for (q, p) in xc.iter_mut().enumerate() {
            *p = job.xh_tile(job.rows[i0 + q], kt0 + c).as_ptr();
        }
    }
    xp
}

/// Scatters a tile decoded in lane layout to row-major (NEON; the x86 paths
/// transpose in registers).
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn lanes_to_rows(lanes: &[f32; TILE_VALUES], table: &[u8; TILE_VALUES], out: &mut [f32]) {
    let out = &mut out[..TILE_VALUES];
    for (p, &v) in lanes.iter().enumerate() {
        out[table[p] as usize] = v;
    }
}
