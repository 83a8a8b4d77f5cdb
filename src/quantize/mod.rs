//! `escha quantize`: an f16 / bf16 / f32 (or dequantizable) GGUF to an
//! Escha-W2 GGUF in the tensor contract of `docs/FORMAT.md` §8.
//! - [`plan`]: which tensors are coded with which K (glob rules);
//! - [`imatrix`]: llama.cpp importance matrices;
//! - [`progress`]: the progress bar.
//!
//! Every coded projection `<stem>.weight` becomes `<stem>.escha_code` (I16),
//! `<stem>.escha_rin` and `<stem>.escha_rout` (F16), in the same place of
//! the tensor list; every other tensor and every metadata key is copied.
//! Output is streamed tensor by tensor into `OUT.partial` and renamed when
//! complete ([`crate::output`]), so a failed run never leaves a
//! plausible-looking file.

pub mod decode;
pub mod hf;
pub mod imatrix;
pub mod plan;
pub mod progress;

use crate::encode::{encode_layer, LayerOptions};
use crate::gguf::{self, GgmlType, GgufFile, GgufWriter};
use crate::output::Output;
use anyhow::{bail, Context};
use half::f16;
use imatrix::Imatrix;
use plan::{Action, Rules};
use progress::Progress;
use std::path::Path;
use std::time::Instant;

/// Settings of one quantization run.
pub struct Options {
    pub rules: Rules,
    pub threads: usize,
    pub seed: u64,
    pub imatrix: Option<Imatrix>,
    pub show_progress: bool,
    /// A twin for speed measurements only: every projection the rules code
    /// gets random code words (each a valid code), `rin` 1 and `rout`
    /// [`RANDOM_ROUT`], with no encoding (seconds, not hours, for a real
    /// model's layout); the report's errors are then NaN.
    pub random_codes: bool,
}

/// `rout` of a random-code twin: small enough that activations stay finite
/// through many layers of random weights.
pub const RANDOM_ROUT: f32 = 0.02;

impl Default for Options {
    fn default() -> Self {
        Self {
            rules: Rules::default(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            seed: 0,
            imatrix: None,
            show_progress: false,
            random_codes: false,
        }
    }
}

/// One coded tensor in the final table.
#[derive(Clone, Debug)]
pub struct Coded {
    pub name: String,
    pub source_type: String,
    pub k: usize,
    pub ic: usize,
    pub oc: usize,
    pub experts: usize,
    /// Code plus rin/rout bits per weight.
    pub bpw: f64,
    /// Worst (over experts) relative Frobenius error of the effective weight.
    pub rel_error: f64,
    /// The same weighted by the imatrix, when one was given.
    pub weighted_error: Option<f64>,
    pub seconds: f64,
    /// Channels (over experts) whose scale saturated at the largest f16.
    pub saturated_channels: usize,
    /// Nonzero output channels too small for f16 scales, coded as pruned.
    pub zeroed_channels: usize,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub coded: Vec<Coded>,
    /// Tensors a rule matched that could not be coded, with the reason.
    pub skipped: Vec<(String, String)>,
    pub copied: usize,
    pub tiles: usize,
    pub seconds: f64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    /// Coded tensors without an imatrix entry (when an imatrix was given).
    pub no_importance: Vec<String>,
    /// The codes are random ([`Options::random_codes`]).
    pub random_codes: bool,
}

/// File type of the non-coded weights (`llama_ftype`), for files that do
/// not declare one: the most common type among the copied 2-D weights.
fn guess_file_type(src: &GgufFile, coded: &[bool]) -> u32 {
    let mut counts = std::collections::HashMap::<u32, usize>::new();
    for (t, &c) in src.tensors().iter().zip(coded) {
        if !c && t.n_dims() >= 2 {
            let ft = match t.ty {
                GgmlType::GGML_TYPE_F32 => 0,
                GgmlType::GGML_TYPE_F16 => 1,
                GgmlType::GGML_TYPE_Q8_0 => 7,
                GgmlType::GGML_TYPE_BF16 => 32,
                _ => continue,
            };
            *counts.entry(ft).or_default() += t.n_elements();
        }
    }
    counts.into_iter().max_by_key(|&(_, n)| n).map_or(1, |(ft, _)| ft)
}

/// Deterministic per-tensor seed (FNV-1a of the name), so each tensor gets
/// its own random signs and reruns give identical files.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(0xcbf29ce484222325u64 ^ seed, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// One tensor's codes and sidecars, expert after expert.
struct CodedTensor {
    code: Vec<i16>,
    rin: Vec<f16>,
    rout: Vec<f16>,
}

/// Codes the weights `read` gives (`experts` matrices `[OC, IC]`) and
/// records it in `report`; random codes need no weights, so `read` is then
/// not called.
fn encode_tensor(
    name: &str,
    source_type: String,
    read: impl FnOnce() -> anyhow::Result<Vec<f32>>,
    (k, ic, oc, experts): (usize, usize, usize, usize),
    opts: &Options,
    progress: &Progress,
    report: &mut Report,
) -> anyhow::Result<CodedTensor> {
    let t0 = Instant::now();
    let mut c = CodedTensor { code: Vec::new(), rin: Vec::new(), rout: Vec::new() };
    let (mut worst, mut worst_w) = (0f64, None::<f64>);
    let (mut saturated, mut zeroed) = (0, 0);
    let w = if opts.random_codes { Vec::new() } else { read()? };
    for e in 0..experts {
        if opts.random_codes {
            let mut rng = crate::rng::Rng::new(tensor_seed(opts.seed, name).wrapping_add(e as u64));
            c.code.extend_from_slice(&rng.code(ic / 16 * (oc / 16) * 16 * k));
            c.rin.extend(std::iter::repeat_n(f16::ONE, ic));
            c.rout.extend(std::iter::repeat_n(f16::from_f32(RANDOM_ROUT), oc));
            worst = f64::NAN;
            report.random_codes = true;
            continue;
        }
        let imp = match &opts.imatrix {
            Some(m) => m.get(name, e, ic)?,
            None => None,
        };
        if opts.imatrix.is_some() && imp.is_none() && e == 0 {
            report.no_importance.push(name.to_string());
        }
        let lo = LayerOptions {
            k,
            threads: opts.threads,
            seed: tensor_seed(opts.seed, name).wrapping_add(e as u64),
            importance: imp,
            progress: Some(&progress.tiles),
        };
        let shown = if experts > 1 { format!("{name} (expert {e})") } else { name.to_string() };
        let enc = encode_layer(&shown, &w[e * ic * oc..(e + 1) * ic * oc], ic, oc, &lo).with_context(|| format!("coding {shown}"))?;
        worst = worst.max(enc.rel_error);
        worst_w = enc.weighted_rel_error.map(|v| worst_w.map_or(v, |m| m.max(v)));
        saturated += enc.saturated_channels;
        zeroed += enc.zeroed_channels;
        c.code.extend_from_slice(&enc.code);
        c.rin.extend_from_slice(&enc.rin);
        c.rout.extend_from_slice(&enc.rout);
    }
    let bits = (c.code.len() * 16 + (c.rin.len() + c.rout.len()) * 16) as f64;
    report.tiles += ic / 16 * (oc / 16) * experts;
    report.coded.push(Coded {
        name: name.to_string(),
        source_type,
        k,
        ic,
        oc,
        experts,
        bpw: bits / (ic * oc * experts) as f64,
        rel_error: worst,
        weighted_error: worst_w,
        seconds: t0.elapsed().as_secs_f64(),
        saturated_channels: saturated,
        zeroed_channels: zeroed,
    });
    Ok(c)
}

fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// `rules` with the GGUF's nextn (MTP) blocks as towers: the last
/// `<arch>.nextn_predict_layers` of `<arch>.block_count` blocks.
fn with_nextn_towers(src: &GgufFile, rules: &plan::Rules) -> anyhow::Result<plan::Rules> {
    let Some(arch) = src.get_str("general.architecture")? else { return Ok(rules.clone()) };
    let nextn = src.get_u32(&format!("{arch}.nextn_predict_layers"))?.unwrap_or(0);
    if nextn == 0 {
        return Ok(rules.clone());
    }
    let blocks = src.get_u32(&format!("{arch}.block_count"))?.unwrap_or(0);
    if nextn > blocks {
        bail!("{arch}.nextn_predict_layers = {nextn} exceeds {arch}.block_count = {blocks}");
    }
    Ok(rules.clone().with_gguf_towers(blocks - nextn, nextn))
}

/// A plan must code something; otherwise the rules or the file are wrong.
fn require_codes(actions: &[Action], input: &Path) -> anyhow::Result<()> {
    if !actions.iter().any(|a| matches!(a, Action::Code { .. })) {
        bail!("no tensor of {} matches a coding rule with codable dims (see --k2/--k3)", input.display());
    }
    Ok(())
}

/// Tiles to encode under a plan.
fn total_tiles(actions: &[Action]) -> usize {
    actions.iter().map(|a| if let Action::Code { ic, oc, experts, .. } = a { ic / 16 * (oc / 16) * experts } else { 0 }).sum()
}

/// Quantizes `input` into `output`.
///
/// # Errors
/// Fails when the output is refused ([`Output::file`]); when `input` is not
/// a readable GGUF or is already an Escha GGUF; when a tensor to code cannot
/// be converted to f32, or no tensor matches a coding rule; when an imatrix
/// entry does not fit its tensor or encoding rejects a weight
/// ([`encode_layer`]); when the written file fails
/// [`crate::contract::check`]; or when reading or writing fails. `output`
/// is then left as it was.
pub fn quantize_gguf(input: &Path, output: &Path, opts: &Options) -> anyhow::Result<Report> {
    let started = Instant::now();
    let out_file = Output::file(output, &[input])?;
    let src = GgufFile::open(input)?;
    if src.get_u32("escha.format_version")?.is_some() {
        bail!("{} is already an Escha GGUF (escha.format_version is set)", input.display());
    }
    // Plan everything first: bad input fails before hours of encoding.
    let mut report = Report { in_bytes: std::fs::metadata(input)?.len(), ..Report::default() };
    let rules = with_nextn_towers(&src, &opts.rules)?;
    let mut actions = Vec::new();
    for t in src.tensors() {
        let a = plan::action(&rules, &t.name, &t.ne, t.n_dims());
        if let Action::Code { .. } = a {
            if !gguf::can_convert(t.ty) {
                bail!("tensor {}: type {} cannot be converted to f32, so it cannot be coded (exclude it with --exclude)", t.name, t.type_name());
            }
        }
        if let Action::Skip(why) = &a {
            report.skipped.push((t.name.clone(), why.clone()));
        }
        actions.push(a);
    }
    require_codes(&actions, input)?;

    let mut w = GgufWriter::new();
    w.copy_kv(&src);
    w.set_u32("escha.format_version", 2);
    w.set_u32("escha.codebook", 1);
    let coded_mask: Vec<bool> = actions.iter().map(|a| matches!(a, Action::Code { .. })).collect();
    let ft = match src.get_u32("general.file_type")? {
        Some(ft) => ft,
        None => guess_file_type(&src, &coded_mask),
    };
    w.set_u32("general.file_type", ft);
    for (t, a) in src.tensors().iter().zip(&actions) {
        match *a {
            Action::Code { k, ic, oc, experts } => {
                let stem = plan::stem(&t.name);
                let e = experts as i64;
                let (ic, oc) = (ic as i64, oc as i64);
                let dims = |v: &[i64]| -> Vec<i64> { if experts > 1 { [v, &[e]].concat() } else { v.to_vec() } };
                w.add_tensor(&format!("{stem}.escha_code"), GgmlType::GGML_TYPE_I16, &dims(&[16 * k as i64, oc / 16, ic / 16]))?;
                w.add_tensor(&format!("{stem}.escha_rin"), GgmlType::GGML_TYPE_F16, &dims(&[ic]))?;
                w.add_tensor(&format!("{stem}.escha_rout"), GgmlType::GGML_TYPE_F16, &dims(&[oc]))?;
            }
            _ => w.add_tensor(&t.name, t.ty, &t.ne[..t.n_dims()])?,
        }
    }

    let mut out = w.create(out_file.path())?;
    let progress = Progress::start(total_tiles(&actions), opts.show_progress);
    let result = (|| -> anyhow::Result<()> {
        for (t, a) in src.tensors().iter().zip(&actions) {
            let Action::Code { k, ic, oc, experts } = *a else {
                out.write_tensor(&t.name, &src.read(t)?)?;
                report.copied += 1;
                continue;
            };
            progress.set_label(&t.name);
            let c = encode_tensor(&t.name, t.type_name(), || Ok(src.read_f32(t)?), (k, ic, oc, experts), opts, &progress, &mut report)?;
            let stem = plan::stem(&t.name);
            out.write_tensor(&format!("{stem}.escha_code"), as_bytes(&c.code))?;
            out.write_tensor(&format!("{stem}.escha_rin"), as_bytes(&c.rin))?;
            out.write_tensor(&format!("{stem}.escha_rout"), as_bytes(&c.rout))?;
        }
        out.finish()?;
        Ok(())
    })();
    progress.finish();
    result?;
    // What the loader will check, before the file takes its place.
    crate::contract::check(&GgufFile::open(out_file.path())?).context("checking the written file")?;
    out_file.commit()?;
    report.out_bytes = std::fs::metadata(output)?.len();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

impl Report {
    /// Coded weights and their total bits.
    pub fn coded_weights(&self) -> (usize, f64) {
        self.coded.iter().fold((0, 0.0), |(n, b), c| {
            let w = c.ic * c.oc * c.experts;
            (n + w, b + c.bpw * w as f64)
        })
    }

    /// The human-readable summary: per-tensor table, skipped tensors, totals.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let wtd = self.coded.iter().any(|c| c.weighted_error.is_some());
        let nw = self.coded.iter().map(|c| c.name.len()).max().unwrap_or(0).max(6);
        let _ = writeln!(
            s,
            "{:<nw$} {:>6} {:>2} {:>13} {:>6} {:>8}{} {:>7}",
            "tensor",
            "from",
            "K",
            "IC x OC (xE)",
            "bpw",
            "rel err",
            if wtd { "  imat err" } else { "" },
            "time"
        );
        for c in &self.coded {
            let shape = if c.experts > 1 { format!("{}x{}x{}", c.ic, c.oc, c.experts) } else { format!("{}x{}", c.ic, c.oc) };
            let we = match (wtd, c.weighted_error) {
                (true, Some(v)) => format!("  {v:>8.4}"),
                (true, None) => format!("  {:>8}", "-"),
                _ => String::new(),
            };
            let _ = writeln!(s, "{:<nw$} {:>6} {:>2} {:>13} {:>6.3} {:>8.4}{we} {:>6.1}s", c.name, c.source_type, c.k, shape, c.bpw, c.rel_error, c.seconds);
        }
        for (name, why) in &self.skipped {
            let _ = writeln!(s, "skipped (copied unchanged): {name}: {why}");
        }
        if self.random_codes {
            let _ = writeln!(s, "random codes (--random-codes): a twin for speed measurements only, not these weights");
        }
        for c in self.coded.iter().filter(|c| c.saturated_channels + c.zeroed_channels > 0) {
            let _ = writeln!(
                s,
                "out of f16 range: {}: {} channels clipped at the largest f16 scale, {} channels too small for any f16 scale coded as zero",
                c.name, c.saturated_channels, c.zeroed_channels
            );
        }
        for name in &self.no_importance {
            let _ = writeln!(s, "no imatrix entry (coded without importance): {name}");
        }
        let (n, bits) = self.coded_weights();
        let err = self.coded.iter().map(|c| c.rel_error * c.rel_error * (c.ic * c.oc * c.experts) as f64).sum::<f64>();
        let _ = writeln!(
            s,
            "coded {} tensors, {:.1} M weights at {:.3} bits/weight (weight-averaged rel err {:.4}); copied {}; skipped {}",
            self.coded.len(),
            n as f64 / 1e6,
            bits / n.max(1) as f64,
            (err / n.max(1) as f64).sqrt(),
            self.copied,
            self.skipped.len()
        );
        let _ = writeln!(
            s,
            "{} tiles in {:.1} s ({:.1} tiles/s); file {:.1} MiB -> {:.1} MiB",
            self.tiles,
            self.seconds,
            self.tiles as f64 / self.seconds.max(1e-9),
            self.in_bytes as f64 / 1048576.0,
            self.out_bytes as f64 / 1048576.0
        );
        s
    }
}
