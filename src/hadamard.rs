//! The 128-point Walsh-Hadamard transform used on both sides of every coded
//! linear: unnormalised, Sylvester (natural) order, butterfly stages
//! h = 1, 2, ..., 64 with pairs (a + b, a - b), in f32, on each contiguous
//! 128-block. The scale is applied separately as [`RS`].

pub use crate::format::RS;
/// Transform block length: the format's Hadamard block.
pub const N: usize = crate::format::HBLOCK;

/// In-place H128 on one 128-block. Every output is the same sequence of f32
/// additions whatever the vector width, so SIMD versions are bit-exact.
#[inline]
pub fn h128_block(x: &mut [f32]) {
    assert_eq!(x.len(), N);
    let mut h = 1;
    while h < N {
        for base in (0..N).step_by(2 * h) {
            for i in base..base + h {
                let (a, b) = (x[i], x[i + h]);
                x[i] = a + b;
                x[i + h] = a - b;
            }
        }
        h *= 2;
    }
}

/// In-place H128 on every contiguous 128-block of `x` (length a multiple of 128).
pub fn h128(x: &mut [f32]) {
    assert!(x.len().is_multiple_of(N), "H128 needs a multiple of 128 values, got {}", x.len());
    for blk in x.chunks_exact_mut(N) {
        h128_block(blk);
    }
}
