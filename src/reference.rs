//! The forward contract, literally: scale folding, input transform, the
//! f32 product with the decoded weight, output transform, optional bias,
//! expert-indexed (MoE) dispatch and the reference SwiGLU.
//!
//! This module is the slow, obvious twin of the fast kernels in
//! [`crate::cpu`]; it shares their transforms ([`crate::transform`]) and
//! its scalar GEMV sums in ascending input order so that it
//! is bit-exact to the C reference in `ggml-escha/`.

use crate::codec::reconstruct;
use crate::error::{EschaError, Result};
use crate::transform::{fold_into, fold_scales, input_transform, output_transform};
use crate::validate::{check_finite, check_len, LinearShape, MoeShape};
use half::f16;

/// Everything a dense coded linear needs besides its input.
#[derive(Clone, Copy, Debug)]
pub struct Linear<'a> {
    /// Name used in error messages.
    pub name: &'a str,
    pub shape: LinearShape,
    /// `[IC/16, OC/16, 16K]` int16.
    pub code: &'a [i16],
    pub rin: &'a [f16],
    pub rout: &'a [f16],
    pub s_in: Option<&'a [f32]>,
    pub s_out: Option<&'a [f32]>,
    /// Bias values (checkpoint f16 widened exactly); `None` = not applied.
    pub bias: Option<&'a [f32]>,
}

impl<'a> Linear<'a> {
    /// The output transform's factor of outputs `cols`: `rout` times
    /// `s_out` where there is one, widened to f32 in `out`.
    pub fn rout_eff_into(&self, cols: std::ops::Range<usize>, out: &mut [f32]) {
        fold_into(&self.rout[cols.clone()], self.s_out.map(|s| &s[cols]), out);
    }

    /// Checks every length and that the scale vectors are finite.
    ///
    /// # Errors
    /// [`EschaError::BadLength`] for a code or vector of the wrong length,
    /// [`EschaError::NonFinite`] for a NaN or infinity in `rin`, `rout`,
    /// `s_in`, `s_out` or `bias`.
    pub fn validate(&self) -> Result<()> {
        let (n, s) = (self.name, self.shape);
        check_len(n, "code", self.code.len(), s.code_len())?;
        check_len(n, "rin", self.rin.len(), s.ic)?;
        check_len(n, "rout", self.rout.len(), s.oc)?;
        check_finite(n, "rin", self.rin.iter().map(|v| v.to_f32()))?;
        check_finite(n, "rout", self.rout.iter().map(|v| v.to_f32()))?;
        if let Some(v) = self.s_in {
            check_len(n, "s_in", v.len(), s.ic)?;
            check_finite(n, "s_in", v.iter().copied())?;
        }
        if let Some(v) = self.s_out {
            check_len(n, "s_out", v.len(), s.oc)?;
            check_finite(n, "s_out", v.iter().copied())?;
        }
        if let Some(v) = self.bias {
            check_len(n, "bias", v.len(), s.oc)?;
            check_finite(n, "bias", v.iter().copied())?;
        }
        Ok(())
    }

    /// The folded scale vectors.
    pub fn folded(&self) -> (Vec<f32>, Vec<f32>) {
        fold_scales(self.rin, self.rout, self.s_in, self.s_out)
    }
}

fn check_x(name: &str, x: &[f32], rows: usize, ic: usize) -> Result<()> {
    check_len(name, "x", x.len(), rows * ic)
}

/// Reference dense linear: `x [M, IC]` -> `y [M, OC]` (f16).
///
/// # Errors
/// Those of [`Linear::validate`], and [`EschaError::BadLength`] when `x`
/// does not hold `m * IC` values.
pub fn linear(l: &Linear, x: &[f32], m: usize) -> Result<Vec<f16>> {
    l.validate()?;
    check_x(l.name, x, m, l.shape.ic)?;
    let w = reconstruct(l.code, l.shape);
    let (rin_eff, rout_eff) = l.folded();
    let mut y = vec![f16::ZERO; m * l.shape.oc];
    for (xr, yr) in x.chunks_exact(l.shape.ic).zip(y.chunks_exact_mut(l.shape.oc)) {
        linear_row(&w, l.shape, xr, &rin_eff, &rout_eff, l.bias, yr);
    }
    Ok(y)
}

/// One row through the contract with a reconstructed `W_bare`.
fn linear_row(w: &[f16], s: LinearShape, x: &[f32], rin_eff: &[f32], rout_eff: &[f32], bias: Option<&[f32]>, y: &mut [f16]) {
    let mut xh = vec![0f32; s.ic];
    input_transform(x, rin_eff, &mut xh);
    // Ascending input order, separate multiply and add (no FMA): the order
    // the C reference uses, so the two agree bit for bit.
    let mut mid = vec![0f32; s.oc];
    for (r, &a) in xh.iter().enumerate() {
        let wr = &w[r * s.oc..(r + 1) * s.oc];
        for (acc, wv) in mid.iter_mut().zip(wr) {
            *acc += a * wv.to_f32();
        }
    }
    output_transform(&mut mid, rout_eff, bias, y);
}

/// Everything an expert-stacked coded linear needs besides its input.
/// Vectors are per expert (`[E, n]`); `s_in`, `s_out` and `bias` may also be
/// shared by all experts (`[n]`).
#[derive(Clone, Copy, Debug)]
pub struct Moe<'a> {
    pub name: &'a str,
    pub shape: MoeShape,
    /// `[E, IC/16, OC/16, 16K]` int16.
    pub code: &'a [i16],
    pub rin: &'a [f16],
    pub rout: &'a [f16],
    pub s_in: Option<&'a [f32]>,
    pub s_out: Option<&'a [f32]>,
    pub bias: Option<&'a [f32]>,
}

/// A per-expert vector that may be shared (`[n]`) or stacked (`[E, n]`).
fn expert_slice<T>(v: &[T], e: usize, n: usize) -> &[T] {
    if v.len() == n {
        v
    } else {
        &v[e * n..(e + 1) * n]
    }
}

impl<'a> Moe<'a> {
    /// Checks every length (`s_in`, `s_out`, `bias` `[n]` or `[E, n]`) and
    /// that every expert's vectors are finite.
    ///
    /// # Errors
    /// [`EschaError::BadLength`] for a code or vector of the wrong length,
    /// [`EschaError::NonFinite`] for a NaN or infinity in any expert's
    /// vectors.
    pub fn validate(&self) -> Result<()> {
        let s = self.shape;
        check_len(self.name, "code", self.code.len(), s.code_len())?;
        check_len(self.name, "rin", self.rin.len(), s.e * s.ic)?;
        check_len(self.name, "rout", self.rout.len(), s.e * s.oc)?;
        for e in 0..s.e {
            self.expert(e).validate()?;
        }
        let opt = |what: &'static str, v: Option<usize>, n: usize| -> Result<()> {
            match v {
                Some(len) if len != n && len != s.e * n => {
                    Err(EschaError::BadLength { tensor: self.name.into(), what, got: len, expected: s.e * n })
                }
                _ => Ok(()),
            }
        };
        opt("s_in", self.s_in.map(|v| v.len()), s.ic)?;
        opt("s_out", self.s_out.map(|v| v.len()), s.oc)?;
        opt("bias", self.bias.map(|v| v.len()), s.oc)
    }

    /// Expert `e` as a dense linear (slices must already have valid lengths).
    pub fn expert(&self, e: usize) -> Linear<'a> {
        let s = self.shape;
        let opt = |v: Option<&'a [f32]>, n: usize| v.filter(|v| v.len() == n || v.len() == s.e * n).map(|v| expert_slice(v, e, n));
        Linear {
            name: self.name,
            shape: s.linear(),
            code: s.expert_code(self.code, e),
            rin: expert_slice(self.rin, e, s.ic),
            rout: expert_slice(self.rout, e, s.oc),
            s_in: opt(self.s_in, s.ic),
            s_out: opt(self.s_out, s.oc),
            bias: opt(self.bias, s.oc),
        }
    }
}

/// Token routing of an expert-indexed product: `ids [T, n_used]` and the
/// input layout `x [T, nx, IC]` with `nx` 1 (broadcast) or `n_used`.
#[derive(Clone, Copy, Debug)]
pub struct Routing<'a> {
    pub ids: &'a [i32],
    pub n_used: usize,
    pub tokens: usize,
    pub nx: usize,
}

impl<'a> Routing<'a> {
    /// Checks ids against the expert count and the x layout.
    ///
    /// # Errors
    /// [`EschaError::BadLength`] when `ids` does not hold `tokens * n_used`
    /// values, [`EschaError::Shape`] when `nx` is 0 or does not divide
    /// `n_used`, [`EschaError::BadExpertId`] for an id outside `0..n_expert`.
    pub fn validate(&self, name: &str, n_expert: usize) -> Result<()> {
        check_len(name, "ids", self.ids.len(), self.tokens * self.n_used)?;
        if self.nx == 0 || !self.n_used.is_multiple_of(self.nx) {
            return Err(EschaError::Shape {
                tensor: name.into(),
                detail: format!("x has {} rows per token; n_used {} must be a multiple of it", self.nx, self.n_used),
            });
        }
        for (i, &id) in self.ids.iter().enumerate() {
            if id < 0 || id as usize >= n_expert {
                return Err(EschaError::BadExpertId {
                    tensor: name.into(),
                    id: id as i64,
                    token: i / self.n_used,
                    slot: i % self.n_used,
                    n_expert,
                });
            }
        }
        Ok(())
    }

    /// `(expert, x row)` of slot `(t, u)`.
    #[inline]
    pub fn slot(&self, t: usize, u: usize) -> (usize, usize) {
        (self.ids[t * self.n_used + u] as usize, t * self.nx + u % self.nx)
    }
}

/// Reference expert-indexed linear: `y [T, n_used, OC]`.
///
/// # Errors
/// Those of [`Moe::validate`] and [`Routing::validate`], and
/// [`EschaError::BadLength`] when `x` does not hold `tokens * nx * IC`
/// values.
pub fn moe(p: &Moe, x: &[f32], r: &Routing) -> Result<Vec<f16>> {
    p.validate()?;
    r.validate(p.name, p.shape.e)?;
    check_x(p.name, x, r.tokens * r.nx, p.shape.ic)?;
    let (ic, oc) = (p.shape.ic, p.shape.oc);
    let mut y = vec![f16::ZERO; r.tokens * r.n_used * oc];
    // Decode each used expert once.
    type Decoded = (Vec<f16>, Vec<f32>, Vec<f32>);
    let mut cache: Vec<Option<Decoded>> = vec![None; p.shape.e];
    for t in 0..r.tokens {
        for u in 0..r.n_used {
            let (e, xr) = r.slot(t, u);
            let lin = p.expert(e);
            let (w, ri, ro) = cache[e].get_or_insert_with(|| {
                let (ri, ro) = lin.folded();
                (reconstruct(lin.code, lin.shape), ri, ro)
            });
            let out = &mut y[(t * r.n_used + u) * oc..][..oc];
            linear_row(w, lin.shape, &x[xr * ic..(xr + 1) * ic], ri, ro, lin.bias, out);
        }
    }
    Ok(y)
}

/// Reference SwiGLU on f16 `gate_up [rows, 2I]` (gate = first half):
/// `s = f16(g * sigmoid(g))`, `out = f16(s * u)`.
pub fn swiglu(gate_up: &[f16], rows: usize, inter: usize) -> Vec<f16> {
    assert_eq!(gate_up.len(), rows * 2 * inter, "gate_up must be [rows, 2*I]");
    let mut out = Vec::with_capacity(rows * inter);
    for row in gate_up.chunks_exact(2 * inter) {
        let (g, u) = row.split_at(inter);
        for (g, u) in g.iter().zip(u) {
            let g = g.to_f32();
            let s = f16::from_f32(g / (1.0 + (-g).exp()));
            out.push(f16::from_f32(s.to_f32() * u.to_f32()));
        }
    }
    out
}
