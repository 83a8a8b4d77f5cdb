//! Files that break one rule of the contract each, made from a valid Escha
//! GGUF: the list that `escha decode` (tests/bad_input.rs) and llama.cpp's
//! loader (tests/qwen35-e2e.sh, through `examples/contract_cases.rs`) must
//! both refuse, naming the same key or tensor.

use crate::gguf::{GgmlType, GgufFile, GgufWriter};
use anyhow::{bail, Context, Result};
use half::f16;
use std::path::Path;

/// One way to break a file.
#[derive(Clone, Copy, Debug)]
pub enum Edit {
    /// A non-finite value at index 3 of leaf `.0` (`escha_s_in` / `escha_s_out`
    /// / `bias` are added, all ones, when absent).
    NonFinite(&'static str, f32),
    /// A u32 key set to a value.
    Key(&'static str, u32),
    /// `escha.apply_bias` as a string.
    ApplyBiasNotBool,
    /// An extra `S.escha_rotation` F32 `[4]`.
    UnknownLeaf,
    /// `S.escha_rin` reshaped to `{IC/2, 2}`.
    RinTwoDims,
    /// `S.escha_rout` half as long as OC.
    RoutShort,
    /// `S.escha_s_in` added as F16.
    SInF16,
    /// `S.escha_rin` stored as F32.
    RinF32,
    /// `S.escha_code` dropped, its sidecars kept.
    NoCode,
    /// `S.escha_code` stored as F16 bits.
    CodeF16,
    /// `S.bias` added as I16.
    BiasI16,
    /// `S.weight` (F16 zeros) added beside the code.
    WeightAndCode,
    /// A copy of the stem's code and sidecars under `blk.99.<name>`, a
    /// layer no model has (loader only: without an architecture the file is
    /// well formed).
    Orphan,
}

/// A case: what it edits and what the refusal must name.
#[derive(Clone, Debug)]
pub struct Case {
    pub id: &'static str,
    pub edit: Edit,
    /// The key or tensor the error names; `{S}` is the stem.
    pub names: String,
    /// Only llama.cpp's loader can see this one.
    pub loader_only: bool,
}

/// Every case, for the stem `stem` (a coded weight of the file).
pub fn all(stem: &str) -> Vec<Case> {
    let case = |id, edit, names: &str| Case { id, edit, names: names.replace("{S}", stem), loader_only: false };
    let mut v = vec![
        case("rin-nan", Edit::NonFinite("escha_rin", f32::NAN), "{S}.escha_rin"),
        case("rin-inf", Edit::NonFinite("escha_rin", f32::INFINITY), "{S}.escha_rin"),
        case("rout-nan", Edit::NonFinite("escha_rout", f32::NAN), "{S}.escha_rout"),
        case("rout-inf", Edit::NonFinite("escha_rout", f32::NEG_INFINITY), "{S}.escha_rout"),
        case("s-in-nan", Edit::NonFinite("escha_s_in", f32::NAN), "{S}.escha_s_in"),
        case("s-in-inf", Edit::NonFinite("escha_s_in", f32::INFINITY), "{S}.escha_s_in"),
        case("s-out-nan", Edit::NonFinite("escha_s_out", f32::NAN), "{S}.escha_s_out"),
        case("s-out-inf", Edit::NonFinite("escha_s_out", f32::INFINITY), "{S}.escha_s_out"),
        case("bias-nan", Edit::NonFinite("bias", f32::NAN), "{S}.bias"),
        case("bias-inf", Edit::NonFinite("bias", f32::INFINITY), "{S}.bias"),
        case("format-version", Edit::Key("escha.format_version", 3), "escha.format_version"),
        case("codebook", Edit::Key("escha.codebook", 2), "escha.codebook"),
        case("apply-bias-type", Edit::ApplyBiasNotBool, "escha.apply_bias"),
        case("unknown-leaf", Edit::UnknownLeaf, "{S}.escha_rotation"),
        case("rin-2d", Edit::RinTwoDims, "{S}.escha_rin"),
        case("rout-short", Edit::RoutShort, "{S}.escha_rout"),
        case("s-in-f16", Edit::SInF16, "{S}.escha_s_in"),
        case("rin-f32", Edit::RinF32, "{S}.escha_rin"),
        case("no-code", Edit::NoCode, "{S}"),
        case("code-f16", Edit::CodeF16, "{S}.escha_code"),
        case("bias-i16", Edit::BiasI16, "{S}.bias"),
        case("weight-and-code", Edit::WeightAndCode, "{S}.weight"),
    ];
    let leaf = stem.rsplit_once('.').map_or(stem, |(_, l)| l);
    v.push(Case { id: "orphan", edit: Edit::Orphan, names: format!("blk.99.{leaf}.escha_"), loader_only: true });
    v
}

/// The first coded stem of a file.
pub fn first_stem(src: &GgufFile) -> Option<String> {
    src.tensors().iter().find_map(|t| t.name.strip_suffix(".escha_code").map(str::to_string))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect()
}

/// A tensor to write: name, type, ne, bytes.
type Out = (String, GgmlType, Vec<i64>, Vec<u8>);

/// Writes `src` with `case` applied to stem `stem` into `out`.
pub fn write(src: &GgufFile, stem: &str, case: &Case, out: &Path) -> Result<()> {
    let code = src.tensor(&format!("{stem}.escha_code")).with_context(|| format!("{stem}.escha_code: not in {}", src.path().display()))?;
    let (oc, ic, e) = (code.ne[1] * 16, code.ne[2] * 16, code.ne[3]);
    let dims = |n: i64| if e > 1 { vec![n, e] } else { vec![n] };
    let name = |leaf: &str| format!("{stem}.{leaf}");
    let mut tensors: Vec<Out> = Vec::new();
    for t in src.tensors() {
        tensors.push((t.name.clone(), t.ty, t.ne[..t.n_dims()].to_vec(), src.read(t)?));
    }
    let find = |ts: &[Out], n: &str| ts.iter().position(|t| t.0 == n);
    let mut w = GgufWriter::new();
    w.copy_kv(src);
    match case.edit {
        Edit::NonFinite(leaf, value) => {
            let n = name(leaf);
            if find(&tensors, &n).is_none() {
                let len = if leaf == "escha_s_in" { ic } else { oc };
                tensors.push((n.clone(), GgmlType::GGML_TYPE_F32, dims(len), f32_bytes(&vec![1.0; (len * e) as usize])));
            }
            let i = find(&tensors, &n).context("added above")?;
            let t = &mut tensors[i];
            match t.1 {
                GgmlType::GGML_TYPE_F32 => t.3[12..16].copy_from_slice(&value.to_le_bytes()),
                GgmlType::GGML_TYPE_F16 => t.3[6..8].copy_from_slice(&f16::from_f32(value).to_le_bytes()),
                other => bail!("{n}: type {other:?} in the source"),
            }
        }
        Edit::Key(key, value) => w.set_u32(key, value),
        Edit::ApplyBiasNotBool => w.set_str("escha.apply_bias", "yes"),
        Edit::UnknownLeaf => tensors.push((name("escha_rotation"), GgmlType::GGML_TYPE_F32, vec![4], f32_bytes(&[0.0; 4]))),
        Edit::RinTwoDims => {
            let i = find(&tensors, &name("escha_rin")).context("no rin")?;
            tensors[i].2 = vec![ic / 2, 2 * e];
        }
        Edit::RoutShort => {
            let i = find(&tensors, &name("escha_rout")).context("no rout")?;
            tensors[i].2 = dims(oc / 2);
            tensors[i].3 = f16_bytes(&vec![1.0; (oc / 2 * e) as usize]);
        }
        Edit::SInF16 => tensors.push((name("escha_s_in"), GgmlType::GGML_TYPE_F16, dims(ic), f16_bytes(&vec![1.0; (ic * e) as usize]))),
        Edit::RinF32 => {
            let i = find(&tensors, &name("escha_rin")).context("no rin")?;
            let v: Vec<f32> = tensors[i].3.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
            tensors[i].1 = GgmlType::GGML_TYPE_F32;
            tensors[i].3 = f32_bytes(&v);
        }
        Edit::NoCode => tensors.retain(|t| t.0 != code.name),
        Edit::CodeF16 => {
            let i = find(&tensors, &code.name).context("no code")?;
            tensors[i].1 = GgmlType::GGML_TYPE_F16;
        }
        Edit::BiasI16 => {
            tensors.retain(|t| t.0 != name("bias"));
            tensors.push((name("bias"), GgmlType::GGML_TYPE_I16, dims(oc), vec![0; (2 * oc * e) as usize]));
        }
        Edit::WeightAndCode => {
            let ne = if e > 1 { vec![ic, oc, e] } else { vec![ic, oc] };
            tensors.push((name("weight"), GgmlType::GGML_TYPE_F16, ne, vec![0; (2 * ic * oc * e) as usize]));
        }
        Edit::Orphan => {
            let leaf = stem.rsplit_once('.').map_or(stem, |(_, l)| l);
            let copies: Vec<Out> = tensors
                .iter()
                .filter(|t| t.0.strip_prefix(stem).is_some_and(|r| r.starts_with(".escha_")))
                .map(|t| (format!("blk.99.{leaf}{}", &t.0[stem.len()..]), t.1, t.2.clone(), t.3.clone()))
                .collect();
            tensors.extend(copies);
        }
    }
    for t in &tensors {
        w.add_tensor(&t.0, t.1, &t.2)?;
    }
    let mut s = w.create(out)?;
    for t in &tensors {
        s.write_tensor(&t.0, &t.3)?;
    }
    s.finish()?;
    Ok(())
}
