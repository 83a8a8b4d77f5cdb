//! `escha decode`: an Escha GGUF back to a plain GGUF whose coded weights
//! are the decoded effective weights (F32), for exactness checks of the
//! escha ops inside llama.cpp against its own matrix multiply.

use crate::encode::effective_weight;
use crate::gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo};
use crate::validate::LinearShape;
use anyhow::{bail, Context};
use half::f16;
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
        let shape = LinearShape::new(stem, k, ic, oc)?;
        let code: Vec<i16> = src.read(t)?.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
        let need = |name: &str| leaf(&src, stem, name).with_context(|| format!("{stem}: missing {name}"));
        let f16s = |ti: &TensorInfo| -> anyhow::Result<Vec<f16>> {
            Ok(src.read_f32(ti)?.into_iter().map(f16::from_f32).collect())
        };
        let (rin, rout) = (f16s(need("escha_rin")?)?, f16s(need("escha_rout")?)?);
        let s_in = leaf(&src, stem, "escha_s_in").map(|ti| src.read_f32(ti)).transpose()?;
        let s_out = leaf(&src, stem, "escha_s_out").map(|ti| src.read_f32(ti)).transpose()?;
        crate::validate::check_len(stem, "rin", rin.len(), ic * e)?;
        crate::validate::check_len(stem, "rout", rout.len(), oc * e)?;
        // Per-channel scales: one vector per expert, or one shared by all.
        let per_expert = |what: &'static str, v: &Option<Vec<f32>>, n: usize| -> anyhow::Result<()> {
            match v {
                Some(v) if v.len() != n && v.len() != n * e => Err(crate::EschaError::BadLength { tensor: stem.into(), what, got: v.len(), expected: n * e }.into()),
                _ => Ok(()),
            }
        };
        per_expert("s_in", &s_in, ic)?;
        per_expert("s_out", &s_out, oc)?;
        let slice = |v: &Option<Vec<f32>>, n: usize, x: usize| v.as_ref().map(|v| if v.len() == n { v.clone() } else { v[x * n..(x + 1) * n].to_vec() });
        let mut weights = Vec::with_capacity(ic * oc * e);
        for x in 0..e {
            let mut we = effective_weight(&code[x * shape.code_len()..(x + 1) * shape.code_len()], shape, &rin[x * ic..(x + 1) * ic], &rout[x * oc..(x + 1) * oc]);
            if let Some(si) = slice(&s_in, ic, x) {
                we.chunks_exact_mut(ic).for_each(|row| row.iter_mut().zip(&si).for_each(|(a, b)| *a *= b));
            }
            if let Some(so) = slice(&s_out, oc, x) {
                we.chunks_exact_mut(ic).zip(&so).for_each(|(row, b)| row.iter_mut().for_each(|a| *a *= b));
            }
            weights.extend(we);
        }
        out.write_tensor(&format!("{stem}.weight"), bytemuck::cast_slice(&weights))?;
        n += 1;
    }
    out.finish()?;
    Ok(n)
}
