//! Lane windows: how a SIMD kernel pulls the 16-bit states of a tile out of
//! its 32-bit words without a bit loop.
//!
//! Trellis value `t = 8*lane + j`. All states a lane needs lie in one 32-bit
//! stretch of the circular stream for K=2 (8 states span 30 bits) and in two
//! stretches for K=3 (j = 0..3 and j = 4..7, 25 bits each). A stretch ending
//! at stream position `e` (exclusive) starts at `a = e - 32`, i.e. at bit
//! `off = a mod 32` of word `q = floor(a / 32)`, so it equals
//! `(w[q] << off) | (w[q+1] >> (32 - off))` (the second term is 0 when
//! `off == 0`). State `j` is then `(window >> shift_j) & 0xFFFF`.
//!
//! Kernels read words from an "extended" copy of the tile,
//! `ext = [w[nw-1], w[0], ..., w[nw-1], w[0], 0...]`, so `w[q]` is
//! `ext[q + 1]` for every `q` in `-1..nw` and no index wraps.

/// Length of the extended word buffer (covers 16-lane loads for K=3).
pub const EXT_WORDS: usize = 48;

/// Number of 32-bit stretches per lane.
pub const fn windows_per_lane(k: usize) -> usize {
    if k == 2 {
        1
    } else {
        2
    }
}

/// Which stretch holds state `j`, and how far to shift it down.
pub const fn state_window(k: usize, j: usize) -> (usize, u32) {
    if k == 2 {
        (0, (2 * (7 - j)) as u32)
    } else if j < 4 {
        (0, (3 * (3 - j)) as u32)
    } else {
        (1, (3 * (7 - j)) as u32)
    }
}

/// End position (exclusive) of stretch `h` of `lane`.
const fn window_end(k: usize, lane: usize, h: usize) -> i64 {
    let last_j = if k == 2 { 7 } else if h == 0 { 3 } else { 7 };
    ((8 * lane + last_j + 1) * k) as i64
}

/// Word index and bit offset of a stretch start, as `(ext index of w[q], off)`.
pub const fn window_source(k: usize, lane: usize, h: usize) -> (usize, u32) {
    let a = window_end(k, lane, h) - 32;
    let q = a.div_euclid(32);
    ((q + 1) as usize, a.rem_euclid(32) as u32)
}

/// Per-vector constants for a kernel whose vectors hold `W` consecutive
/// lanes (`W` = 8 for AVX2/scalar groups, 16 for AVX-512, 4 for NEON).
#[derive(Clone, Copy, Debug)]
pub struct GroupWindow<const W: usize> {
    /// ext index of the first word loaded for this group.
    pub base: usize,
    /// Per lane: index (relative to `base`) of `w[q]`; `w[q+1]` is the next one.
    pub idx_a: [i32; W],
    pub idx_b: [i32; W],
    pub shl: [u32; W],
    pub shr: [u32; W],
}

/// The identity lane order: vector position `i` holds lane `W*g + i`.
pub const fn identity<const W: usize>() -> [usize; W] {
    let mut p = [0usize; W];
    let mut i = 0;
    while i < W {
        p[i] = i;
        i += 1;
    }
    p
}

/// `tables[h][g]` for K, with `32 / W` groups; vector position `i` of group
/// `g` holds lane `W*g + perm[i]` (a kernel may order lanes as it likes).
pub const fn group_windows<const W: usize, const G: usize>(k: usize, perm: &[usize; W]) -> [[GroupWindow<W>; G]; 2] {
    let empty = GroupWindow { base: 0, idx_a: [0; W], idx_b: [0; W], shl: [0; W], shr: [0; W] };
    let mut out = [[empty; G]; 2];
    let mut h = 0;
    while h < windows_per_lane(k) {
        let mut g = 0;
        while g < G {
            let mut base = usize::MAX;
            let mut i = 0;
            while i < W {
                let (e, _) = window_source(k, g * W + perm[i], h);
                if e < base {
                    base = e;
                }
                i += 1;
            }
            let mut gw = empty;
            gw.base = base;
            let mut i = 0;
            while i < W {
                let (e, off) = window_source(k, g * W + perm[i], h);
                gw.idx_a[i] = (e - base) as i32;
                gw.idx_b[i] = (e + 1 - base) as i32;
                gw.shl[i] = off;
                gw.shr[i] = 32 - off;
                i += 1;
            }
            out[h][g] = gw;
            g += 1;
        }
        h += 1;
    }
    out
}

/// A group's windows for a kernel that holds the tile's `nw = 8k` words in
/// registers instead of `ext`: word indices taken mod `nw` (so the ring
/// needs no copy), otherwise as [`GroupWindow`].
#[derive(Clone, Copy, Debug)]
pub struct RingWindow<const W: usize> {
    /// Per lane: index of `w[q mod nw]` and of `w[(q + 1) mod nw]`.
    pub idx_a: [i32; W],
    pub idx_b: [i32; W],
    pub shl: [u32; W],
    pub shr: [u32; W],
}

/// [`group_windows`] with tile word indices (`ext` index `e` is word
/// `(e - 1) mod nw`).
pub const fn ring_windows<const W: usize, const G: usize>(k: usize, perm: &[usize; W]) -> [[RingWindow<W>; G]; 2] {
    let tabs = group_windows::<W, G>(k, perm);
    let nw = 8 * k;
    let empty = RingWindow { idx_a: [0; W], idx_b: [0; W], shl: [0; W], shr: [0; W] };
    let mut out = [[empty; G]; 2];
    let mut h = 0;
    while h < 2 {
        let mut g = 0;
        while g < G {
            let gw = &tabs[h][g];
            let mut i = 0;
            while i < W {
                out[h][g].idx_a[i] = ((gw.base + gw.idx_a[i] as usize + nw - 1) % nw) as i32;
                out[h][g].idx_b[i] = ((gw.base + gw.idx_b[i] as usize + nw - 1) % nw) as i32;
                out[h][g].shl[i] = gw.shl[i];
                out[h][g].shr[i] = gw.shr[i];
                i += 1;
            }
            g += 1;
        }
        h += 1;
    }
    out
}

/// Fills `ext` from one tile of `16*k` int16 words.
#[inline(always)]
pub fn fill_ext(tile: &[i16], k: usize, ext: &mut [u32; EXT_WORDS]) {
    let nw = 8 * k;
    assert!(tile.len() >= 2 * nw && nw + 2 <= EXT_WORDS);
    // Word m is u16[2m] | u16[2m+1] << 16: on a little-endian machine that
    // is the memory of the two int16 as they lie, so a byte copy does it.
    #[cfg(target_endian = "little")]
    // SAFETY: 4*nw bytes are readable from tile (asserted) and writable
    // from ext[1] (nw + 1 < EXT_WORDS); the buffers do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(tile.as_ptr() as *const u8, ext.as_mut_ptr().add(1) as *mut u8, 4 * nw)
    };
    #[cfg(not(target_endian = "little"))]
    for m in 0..nw {
        ext[m + 1] = crate::codec::tile_word32(tile, m);
    }
    ext[0] = ext[nw];
    ext[nw + 1] = ext[1];
}

/// Lane-layout index `(g*8 + j)*W + i` (groups of `W` lanes: vector
/// position `i` holds lane `W*g + perm[i]`, value `j`) -> row-major index
/// `row*16 + col` in the tile.
pub const fn lane_to_rowmajor<const W: usize>(perm: &[usize; W]) -> [u8; 256] {
    let mut out = [0u8; 256];
    let mut p = 0;
    while p < 256 {
        let (g, j, i) = (p / (8 * W), (p / W) % 8, p % W);
        out[p] = crate::codec::TILE_POS[8 * (W * g + perm[i]) + j];
        p += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::tile_state;

    /// The window decomposition reproduces the literal bitstream for every
    /// lane/state of random tiles, both K, and all group widths.
    #[test]
    fn windows_match_bitstream() {
        fn tile_of(rng: &mut crate::rng::Rng, k: usize) -> Vec<i16> {
            (0..16 * k).map(|_| rng.next_u32() as i16).collect()
        }
        fn check<const W: usize, const G: usize>(k: usize, tile: &[i16], perm: &[usize; W]) {
            let tabs = group_windows::<W, G>(k, perm);
            let mut ext = [0u32; EXT_WORDS];
            fill_ext(tile, k, &mut ext);
            for lane in 0..32 {
                let (g, i) = (lane / W, perm.iter().position(|&p| p == lane % W).unwrap());
                for j in 0..8 {
                    let (h, sh) = state_window(k, j);
                    let gw = &tabs[h][g];
                    // NEON (W = 4) loads 8 words (two registers) per group.
                    assert!(gw.idx_b[i] < W.max(8) as i32, "group span exceeds the loaded words");
                    let a = ext[gw.base + gw.idx_a[i] as usize];
                    let b = ext[gw.base + gw.idx_b[i] as usize];
                    let win = a.checked_shl(gw.shl[i]).unwrap_or(0) | b.checked_shr(gw.shr[i]).unwrap_or(0);
                    let s = ((win >> sh) & 0xFFFF) as u16;
                    assert_eq!(s, tile_state(tile, k, 8 * lane + j), "k={k} W={W} lane={lane} j={j}");
                }
            }
        }
        fn check_ring<const W: usize, const G: usize>(k: usize, tile: &[i16], perm: &[usize; W]) {
            let tabs = ring_windows::<W, G>(k, perm);
            let words: Vec<u32> = (0..8 * k).map(|m| crate::codec::tile_word32(tile, m)).collect();
            for lane in 0..32 {
                let (g, i) = (lane / W, perm.iter().position(|&p| p == lane % W).unwrap());
                for j in 0..8 {
                    let (h, sh) = state_window(k, j);
                    let rw = &tabs[h][g];
                    let (a, b) = (words[rw.idx_a[i] as usize], words[rw.idx_b[i] as usize]);
                    let win = a.checked_shl(rw.shl[i]).unwrap_or(0) | b.checked_shr(rw.shr[i]).unwrap_or(0);
                    assert_eq!(((win >> sh) & 0xFFFF) as u16, tile_state(tile, k, 8 * lane + j), "ring k={k} W={W} lane={lane} j={j}");
                }
            }
        }
        let mut rng = crate::rng::Rng::new(7);
        for k in [2, 3] {
            for _ in 0..200 {
                check_ring::<16, 2>(k, &tile_of(&mut rng, k), &identity());
                let tile = tile_of(&mut rng, k);
                check::<4, 8>(k, &tile, &identity());
                check::<8, 4>(k, &tile, &identity());
                check::<8, 4>(k, &tile, &[0, 1, 4, 5, 2, 3, 6, 7]);
                check::<16, 2>(k, &tile, &identity());
            }
        }
    }
}
