//! Single-core timing of the tile encoder on Gaussian tiles.
//!
//! `cargo run --release --no-default-features --example encode_timing`
use escha_ggml::encode::TileEncoder;
use escha_ggml::testutil::Rng;
fn main() {
    for k in [2usize, 3] {
        let mut enc = TileEncoder::new(k);
        let mut rng = Rng::new(1);
        let n = 16;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            let target: Vec<f32> = (0..256).map(|_| 1.2 * rng.normal()).collect();
            std::hint::black_box(enc.encode(&target, None));
        }
        println!("K={k}: {:.1} tiles/s", n as f64 / t0.elapsed().as_secs_f64());
    }
}
