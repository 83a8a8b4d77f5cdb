//! `escha`: the codec and the dense forward paths on the raw little-endian
//! golden files of docs/FORMAT.md §10, for cross-checking other
//! implementations (llama.cpp / ggml, the vendor's Python) against this one.
//!
//! Exit status: 0 success, 1 error or `--compare` found differences,
//! 2 command-line mistake.

use anyhow::{anyhow, bail, Result};
use escha_ggml::codec::{self, TILE, TILE_VALUES};
use escha_ggml::cpu::{CpuLinear, Isa, Kernel};
use escha_ggml::reference::{self, Linear};
use escha_ggml::output::Output;
use escha_ggml::{cref, rawio, LinearShape};
use half::f16;
use std::ffi::OsString;
use std::fmt;
use std::path::Path;
use std::process::ExitCode;

const USAGE: &str = "\
escha: Escha-W2 trellis weights on raw little-endian files (docs/FORMAT.md §10)

usage:
  escha reconstruct CODE.i16 (--ic IC --oc OC | --rin RIN.f16 --rout ROUT.f16) -o W.f16
                    [--compare GOLD.f16]
      Decode a code [IC/16, OC/16, 16K] into W_bare [IC, OC] (f16).
      K (2 or 3) follows from the file length.
      e.g. escha reconstruct q_proj.i16 --ic 4096 --oc 4096 -o w.f16 --compare w_gold.f16

  escha linear --code CODE.i16 --rin RIN.f16 --rout ROUT.f16 [--s-in S.f32] [--s-out S.f32]
               [--bias B.f16|B.f32] [--no-bias] --x X.f16|X.f32 -o Y.f16
               [--impl reference|c|cpu] [--isa scalar|avx2|avx512|avx512vbmi|avx512fp16|neon|neonfp16] [--compare GOLD.f16]
      y [M, OC] = the coded linear applied to x [M, IC]; IC = len(rin), OC = len(rout).
      --impl: reference (default, the contract), c (the linked C reference) or cpu
      (the SIMD kernels; --isa picks a path, default the best of this machine).
      e.g. escha linear --code c.i16 --rin rin.f16 --rout rout.f16 --x x.f32 -o y.f16 --impl cpu

  escha info CODE.i16 (--ic IC --oc OC | --rin RIN.f16 --rout ROUT.f16)
      K, shapes, and the first tile decoded as a 16x16 grid (rows = inputs).
      e.g. escha info q_proj.i16 --ic 4096 --oc 4096

  escha quantize IN.gguf OUT.gguf [--k2 PATTERN]... [--k3 PATTERN]... [--exclude PATTERN]...
                 [--imatrix FILE] [--threads N] [--seed N] [--no-progress] [--random-codes]
  escha quantize IN_DIR OUT_DIR [same options]
      Code the projections of an f16/bf16/f32 (or dequantizable) GGUF as Escha-W2
      (docs/FORMAT.md §8); everything else is copied. Given an HF checkpoint directory
      (config.json + *.safetensors), write an Escha HF checkpoint directory instead
      (leaf contract, §7; HF names, default mix by the same rule). PATTERNs are globs over tensor
      names (* and ?), repeatable; giving any --k2/--k3 replaces the default mix
      (--k3 'blk.*.ffn_up*.weight' --k3 'blk.*.ffn_down*.weight' --k2 'blk.*.attn_*.weight'
       --k2 'blk.*.ffn_*.weight' --k2 'blk.*.ssm_out.weight'); routers (*.ffn_gate_inp*)
      are never coded. The MTP head (HF mtp.*, written to OUT_DIR/mtp/; a GGUF's nextn
      blocks) is coded only by a pattern starting with its prefix ('mtp.*_proj.weight',
      'blk.64.*'). --imatrix: a llama-imatrix file (GGUF or legacy .dat).
      --random-codes: for speed measurements only, a twin with the same layout whose
      coded projections get random code words (rin 1, rout 0.02), written in seconds.
      e.g. escha quantize model-f16.gguf model-escha.gguf --imatrix imatrix.gguf

  escha decode IN.gguf OUT.gguf
  escha decode IN_DIR OUT_DIR
      The reverse for checking: every coded weight of an Escha GGUF becomes
      <stem>.weight F32 holding its decoded effective weight. Given an Escha HF
      checkpoint directory, write a plain one (coded linears and int8 rows as
      F32 P.weight, no quantization_config; an mtp/ folder's MTP head joins the
      main file) that any converter can read.

  escha help | --help
      This text.

Outputs are written to OUT.partial beside OUT and renamed when complete; an output that
is an input (through any link) or not a regular file (a directory, /dev/null) is refused.

exit status: 0 success, 1 error or --compare found differences, 2 command-line mistake
";

/// A command-line mistake (as opposed to bad data): reported with a pointer
/// to `--help` and exit status 2.
#[derive(Debug)]
struct Usage(String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn usage<T>(msg: impl Into<String>) -> Result<T> {
    Err(Usage(msg.into()).into())
}

fn main() -> ExitCode {
    match run(std::env::args_os().skip(1).collect()) {
        Ok(code) => code,
        Err(e) if e.is::<Usage>() => {
            eprintln!("escha: {e}\nrun `escha --help` for usage");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(argv: Vec<OsString>) -> Result<ExitCode> {
    // std::env::args() would panic on a non-UTF-8 argument.
    let argv = argv
        .into_iter()
        .map(|a| a.into_string().or_else(|a| usage(format!("argument {a:?} is not valid UTF-8"))))
        .collect::<Result<Vec<String>>>()?;
    let Some((cmd, rest)) = argv.split_first() else {
        print!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    };
    if matches!(cmd.as_str(), "help" | "--help" | "-h") || rest.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    match cmd.as_str() {
        "reconstruct" => cmd_reconstruct(&Args::parse(&RECONSTRUCT, rest)?),
        "linear" => cmd_linear(&Args::parse(&LINEAR, rest)?),
        "info" => cmd_info(&Args::parse(&INFO, rest)?),
        "quantize" => cmd_quantize(&Args::parse(&QUANTIZE, rest)?),
        "decode" => cmd_decode(&Args::parse(&DECODE, rest)?),
        other => usage(format!("unknown subcommand {other:?} (expected reconstruct, linear, info, quantize, decode or help)")),
    }
}

// ---------------------------------------------------------------------------
// Argument parsing
// ---------------------------------------------------------------------------

/// What a subcommand accepts.
struct Spec {
    name: &'static str,
    /// Flags that take a value (`--flag VALUE` or `--flag=VALUE`).
    values: &'static [&'static str],
    /// Flags without a value.
    switches: &'static [&'static str],
    /// Positional arguments, all required.
    positional: &'static [&'static str],
    /// Value flags that may be given more than once.
    repeatable: &'static [&'static str],
}

const RECONSTRUCT: Spec = Spec {
    name: "reconstruct",
    values: &["--ic", "--oc", "--rin", "--rout", "-o", "--compare"],
    switches: &[],
    positional: &["CODE.i16"],
    repeatable: &[],
};

const LINEAR: Spec = Spec {
    name: "linear",
    values: &["--code", "--rin", "--rout", "--s-in", "--s-out", "--bias", "--x", "-o", "--impl", "--isa", "--compare"],
    switches: &["--no-bias"],
    positional: &[],
    repeatable: &[],
};

const INFO: Spec = Spec { name: "info", values: &["--ic", "--oc", "--rin", "--rout"], switches: &[], positional: &["CODE.i16"], repeatable: &[] };

const DECODE: Spec = Spec { name: "decode", values: &[], switches: &[], positional: &["IN", "OUT"], repeatable: &[] };

const QUANTIZE: Spec = Spec {
    name: "quantize",
    values: &["--k2", "--k3", "--exclude", "--imatrix", "--threads", "--seed"],
    switches: &["--no-progress", "--random-codes"],
    positional: &["IN.gguf", "OUT.gguf"],
    repeatable: &["--k2", "--k3", "--exclude"],
};

struct Args {
    cmd: &'static str,
    positional: Vec<String>,
    values: Vec<(&'static str, String)>,
    switches: Vec<&'static str>,
}

impl Args {
    fn parse(spec: &Spec, argv: &[String]) -> Result<Self> {
        let mut a = Args { cmd: spec.name, positional: Vec::new(), values: Vec::new(), switches: Vec::new() };
        let mut it = argv.iter();
        while let Some(arg) = it.next() {
            if !arg.starts_with('-') || arg == "-" {
                a.positional.push(arg.clone());
                continue;
            }
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (arg.as_str(), None),
            };
            if let Some(&flag) = spec.values.iter().find(|&&f| f == name) {
                let value = match inline {
                    Some(v) => v,
                    // A following flag means the value was forgotten, not
                    // that the user wants a file called "--oc".
                    None => match it.next() {
                        Some(v) if !v.starts_with("--") => v.clone(),
                        _ => return usage(format!("{}: {flag} needs a value", spec.name)),
                    },
                };
                if a.get(flag).is_some() && !spec.repeatable.contains(&flag) {
                    return usage(format!("{}: {flag} given twice", spec.name));
                }
                a.values.push((flag, value));
            } else if let Some(&flag) = spec.switches.iter().find(|&&f| f == name) {
                if inline.is_some() {
                    return usage(format!("{}: {flag} takes no value", spec.name));
                }
                a.switches.push(flag);
            } else {
                return usage(format!("{}: unknown flag {arg}", spec.name));
            }
        }
        if a.positional.len() != spec.positional.len() {
            let want = if spec.positional.is_empty() { "no positional arguments".to_string() } else { spec.positional.join(" ") };
            return usage(format!("{}: expected {want}, got {:?}", spec.name, a.positional));
        }
        Ok(a)
    }

    fn get(&self, flag: &str) -> Option<&str> {
        self.values.iter().find(|(f, _)| *f == flag).map(|(_, v)| v.as_str())
    }

    #[cfg_attr(not(feature = "ggml"), allow(dead_code))]
    fn all(&self, flag: &str) -> Vec<String> {
        self.values.iter().filter(|(f, _)| *f == flag).map(|(_, v)| v.clone()).collect()
    }

    fn required(&self, flag: &str) -> Result<&str> {
        match self.get(flag) {
            Some(v) => Ok(v),
            None => usage(format!("{}: missing required flag {flag}", self.cmd)),
        }
    }

    fn has(&self, switch: &str) -> bool {
        self.switches.contains(&switch)
    }

    fn number(&self, flag: &str) -> Result<usize> {
        let v = self.required(flag)?;
        v.parse().or_else(|_| usage(format!("{}: {flag} expects a non-negative integer, got {v:?}", self.cmd)))
    }
}

/// Where IC and OC come from.
enum Dims<'a> {
    Given(usize, usize),
    /// The element counts of the rin / rout files.
    Files(&'a Path, &'a Path),
}

/// `--ic IC --oc OC` or `--rin RIN.f16 --rout ROUT.f16`, exactly one pair.
fn dims_arg(a: &Args) -> Result<Dims<'_>> {
    let given = |f| a.get(f).is_some();
    match (given("--ic") || given("--oc"), given("--rin") || given("--rout")) {
        (true, true) => usage(format!("{}: give either --ic/--oc or --rin/--rout, not both", a.cmd)),
        (true, false) => Ok(Dims::Given(a.number("--ic")?, a.number("--oc")?)),
        (false, true) => Ok(Dims::Files(Path::new(a.required("--rin")?), Path::new(a.required("--rout")?))),
        (false, false) => usage(format!("{}: missing --ic IC --oc OC (or --rin RIN.f16 --rout ROUT.f16)", a.cmd)),
    }
}

impl Dims<'_> {
    /// The files the dimensions are read from.
    fn files(&self) -> Vec<&Path> {
        match *self {
            Dims::Given(..) => Vec::new(),
            Dims::Files(rin, rout) => vec![rin, rout],
        }
    }

    fn resolve(&self) -> Result<(usize, usize)> {
        match *self {
            Dims::Given(ic, oc) => Ok((ic, oc)),
            Dims::Files(rin, rout) => Ok((rawio::read_f16(rin)?.len(), rawio::read_f16(rout)?.len())),
        }
    }
}

#[derive(Clone, Copy)]
enum Impl {
    Reference,
    C,
    Cpu(Option<Isa>),
}

fn impl_arg(a: &Args) -> Result<Impl> {
    let isa = match a.get("--isa") {
        None => None,
        Some(name) => match Isa::from_name(name) {
            Some(isa) => Some(isa),
            None => return usage(format!("linear: unknown --isa {name:?} (expected scalar, avx2, avx512, avx512vbmi, avx512fp16, neon or neonfp16)")),
        },
    };
    match (a.get("--impl").unwrap_or("reference"), isa) {
        ("cpu", isa) => Ok(Impl::Cpu(isa)),
        (_, Some(_)) => usage("linear: --isa only applies to --impl cpu"),
        ("reference", None) => Ok(Impl::Reference),
        ("c", None) => Ok(Impl::C),
        (other, None) => usage(format!("linear: unknown --impl {other:?} (expected reference, c or cpu)")),
    }
}

// ---------------------------------------------------------------------------
// Shared steps
// ---------------------------------------------------------------------------

/// Reads a code file and derives K from its length for the given IC / OC.
/// The file name doubles as the tensor name in errors.
fn load_code(path: &Path, ic: usize, oc: usize) -> Result<(Vec<i16>, LinearShape)> {
    let name = path.display().to_string();
    // IC / OC first (K=2 is always valid): K cannot be derived without them.
    LinearShape::new(&name, 2, ic, oc)?;
    let code = rawio::read_i16(path)?;
    let per_k = (ic / TILE)
        .checked_mul(oc / TILE)
        .and_then(|t| t.checked_mul(16))
        .ok_or_else(|| anyhow!("{name}: IC={ic} x OC={oc} is too large"))?;
    let n = code.len();
    if n % per_k != 0 || !(2..=3).contains(&(n / per_k)) {
        let k = if n % per_k == 0 { (n / per_k).to_string() } else { format!("{:.3}", n as f64 / per_k as f64) };
        bail!(
            "{name}: {n} int16 values for IC={ic}, OC={oc} imply K={k}; K must be 2 or 3 \
             ({} or {} values of layout [IC/16, OC/16, 16K])",
            2 * per_k,
            3 * per_k
        );
    }
    Ok((code, LinearShape::new(&name, n / per_k, ic, oc)?))
}

fn print_code_summary(path: &Path, shape: LinearShape) {
    let (kt, nt) = shape.tiles();
    let bits = (shape.code_len() * 16) as f64 / (shape.ic * shape.oc) as f64;
    println!(
        "code {}: K={}, IC={}, OC={} (tiles {kt}x{nt}), {bits:.2} bits/weight",
        path.display(),
        shape.k,
        shape.ic,
        shape.oc
    );
}

/// Distance in representable f16 values; +0 and -0 are 0 apart.
fn ulp_distance(a: f16, b: f16) -> u32 {
    let ordinal = |h: f16| {
        let bits = i32::from(h.to_bits());
        if bits & 0x8000 != 0 {
            -(bits & 0x7fff)
        } else {
            bits
        }
    };
    ordinal(a).abs_diff(ordinal(b))
}

/// Compares `got` with a golden file bit for bit and prints the verdict;
/// exit status 1 when they differ.
fn compare(got: &[f16], gold: &Path) -> Result<ExitCode> {
    let want = rawio::read_f16(gold)?;
    if want.len() != got.len() {
        bail!("{}: {} values, but the output has {}", gold.display(), want.len(), got.len());
    }
    let (mut n_diff, mut n_nan, mut max_abs, mut max_ulp) = (0usize, 0usize, 0f32, 0u32);
    for (&g, &w) in got.iter().zip(&want) {
        if g.to_bits() == w.to_bits() {
            continue;
        }
        n_diff += 1;
        // NaN mismatches have no meaningful distance: count them apart.
        if g.is_nan() || w.is_nan() {
            n_nan += 1;
            continue;
        }
        max_abs = max_abs.max((g.to_f32() - w.to_f32()).abs());
        max_ulp = max_ulp.max(ulp_distance(g, w));
    }
    if n_diff == 0 {
        println!("identical ({} values)", got.len());
        return Ok(ExitCode::SUCCESS);
    }
    let nan = if n_nan > 0 { format!(" ({n_nan} involving NaN)") } else { String::new() };
    println!(
        "{n_diff} of {} values differ from {}{nan}: max |diff| {max_abs:e}, max {max_ulp} f16 ulp",
        got.len(),
        gold.display()
    );
    Ok(ExitCode::from(1))
}

// ---------------------------------------------------------------------------
// Subcommands
// ---------------------------------------------------------------------------

fn cmd_reconstruct(a: &Args) -> Result<ExitCode> {
    let code_path = Path::new(&a.positional[0]);
    let dims = dims_arg(a)?;
    let out = Path::new(a.required("-o")?);
    let gold = a.get("--compare").map(Path::new);

    let mut inputs = vec![code_path];
    inputs.extend(dims.files());
    inputs.extend(gold);
    let out = Output::file(out, &inputs)?;
    let (ic, oc) = dims.resolve()?;
    let (code, shape) = load_code(code_path, ic, oc)?;
    print_code_summary(code_path, shape);
    let w = codec::reconstruct(&code, shape);
    rawio::write_f16(out.path(), &w)?;
    out.commit()?;
    match gold {
        Some(gold) => compare(&w, gold),
        None => Ok(ExitCode::SUCCESS),
    }
}

fn cmd_linear(a: &Args) -> Result<ExitCode> {
    // Every command-line check before any file is touched.
    let code_path = Path::new(a.required("--code")?);
    let rin_path = Path::new(a.required("--rin")?);
    let rout_path = Path::new(a.required("--rout")?);
    let x_path = Path::new(a.required("--x")?);
    let out = Path::new(a.required("-o")?);
    let imp = impl_arg(a)?;
    let gold = a.get("--compare").map(Path::new);
    let mut inputs = vec![code_path, rin_path, rout_path, x_path];
    inputs.extend(["--s-in", "--s-out", "--bias"].into_iter().filter_map(|f| a.get(f).map(Path::new)));
    inputs.extend(gold);
    let out = Output::file(out, &inputs)?;

    let rin = rawio::read_f16(rin_path)?;
    let rout = rawio::read_f16(rout_path)?;
    let (ic, oc) = (rin.len(), rout.len());
    let (code, shape) = load_code(code_path, ic, oc)?;
    let read_opt = |flag| a.get(flag).map(|p| rawio::read_float(Path::new(p))).transpose();
    let s_in = read_opt("--s-in")?;
    let s_out = read_opt("--s-out")?;
    let (bias, bias_state) = match (a.get("--bias"), a.has("--no-bias")) {
        (Some(_), true) => (None, "ignored (--no-bias)"),
        (Some(p), false) => (Some(rawio::read_float(Path::new(p))?), "applied"),
        (None, _) => (None, "absent"),
    };
    let x = rawio::read_float(x_path)?;
    if x.is_empty() || x.len() % ic != 0 {
        bail!(
            "{}: {} values are not a whole number of rows of IC={ic} (IC from {})",
            x_path.display(),
            x.len(),
            rin_path.display()
        );
    }
    let m = x.len() / ic;

    let name = code_path.display().to_string();
    let lin = Linear {
        name: &name,
        shape,
        code: &code,
        rin: &rin,
        rout: &rout,
        s_in: s_in.as_deref(),
        s_out: s_out.as_deref(),
        bias: bias.as_deref(),
    };
    lin.validate()?;
    let (label, y) = match imp {
        Impl::Reference => ("reference".to_string(), reference::linear(&lin, &x, m)?),
        Impl::C => ("c".to_string(), cref::linear(&lin, &x, m)?),
        Impl::Cpu(isa) => {
            let kernel = match isa {
                None => Kernel::best(),
                Some(isa) => Kernel::with_isa(isa).ok_or_else(|| {
                    let avail: Vec<_> = Isa::all_available().into_iter().map(Isa::name).collect();
                    anyhow!("ISA {} is not available on this machine (available: {})", isa.name(), avail.join(", "))
                })?,
            };
            // The kernels return f32 holding f16 values: the conversion is exact.
            let y = CpuLinear::new(&lin, kernel)?.forward(&x, m)?;
            (format!("cpu/{}", kernel.isa().name()), y.into_iter().map(f16::from_f32).collect())
        }
    };
    let yes_no = |v: &Option<Vec<f32>>| if v.is_some() { "yes" } else { "no" };
    println!(
        "linear: K={}, IC={ic}, OC={oc}, M={m}, s_in={}, s_out={}, bias={bias_state}, impl={label}",
        shape.k,
        yes_no(&s_in),
        yes_no(&s_out)
    );
    rawio::write_f16(out.path(), &y)?;
    out.commit()?;
    match gold {
        Some(gold) => compare(&y, gold),
        None => Ok(ExitCode::SUCCESS),
    }
}

fn cmd_info(a: &Args) -> Result<ExitCode> {
    let code_path = Path::new(&a.positional[0]);
    let (ic, oc) = dims_arg(a)?.resolve()?;
    let (code, shape) = load_code(code_path, ic, oc)?;
    let (kt, nt) = shape.tiles();
    let words = codec::tile_words16(shape.k);
    print_code_summary(code_path, shape);
    println!("  code [IC/16, OC/16, 16K] = [{kt}, {nt}, {words}]: {} int16 values", code.len());
    println!("  W_bare [IC, OC] = [{ic}, {oc}]: {} f16 values", ic * oc);
    println!("first tile (inputs 0..16 down, outputs 0..16 across):");
    let mut tile = [f16::ZERO; TILE_VALUES];
    codec::decode_tile_rows(&code[..words], shape.k, &mut tile);
    for row in tile.chunks_exact(TILE) {
        let cells: Vec<String> = row.iter().map(|v| format!("{:8.4}", v.to_f32())).collect();
        println!("{}", cells.join(""));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "ggml")]
fn cmd_quantize(a: &Args) -> Result<ExitCode> {
    use escha_ggml::quantize::{self, imatrix::Imatrix, plan::Rules, Options};
    let (input, output) = (Path::new(&a.positional[0]), Path::new(&a.positional[1]));
    if !input.exists() {
        bail!("quantize: input {} does not exist", input.display());
    }
    let mut opts = Options {
        rules: Rules::with_args(if input.is_dir() { Rules::hf() } else { Rules::default() }, a.all("--k2"), a.all("--k3"), a.all("--exclude")),
        show_progress: !a.has("--no-progress"),
        random_codes: a.has("--random-codes"),
        ..Options::default()
    };
    if a.get("--threads").is_some() {
        opts.threads = a.number("--threads")?.max(1);
    }
    if a.get("--seed").is_some() {
        opts.seed = a.number("--seed")? as u64;
    }
    if let Some(p) = a.get("--imatrix") {
        opts.imatrix = Some(Imatrix::load(Path::new(p))?);
    }
    eprintln!("escha quantize: {} -> {} on {} threads", input.display(), output.display(), opts.threads);
    let report = if input.is_dir() { quantize::hf::quantize_hf(input, output, &opts)? } else { quantize::quantize_gguf(input, output, &opts)? };
    print!("{}", report.table());
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "ggml"))]
fn cmd_quantize(_: &Args) -> Result<ExitCode> {
    bail!("quantize: this build has no GGUF support (build with the default `ggml` feature)")
}

#[cfg(feature = "ggml")]
fn cmd_decode(a: &Args) -> Result<ExitCode> {
    let (input, output) = (Path::new(&a.positional[0]), Path::new(&a.positional[1]));
    let n = if input.is_dir() {
        escha_ggml::quantize::decode::decode_hf(input, output)?
    } else {
        escha_ggml::quantize::decode::decode_gguf(input, output)?
    };
    println!("decoded {n} coded weights into {}", output.display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "ggml"))]
fn cmd_decode(_: &Args) -> Result<ExitCode> {
    bail!("decode: this build has no GGUF support (build with the default `ggml` feature)")
}
