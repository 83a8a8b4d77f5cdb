//! Bad input never panics and never destroys a file: degenerate weights
//! encode, malformed files give errors naming the file or tensor, and no
//! command leaves a partial output, overwrites an input or replaces
//! anything that is not a regular file.
#![cfg(feature = "ggml")]

mod common;

use common::cli::{escha, Out, TempDir};
use common::files::{f16_tensor, f32_tensor, write_gguf, write_safetensors, Src};
use common::Problem;
use escha_ggml::contract::{self, cases};
use escha_ggml::encode::effective_weight;
use escha_ggml::gguf::GgufFile;
use escha_ggml::rawio;
use escha_ggml::testutil::Rng;
use escha_ggml::LinearShape;
use half::f16;
use std::path::Path;

fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| scale * rng.normal()).collect()
}

fn exists(p: &str) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// An error: exit 1, the message naming `what`, neither `out` nor its
/// `.partial` left behind.
fn refused(o: &Out, what: &str, out: &str) {
    assert_eq!(o.code, 1, "expected exit 1 naming {what}: {}{}", o.stdout, o.stderr);
    assert!(o.stderr.contains(what), "the error must name {what}: {}", o.stderr);
    assert!(!exists(&format!("{out}.partial")), "{out}.partial left behind");
}

/// A small Escha GGUF (two coded weights), made by `escha quantize`.
fn escha_gguf(d: &TempDir, name: &str) -> String {
    let mut rng = Rng::new(5);
    let src = d.file(&format!("{name}-src.gguf"));
    write_gguf(
        &src,
        &[
            f32_tensor("blk.0.attn_norm.weight", &[128], &random(&mut rng, 128, 1.0)),
            f16_tensor("blk.0.attn_q.weight", &[128, 256], &random(&mut rng, 128 * 256, 0.02)),
            f16_tensor("blk.0.ffn_up.weight", &[256, 128], &random(&mut rng, 256 * 128, 0.02)),
        ],
    );
    let out = d.file(&format!("{name}.gguf"));
    let o = escha(&["quantize", &src, &out, "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    out
}

/// `(shape, code, rin, rout)` of a coded stem.
fn coded(f: &GgufFile, stem: &str) -> (LinearShape, Vec<i16>, Vec<f16>, Vec<f16>) {
    let c = contract::coded_weights(f).unwrap().into_iter().find(|c| c.stem == stem).unwrap_or_else(|| panic!("{stem} not coded"));
    let d = c.read(f).unwrap();
    (c.shape, d.code, d.rin, d.rout)
}

#[test]
fn degenerate_weights_encode_to_finite_scales() {
    let d = TempDir::new("degen");
    let mut rng = Rng::new(21);
    let (ic, oc) = (128usize, 256usize);
    // Rows are outputs. One column at RMS 2e-20 (rin rounds to f16 zero
    // unless scaled into range), one zero column, one zero row.
    let mut q = random(&mut rng, oc * ic, 0.02);
    for c in 0..oc {
        q[c * ic + 5] *= 1e-18;
        q[c * ic + 9] = 0.0;
    }
    q[7 * ic..8 * ic].fill(0.0);
    let small = random(&mut rng, oc * ic, 1e-9);
    let tiny = random(&mut rng, oc * ic, 1e-20);
    let huge = random(&mut rng, oc * ic, 1e10);
    let extreme: Vec<f32> = (0..oc * ic).map(|i| if i % 3 == 0 { 3e38 } else { -3e38 }).collect();
    let ne = [ic as i64, oc as i64];
    let src = [
        f32_tensor("blk.0.attn_q.weight", &ne, &q),
        f32_tensor("blk.0.attn_k.weight", &ne, &tiny),
        f32_tensor("blk.0.attn_v.weight", &ne, &vec![0.0; oc * ic]),
        f32_tensor("blk.0.attn_output.weight", &ne, &huge),
        f32_tensor("blk.0.ffn_gate.weight", &ne, &extreme),
        f32_tensor("blk.0.ffn_up.weight", &ne, &small),
    ];
    let (input, output) = (d.file("in.gguf"), d.file("out.gguf"));
    write_gguf(&input, &src);
    let o = escha(&["quantize", &input, &output, "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!exists(&format!("{output}.partial")));
    let table = o.stdout.to_lowercase();
    assert!(!table.contains("inf") && !table.contains("nan"), "{}", o.stdout);
    for stem in ["blk.0.attn_k", "blk.0.attn_output", "blk.0.ffn_gate"] {
        assert!(o.stdout.lines().any(|l| l.starts_with("out of f16 range") && l.contains(stem)), "{stem} not reported: {}", o.stdout);
    }

    let f = GgufFile::open(&output).unwrap();
    assert_eq!(contract::check(&f).unwrap(), 6, "every vector finite, as the loader requires");
    let weff = |stem: &str| {
        let (shape, code, rin, rout) = coded(&f, stem);
        assert!(rin.iter().chain(&rout).all(|v| v.is_finite()), "{stem}: scales");
        let w = effective_weight(&code, shape, &rin, &rout);
        assert!(w.iter().all(|v| v.is_finite()), "{stem}: decoded weight");
        w
    };
    let rel = |a: &[f32], b: &[f32]| {
        let num: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum();
        (num / b.iter().map(|&y| (y as f64).powi(2)).sum::<f64>()).sqrt()
    };
    let wq = weff("blk.0.attn_q");
    assert!(wq[7 * ic..8 * ic].iter().all(|&v| v == 0.0), "a zero row decodes to exactly zero");
    assert!(rel(&wq, &q) < 0.30, "attn_q: rel err {}", rel(&wq, &q));
    assert!(weff("blk.0.attn_v").iter().all(|&v| v == 0.0), "an all-zero weight decodes to exactly zero");
    let wu = weff("blk.0.ffn_up");
    assert!(rel(&wu, &small) < 0.16, "1e-9 weights are scaled into range: rel err {}", rel(&wu, &small));
    for stem in ["blk.0.attn_k", "blk.0.attn_output", "blk.0.ffn_gate"] {
        weff(stem);
    }
    // The file is one the loader's rules accept.
    let o = escha(&["decode", &output, &d.file("decoded.gguf")]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn malformed_checkpoints_are_named_errors() {
    let d = TempDir::new("hfbad");
    let config = r#"{"model_type": "qwen3_5", "quantization_config": {"quant_method": "escha", "format_version": "2.0"}}"#;
    let checkpoint = |name: &str, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)], config: &str| {
        let dir = d.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        write_safetensors(&dir.join("model.safetensors"), tensors);
        std::fs::write(dir.join("config.json"), config).unwrap();
        dir.to_str().unwrap().to_string()
    };
    let p = "model.layers.0.self_attn.o_proj";
    for (name, shape, scale_shape) in [("rows0", vec![0, 4], vec![0]), ("rank0", vec![], vec![1])] {
        let n: usize = shape.iter().product();
        let dir = checkpoint(
            name,
            &[(&format!("{p}.weight_int8"), "I8", shape, vec![1; n]), (&format!("{p}.weight_scale"), "F16", scale_shape.clone(), vec![0; 2 * scale_shape.iter().product::<usize>()])],
            config,
        );
        let out = d.file(&format!("{name}-out"));
        refused(&escha(&["decode", &dir, &out]), &format!("{p}: weight_int8"), &out);
        assert!(!exists(&out));
    }
    // A header claiming 2^62 x 128 f16 values in 0 bytes: the size product
    // overflows and must not wrap to a size that passes.
    let plain = r#"{"model_type": "qwen3_5"}"#;
    let q = "model.layers.0.self_attn.q_proj.weight";
    let dir = checkpoint("huge", &[(q, "F16", vec![1 << 62, 128], vec![])], plain);
    let out = d.file("huge-out");
    let o = escha(&["quantize", &dir, &out, "--no-progress"]);
    refused(&o, q, &out);
    assert!(o.stderr.contains("too large"), "{}", o.stderr);
    assert!(!exists(&out));
}

#[test]
fn outputs_never_replace_an_input_or_a_special_file() {
    let d = TempDir::new("outputs");
    let x = escha_gguf(&d, "x");
    let original = std::fs::read(&x).unwrap();
    let unchanged = |what: &str| assert!(std::fs::read(&x).unwrap() == original, "{what}: the input was touched");
    // The output is the input: by name, through a symbolic link, a hard link.
    let o = escha(&["decode", &x, &x]);
    refused(&o, "is the input", &x);
    unchanged("decode X X");
    let (sym, hard) = (d.file("sym.gguf"), d.file("hard.gguf"));
    std::os::unix::fs::symlink(&x, &sym).unwrap();
    std::fs::hard_link(&x, &hard).unwrap();
    for link in [&sym, &hard] {
        refused(&escha(&["decode", &x, link]), "is the input", link);
        refused(&escha(&["quantize", link, &x, "--no-progress"]), "is the input", &x);
        unchanged(link);
    }
    assert!(std::fs::symlink_metadata(&sym).unwrap().file_type().is_symlink(), "the link stays a link");
    // The output's temporary file is the input.
    let y_partial = d.file("y.gguf.partial");
    std::fs::copy(&x, &y_partial).unwrap();
    let o = escha(&["decode", &y_partial, &d.file("y.gguf")]);
    assert!(o.code == 1 && o.stderr.contains("temporary file") && o.stderr.contains("is the input"), "{}", o.stderr);
    assert!(std::fs::read(&y_partial).unwrap() == original, "decode Y.partial Y touched its input");

    // A failed decode leaves neither OUT nor OUT.partial, and keeps what OUT was.
    let bad = d.file("bad.gguf");
    let f = GgufFile::open(&x).unwrap();
    let stem = cases::first_stem(&f).unwrap();
    let nan = cases::all(&stem).into_iter().find(|c| c.id == "rin-nan").unwrap();
    cases::write(&f, &stem, &nan, Path::new(&bad)).unwrap();
    let kept = d.file("kept.gguf");
    std::fs::write(&kept, b"an earlier result").unwrap();
    refused(&escha(&["decode", &bad, &kept]), &format!("{stem}.escha_rin"), &kept);
    assert_eq!(std::fs::read(&kept).unwrap(), b"an earlier result", "a failed decode replaced OUT");
    let fresh = d.file("fresh.gguf");
    refused(&escha(&["decode", &bad, &fresh]), &format!("{stem}.escha_rin"), &fresh);
    assert!(!exists(&fresh));

    // Not regular files: refused before any work, left as they were.
    let src = d.file("x-src.gguf");
    let dir = d.file("a-dir");
    std::fs::create_dir(&dir).unwrap();
    let fifo = d.file("a-fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let null_link = d.file("null-link");
    std::os::unix::fs::symlink("/dev/null", &null_link).unwrap();
    for (out, kind) in [(&dir, "a directory"), (&fifo, "a FIFO"), (&null_link, "a character device")] {
        let o = escha(&["quantize", &src, out, "--no-progress"]);
        refused(&o, kind, out);
        assert!(o.stdout.is_empty(), "{out}: work done before the refusal: {}", o.stdout);
        refused(&escha(&["decode", &x, out]), kind, out);
    }
    assert!(std::fs::metadata(&dir).unwrap().is_dir() && std::fs::read_dir(&dir).unwrap().next().is_none());
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(std::fs::symlink_metadata(&null_link).unwrap().file_type().is_symlink());
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    // A missing directory is named up front.
    refused(&escha(&["decode", &x, &d.file("no/such/dir.gguf")]), "does not exist", &d.file("no/such/dir.gguf"));

    // The raw-file commands follow the same rules.
    let p = Problem::new(3, 2, 128, 128, false, false);
    let (code, rin, rout, xs) = (d.file("c.i16"), d.file("rin.f16"), d.file("rout.f16"), d.file("x.f32"));
    rawio::write_i16(code.as_ref(), &p.code).unwrap();
    rawio::write_f16(rin.as_ref(), &p.rin).unwrap();
    rawio::write_f16(rout.as_ref(), &p.rout).unwrap();
    rawio::write_f32(xs.as_ref(), &p.input(4, 2)).unwrap();
    let code_bytes = std::fs::read(&code).unwrap();
    refused(&escha(&["reconstruct", &code, "--ic", "128", "--oc", "128", "-o", &code]), "is the input", &code);
    refused(&escha(&["linear", "--code", &code, "--rin", &rin, "--rout", &rout, "--x", &xs, "-o", &rin]), "is the input", &rin);
    refused(&escha(&["reconstruct", &code, "--ic", "128", "--oc", "128", "-o", &fifo]), "a FIFO", &fifo);
    assert_eq!(std::fs::read(&code).unwrap(), code_bytes);
    assert_eq!(rawio::read_f16(rin.as_ref()).unwrap(), p.rin);
}

#[test]
fn directory_outputs_follow_the_same_rules() {
    let d = TempDir::new("hfout");
    let mut rng = Rng::new(8);
    let input = d.0.join("in");
    std::fs::create_dir_all(&input).unwrap();
    let h = |v: &[f32]| v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect::<Vec<u8>>();
    write_safetensors(&input.join("model.safetensors"), &[("model.layers.0.self_attn.q_proj.weight", "F16", vec![128, 128], h(&random(&mut rng, 128 * 128, 0.02)))]);
    std::fs::write(input.join("config.json"), r#"{"model_type": "qwen3_5"}"#).unwrap();
    let input = input.to_str().unwrap().to_string();
    let coded = d.file("coded");
    assert_eq!(escha(&["quantize", &input, &coded, "--no-progress"]).code, 0);
    // An existing output (directory or file) is refused before any work.
    let taken = d.file("taken");
    std::fs::write(&taken, b"keep me").unwrap();
    for (out, why) in [(&input, "is the input"), (&coded, "already exists"), (&taken, "already exists")] {
        let o = escha(&["quantize", &input, out, "--no-progress"]);
        refused(&o, why, out);
        assert!(o.stdout.is_empty(), "{}", o.stdout);
    }
    assert_eq!(std::fs::read(&taken).unwrap(), b"keep me");
    refused(&escha(&["decode", &coded, &coded]), "is the input", &coded);
    // A stale OUT.partial is named and left alone, never removed: it may be
    // someone's input.
    let out = d.file("out");
    let stale = format!("{out}.partial");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(format!("{stale}/mine.txt"), b"mine").unwrap();
    for o in [escha(&["quantize", &input, &out, "--no-progress"]), escha(&["decode", &coded, &out])] {
        assert!(o.code == 1 && o.stderr.contains(&stale), "{}", o.stderr);
    }
    assert_eq!(std::fs::read(format!("{stale}/mine.txt")).unwrap(), b"mine");
    std::fs::remove_dir_all(&stale).unwrap();
    // Decoding Z.partial into Z: the temporary directory is the input.
    let o = escha(&["decode", &stale_input(&d, &coded), &d.file("z")]);
    assert!(o.code == 1 && o.stderr.contains("is the input"), "{}", o.stderr);
    // A failed decode leaves no directory.
    let broken = d.file("broken");
    copy_dir(&coded, &broken);
    let st = format!("{broken}/model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() - 64]).unwrap();
    let o = escha(&["decode", &broken, &out]);
    refused(&o, "truncated", &out);
    assert!(!exists(&out));
}

/// A copy of `dir` named `z.partial`, whose output `z` would write into it.
fn stale_input(d: &TempDir, dir: &str) -> String {
    let p = d.file("z.partial");
    copy_dir(dir, &p);
    p
}

fn copy_dir(from: &str, to: &str) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), Path::new(to).join(e.file_name())).unwrap();
    }
}

#[test]
fn non_finite_biases_are_refused_by_every_implementation() {
    let d = TempDir::new("bias");
    let p = Problem::new(11, 2, 128, 256, false, false);
    let files = ["c.i16", "rin.f16", "rout.f16", "b.f32", "x.f32"].map(|n| d.file(n));
    rawio::write_i16(files[0].as_ref(), &p.code).unwrap();
    rawio::write_f16(files[1].as_ref(), &p.rin).unwrap();
    rawio::write_f16(files[2].as_ref(), &p.rout).unwrap();
    rawio::write_f32(files[4].as_ref(), &p.input(12, 3)).unwrap();
    for bad in [f32::NAN, f32::INFINITY] {
        let mut bias = vec![0.25f32; 256];
        bias[5] = bad;
        rawio::write_f32(files[3].as_ref(), &bias).unwrap();
        for imp in ["reference", "c", "cpu"] {
            let y = d.file("y.f16");
            let o = escha(&["linear", "--code", &files[0], "--rin", &files[1], "--rout", &files[2], "--bias", &files[3], "--x", &files[4], "-o", &y, "--impl", imp]);
            refused(&o, "bias", &y);
            assert!(o.stderr.contains("index 5"), "{imp}: {}", o.stderr);
            assert!(!exists(&y));
        }
    }
}

#[test]
fn decode_refuses_what_the_loader_refuses() {
    let d = TempDir::new("contract");
    let x = escha_gguf(&d, "x");
    assert_eq!(escha(&["decode", &x, &d.file("ok.gguf")]).code, 0, "the unedited file decodes");
    let f = GgufFile::open(&x).unwrap();
    let stem = cases::first_stem(&f).unwrap();
    let all = cases::all(&stem);
    assert!(all.len() > 20);
    for c in all {
        let (input, out) = (d.file(&format!("{}.gguf", c.id)), d.file(&format!("{}-out.gguf", c.id)));
        cases::write(&f, &stem, &c, Path::new(&input)).unwrap();
        let o = escha(&["decode", &input, &out]);
        if c.loader_only {
            // Well formed without an architecture: only the loader knows
            // which stems a model has.
            assert_eq!(o.code, 0, "{}: {}", c.id, o.stderr);
            continue;
        }
        refused(&o, &c.names, &out);
        assert!(!exists(&out), "{}: output written", c.id);
    }
}

#[test]
fn quantize_checks_its_output_before_it_takes_its_place() {
    // A source whose coded stem has a NaN bias: the written file would be
    // refused by the loader, so no file is written.
    let d = TempDir::new("qcheck");
    let mut rng = Rng::new(2);
    let mut bias = vec![0.0f32; 128];
    bias[9] = f32::NAN;
    let src: [Src; 2] = [f16_tensor("blk.0.attn_q.weight", &[128, 128], &random(&mut rng, 128 * 128, 0.02)), f32_tensor("blk.0.attn_q.bias", &[128], &bias)];
    let (input, output) = (d.file("in.gguf"), d.file("out.gguf"));
    write_gguf(&input, &src);
    refused(&escha(&["quantize", &input, &output, "--no-progress"]), "blk.0.attn_q.bias", &output);
    assert!(!exists(&output));
}

#[test]
fn a_gguf_with_an_empty_key_is_a_named_error() {
    // ggml's parser takes a key whose first byte is NUL; copying it would abort.
    let d = TempDir::new("emptykey");
    let x = escha_gguf(&d, "x");
    let mut bytes = std::fs::read(&x).unwrap();
    let at = bytes.windows(12).position(|w| w == b"general.name").expect("a key to break");
    bytes[at] = 0;
    let bad = d.file("bad.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let out = d.file("out.gguf");
    let o = escha(&["decode", &bad, &out]);
    refused(&o, "empty key", &out);
    assert!(o.stderr.contains("bad.gguf"), "{}", o.stderr);
    assert!(!exists(&out));
}
