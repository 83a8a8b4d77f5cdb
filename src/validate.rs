//! Shapes and validation: every rule of the contract that can reject input,
//! with errors naming the tensor.

use crate::error::{EschaError, Result};
pub use crate::format::HBLOCK;
use crate::format::TILE;
use std::collections::BTreeMap;

/// Shape of one coded linear (`IC` inputs -> `OC` outputs, `K` bits/weight).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub k: usize,
    pub ic: usize,
    pub oc: usize,
}

/// Shape of an expert-stacked coded linear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    pub k: usize,
    pub e: usize,
    pub ic: usize,
    pub oc: usize,
}

fn k_from_last_dim(tensor: &str, last: i64) -> Result<usize> {
    if last <= 0 || last % 16 != 0 {
        return Err(EschaError::BadLastDim { tensor: tensor.into(), last_dim: last });
    }
    let k = last / 16;
    if k != 2 && k != 3 {
        return Err(EschaError::BadK { tensor: tensor.into(), k, last_dim: last });
    }
    Ok(k as usize)
}

fn tiles_dim(tensor: &str, what: &'static str, tiles: i64) -> Result<usize> {
    let ch = tiles.checked_mul(TILE as i64).unwrap_or(-1);
    if tiles <= 0 || ch % HBLOCK as i64 != 0 {
        return Err(EschaError::NotMultipleOf128 { tensor: tensor.into(), what, value: ch });
    }
    Ok(ch as usize)
}

impl LinearShape {
    /// Validated shape; K is 2 or 3, IC and OC positive multiples of 128.
    ///
    /// # Errors
    /// [`EschaError::BadK`] when K is not 2 or 3 ([`EschaError::BadLastDim`]
    /// for K = 0), [`EschaError::NotMultipleOf128`] when IC or OC is 0 or not
    /// a multiple of 128.
    pub fn new(tensor: &str, k: usize, ic: usize, oc: usize) -> Result<Self> {
        k_from_last_dim(tensor, 16 * k as i64)?;
        for (what, v) in [("IC", ic), ("OC", oc)] {
            if v == 0 || v % HBLOCK != 0 {
                return Err(EschaError::NotMultipleOf128 { tensor: tensor.into(), what, value: v as i64 });
            }
        }
        Ok(Self { k, ic, oc })
    }

    /// From a dense code's checkpoint shape `[IC/16, OC/16, 16K]`.
    /// K comes from the last dimension, never from metadata.
    ///
    /// # Errors
    /// [`EschaError::Shape`] when `dims` is not 3-D,
    /// [`EschaError::BadLastDim`] or [`EschaError::BadK`] when the last
    /// dimension is not 32 or 48, [`EschaError::NotMultipleOf128`] when a tile
    /// count is not positive or 16 times it is not a multiple of 128.
    pub fn from_code_dims(tensor: &str, dims: &[i64]) -> Result<Self> {
        if dims.len() != 3 {
            return Err(EschaError::Shape {
                tensor: tensor.into(),
                detail: format!("dense code must be 3-D [IC/16, OC/16, 16K], got {dims:?}"),
            });
        }
        let k = k_from_last_dim(tensor, dims[2])?;
        let ic = tiles_dim(tensor, "IC", dims[0])?;
        let oc = tiles_dim(tensor, "OC", dims[1])?;
        Ok(Self { k, ic, oc })
    }

    /// int16 words in the code tensor.
    pub fn code_len(&self) -> usize {
        (self.ic / TILE) * (self.oc / TILE) * 16 * self.k
    }

    /// Tiles along IC (`kt`) and OC (`nt`).
    pub fn tiles(&self) -> (usize, usize) {
        (self.ic / TILE, self.oc / TILE)
    }
}

impl MoeShape {
    /// From an expert code's checkpoint shape `[E, IC/16, OC/16, 16K]`.
    ///
    /// # Errors
    /// [`EschaError::Shape`] when `dims` is not 4-D or E is not positive;
    /// those of [`LinearShape::from_code_dims`] for the other three.
    pub fn from_code_dims(tensor: &str, dims: &[i64]) -> Result<Self> {
        if dims.len() != 4 {
            return Err(EschaError::Shape {
                tensor: tensor.into(),
                detail: format!("expert code must be 4-D [E, IC/16, OC/16, 16K], got {dims:?}"),
            });
        }
        if dims[0] <= 0 {
            return Err(EschaError::Shape { tensor: tensor.into(), detail: format!("expert count {} must be positive", dims[0]) });
        }
        let l = LinearShape::from_code_dims(tensor, &dims[1..])?;
        Ok(Self { k: l.k, e: dims[0] as usize, ic: l.ic, oc: l.oc })
    }

    /// Validated shape of `e` experts of `(k, ic, oc)`.
    ///
    /// # Errors
    /// Those of [`LinearShape::new`], and [`EschaError::Shape`] when `e` is 0.
    pub fn new(tensor: &str, k: usize, e: usize, ic: usize, oc: usize) -> Result<Self> {
        let l = LinearShape::new(tensor, k, ic, oc)?;
        if e == 0 {
            return Err(EschaError::Shape { tensor: tensor.into(), detail: "expert count must be positive".into() });
        }
        Ok(Self { k: l.k, e, ic: l.ic, oc: l.oc })
    }

    /// The per-expert linear shape.
    pub fn linear(&self) -> LinearShape {
        LinearShape { k: self.k, ic: self.ic, oc: self.oc }
    }

    pub fn code_len(&self) -> usize {
        self.e * self.linear().code_len()
    }

    /// Expert `e`'s slice of the stacked code.
    pub fn expert_code<'a>(&self, code: &'a [i16], e: usize) -> &'a [i16] {
        let n = self.linear().code_len();
        &code[e * n..(e + 1) * n]
    }
}

/// Checks a vector's length.
///
/// # Errors
/// [`EschaError::BadLength`] when `got != expected`.
pub fn check_len(tensor: &str, what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got != expected {
        return Err(EschaError::BadLength { tensor: tensor.into(), what, got, expected });
    }
    Ok(())
}

/// Rejects NaN / inf in a scale vector (they would silently poison outputs).
///
/// # Errors
/// [`EschaError::NonFinite`] at the first NaN or infinity.
pub fn check_finite(tensor: &str, what: &'static str, v: impl IntoIterator<Item = f32>) -> Result<()> {
    for (index, value) in v.into_iter().enumerate() {
        if !value.is_finite() {
            return Err(EschaError::NonFinite { tensor: tensor.into(), what, index, value });
        }
    }
    Ok(())
}

/// `v` itself when every value is finite ([`check_finite`] on a whole
/// tensor read from a file).
///
/// # Errors
/// [`EschaError::NonFinite`] at the first NaN or infinity.
pub fn finite(tensor: &str, v: Vec<f32>) -> Result<Vec<f32>> {
    check_finite(tensor, "value", v.iter().copied())?;
    Ok(v)
}

// ---------------------------------------------------------------------------
// Checkpoint leaf contract
// ---------------------------------------------------------------------------

/// Element type of a checkpoint leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafDtype {
    I16,
    F16,
    F32,
    I32,
    Other,
}

/// What the validator needs to know of one leaf: dtype, shape, and for
/// `escha_config` its int32 values.
#[derive(Clone, Debug, PartialEq)]
pub struct Leaf {
    pub dtype: LeafDtype,
    pub shape: Vec<i64>,
    pub ints: Option<Vec<i64>>,
}

/// The leaves of one coded linear that the contract knows.
pub const REQUIRED_LEAVES: [&str; 3] = ["escha_code", "escha_rin", "escha_rout"];
pub const OPTIONAL_LEAVES: [&str; 4] = ["escha_s_in", "escha_s_out", "escha_config", "bias"];

/// A validated coded linear from a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct CodedLeaves {
    /// Experts, when the code is E-stacked.
    pub experts: Option<usize>,
    pub shape: LinearShape,
    pub has_s_in: bool,
    pub has_s_out: bool,
    pub has_bias: bool,
}

fn expect_shape(prefix: &str, leaf: &str, l: &Leaf, dtypes: &[LeafDtype], expected: &[i64]) -> Result<()> {
    let name = format!("{prefix}.{leaf}");
    if !dtypes.contains(&l.dtype) {
        return Err(EschaError::Shape { tensor: name, detail: format!("dtype {:?}, expected one of {dtypes:?}", l.dtype) });
    }
    // An expert vector may be stored [E, n] or, shared by all experts, [n].
    let shared = expected.len() == 2 && l.shape.len() == 1 && l.shape[0] == expected[1];
    if l.shape != expected && !shared {
        let got: usize = l.shape.iter().product::<i64>().max(0) as usize;
        let want: usize = expected.iter().product::<i64>() as usize;
        if got != want {
            return Err(EschaError::BadLength { tensor: name, what: "length", got, expected: want });
        }
        return Err(EschaError::Shape { tensor: name, detail: format!("shape {:?}, expected {expected:?}", l.shape) });
    }
    Ok(())
}

/// Validates the leaves `{prefix}.escha_*` (and `{prefix}.bias`) of one
/// coded linear against the leaf contract. `leaves` maps leaf name (without
/// the prefix) to its description; non-escha leaves other than `bias` are
/// ignored (they belong to other tensors of the module).
///
/// # Errors
/// [`EschaError::UnknownLeaf`] for an `escha_*` leaf outside the contract,
/// [`EschaError::MissingLeaf`] for a missing required leaf, the errors of
/// [`LinearShape::from_code_dims`] / [`MoeShape::from_code_dims`] for the
/// code, [`EschaError::Shape`] or [`EschaError::BadLength`] for a leaf of
/// the wrong dtype or shape, and those of [`check_config`].
pub fn validate_leaves(prefix: &str, leaves: &BTreeMap<String, Leaf>) -> Result<CodedLeaves> {
    for name in leaves.keys() {
        if name.starts_with("escha_") && !REQUIRED_LEAVES.contains(&name.as_str()) && !OPTIONAL_LEAVES.contains(&name.as_str()) {
            return Err(EschaError::UnknownLeaf { prefix: prefix.into(), leaf: name.clone() });
        }
    }
    for req in REQUIRED_LEAVES {
        if !leaves.contains_key(req) {
            return Err(EschaError::MissingLeaf { prefix: prefix.into(), leaf: req.into() });
        }
    }
    let code = &leaves["escha_code"];
    let code_name = format!("{prefix}.escha_code");
    if code.dtype != LeafDtype::I16 {
        return Err(EschaError::Shape { tensor: code_name, detail: format!("dtype {:?}, expected I16", code.dtype) });
    }
    let (experts, shape) = match code.shape.len() {
        4 => {
            let m = MoeShape::from_code_dims(&code_name, &code.shape)?;
            (Some(m.e), m.linear())
        }
        _ => (None, LinearShape::from_code_dims(&code_name, &code.shape)?),
    };
    let per = |n: usize| -> Vec<i64> {
        match experts {
            Some(e) => vec![e as i64, n as i64],
            None => vec![n as i64],
        }
    };
    expect_shape(prefix, "escha_rin", &leaves["escha_rin"], &[LeafDtype::F16], &per(shape.ic))?;
    expect_shape(prefix, "escha_rout", &leaves["escha_rout"], &[LeafDtype::F16], &per(shape.oc))?;
    let f = [LeafDtype::F32, LeafDtype::F16];
    if let Some(l) = leaves.get("escha_s_in") {
        expect_shape(prefix, "escha_s_in", l, &f, &per(shape.ic))?;
    }
    if let Some(l) = leaves.get("escha_s_out") {
        expect_shape(prefix, "escha_s_out", l, &f, &per(shape.oc))?;
    }
    if let Some(l) = leaves.get("bias") {
        expect_shape(prefix, "bias", l, &f, &per(shape.oc))?;
    }
    if let Some(cfg) = leaves.get("escha_config") {
        check_config(&format!("{prefix}.escha_config"), cfg, experts, shape)?;
    }
    Ok(CodedLeaves {
        experts,
        shape,
        has_s_in: leaves.contains_key("escha_s_in"),
        has_s_out: leaves.contains_key("escha_s_out"),
        has_bias: leaves.contains_key("bias"),
    })
}

/// `escha_config`: dense `[16, K, 2, 1, IC, OC]`; MoE
/// `[16, K, 2, 1, E, in_f, out_f, in_p, out_p]` with `in_p == in_f`,
/// `out_p == out_f`. Entry 3 is the codebook id (must be 1).
///
/// # Errors
/// [`EschaError::Shape`] when `cfg.ints` is `None`,
/// [`EschaError::BadCodebook`] when entry 3 is not 1,
/// [`EschaError::ConfigDisagrees`] when the entry count, tile size, K,
/// entry 2, E or the dimensions disagree with the code.
pub fn check_config(tensor: &str, cfg: &Leaf, experts: Option<usize>, shape: LinearShape) -> Result<()> {
    let v = cfg.ints.as_deref().ok_or_else(|| EschaError::Shape {
        tensor: tensor.into(),
        detail: "escha_config values were not provided".into(),
    })?;
    let want_len = if experts.is_some() { 9 } else { 6 };
    let dis = |detail: String| Err(EschaError::ConfigDisagrees { tensor: tensor.into(), detail });
    if v.len() != want_len {
        return dis(format!("has {} entries ({}), expected {want_len}", v.len(), if experts.is_some() { "MoE" } else { "dense" }));
    }
    if v[3] != crate::format::CODEBOOK_CBA {
        return Err(EschaError::BadCodebook { tensor: tensor.into(), id: v[3] });
    }
    if v[0] != TILE as i64 {
        return dis(format!("tile size {} (code has 16)", v[0]));
    }
    if v[1] != shape.k as i64 {
        return dis(format!("K={} (code last dim gives K={})", v[1], shape.k));
    }
    if v[2] != 2 {
        return dis(format!("entry 2 = {} (expected 2)", v[2]));
    }
    let (ic, oc) = (shape.ic as i64, shape.oc as i64);
    match experts {
        None => {
            if v[4] != ic || v[5] != oc {
                return dis(format!("in/out {}x{} (code is {ic}x{oc})", v[4], v[5]));
            }
        }
        Some(e) => {
            if v[4] != e as i64 {
                return dis(format!("E={} (code has {e})", v[4]));
            }
            if v[5] != ic || v[6] != oc {
                return dis(format!("in/out {}x{} (code is {ic}x{oc})", v[5], v[6]));
            }
            if v[7] != v[5] || v[8] != v[6] {
                return dis(format!("padded dims {}x{} differ from {}x{}", v[7], v[8], v[5], v[6]));
            }
        }
    }
    Ok(())
}
