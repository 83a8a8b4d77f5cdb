//! Decodes one random tile per K with the Rust codec and the C reference
//! and prints the 16x16 block (rows = input offsets, columns = outputs).
//!
//! `cargo run --release --example decode_tile`

use escha_ggml::codec::{decode_tile_rows, TILE};
use escha_ggml::testutil::Rng;
use escha_ggml::{cref, LinearShape};
use half::f16;

fn main() {
    let mut rng = Rng::new(2026);
    for k in [2, 3] {
        let tile = rng.code(16 * k);
        let mut w = [f16::ZERO; 256];
        decode_tile_rows(&tile, k, &mut w);
        // The C reference reconstructs a whole (minimal) weight; compare its
        // first tile with ours.
        let shape = LinearShape::new("example", k, 128, 128).unwrap();
        let mut code = vec![0i16; shape.code_len()];
        code[..16 * k].copy_from_slice(&tile);
        let c = cref::reconstruct(&code, shape);
        let same = (0..TILE).all(|r| (0..TILE).all(|col| c[r * 128 + col].to_bits() == w[r * TILE + col].to_bits()));
        println!("K={k}: {} int16 words, C reference agrees: {same}", 16 * k);
        for r in 0..TILE {
            let row: Vec<String> = (0..TILE).map(|col| format!("{:7.3}", w[r * TILE + col].to_f32())).collect();
            println!("  {}", row.join(""));
        }
    }
}
