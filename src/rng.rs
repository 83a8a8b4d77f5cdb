//! Deterministic pseudo-random numbers (SplitMix64; no dependency, the same
//! stream on every platform): the encoder's seeded sign flips, and the data
//! of tests, benches and examples.

use half::f16;

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
    /// Approximately standard normal (sum of uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.uniform()).sum::<f32>() * 0.866
    }
    /// Random int16 code words (every bit string is a valid code).
    pub fn code(&mut self, n: usize) -> Vec<i16> {
        (0..n).map(|_| self.next_u32() as i16).collect()
    }
    /// f16 values `center + spread * uniform`.
    pub fn f16s(&mut self, n: usize, center: f32, spread: f32) -> Vec<f16> {
        (0..n).map(|_| f16::from_f32(center + spread * self.uniform())).collect()
    }
    pub fn f32s(&mut self, n: usize, center: f32, spread: f32) -> Vec<f32> {
        (0..n).map(|_| center + spread * self.uniform()).collect()
    }
}
