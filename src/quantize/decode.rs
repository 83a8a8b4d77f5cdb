//! `escha decode`: an Escha GGUF back to a plain GGUF whose coded weights
//! are the decoded effective weights (F32), for exactness checks of the
//! escha ops inside llama.cpp against its own matrix multiply; and the same
//! for an Escha HF checkpoint directory, for checking converters.

use crate::encode::effective_weight;
use crate::gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo};
use crate::validate::LinearShape;
use anyhow::{bail, Context};
use crate::safetensors::{read_header, StTensor, StWriter};
use half::f16;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

const SIDECARS: [&str; 4] = ["escha_rin", "escha_rout", "escha_s_in", "escha_s_out"];

fn leaf<'a>(src: &'a GgufFile, stem: &str, name: &str) -> Option<&'a TensorInfo> {
    src.tensor(&format!("{stem}.{name}"))
}

/// Decodes every coded weight of `input` into `<stem>.weight` F32.
pub fn decode_gguf(input: &Path, output: &Path) -> anyhow::Result<usize> {
    let src = GgufFile::open(input)?;
    if src.get_u32("escha.format_version")?.is_none() {
        bail!("{} is not an Escha GGUF (no escha.format_version)", input.display());
    }
    let mut w = GgufWriter::new();
    w.copy_kv(&src);
    w.remove_key("escha.format_version");
    w.remove_key("escha.codebook");
    w.remove_key("escha.apply_bias");
    let is_sidecar = |n: &str| SIDECARS.iter().any(|s| n.ends_with(&format!(".{s}")));
    for t in src.tensors() {
        if let Some(stem) = t.name.strip_suffix(".escha_code") {
            let (k16, oc, ic, e) = (t.ne[0], t.ne[1] * 16, t.ne[2] * 16, t.ne[3]);
            if t.ty != GgmlType::GGML_TYPE_I16 || !(k16 == 32 || k16 == 48) {
                bail!("{}: not an i16 code with ne[0] = 32 or 48", t.name);
            }
            let ne: Vec<i64> = if e > 1 { vec![ic, oc, e] } else { vec![ic, oc] };
            w.add_tensor(&format!("{stem}.weight"), GgmlType::GGML_TYPE_F32, &ne)?;
        } else if !is_sidecar(&t.name) {
            w.add_tensor(&t.name, t.ty, &t.ne[..t.n_dims()])?;
        }
    }
    let mut out = w.create(output)?;
    let mut n = 0;
    for t in src.tensors() {
        let Some(stem) = t.name.strip_suffix(".escha_code") else {
            if !is_sidecar(&t.name) {
                out.write_tensor(&t.name, &src.read(t)?)?;
            }
            continue;
        };
        let (k, oc, ic, e) = ((t.ne[0] / 16) as usize, (t.ne[1] * 16) as usize, (t.ne[2] * 16) as usize, t.ne[3] as usize);
        let code: Vec<i16> = src.read(t)?.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
        let need = |name: &str| leaf(&src, stem, name).with_context(|| format!("{stem}: missing {name}"));
        let f16s = |ti: &TensorInfo| -> anyhow::Result<Vec<f16>> {
            if ti.ty != GgmlType::GGML_TYPE_F16 {
                bail!("{}: type {}, expected f16 (as the loader requires)", ti.name, ti.type_name());
            }
            Ok(src.read_f32(ti)?.into_iter().map(f16::from_f32).collect())
        };
        let s_in = leaf(&src, stem, "escha_s_in").map(|ti| src.read_f32(ti)).transpose()?;
        let s_out = leaf(&src, stem, "escha_s_out").map(|ti| src.read_f32(ti)).transpose()?;
        let coded = Coded {
            stem,
            k,
            ic,
            oc,
            experts: e,
            code: &code,
            rin: &f16s(need("escha_rin")?)?,
            rout: &f16s(need("escha_rout")?)?,
            s_in: s_in.as_deref(),
            s_out: s_out.as_deref(),
        };
        let weights = coded.effective_weights()?;
        out.write_tensor(&format!("{stem}.weight"), bytemuck::cast_slice(&weights))?;
        n += 1;
    }
    out.finish()?;
    Ok(n)
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
/// (row times scale), and `quantization_config` is dropped. Any converter
/// can then read it: the reference for checking an Escha converter.
pub fn decode_hf(input: &Path, output: &Path) -> anyhow::Result<usize> {
    let mut config: Value = serde_json::from_slice(&std::fs::read(input.join("config.json")).with_context(|| format!("{}: no config.json", input.display()))?)?;
    if config.pointer("/quantization_config/quant_method").and_then(Value::as_str).is_none_or(|m| m != "escha" && m != "eschamoe") {
        bail!("{} is not an Escha checkpoint (quantization_config.quant_method is not escha or eschamoe)", input.display());
    }
    if output.exists() {
        bail!("output directory {} already exists", output.display());
    }
    let mut files: Vec<_> = std::fs::read_dir(input)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    let mut tensors = Vec::new();
    for f in files.iter().filter(|p| p.extension().is_some_and(|e| e == "safetensors")) {
        tensors.extend(read_header(f)?);
    }
    let by_name: HashMap<&str, &StTensor> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let get = |name: &str| by_name.get(name).copied();
    let mut w = StWriter::default();
    w.metadata("format", "pt");
    enum Out {
        Code,
        Int8,
        Copy,
    }
    let mut plan: Vec<(&StTensor, Out)> = Vec::new(); // in output order
    for t in &tensors {
        if let Some(stem) = t.name.strip_suffix(".escha_code") {
            let [lead @ .., kt, nt, _] = t.shape.as_slice() else { bail!("{}: rank {} is not 3 or 4", t.name, t.shape.len()) };
            if lead.len() > 1 {
                bail!("{}: rank {} is not 3 or 4", t.name, t.shape.len());
            }
            w.add(&format!("{stem}.weight"), "F32", &[lead, &[nt * 16, kt * 16]].concat())?;
            plan.push((t, Out::Code));
        } else if let Some(stem) = t.name.strip_suffix(".weight_int8") {
            w.add(&format!("{stem}.weight"), "F32", &t.shape)?;
            plan.push((t, Out::Int8));
        } else if t.name.rsplit_once('.').is_some_and(|(_, l)| l.starts_with("escha_")) || t.name.ends_with(".weight_scale") {
            continue;
        } else {
            w.add(&t.name, &t.dtype, &t.shape)?;
            plan.push((t, Out::Copy));
        }
    }
    std::fs::create_dir_all(output)?;
    let mut out = w.create(&output.join("model.safetensors"))?;
    let mut n = 0;
    for (t, what) in plan {
        match what {
            Out::Code => {
                let stem = t.name.strip_suffix(".escha_code").unwrap();
                let need = |l: &str| get(&format!("{stem}.{l}")).with_context(|| format!("{stem}: required leaf {l} is missing"));
                let f16s = |t: &StTensor| -> anyhow::Result<Vec<f16>> {
                    if t.dtype != "F16" {
                        bail!("{}: dtype {}, expected F16", t.name, t.dtype);
                    }
                    Ok(t.read()?.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect())
                };
                let f32s = |l: &str| -> anyhow::Result<Option<Vec<f32>>> {
                    get(&format!("{stem}.{l}")).map(|t| if t.dtype == "F32" { t.read_f32() } else { bail!("{}: dtype {}, expected F32", t.name, t.dtype) }).transpose()
                };
                if t.dtype != "I16" {
                    bail!("{}: dtype {}, escha codes are I16", t.name, t.dtype);
                }
                let code: Vec<i16> = t.read()?.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
                let (s_in, s_out) = (f32s("escha_s_in")?, f32s("escha_s_out")?);
                let s = &t.shape;
                let (k16, nt, kt) = (s[s.len() - 1], s[s.len() - 2], s[s.len() - 3]);
                let coded = Coded {
                    stem,
                    k: k16 / 16,
                    ic: kt * 16,
                    oc: nt * 16,
                    experts: if s.len() == 4 { s[0] } else { 1 },
                    code: &code,
                    rin: &f16s(need("escha_rin")?)?,
                    rout: &f16s(need("escha_rout")?)?,
                    s_in: s_in.as_deref(),
                    s_out: s_out.as_deref(),
                };
                out.write(&format!("{stem}.weight"), bytemuck::cast_slice(&coded.effective_weights()?))?;
                n += 1;
            }
            Out::Int8 => {
                let stem = t.name.strip_suffix(".weight_int8").unwrap();
                let st = get(&format!("{stem}.weight_scale")).with_context(|| format!("{stem}: weight_scale is missing"))?;
                let (rows, cols) = (t.shape[0], t.size / t.shape[0]);
                if t.dtype != "I8" || st.dtype != "F16" || st.shape.iter().product::<usize>() != rows {
                    bail!("{stem}: expected I8 [N, IC] rows and F16 [N] scales");
                }
                let scale: Vec<f32> = st.read()?.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
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
    std::fs::write(output.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    super::hf::copy_side_files(&files, output)?;
    Ok(n)
}
