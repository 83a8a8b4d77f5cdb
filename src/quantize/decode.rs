//! `escha decode`: an Escha GGUF back to a plain GGUF whose coded weights
//! are the decoded effective weights (F32), for exactness checks of the
//! escha ops inside llama.cpp against its own matrix multiply; and the same
//! for an Escha HF checkpoint directory, for checking converters.

use crate::contract::{self, CodedGguf};
use crate::encode::effective_weight;
use crate::gguf::{GgmlType, GgufFile, GgufWriter};
use crate::output::Output;
use crate::safetensors::{StTensor, StWriter};
use crate::validate::{finite, validate_leaves, CodedLeaves, LinearShape};
use anyhow::{bail, Context};
use half::f16;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Decodes every coded weight of `input` into `<stem>.weight` F32. The
/// input is checked as llama.cpp's loader checks it ([`crate::contract`]).
/// Returns the number of coded weights decoded.
///
/// # Errors
/// Fails when the output is refused ([`Output::file`]), when `input` is not
/// a readable GGUF or has no `escha.format_version`, when it breaks the
/// tensor contract ([`contract::coded_weights`], [`CodedGguf::read`]), or
/// when reading or writing fails. `output` is then left as it was.
pub fn decode_gguf(input: &Path, output: &Path) -> anyhow::Result<usize> {
    let out_file = Output::file(output, &[input])?;
    let src = GgufFile::open(input)?;
    if src.get_u32("escha.format_version")?.is_none() {
        bail!("{} is not an Escha GGUF (no escha.format_version)", input.display());
    }
    let coded = contract::coded_weights(&src)?;
    let by_code: HashMap<&str, &CodedGguf> = coded.iter().map(|c| (c.code.name.as_str(), c)).collect();
    // Tensors the decoded weight replaces: every leaf of a coded stem but its bias.
    let replaced: HashSet<&str> = coded.iter().flat_map(|c| [Some(c.rin), Some(c.rout), c.s_in, c.s_out]).flatten().map(|t| t.name.as_str()).collect();
    let mut w = GgufWriter::new();
    w.copy_kv(&src);
    w.remove_key("escha.format_version");
    w.remove_key("escha.codebook");
    w.remove_key("escha.apply_bias");
    for t in src.tensors() {
        if let Some(c) = by_code.get(t.name.as_str()) {
            let (ic, oc, e) = (c.shape.ic as i64, c.shape.oc as i64, c.experts as i64);
            let ne: Vec<i64> = if e > 1 { vec![ic, oc, e] } else { vec![ic, oc] };
            w.add_tensor(&format!("{}.weight", c.stem), GgmlType::GGML_TYPE_F32, &ne)?;
        } else if !replaced.contains(t.name.as_str()) {
            w.add_tensor(&t.name, t.ty, &t.ne[..t.n_dims()])?;
        }
    }
    let mut out = w.create(out_file.path())?;
    for t in src.tensors() {
        let Some(c) = by_code.get(t.name.as_str()) else {
            if !replaced.contains(t.name.as_str()) {
                out.write_tensor(&t.name, &src.read(t)?)?;
            }
            continue;
        };
        // Reading checks every vector, the bias (written later, as it is) too.
        let d = c.read(&src)?;
        let coded = Coded {
            stem: &c.stem,
            k: c.shape.k,
            ic: c.shape.ic,
            oc: c.shape.oc,
            experts: c.experts,
            code: &d.code,
            rin: &d.rin,
            rout: &d.rout,
            s_in: d.s_in.as_deref(),
            s_out: d.s_out.as_deref(),
        };
        let weights = coded.effective_weights()?;
        out.write_tensor(&format!("{}.weight", c.stem), bytemuck::cast_slice(&weights))?;
    }
    out.finish()?;
    out_file.commit()?;
    Ok(coded.len())
}

/// One coded weight's leaves, for decoding.
struct Coded<'a> {
    stem: &'a str,
    k: usize,
    ic: usize,
    oc: usize,
    experts: usize,
    code: &'a [i16],
    rin: &'a [f16],
    rout: &'a [f16],
    s_in: Option<&'a [f32]>,
    s_out: Option<&'a [f32]>,
}

impl Coded<'_> {
    /// The effective weights `[E][OC][IC]` (f32), scales folded in.
    fn effective_weights(&self) -> anyhow::Result<Vec<f32>> {
        let (stem, ic, oc, e) = (self.stem, self.ic, self.oc, self.experts);
        let shape = LinearShape::new(stem, self.k, ic, oc)?;
        crate::validate::check_len(stem, "code", self.code.len(), shape.code_len() * e)?;
        crate::validate::check_len(stem, "rin", self.rin.len(), ic * e)?;
        crate::validate::check_len(stem, "rout", self.rout.len(), oc * e)?;
        // Per-channel scales: one vector per expert, or one shared by all.
        let per_expert = |what: &'static str, v: Option<&[f32]>, n: usize| -> anyhow::Result<()> {
            match v {
                Some(v) if v.len() != n && v.len() != n * e => Err(crate::EschaError::BadLength { tensor: stem.into(), what, got: v.len(), expected: n * e }.into()),
                _ => Ok(()),
            }
        };
        per_expert("s_in", self.s_in, ic)?;
        per_expert("s_out", self.s_out, oc)?;
        let slice = |v: Option<&[f32]>, n: usize, x: usize| v.map(|v| if v.len() == n { v.to_vec() } else { v[x * n..(x + 1) * n].to_vec() });
        let mut weights = Vec::with_capacity(ic * oc * e);
        for x in 0..e {
            let code = &self.code[x * shape.code_len()..(x + 1) * shape.code_len()];
            let mut we = effective_weight(code, shape, &self.rin[x * ic..(x + 1) * ic], &self.rout[x * oc..(x + 1) * oc]);
            if let Some(si) = slice(self.s_in, ic, x) {
                we.chunks_exact_mut(ic).for_each(|row| row.iter_mut().zip(&si).for_each(|(a, b)| *a *= b));
            }
            if let Some(so) = slice(self.s_out, oc, x) {
                we.chunks_exact_mut(ic).zip(&so).for_each(|(row, b)| row.iter_mut().for_each(|a| *a *= b));
            }
            weights.extend(we);
        }
        Ok(weights)
    }
}

/// An Escha HF checkpoint directory (§7) to a plain one: each coded linear
/// `P` becomes `P.weight` F32 `[E?, OC, IC]` holding its effective weight,
/// each int8 pair `P.weight_int8` + `P.weight_scale` becomes `P.weight` F32
/// (row times scale), and `quantization_config` is dropped; an MTP head in
/// the export's `mtp/` folder joins the main file, as HF releases keep it.
/// Any converter can then read it: the reference for checking an Escha
/// converter.
/// Returns the number of tensors decoded (coded linears and int8 pairs).
///
/// # Errors
/// Fails when the output is refused ([`Output::dir`]); when `input` has no
/// readable JSON `config.json` or its `quant_method` is not `escha` or
/// `eschamoe`; when a safetensors header is bad or the `mtp/` folder holds
/// a tensor not named `mtp.*` ([`super::hf::checkpoint_tensors`]); when a
/// coded linear breaks the leaf contract ([`validate_leaves`]) or also has
/// `.weight`; when an escha leaf, `weight_int8` or `weight_scale` stands
/// without its partner or an int8 pair is malformed; when a vector is not
/// finite; or when reading or writing fails. No output directory is left
/// then.
pub fn decode_hf(input: &Path, output: &Path) -> anyhow::Result<usize> {
    let out_dir = Output::dir(output, &[input])?;
    let cfg_path = input.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&cfg_path).with_context(|| format!("{}: no config.json", input.display()))?)
        .with_context(|| format!("{} is not JSON", cfg_path.display()))?;
    if config.pointer("/quantization_config/quant_method").and_then(Value::as_str).is_none_or(|m| m != "escha" && m != "eschamoe") {
        bail!("{} is not an Escha checkpoint (quantization_config.quant_method is not escha or eschamoe)", input.display());
    }
    // The MTP head of the export's mtp/ folder joins the main file, where
    // HF releases (and so upstream's converter) keep it.
    let (files, tensors) = super::hf::checkpoint_tensors(input)?;
    let by_name: HashMap<&str, &StTensor> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let get = |name: &str| by_name.get(name).copied();
    // Every coded prefix checked against the leaf contract (§7) first.
    let mut coded: HashMap<&str, CodedLeaves> = HashMap::new();
    for t in &tensors {
        let Some((prefix, leaf)) = t.name.rsplit_once('.').filter(|(_, l)| l.starts_with("escha_")) else {
            if t.name.starts_with("escha_") {
                bail!("{}: an escha tensor outside any coded linear (not in the leaf contract)", t.name);
            }
            continue;
        };
        if leaf != "escha_code" {
            if get(&format!("{prefix}.escha_code")).is_none() {
                bail!("{}: escha leaf without {prefix}.escha_code", t.name);
            }
            continue;
        }
        let mut leaves = BTreeMap::new();
        for (name, l) in by_name.iter().filter_map(|(n, l)| n.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')).map(|r| (r, l))) {
            if name.starts_with("escha_") || name == "bias" {
                leaves.insert(name.to_string(), l.leaf()?);
            }
        }
        let c = validate_leaves(prefix, &leaves)?;
        if get(&format!("{prefix}.weight")).is_some() {
            bail!("{prefix}: has both {prefix}.weight and {prefix}.escha_code (a coded linear replaces .weight)");
        }
        coded.insert(prefix, c);
    }
    let mut w = StWriter::default();
    w.metadata("format", "pt");
    /// What each output tensor is, with what its writing needs.
    enum Out<'t> {
        Code { prefix: &'t str, leaves: &'t CodedLeaves },
        Int8 { stem: &'t str, scale: &'t StTensor, cols: usize },
        Copy,
    }
    let mut plan: Vec<(&StTensor, Out)> = Vec::new(); // in output order
    for t in &tensors {
        if let Some((prefix, leaves)) = t.name.strip_suffix(".escha_code").and_then(|p| coded.get(p).map(|c| (p, c))) {
            let lead: Vec<usize> = leaves.experts.into_iter().collect();
            w.add(&format!("{prefix}.weight"), "F32", &[lead.as_slice(), &[leaves.shape.oc, leaves.shape.ic]].concat())?;
            plan.push((t, Out::Code { prefix, leaves }));
        } else if let Some(stem) = t.name.strip_suffix(".weight_int8") {
            let (scale, cols) = int8_pair(stem, t, get(&format!("{stem}.weight_scale")))?;
            w.add(&format!("{stem}.weight"), "F32", &t.shape)?;
            plan.push((t, Out::Int8 { stem, scale, cols }));
        } else if let Some(stem) = t.name.strip_suffix(".weight_scale") {
            if get(&format!("{stem}.weight_int8")).is_none() {
                bail!("{}: a row scale without {stem}.weight_int8", t.name);
            }
        } else if t.name.rsplit_once('.').is_none_or(|(_, l)| !l.starts_with("escha_")) {
            w.add(&t.name, &t.dtype, &t.shape)?;
            plan.push((t, Out::Copy));
        }
    }
    let mut out = w.create(&out_dir.path().join("model.safetensors"))?;
    let mut n = 0;
    for (t, what) in plan {
        match what {
            Out::Code { prefix, leaves: c } => {
                let leaf = |l: &str| get(&format!("{prefix}.{l}"));
                // Finite vectors, as the loader requires of the GGUF.
                let vector = |t: &StTensor| -> anyhow::Result<Vec<f32>> { Ok(finite(&t.name, t.read_f32()?)?) };
                let halves = |l: &str| -> anyhow::Result<Vec<f16>> {
                    let t = leaf(l).with_context(|| format!("{prefix}: required leaf {l} is missing"))?;
                    Ok(vector(t)?.into_iter().map(f16::from_f32).collect())
                };
                let code: Vec<i16> = t.read()?.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
                let (s_in, s_out) = (leaf("escha_s_in").map(vector).transpose()?, leaf("escha_s_out").map(vector).transpose()?);
                leaf("bias").map(vector).transpose()?;
                let coded = Coded {
                    stem: prefix,
                    k: c.shape.k,
                    ic: c.shape.ic,
                    oc: c.shape.oc,
                    experts: c.experts.unwrap_or(1),
                    code: &code,
                    rin: &halves("escha_rin")?,
                    rout: &halves("escha_rout")?,
                    s_in: s_in.as_deref(),
                    s_out: s_out.as_deref(),
                };
                out.write(&format!("{prefix}.weight"), bytemuck::cast_slice(&coded.effective_weights()?))?;
                n += 1;
            }
            Out::Int8 { stem, scale: st, cols } => {
                let scale = finite(&st.name, st.read()?.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect())?;
                let q = t.read()?;
                let wts: Vec<f32> = q.iter().enumerate().map(|(i, &b)| (b as i8) as f32 * scale[i / cols]).collect();
                out.write(&format!("{stem}.weight"), bytemuck::cast_slice(&wts))?;
                n += 1;
            }
            Out::Copy => out.write(&t.name, &t.read()?)?,
        }
    }
    out.finish()?;
    if let Some(o) = config.as_object_mut() {
        o.remove("quantization_config");
    }
    std::fs::write(out_dir.path().join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    super::hf::copy_side_files(&files, out_dir.path())?;
    out_dir.commit()?;
    Ok(n)
}

/// An int8 pair: I8 rows `[N, IC]` (N, IC positive) and F16 scales, one per
/// row. Returns the scales and IC.
fn int8_pair<'a>(stem: &str, q: &StTensor, scale: Option<&'a StTensor>) -> anyhow::Result<(&'a StTensor, usize)> {
    let Some(st) = scale else { bail!("{stem}: {stem}.weight_int8 without {stem}.weight_scale") };
    match (q.dtype.as_str(), q.shape.as_slice(), st.dtype.as_str()) {
        ("I8", &[rows, cols], "F16") if rows > 0 && cols > 0 && st.shape.iter().product::<usize>() == rows && st.shape.len() <= 2 => Ok((st, cols)),
        _ => bail!(
            "{stem}: weight_int8 {} {:?} with weight_scale {} {:?}; expected I8 [N, IC] rows (N, IC > 0) and F16 [N] scales",
            q.dtype,
            q.shape,
            st.dtype,
            st.shape
        ),
    }
}
