//! Scalar twin of the SIMD kernels. It sums each output column in
//! ascending input order with separate multiply and add, exactly as the
//! reference does, so it is bit-exact to the reference and to C.

use super::job::{BlockJob, BLOCK_COLS, BLOCK_TILES};
use crate::codec::{cb_table, tile_state, TILE, TILE_POS, TILE_VALUES};

/// Row-major f32 values of tile `(kt, nt)`.
fn decode_rows(job: &BlockJob, kt: usize, nt: usize, out: &mut [f32; TILE_VALUES]) {
    let off = job.tile_offset(kt, nt);
    let tile = &job.code[off..off + 16 * job.k];
    let cb = cb_table();
    for t in 0..TILE_VALUES {
        out[TILE_POS[t] as usize] = cb[tile_state(tile, job.k, t) as usize].to_f32();
    }
}

pub(super) fn block_mid(job: &BlockJob, mid: &mut [f32]) {
    let mut w = [0f32; TILE_VALUES];
    for kt in 0..job.kt_n() {
        for tl in job.tile_range() {
            decode_rows(job, kt, job.block * BLOCK_TILES + tl, &mut w);
            for (i, &row) in job.rows.iter().enumerate() {
                let x = job.xh_tile(row, kt);
                let acc = &mut mid[i * BLOCK_COLS + tl * TILE..][..TILE];
                for (r, &a) in x.iter().enumerate() {
                    for (c, o) in acc.iter_mut().enumerate() {
                        *o += a * w[r * TILE + c];
                    }
                }
            }
        }
    }
}
