//! Per-stage bit-exactness of every ISA path this machine runs, against the
//! C reference's `reconstruct` (an independent transcription of the
//! contract), so a failure names the stage and the ISA:
//! - "decode": the batched product's tile decode (`TileOps::decode_rows`),
//!   value for value, bit for bit;
//! - "gemv" and "batched": the decode fused into the one-row product and the
//!   batched product's multiply, read back through one-hot inputs. A
//!   one-hot row's product is one exact product with 1.0 plus exact zeros,
//!   so its output is the weight row itself, whatever the summation order.

use super::batch::TileOps;
use super::dispatch::{scratch_floats, Isa, Kernel};
use super::job::{xh_index, BlockJob, ALL_TILES, BLOCK_COLS, BLOCK_TILES};
use crate::cref;
use crate::format::{TILE, TILE_VALUES};
use crate::rng::Rng;
use crate::validate::LinearShape;
use half::f16;

/// (IC, OC): one and several output blocks and Hadamard blocks.
const SHAPES: [(usize, usize); 3] = [(128, 128), (256, 128), (128, 384)];

fn cases() -> impl Iterator<Item = (LinearShape, Vec<i16>, Vec<f16>)> {
    let mut seed = 7;
    [2, 3].into_iter().flat_map(move |k| {
        SHAPES.map(|(ic, oc)| {
            seed += 1;
            let shape = LinearShape::new("stage", k, ic, oc).unwrap();
            let code = Rng::new(seed).code(shape.code_len());
            let w = cref::reconstruct(&code, shape);
            (shape, code, w)
        })
    })
}

/// The first position where `got` (f32 values) is not `want` (f16), bit for bit.
fn first_mismatch(got: &[f32], want: &[f16]) -> Option<(usize, f32, f16)> {
    got.iter().zip(want).enumerate().find(|(_, (g, w))| g.to_bits() != w.to_f32().to_bits()).map(|(i, (g, w))| (i, *g, *w))
}

/// Every tile of `code` through `T::decode_rows`, as `W [IC, OC]`.
///
/// # Safety
/// 1. The CPU supports `T`'s ISA.
unsafe fn decode_all<T: TileOps>(shape: LinearShape, code: &[i16]) -> Vec<f32> {
    let (ic, oc) = (shape.ic, shape.oc);
    let job = BlockJob { k: shape.k, ic, oc, code, xh: &[], n_xrows: 0, rows: &[], block: 0, tiles: ALL_TILES };
    let mut w = vec![f32::NAN; ic * oc];
    let mut tile = [0f32; TILE_VALUES];
    for kt in 0..ic / TILE {
        for nt in 0..oc / TILE {
            // SAFETY: 1. is ours; the job is consistent: `code` has the
            // shape's length and (kt, nt) is a tile of it.
            match shape.k {
                2 => T::decode_rows::<2>(&job, kt, nt, &mut tile),
                _ => T::decode_rows::<3>(&job, kt, nt, &mut tile),
            }
            for r in 0..TILE {
                w[(kt * TILE + r) * oc + nt * TILE..][..TILE].copy_from_slice(&tile[r * TILE..][..TILE]);
            }
        }
    }
    w
}

#[test]
fn simd_tile_decode_is_bit_exact() {
    let mut tested = 0;
    for isa in Isa::all_available() {
        for (shape, code, want) in cases() {
            // SAFETY: 1. `isa` is available on this CPU.
            let got = unsafe {
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => decode_all::<super::avx2::Avx2>(shape, &code),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => decode_all::<super::avx512::Avx512>(shape, &code),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512Vbmi => decode_all::<super::avx512::Avx512Vbmi>(shape, &code),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512Fp16 => decode_all::<super::avx512::Avx512Fp16>(shape, &code),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Amx => decode_all::<super::avx512::Avx512Fp16>(shape, &code),
                    #[cfg(target_arch = "aarch64")]
                    Isa::Neon => decode_all::<super::neon::Neon>(shape, &code),
                    #[cfg(target_arch = "aarch64")]
                    Isa::NeonFp16 => decode_all::<super::neon::NeonFp16>(shape, &code),
                    _ => continue, // the scalar path decodes inside its product
                }
            };
            if let Some((i, g, w)) = first_mismatch(&got, &want) {
                panic!("decode, {}: K={} {}x{}: W[{}][{}] = {g:e}, the C reference has {w:e}", isa.name(), shape.k, shape.ic, shape.oc, i / shape.oc, i % shape.oc);
            }
            tested += 1;
        }
    }
    eprintln!("decode stage: {tested} cases bit-exact on {:?}", Isa::all_available().iter().map(|i| i.name()).collect::<Vec<_>>());
    let lacking: Vec<_> = Isa::ALL.iter().filter(|i| !i.available()).map(|i| i.name()).collect();
    if !lacking.is_empty() {
        println!("stage tests: skipped {lacking:?}, paths this CPU (or its OS) cannot run");
    }
}

/// `W [IC, OC]` read back through `Kernel::block_mid` on one-hot inputs,
/// `per_call` rows per call (1: the GEMV; more: the batched product).
fn one_hot_product(kernel: &Kernel, shape: LinearShape, code: &[i16], per_call: usize) -> Vec<f32> {
    scaled_one_hot_product(kernel, shape, code, per_call, 1.0)
}

/// [`one_hot_product`] with `hot` in place of 1.0: `hot * W [IC, OC]`.
fn scaled_one_hot_product(kernel: &Kernel, shape: LinearShape, code: &[i16], per_call: usize, hot: f32) -> Vec<f32> {
    let (ic, oc) = (shape.ic, shape.oc);
    let mut xh = vec![0f32; ic * ic];
    for i in 0..ic {
        xh[xh_index(ic, i, i / TILE) + i % TILE] = hot;
    }
    let mut w = vec![f32::NAN; ic * oc];
    let mut scratch = vec![0f32; scratch_floats(per_call)];
    let all: Vec<usize> = (0..ic).collect();
    for rows in all.chunks(per_call) {
        for block in 0..oc / BLOCK_COLS {
            let job = BlockJob { k: shape.k, ic, oc, code, xh: &xh, n_xrows: ic, rows, block, tiles: ALL_TILES };
            let (mid, rest) = scratch.split_at_mut(rows.len() * BLOCK_COLS);
            kernel.block_mid(&job, mid, rest);
            for (q, &row) in rows.iter().enumerate() {
                w[row * oc + block * BLOCK_TILES * TILE..][..BLOCK_COLS].copy_from_slice(&mid[q * BLOCK_COLS..][..BLOCK_COLS]);
            }
        }
    }
    w
}

#[test]
fn fused_decode_of_every_product_is_exact() {
    for isa in Isa::all_available() {
        let kernel = Kernel::with_isa(isa).unwrap();
        for (shape, code, want) in cases() {
            // 2 to 4 rows a call: the GEMV where the ISA takes it for
            // several rows (`TileOps::GEMV_ROWS`); 5: the batched kernels'
            // row blocks and their 1-row tail.
            let stages = [("gemv", 1), ("2 rows a call", 2), ("3 rows a call", 3), ("4 rows a call", 4), ("batched", shape.ic), ("batched, 5 rows a call", 5)];
            for (stage, per_call) in stages {
                let got = one_hot_product(&kernel, shape, &code, per_call);
                // A decoded -0 comes back as +0 (+0 + -0): compare values.
                let bad = got.iter().zip(&want).position(|(g, w)| *g != w.to_f32());
                if let Some(i) = bad {
                    panic!("{stage}, {}: K={} {}x{}: W[{}][{}] read back as {:e}, the C reference has {:e}", isa.name(), shape.k, shape.ic, shape.oc, i / shape.oc, i % shape.oc, got[i], want[i].to_f32());
                }
            }
        }
    }
}

/// An infinite input (an f16 overflow of the input transform) gives what
/// f32 arithmetic gives, `inf * w` (NaN where w is 0), on every path and
/// row count: the AMX product, whose bf16 split of inf would be NaN, hands
/// such calls to the FMA product.
#[test]
fn infinite_inputs_give_infinite_products() {
    for isa in Isa::all_available() {
        let kernel = Kernel::with_isa(isa).unwrap();
        for (shape, code, w) in cases() {
            for per_call in [1, 5, 17] {
                let got = scaled_one_hot_product(&kernel, shape, &code, per_call, f32::INFINITY);
                for (i, (g, w)) in got.iter().zip(&w).enumerate() {
                    let want = f32::INFINITY * w.to_f32();
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "{}, {per_call} rows a call: K={} {}x{}: inf * W[{}][{}] = {g:e}, f32 gives {want:e}",
                        isa.name(), shape.k, shape.ic, shape.oc, i / shape.oc, i % shape.oc
                    );
                }
            }
        }
    }
}
