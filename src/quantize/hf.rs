//! An HF checkpoint directory (config.json + *.safetensors, f16/bf16/f32)
//! to an Escha HF checkpoint directory with the leaf contract of
//! `docs/FORMAT.md` §7, so converters can be tested on checkpoints made
//! here. Coded prefix `P` (the weight name without `.weight`) gets
//! `P.escha_code` I16 `[E?, IC/16, OC/16, 16K]`, `P.escha_rin` /
//! `P.escha_rout` F16 and `P.escha_config` I32; everything else is copied,
//! and `config.json` gains `quantization_config`.
//!
//! The MTP head (`mtp.*` tensors, in the main shards as HF releases carry
//! it or in an `mtp/` folder as the Escha export ships it) is read from
//! either place and written to `mtp/model.safetensors` with its own
//! `mtp/config.json`, the export's layout; it stays uncoded unless a
//! pattern names it ([`plan`]).

use super::plan::{self, Action};
use super::progress::Progress;
use super::{as_bytes, encode_tensor, require_codes, total_tiles, Options, Report};
use crate::output::Output;
use crate::safetensors::{read_header, StTensor, StWriter};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

fn ggml_ne(shape: &[usize]) -> [i64; 4] {
    let mut ne = [1i64; 4];
    for (d, &n) in shape.iter().rev().enumerate().take(4) {
        ne[d] = n as i64;
    }
    ne
}

/// The folder of an Escha export's MTP head, and the prefix of its tensors.
pub(crate) const MTP_DIR: &str = "mtp";
pub(crate) const MTP_PREFIX: &str = "mtp.";

/// The `*.safetensors` files of a checkpoint directory (sorted), its other
/// files, and every tensor: those of the main files, then those of its
/// `mtp/` folder, whose tensors must all be `mtp.*`.
///
/// # Errors
/// Fails when a directory cannot be read or a header is bad
/// ([`read_header`]), when the `mtp/` folder holds a tensor not named
/// `mtp.*`, or when a tensor name occurs twice.
pub(crate) fn checkpoint_tensors(input: &Path) -> anyhow::Result<(Vec<std::path::PathBuf>, Vec<StTensor>)> {
    let listing = |dir: &Path| -> anyhow::Result<Vec<std::path::PathBuf>> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("{}: cannot list the directory", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        v.sort();
        Ok(v)
    };
    let is_st = |p: &&std::path::PathBuf| p.extension().is_some_and(|e| e == "safetensors");
    let files = listing(input)?;
    let mut tensors = Vec::new();
    for f in files.iter().filter(is_st) {
        tensors.extend(read_header(f)?);
    }
    let mtp = input.join(MTP_DIR);
    if mtp.is_dir() {
        for f in listing(&mtp)?.iter().filter(is_st) {
            for t in read_header(f)? {
                if !t.name.starts_with(MTP_PREFIX) {
                    bail!("{}: tensor {} in the MTP folder is not an {MTP_PREFIX}* tensor", f.display(), t.name);
                }
                tensors.push(t);
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for t in &tensors {
        if !seen.insert(t.name.as_str()) {
            bail!("tensor {} occurs twice in {} (main shards and MTP folder?)", t.name, input.display());
        }
    }
    Ok((files, tensors))
}

/// Quantizes the checkpoint in `input` into the new directory `output`.
///
/// # Errors
/// Fails when the output is refused ([`Output::dir`]); when `input` has no
/// readable JSON `config.json` or is already quantized; when it has no
/// `*.safetensors` or a bad header; when a tensor has rank above 4, or one
/// to code is not F32, F16 or BF16; when no tensor matches a coding rule;
/// when an imatrix entry does not fit its tensor or encoding rejects a
/// weight; or when reading or writing fails. No output directory is left
/// then.
pub fn quantize_hf(input: &Path, output: &Path, opts: &Options) -> anyhow::Result<Report> {
    let started = Instant::now();
    let out_dir = Output::dir(output, &[input])?;
    let cfg_path = input.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&cfg_path).with_context(|| format!("{}: an HF checkpoint needs config.json", input.display()))?)
        .with_context(|| format!("{} is not JSON", cfg_path.display()))?;
    if let Some(m) = config.pointer("/quantization_config/quant_method").and_then(Value::as_str) {
        bail!("{} is already quantized (quant_method {m})", input.display());
    }
    let (files, tensors) = checkpoint_tensors(input)?;
    if tensors.is_empty() {
        bail!("{}: no *.safetensors files", input.display());
    }
    let mut report = Report { in_bytes: tensors.iter().map(|t| t.size as u64).sum(), ..Report::default() };
    let mut actions = Vec::new();
    let mut ignore = Vec::new();
    for t in &tensors {
        if t.shape.len() > 4 {
            bail!("tensor {}: rank {} is not supported", t.name, t.shape.len());
        }
        let a = plan::action(&opts.rules, &t.name, &ggml_ne(&t.shape), t.shape.len().max(1));
        match &a {
            Action::Code { .. } if !t.convertible() => {
                bail!("tensor {}: dtype {} cannot be coded (F32, F16 or BF16 expected; exclude it with --exclude)", t.name, t.dtype)
            }
            Action::Skip(why) => report.skipped.push((t.name.clone(), why.clone())),
            _ => {}
        }
        if plan::is_candidate(&t.name, t.shape.len()) && !matches!(a, Action::Code { .. }) && t.name.contains("proj") {
            ignore.push(plan::stem(&t.name).to_string());
        }
        actions.push(a);
    }
    require_codes(&actions, input)?;

    // Two output files: the trunk, and the MTP head in mtp/ (when there is one).
    let is_mtp = |t: &StTensor| t.name.starts_with(MTP_PREFIX);
    let n_mtp = tensors.iter().filter(|t| is_mtp(t)).count();
    let mut w = [StWriter::default(), StWriter::default()];
    for w in &mut w {
        w.metadata("format", "pt");
    }
    for (t, a) in tensors.iter().zip(&actions) {
        let w = &mut w[is_mtp(t) as usize];
        match *a {
            Action::Code { k, ic, oc, experts } => {
                let p = plan::stem(&t.name);
                let lead: Vec<usize> = if t.shape.len() == 3 { vec![experts] } else { vec![] };
                let with = |v: &[usize]| [lead.as_slice(), v].concat();
                w.add(&format!("{p}.escha_code"), "I16", &with(&[ic / 16, oc / 16, 16 * k]))?;
                w.add(&format!("{p}.escha_rin"), "F16", &with(&[ic]))?;
                w.add(&format!("{p}.escha_rout"), "F16", &with(&[oc]))?;
                w.add(&format!("{p}.escha_config"), "I32", &[if lead.is_empty() { 6 } else { 9 }])?;
            }
            _ => w.add(&t.name, &t.dtype, &t.shape)?,
        }
    }
    let partial = out_dir.path();
    let progress = Progress::start(total_tiles(&actions), opts.show_progress);
    let result = (|| -> anyhow::Result<()> {
        let [main, head] = w;
        let mut outs = vec![main.create(&partial.join("model.safetensors"))?];
        if n_mtp > 0 {
            std::fs::create_dir(partial.join(MTP_DIR))?;
            outs.push(head.create(&partial.join(MTP_DIR).join("model.safetensors"))?);
        }
        let mut moe = false;
        for (t, a) in tensors.iter().zip(&actions) {
            let out = &mut outs[is_mtp(t) as usize];
            let Action::Code { k, ic, oc, experts } = *a else {
                out.write(&t.name, &t.read()?)?;
                report.copied += 1;
                continue;
            };
            progress.set_label(&t.name);
            let c = encode_tensor(&t.name, t.dtype.to_lowercase(), || t.read_f32(), (k, ic, oc, experts), opts, &progress, &mut report)?;
            let p = plan::stem(&t.name);
            let config: Vec<i32> = if t.shape.len() == 3 {
                moe = true;
                vec![16, k as i32, 2, 1, experts as i32, ic as i32, oc as i32, ic as i32, oc as i32]
            } else {
                vec![16, k as i32, 2, 1, ic as i32, oc as i32]
            };
            out.write(&format!("{p}.escha_code"), as_bytes(&c.code))?;
            out.write(&format!("{p}.escha_rin"), as_bytes(&c.rin))?;
            out.write(&format!("{p}.escha_rout"), as_bytes(&c.rout))?;
            out.write(&format!("{p}.escha_config"), as_bytes(&config))?;
        }
        for out in outs {
            out.finish()?;
        }
        if n_mtp > 0 {
            write_mtp_config(input, partial, &tensors)?;
        }
        config["quantization_config"] = json!({
            "quant_method": if moe { "eschamoe" } else { "escha" },
            "format_version": "2.0",
            "ignore": ignore,
        });
        std::fs::write(partial.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
        copy_side_files(&files, partial)
    })();
    progress.finish();
    result?;
    out_dir.commit()?;
    report.out_bytes = std::fs::metadata(output.join("model.safetensors"))?.len();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// `mtp/config.json` of the output: the input's own, or one giving the
/// number of MTP layers (`mtp.layers.N.*`).
fn write_mtp_config(input: &Path, out: &Path, tensors: &[StTensor]) -> anyhow::Result<()> {
    let dst = out.join(MTP_DIR).join("config.json");
    let src = input.join(MTP_DIR).join("config.json");
    if src.is_file() {
        std::fs::copy(&src, &dst)?;
        return Ok(());
    }
    let layers = tensors
        .iter()
        .filter_map(|t| t.name.strip_prefix("mtp.layers.")?.split('.').next()?.parse::<usize>().ok())
        .max()
        .map_or(0, |n| n + 1);
    std::fs::write(dst, serde_json::to_vec_pretty(&json!({ "mtp_num_hidden_layers": layers }))?)?;
    Ok(())
}

/// Copies a checkpoint's side files (tokenizer, generation config, ...):
/// every file but the weights, their index and config.json.
pub(crate) fn copy_side_files(files: &[std::path::PathBuf], dir: &Path) -> anyhow::Result<()> {
    for f in files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        let skip = f.extension().is_some_and(|e| e == "safetensors") || name == "config.json" || name == "model.safetensors.index.json";
        if f.is_file() && !skip {
            std::fs::copy(f, dir.join(&*name))?;
        }
    }
    Ok(())
}
