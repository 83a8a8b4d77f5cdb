//! Test data for tests, benches and examples: random problems (from
//! [`crate::rng::Rng`]), imatrix files.

use crate::reference::Linear;
use crate::LinearShape;
use half::f16;

pub use crate::rng::Rng;

/// A llama.cpp legacy `.dat` importance matrix: per entry (weight name,
/// ncall, values), the values stored as given (llama-imatrix stores
/// mean * ncall).
pub fn legacy_imatrix(entries: &[(&str, i32, &[f32])]) -> Vec<u8> {
    let mut b = (entries.len() as i32).to_le_bytes().to_vec();
    for (name, ncall, values) in entries {
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend(ncall.to_le_bytes());
        b.extend((values.len() as i32).to_le_bytes());
        values.iter().for_each(|v| b.extend(v.to_le_bytes()));
    }
    b
}

/// Owned data of one random dense linear (rin/rout with random signs and
/// magnitudes around real exports', optional s_in/s_out near 1, an
/// f16-valued bias).
pub struct RandomLinear {
    pub shape: LinearShape,
    pub code: Vec<i16>,
    pub rin: Vec<f16>,
    pub rout: Vec<f16>,
    pub s_in: Option<Vec<f32>>,
    pub s_out: Option<Vec<f32>>,
    pub bias: Option<Vec<f32>>,
}

impl RandomLinear {
    pub fn new(seed: u64, k: usize, ic: usize, oc: usize, scales: bool, bias: bool) -> Self {
        let mut rng = Rng::new(seed);
        let shape = LinearShape::new("test", k, ic, oc).unwrap();
        // rin/rout: random signs times magnitudes around the real exports'.
        let signed = |rng: &mut Rng, n: usize, mag: f32| -> Vec<f16> {
            (0..n).map(|_| f16::from_f32(if rng.next_u32() & 1 == 0 { mag } else { -mag } * (1.0 + 0.5 * rng.uniform()))).collect()
        };
        RandomLinear {
            shape,
            code: rng.code(shape.code_len()),
            rin: signed(&mut rng, ic, 0.8),
            rout: signed(&mut rng, oc, 0.02),
            s_in: scales.then(|| rng.f32s(ic, 1.0, 0.02)),
            s_out: scales.then(|| rng.f32s(oc, 1.0, 0.02)),
            bias: bias.then(|| rng.f16s(oc, 0.0, 0.05).into_iter().map(f16::to_f32).collect()),
        }
    }

    pub fn linear(&self) -> Linear<'_> {
        Linear {
            name: "test",
            shape: self.shape,
            code: &self.code,
            rin: &self.rin,
            rout: &self.rout,
            s_in: self.s_in.as_deref(),
            s_out: self.s_out.as_deref(),
            bias: self.bias.as_deref(),
        }
    }

    pub fn input(&self, seed: u64, m: usize) -> Vec<f32> {
        Rng::new(seed).f32s(m * self.shape.ic, 0.0, 1.0)
    }
}

