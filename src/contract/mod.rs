//! The GGUF tensor contract of `docs/FORMAT.md` §8, checked exactly as
//! llama.cpp's loader checks it (`ggml-escha/llama/llama-escha.cpp`), so that
//! `escha decode` accepts a file if and only if the loader would, and
//! `escha quantize` can check what it wrote. Every error names the key or
//! tensor.
//!
//! Metadata: `escha.format_version`, when present, is u32 2;
//! `escha.codebook`, when present, is u32 1; `escha.apply_bias`, when
//! present, is a bool. Per stem `S` with any `S.escha_*` tensor:
//! - only `escha_code`, `escha_rin`, `escha_rout`, `escha_s_in`,
//!   `escha_s_out` exist as `S.escha_*`; `S.escha_code` is present and
//!   `S.weight` is not;
//! - the code is I16 `{16K, OC/16, IC/16, E}` with K 2 or 3 and IC, OC
//!   positive multiples of 128;
//! - `rin` / `rout` are F16 and `s_in` / `s_out` F32, `{IC, E}` / `{OC, E}`
//!   (`{IC}` / `{OC}` when E = 1); `S.bias`, when present, F32 or F16
//!   `{OC, E}`;
//! - their values are finite ([`CodedGguf::read_vectors`], [`check`]).
//!
//! The published layout's global tables (`escha_lut`, ...) belong to layout
//! (a), which this contract does not cover: they are refused here.

#[doc(hidden)]
pub mod cases;

use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::validate::{finite, LinearShape};
use anyhow::{bail, Result};
use half::f16;
use std::collections::HashSet;

/// The `S.escha_*` leaves the loader knows.
pub const GGUF_LEAVES: [&str; 5] = ["escha_code", "escha_rin", "escha_rout", "escha_s_in", "escha_s_out"];

/// One coded weight of a GGUF, its tensors checked for type and shape.
#[derive(Clone, Debug)]
pub struct CodedGguf<'a> {
    pub stem: String,
    pub shape: LinearShape,
    pub experts: usize,
    pub code: &'a TensorInfo,
    pub rin: &'a TensorInfo,
    pub rout: &'a TensorInfo,
    pub s_in: Option<&'a TensorInfo>,
    pub s_out: Option<&'a TensorInfo>,
    pub bias: Option<&'a TensorInfo>,
}

/// The stem and leaf of `S.escha_*` names.
fn escha_leaf(name: &str) -> Option<(&str, &str)> {
    name.rsplit_once('.').filter(|(_, leaf)| leaf.starts_with("escha_"))
}

fn check_keys(src: &GgufFile) -> Result<()> {
    if let Some(v) = src.get_u32("escha.format_version")? {
        if v != 2 {
            bail!("escha.format_version = {v}; this reader knows version 2 (docs/FORMAT.md §8)");
        }
    }
    if let Some(v) = src.get_u32("escha.codebook")? {
        if v != 1 {
            bail!("escha.codebook = {v}; only codebook 1 (cbA) is defined");
        }
    }
    src.get_bool("escha.apply_bias")?;
    Ok(())
}

fn expect(t: &TensorInfo, types: &[GgmlType], ne: [i64; 4]) -> Result<()> {
    if !types.contains(&t.ty) {
        let want: Vec<String> = types.iter().map(|&ty| crate::gguf::type_name(ty)).collect();
        bail!("{}: type {}, expected {}", t.name, t.type_name(), want.join(" or "));
    }
    if t.ne != ne {
        bail!("{}: ne {:?}, expected {:?}", t.name, &t.ne[..t.n_dims()], &ne[..ne.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1)]);
    }
    Ok(())
}

/// Checks the metadata and every coded weight's tensors (types, shapes,
/// leaf names) and returns the coded weights in file order.
///
/// # Errors
/// Fails, naming the key or tensor, when `escha.format_version` is not
/// u32 2, `escha.codebook` not u32 1 or `escha.apply_bias` not a bool; when
/// a global `escha_*` table or an unknown `S.escha_*` leaf is present; when
/// a stem has sidecars but no `escha_code`, or both `.weight` and
/// `.escha_code`; when a code is not I16 `{16K, OC/16, IC/16, E}` with K 2
/// or 3, E positive and IC, OC positive multiples of 128; or when `rin` /
/// `rout` is missing or a leaf has the wrong type or shape.
pub fn coded_weights(src: &GgufFile) -> Result<Vec<CodedGguf<'_>>> {
    check_keys(src)?;
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    for t in src.tensors() {
        if t.name.starts_with("escha_") {
            bail!("{}: a global table of the published layout (qwen35.escha.version = 1), not of this contract", t.name);
        }
        if let Some((stem, leaf)) = escha_leaf(&t.name) {
            if !GGUF_LEAVES.contains(&leaf) {
                bail!("{}: unknown escha tensor (a newer format feature? refusing to guess)", t.name);
            }
            if seen.insert(stem) {
                order.push(stem);
            }
        }
    }
    let get = |stem: &str, leaf: &str| src.tensor(&format!("{stem}.{leaf}"));
    let mut out = Vec::new();
    for stem in order {
        let Some(code) = get(stem, "escha_code") else {
            bail!("{stem}: escha sidecars without {stem}.escha_code");
        };
        if get(stem, "weight").is_some() {
            bail!("{stem}: has both {stem}.weight and {stem}.escha_code (a coded weight replaces .weight)");
        }
        if code.ty != GgmlType::GGML_TYPE_I16 {
            bail!("{}: type {}, escha codes are i16", code.name, code.type_name());
        }
        let [k16, nt, kt, e] = code.ne;
        if e < 1 {
            bail!("{}: expert count ne[3] = {e} must be positive", code.name);
        }
        // The crate's shape rule, on the checkpoint order [IC/16, OC/16, 16K].
        let shape = LinearShape::from_code_dims(&code.name, &[kt, nt, k16])?;
        let (ic, oc) = (shape.ic as i64, shape.oc as i64);
        let need = |leaf: &str| get(stem, leaf).ok_or_else(|| anyhow::anyhow!("{stem}.{leaf}: missing (required with {stem}.escha_code)"));
        let (f16t, f32t) = ([GgmlType::GGML_TYPE_F16], [GgmlType::GGML_TYPE_F32]);
        let (rin, rout) = (need("escha_rin")?, need("escha_rout")?);
        expect(rin, &f16t, [ic, e, 1, 1])?;
        expect(rout, &f16t, [oc, e, 1, 1])?;
        let (s_in, s_out, bias) = (get(stem, "escha_s_in"), get(stem, "escha_s_out"), get(stem, "bias"));
        if let Some(t) = s_in {
            expect(t, &f32t, [ic, e, 1, 1])?;
        }
        if let Some(t) = s_out {
            expect(t, &f32t, [oc, e, 1, 1])?;
        }
        if let Some(t) = bias {
            expect(t, &[GgmlType::GGML_TYPE_F32, GgmlType::GGML_TYPE_F16], [oc, e, 1, 1])?;
        }
        out.push(CodedGguf { stem: stem.to_string(), shape, experts: e as usize, code, rin, rout, s_in, s_out, bias });
    }
    Ok(out)
}

/// The data of one coded weight, read and checked.
pub struct CodedData {
    pub code: Vec<i16>,
    pub rin: Vec<f16>,
    pub rout: Vec<f16>,
    pub s_in: Option<Vec<f32>>,
    pub s_out: Option<Vec<f32>>,
    pub bias: Option<Vec<f32>>,
}

impl CodedGguf<'_> {
    /// Reads the vectors and checks that each is finite (the loader's check
    /// after loading), naming the tensor and index; `code` is left empty.
    ///
    /// # Errors
    /// The [`crate::gguf::GgufError`] of a vector that cannot be read or
    /// converted ([`GgufFile::read_f32`]), [`crate::EschaError::NonFinite`]
    /// for a NaN or infinity.
    pub fn read_vectors(&self, src: &GgufFile) -> Result<CodedData> {
        let vector = |t: &TensorInfo| -> Result<Vec<f32>> { Ok(finite(&t.name, src.read_f32(t)?)?) };
        let halves = |t: &TensorInfo| -> Result<Vec<f16>> { Ok(vector(t)?.into_iter().map(f16::from_f32).collect()) };
        Ok(CodedData {
            code: Vec::new(),
            rin: halves(self.rin)?,
            rout: halves(self.rout)?,
            s_in: self.s_in.map(vector).transpose()?,
            s_out: self.s_out.map(vector).transpose()?,
            bias: self.bias.map(vector).transpose()?,
        })
    }

    /// [`Self::read_vectors`] and the code.
    ///
    /// # Errors
    /// Those of [`Self::read_vectors`], and [`crate::gguf::GgufError::Io`]
    /// when the code cannot be read.
    pub fn read(&self, src: &GgufFile) -> Result<CodedData> {
        let mut d = self.read_vectors(src)?;
        d.code = src.read(self.code)?.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
        Ok(d)
    }
}

/// The whole check of a file: [`coded_weights`] and every vector's values.
/// Returns the number of coded weights.
///
/// # Errors
/// Those of [`coded_weights`], and of [`CodedGguf::read_vectors`] for each
/// coded weight.
pub fn check(src: &GgufFile) -> Result<usize> {
    let coded = coded_weights(src)?;
    for c in &coded {
        c.read_vectors(src)?;
    }
    Ok(coded.len())
}
