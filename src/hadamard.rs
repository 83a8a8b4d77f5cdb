//! The 128-point Walsh-Hadamard transform used on both sides of every coded
//! linear: unnormalised, Sylvester (natural) order, butterfly stages
//! h = 1, 2, ..., 64 with pairs (a + b, a - b), in f32, on each contiguous
//! 128-block. The scale is applied separately as [`RS`].

pub use crate::format::RS;
/// Transform block length: the format's Hadamard block.
pub const N: usize = crate::format::HBLOCK;

/// One butterfly stage with pairs `H` apart. `H` a constant makes each
/// run of `H` pairs a fixed-length loop over two disjoint slices, which the
/// compiler turns into vector adds (a stage a loop of scalar adds before:
/// 0.9% of a 2-thread Gemma-3-270M token, docs/PERFORMANCE.md). The adds
/// and their operands are the same whatever the width.
#[inline(always)]
fn stage<const H: usize>(x: &mut [f32; N]) {
    for pair in x.chunks_exact_mut(2 * H) {
        let (a, b) = pair.split_at_mut(H);
        for (a, b) in a.iter_mut().zip(b.iter_mut()) {
            let (u, v) = (*a, *b);
            *a = u + v;
            *b = u - v;
        }
    }
}

/// In-place H128 on one 128-block. Every output is the same sequence of f32
/// additions whatever the vector width, so SIMD versions are bit-exact.
#[inline]
pub fn h128_block(x: &mut [f32]) {
    let x: &mut [f32; N] = x.try_into().expect("H128 takes one 128-value block");
    stage::<1>(x);
    stage::<2>(x);
    stage::<4>(x);
    stage::<8>(x);
    stage::<16>(x);
    stage::<32>(x);
    stage::<64>(x);
}

/// In-place H128 on every contiguous 128-block of `x` (length a multiple of 128).
pub fn h128(x: &mut [f32]) {
    assert!(x.len().is_multiple_of(N), "H128 needs a multiple of 128 values, got {}", x.len());
    for blk in x.chunks_exact_mut(N) {
        h128_block(blk);
    }
}
