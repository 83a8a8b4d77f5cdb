//! `escha quantize` end to end on small GGUFs written here through ggml's
//! GGUF API: the output follows the tensor contract, copies everything it
//! does not code byte for byte, and its codes decode (through the contract)
//! back to the source weights within the error it reports.
#![cfg(feature = "ggml")]

mod common;

use common::cli::{escha, TempDir};
use common::files::{f16_tensor, f32_tensor, write_gguf, write_gguf_with, write_safetensors, Src};
use escha_ggml::cref;
use escha_ggml::gguf::{GgmlType, GgufFile};
use escha_ggml::hadamard::RS;
use escha_ggml::reference::Linear;
use escha_ggml::testutil::Rng;
use escha_ggml::LinearShape;
use half::f16;

/// Q8_0 written by hand (f16 scale + 32 int8 per block), and its exact values.
fn q8_0_tensor(name: &'static str, ne: &[i64], v: &[f32]) -> (Src, Vec<f32>) {
    let (mut b, mut exact) = (Vec::new(), Vec::new());
    for blk in v.chunks_exact(32) {
        let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = f16::from_f32(amax / 127.0);
        b.extend(d.to_le_bytes());
        for &x in blk {
            let q = (x / d.to_f32()).round().clamp(-127.0, 127.0) as i8;
            b.push(q as u8);
            exact.push(q as f32 * d.to_f32());
        }
    }
    (Src { name, ty: GgmlType::GGML_TYPE_Q8_0, ne: ne.to_vec(), bytes: b }, exact)
}

fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| scale * rng.normal()).collect()
}

/// Widened f16 values as the file holds them.
fn via_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn f16s(bytes: &[u8]) -> Vec<f16> {
    bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect()
}

/// The effective weight `[OC][IC]` of FORMAT.md §1 in f64, with a bound on
/// the error of an f32 evaluation of each entry. Built from the C
/// reference's `W_bare` (`escha decode` and the encoder use the Rust codec)
/// and an f64 Hadamard written for the tests: `W_eff[c][i] = rin[i] * rout[c]
/// * RS^2 * (H W_bare H)[i][c]`. The bound: each of the two 128-point
/// Hadamards in f32 adds at most 7u times the sum of the magnitudes it adds
/// up, so the whole product is within 14u * S of the exact one, S the sum of
/// |W_bare| over the entry's 128x128 block; the final scale multiplies add a
/// few u of |W_eff|. Twice that, to stay clear of second-order terms.
fn weff_spec(code: &[i16], shape: LinearShape, rin: &[f16], rout: &[f16]) -> (Vec<f64>, Vec<f64>) {
    weff_spec_scaled(code, shape, rin, rout, None, None)
}

/// [`weff_spec`] with the optional per-channel scales folded exactly:
/// `W_eff[c][i]` times `s_in[i] * s_out[c]` (one f32 rounding each in the
/// fold, inside the bound's few u of |W_eff|).
fn weff_spec_scaled(code: &[i16], shape: LinearShape, rin: &[f16], rout: &[f16], s_in: Option<&[f32]>, s_out: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let (ic, oc) = (shape.ic, shape.oc);
    let wb: Vec<f64> = cref::reconstruct(code, shape).iter().map(|v| v.to_f64()).collect();
    // Sum of |W_bare| per (input block, output block).
    let (nib, nob) = (ic / 128, oc / 128);
    let mut blk = vec![0f64; nib * nob];
    for i in 0..ic {
        for c in 0..oc {
            blk[(i / 128) * nob + c / 128] += wb[i * oc + c].abs();
        }
    }
    // H over the outputs of each input row, then H over the inputs of each output column.
    let mut a = wb;
    for row in a.chunks_exact_mut(oc) {
        common::h128_f64(row);
    }
    let rs2 = (RS as f64) * (RS as f64);
    let u = 2f64.powi(-24);
    let (mut w, mut bound) = (vec![0f64; oc * ic], vec![0f64; oc * ic]);
    let mut col = vec![0f64; ic];
    for c in 0..oc {
        for i in 0..ic {
            col[i] = a[i * oc + c];
        }
        common::h128_f64(&mut col);
        for i in 0..ic {
            let si = s_in.map_or(1.0, |v| v[i] as f64);
            let so = s_out.map_or(1.0, |v| v[c] as f64);
            let scale = rs2 * rin[i].to_f64() * si * rout[c].to_f64() * so;
            let v = col[i] * scale;
            w[c * ic + i] = v;
            bound[c * ic + i] = 2.0 * (14.0 * u * blk[(i / 128) * nob + c / 128] * scale.abs() + 6.0 * u * v.abs());
        }
    }
    (w, bound)
}

fn f32s_of(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

#[test]
fn quantize_writes_the_contract_and_reproduces_the_weights() {
    let d = TempDir::new("quant");
    let mut rng = Rng::new(7);
    let q = random(&mut rng, 128 * 256, 0.02); // attn_q: IC 256, OC 128
    let up = random(&mut rng, 256 * 128, 0.03); // ffn_up: IC 128, OC 256
    let (down_src, down) = q8_0_tensor("blk.0.ffn_down.weight", &[256, 128], &random(&mut rng, 128 * 256, 0.03));
    let odd = random(&mut rng, 200 * 128, 0.02);
    let norm = random(&mut rng, 128, 1.0);
    let emb = random(&mut rng, 128 * 256, 1.0);
    let src = vec![
        f32_tensor("token_embd.weight", &[128, 256], &emb),
        f32_tensor("blk.0.attn_norm.weight", &[128], &norm),
        f16_tensor("blk.0.attn_q.weight", &[256, 128], &q),
        f16_tensor("blk.0.attn_k.weight", &[200, 128], &odd),
        f32_tensor("blk.0.ffn_up.weight", &[128, 256], &up),
        down_src,
    ];
    let (input, output) = (d.file("in.gguf"), d.file("out.gguf"));
    write_gguf(&input, &src);
    let o = escha(&["quantize", &input, &output, "--threads", "2"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    eprintln!("{}", o.stdout);

    let f = GgufFile::open(&output).unwrap();
    assert_eq!(f.get_u32("escha.format_version").unwrap(), Some(2));
    assert_eq!(f.get_u32("escha.codebook").unwrap(), Some(1));
    assert_eq!(f.get_str("general.name").unwrap().as_deref(), Some("escha-quantize-test"));
    assert_eq!(f.get_u32("llama.block_count").unwrap(), Some(1));
    assert!(f.get_u32("general.file_type").unwrap().is_some(), "explicit file type");
    // Not coded: copied byte for byte, in order.
    for s in &src[..2] {
        let t = f.tensor(s.name).unwrap_or_else(|| panic!("{} missing", s.name));
        assert_eq!(f.read(t).unwrap(), s.bytes, "{}", s.name);
    }
    let k_odd = f.tensor("blk.0.attn_k.weight").expect("dims not multiples of 128: copied");
    assert_eq!(f.read(k_odd).unwrap(), src[3].bytes);
    assert!(o.stdout.contains("skipped") && o.stdout.contains("blk.0.attn_k.weight") && o.stdout.contains("200"), "{}", o.stdout);
    // Coded: the default mix (up/down K=3, attn K=2), no .weight left.
    for (stem, k, ic, oc, want) in [("blk.0.attn_q", 2usize, 256usize, 128usize, via_f16(&q)), ("blk.0.ffn_up", 3, 128, 256, up.clone()), ("blk.0.ffn_down", 3, 256, 128, down.clone())] {
        assert!(f.tensor(&format!("{stem}.weight")).is_none(), "{stem}.weight must be gone");
        let code_t = f.tensor(&format!("{stem}.escha_code")).unwrap();
        assert_eq!(code_t.ty, GgmlType::GGML_TYPE_I16);
        assert_eq!(code_t.ne, [16 * k as i64, oc as i64 / 16, ic as i64 / 16, 1], "{stem}");
        let (rin_t, rout_t) = (f.tensor(&format!("{stem}.escha_rin")).unwrap(), f.tensor(&format!("{stem}.escha_rout")).unwrap());
        assert_eq!((rin_t.ty, rin_t.ne), (GgmlType::GGML_TYPE_F16, [ic as i64, 1, 1, 1]));
        assert_eq!((rout_t.ty, rout_t.ne), (GgmlType::GGML_TYPE_F16, [oc as i64, 1, 1, 1]));
        let code: Vec<i16> = f.read(code_t).unwrap().chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
        let (rin, rout) = (f16s(&f.read(rin_t).unwrap()), f16s(&f.read(rout_t).unwrap()));
        let shape = LinearShape::new(stem, k, ic, oc).unwrap();
        let err = rel_err(&f32s_of(&weff_spec(&code, shape, &rin, &rout).0), &want);
        eprintln!("{stem}: K={k} rel err of the decoded weight {err:.4}");
        // The tile MSE bars (0.070 / 0.019) give about 0.26 / 0.14.
        assert!(err < if k == 2 { 0.30 } else { 0.16 }, "{stem}: {err}");
        // The table reports the same error: its row is "tensor from K IC x OC
        // bpw rel-err time", the error printed to 4 decimals.
        let rows: Vec<&str> = o.stdout.lines().filter(|l| l.split_whitespace().next() == Some(&format!("{stem}.weight"))).collect();
        assert_eq!(rows.len(), 1, "one table row for {stem}: {}", o.stdout);
        let f: Vec<&str> = rows[0].split_whitespace().collect();
        assert_eq!(f.len(), 7, "table row fields: {}", rows[0]);
        assert_eq!((f[2], f[3]), (k.to_string().as_str(), format!("{ic}x{oc}").as_str()), "{}", rows[0]);
        let reported: f64 = f[5].parse().unwrap_or_else(|_| panic!("rel err {:?} is not a number: {}", f[5], rows[0]));
        assert!((reported - err).abs() <= 0.6e-4, "{}: reported rel err {reported} vs {err:.6}", rows[0]);
    }
    // Same input, same seed: the same file.
    let again = d.file("again.gguf");
    assert_eq!(escha(&["quantize", &input, &again, "--no-progress"]).code, 0);
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&output).unwrap());
    // Quantizing an escha file is refused.
    let o = escha(&["quantize", &output, &d.file("x.gguf")]);
    assert!(o.code == 1 && o.stderr.contains("already an Escha GGUF"), "{}", o.stderr);
}

#[test]
fn quantize_rejects_bad_input_with_named_errors() {
    let d = TempDir::new("quantbad");
    let mut rng = Rng::new(9);
    let w = random(&mut rng, 128 * 128, 0.02);
    // Missing file.
    let o = escha(&["quantize", &d.file("nope.gguf"), &d.file("o.gguf")]);
    assert!(o.code == 1 && o.stderr.contains("nope.gguf"), "{}", o.stderr);
    // Not a GGUF.
    std::fs::write(d.file("junk.gguf"), b"definitely not gguf").unwrap();
    let o = escha(&["quantize", &d.file("junk.gguf"), &d.file("o.gguf")]);
    assert!(o.code == 1 && o.stderr.contains("junk.gguf"), "{}", o.stderr);
    // Truncated: the last tensor's data is cut off.
    let good = d.file("good.gguf");
    write_gguf(&good, &[f16_tensor("blk.0.attn_q.weight", &[128, 128], &w), f16_tensor("blk.0.attn_v.weight", &[128, 128], &w)]);
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(d.file("cut.gguf"), &bytes[..bytes.len() - 1000]).unwrap();
    let o = escha(&["quantize", &d.file("cut.gguf"), &d.file("o.gguf")]);
    assert!(o.code == 1 && (o.stderr.contains("blk.0.attn_v.weight") || o.stderr.contains("cut.gguf")), "{}", o.stderr);
    assert!(!std::path::Path::new(&d.file("o.gguf")).exists(), "no output after an error");
    // A matched tensor of a type that has no f32 conversion.
    let ints = Src { name: "blk.0.attn_q.weight", ty: GgmlType::GGML_TYPE_I32, ne: vec![128, 128], bytes: vec![0; 128 * 128 * 4] };
    write_gguf(&d.file("int.gguf"), &[ints]);
    let o = escha(&["quantize", &d.file("int.gguf"), &d.file("o.gguf")]);
    assert!(o.code == 1 && o.stderr.contains("blk.0.attn_q.weight") && o.stderr.contains("i32"), "{}", o.stderr);
    // NaN in a weight names the tensor.
    let mut nan = w.clone();
    nan[300] = f32::NAN;
    write_gguf(&d.file("nan.gguf"), &[f32_tensor("blk.0.attn_q.weight", &[128, 128], &nan)]);
    let o = escha(&["quantize", &d.file("nan.gguf"), &d.file("o.gguf"), "--no-progress"]);
    assert!(o.code == 1 && o.stderr.contains("blk.0.attn_q.weight") && o.stderr.contains("300"), "{}", o.stderr);
    assert!(!std::path::Path::new(&d.file("o.gguf.partial")).exists(), "partial output removed");
    // Nothing codable.
    write_gguf(&d.file("odd.gguf"), &[f16_tensor("blk.0.attn_q.weight", &[200, 128], &random(&mut rng, 200 * 128, 0.02))]);
    let o = escha(&["quantize", &d.file("odd.gguf"), &d.file("o.gguf")]);
    assert!(o.code == 1 && o.stderr.contains("no tensor"), "{}", o.stderr);
    // Output onto the input.
    let o = escha(&["quantize", &good, &good]);
    assert!(o.code == 1 && o.stderr.contains("is the input"), "{}", o.stderr);
    // Command-line mistakes exit 2.
    assert_eq!(escha(&["quantize", &good]).code, 2);
    assert_eq!(escha(&["quantize", &good, &d.file("o.gguf"), "--threads", "many"]).code, 2);
}

#[test]
fn quantize_patterns_and_imatrix() {
    let d = TempDir::new("quantpat");
    let mut rng = Rng::new(13);
    let a = random(&mut rng, 128 * 128, 0.02);
    let b = random(&mut rng, 128 * 128, 0.02);
    let input = d.file("in.gguf");
    write_gguf(&input, &[f16_tensor("blk.0.attn_q.weight", &[128, 128], &a), f16_tensor("blk.0.ffn_up.weight", &[128, 128], &b)]);
    // --k3 on attn only: ffn_up is then copied (user patterns replace the mix).
    let out = d.file("k3.gguf");
    let o = escha(&["quantize", &input, &out, "--k3", "*.attn_q.weight", "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.tensor("blk.0.attn_q.escha_code").unwrap().ne[0], 48);
    assert!(f.tensor("blk.0.ffn_up.weight").is_some() && f.tensor("blk.0.ffn_up.escha_code").is_none());
    // A legacy imatrix for attn_q steers it (its table gets a weighted error).
    let values: Vec<f32> = (0..128).map(|i| 1.0 + 100.0 * (i % 7 == 0) as i32 as f32).collect();
    let im = escha_ggml::testutil::legacy_imatrix(&[("blk.0.attn_q.weight", 1, &values)]);
    std::fs::write(d.file("im.dat"), &im).unwrap();
    let o = escha(&["quantize", &input, &d.file("im.gguf"), "--imatrix", &d.file("im.dat"), "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("imat err"), "{}", o.stdout);
    assert!(o.stdout.contains("no imatrix entry (coded without importance): blk.0.ffn_up.weight"), "{}", o.stdout);
    // A truncated imatrix is an error naming the file.
    std::fs::write(d.file("bad.dat"), &im[..im.len() - 10]).unwrap();
    let o = escha(&["quantize", &input, &d.file("x.gguf"), "--imatrix", &d.file("bad.dat")]);
    assert!(o.code == 1 && o.stderr.contains("bad.dat") && o.stderr.contains("truncated"), "{}", o.stderr);
}

/// The MTP head stays as the export ships it: uncoded, in `mtp/`, unless a
/// pattern naming it asks; `escha decode` puts it back in the main file
/// (where HF releases and upstream's converter have it); a head in the
/// export's own `mtp/` folder is read too, and a folder holding anything
/// else is refused naming the file and the tensor.
#[test]
fn quantize_keeps_the_mtp_head_uncoded_in_its_folder() {
    use escha_ggml::safetensors::read_header;
    let d = TempDir::new("quantmtp");
    let mut rng = Rng::new(23);
    let h = |v: &[f32]| v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect::<Vec<u8>>();
    let trunk = ("model.layers.0.self_attn.q_proj.weight", "F16", vec![256, 128], h(&random(&mut rng, 256 * 128, 0.02)));
    let head = vec![
        ("mtp.fc.weight", "F16", vec![128, 256], h(&random(&mut rng, 128 * 256, 0.02))),
        ("mtp.layers.0.mlp.up_proj.weight", "F16", vec![256, 128], h(&random(&mut rng, 256 * 128, 0.02))),
        ("mtp.norm.weight", "F16", vec![128], h(&random(&mut rng, 128, 0.1))),
    ];
    let cfg = r#"{"model_type": "qwen3_5_text", "hidden_size": 128}"#;
    let names = |p: &std::path::Path| read_header(p).unwrap().into_iter().map(|t| t.name).collect::<Vec<_>>();
    let bytes = |p: &std::path::Path, n: &str| read_header(p).unwrap().into_iter().find(|t| t.name == n).unwrap().read().unwrap();
    let run = |args: &[&std::path::Path], extra: &[&str]| {
        let mut a: Vec<&str> = vec!["quantize"];
        a.extend(args.iter().map(|p| p.to_str().unwrap()));
        a.extend(extra);
        a.push("--no-progress");
        escha(&a)
    };

    // The HF release layout: the head in the main file.
    let input = d.0.join("in");
    std::fs::create_dir_all(&input).unwrap();
    write_safetensors(&input.join("model.safetensors"), &[vec![trunk.clone()], head.clone()].concat());
    std::fs::write(input.join("config.json"), cfg).unwrap();
    let out = d.0.join("out");
    let o = run(&[&input, &out], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let main = names(&out.join("model.safetensors"));
    assert!(main.contains(&"model.layers.0.self_attn.q_proj.escha_code".to_string()), "{main:?}");
    assert!(main.iter().all(|n| !n.starts_with("mtp.")), "the head left in the main file: {main:?}");
    for (n, _, _, b) in &head {
        assert_eq!(&bytes(&out.join("mtp/model.safetensors"), n), b, "{n}: copied byte for byte into mtp/");
    }
    assert_eq!(names(&out.join("mtp/model.safetensors")).len(), 3);
    let mcfg: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("mtp/config.json")).unwrap()).unwrap();
    assert_eq!(mcfg["mtp_num_hidden_layers"], 1);

    // Coded when a pattern names the head (and only what it names).
    let coded = d.0.join("coded");
    let o = run(&[&input, &coded], &["--k2", "*layers.*_proj.weight", "--k2", "mtp.*_proj.weight"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mtp = names(&coded.join("mtp/model.safetensors"));
    assert!(mtp.contains(&"mtp.layers.0.mlp.up_proj.escha_code".to_string()) && mtp.contains(&"mtp.fc.weight".to_string()), "{mtp:?}");
    assert!(names(&coded.join("model.safetensors")).contains(&"model.layers.0.self_attn.q_proj.escha_code".to_string()));

    // escha decode: the head back in the main file, decoded where coded.
    let plain = d.0.join("plain");
    let o = escha(&["decode", coded.to_str().unwrap(), plain.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let main = names(&plain.join("model.safetensors"));
    for n in ["mtp.fc.weight", "mtp.layers.0.mlp.up_proj.weight", "mtp.norm.weight", "model.layers.0.self_attn.q_proj.weight"] {
        assert!(main.contains(&n.to_string()), "{n} not in the decoded main file: {main:?}");
    }
    assert!(!plain.join("mtp").exists());

    // The export's layout as input: its mtp/ folder and config are kept.
    let export = d.0.join("export");
    std::fs::create_dir_all(export.join("mtp")).unwrap();
    write_safetensors(&export.join("model.safetensors"), &[trunk.clone()]);
    write_safetensors(&export.join("mtp/model.safetensors"), &head);
    std::fs::write(export.join("config.json"), cfg).unwrap();
    std::fs::write(export.join("mtp/config.json"), "{\"mtp_num_hidden_layers\": 1, \"tag\": 7}").unwrap();
    let out2 = d.0.join("out2");
    let o = run(&[&export, &out2], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(std::fs::read(out2.join("mtp/config.json")).unwrap(), std::fs::read(export.join("mtp/config.json")).unwrap());
    assert_eq!(names(&out2.join("mtp/model.safetensors")).len(), 3);

    // Bad input: a trunk tensor in the MTP folder, a tensor in both places.
    write_safetensors(&export.join("mtp/model.safetensors"), &[head.clone(), vec![("model.layers.1.x.weight", "F16", vec![128], h(&[0.5; 128]))]].concat());
    let o = run(&[&export, &d.0.join("out3")], &[]);
    assert!(o.code == 1 && o.stderr.contains("model.layers.1.x.weight") && o.stderr.contains("mtp/model.safetensors"), "{}", o.stderr);
    assert!(!d.0.join("out3").exists());
    write_safetensors(&export.join("mtp/model.safetensors"), &head);
    write_safetensors(&export.join("model.safetensors"), &[trunk.clone(), head[2].clone()]);
    let o = run(&[&export, &d.0.join("out4")], &[]);
    assert!(o.code == 1 && o.stderr.contains("mtp.norm.weight occurs twice"), "{}", o.stderr);
    assert!(!d.0.join("out4").exists());
}

/// A GGUF's nextn blocks (the MTP head) are copied by the default mix and
/// coded by a pattern that names them.
#[test]
fn quantize_copies_a_gguf_nextn_block() {
    let d = TempDir::new("quantnextn");
    let mut rng = Rng::new(29);
    let a = random(&mut rng, 128 * 128, 0.02);
    let b = random(&mut rng, 128 * 128, 0.02);
    let input = d.file("in.gguf");
    let keys = [("llama.block_count", 2), ("llama.nextn_predict_layers", 1)];
    write_gguf_with(&input, &keys, &[f16_tensor("blk.0.attn_q.weight", &[128, 128], &a), f16_tensor("blk.1.attn_q.weight", &[128, 128], &b)]);
    let out = d.file("out.gguf");
    let o = escha(&["quantize", &input, &out, "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let f = GgufFile::open(&out).unwrap();
    assert!(f.tensor("blk.0.attn_q.escha_code").is_some());
    assert!(f.tensor("blk.1.attn_q.weight").is_some() && f.tensor("blk.1.attn_q.escha_code").is_none(), "the nextn block must stay uncoded");
    let out = d.file("coded.gguf");
    let o = escha(&["quantize", &input, &out, "--k2", "blk.*.attn_q.weight", "--k2", "blk.1.*", "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let f = GgufFile::open(&out).unwrap();
    assert!(f.tensor("blk.0.attn_q.escha_code").is_some() && f.tensor("blk.1.attn_q.escha_code").is_some());
    // A count beyond the blocks is bad input.
    write_gguf_with(&input, &[("llama.block_count", 1), ("llama.nextn_predict_layers", 2)], &[f16_tensor("blk.0.attn_q.weight", &[128, 128], &a)]);
    let o = escha(&["quantize", &input, &d.file("bad.gguf"), "--no-progress"]);
    assert!(o.code == 1 && o.stderr.contains("nextn_predict_layers = 2 exceeds llama.block_count = 1"), "{}", o.stderr);
}

#[test]
fn quantize_writes_an_escha_hf_checkpoint() {
    use escha_ggml::safetensors::read_header;
    use escha_ggml::validate::validate_leaves;
    use std::collections::BTreeMap;
    let d = TempDir::new("quanthf");
    let mut rng = Rng::new(17);
    let (input, output) = (d.0.join("in"), d.0.join("out"));
    std::fs::create_dir_all(&input).unwrap();
    let q = random(&mut rng, 256 * 128, 0.02); // [OC 256, IC 128]
    let down = random(&mut rng, 128 * 256, 0.02); // [OC 128, IC 256]
    let experts = random(&mut rng, 2 * 256 * 128, 0.02); // [E 2, OC 256, IC 128]
    let bf = |v: &[f32]| v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect::<Vec<u8>>();
    let h = |v: &[f32]| v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect::<Vec<u8>>();
    let f = |v: &[f32]| v.iter().flat_map(|&x| x.to_le_bytes()).collect::<Vec<u8>>();
    let norm = random(&mut rng, 128, 1.0);
    let a_proj = random(&mut rng, 48 * 128, 0.02);
    let router = random(&mut rng, 2 * 128, 0.02);
    // An int8 projection as the MoE exports store them: rows and one f16 scale per row.
    let o_int8: Vec<u8> = (0..128 * 128).map(|i| ((i * 37 % 255) - 127) as i8 as u8).collect();
    let o_scale: Vec<f32> = (0..128).map(|r| 0.001 * (1 + r % 7) as f32).collect();
    let src = vec![
        ("model.embed_tokens.weight", "F16", vec![64, 128], h(&random(&mut rng, 64 * 128, 1.0))),
        ("model.layers.0.self_attn.o_proj.weight_int8", "I8", vec![128, 128], o_int8.clone()),
        ("model.layers.0.self_attn.o_proj.weight_scale", "F16", vec![128], h(&o_scale)),
        ("model.layers.0.input_layernorm.weight", "F32", vec![128], f(&norm)),
        ("model.layers.0.linear_attn.in_proj_a.weight", "F16", vec![48, 128], h(&a_proj)),
        ("model.layers.0.mlp.down_proj.weight", "BF16", vec![128, 256], bf(&down)),
        ("model.layers.0.mlp.experts.gate_up_proj", "F32", vec![2, 256, 128], f(&experts)),
        ("model.layers.0.mlp.gate.weight", "F16", vec![2, 128], h(&router)),
        ("model.layers.0.self_attn.q_proj.weight", "F16", vec![256, 128], h(&q)),
    ];
    write_safetensors(&input.join("model.safetensors"), &src);
    std::fs::write(input.join("config.json"), r#"{"model_type": "qwen3_5_moe", "hidden_size": 128}"#).unwrap();
    std::fs::write(input.join("tokenizer.json"), "{\"tok\": 1}").unwrap();
    let o = escha(&["quantize", input.to_str().unwrap(), output.to_str().unwrap(), "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    eprintln!("{}", o.stdout);

    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(output.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "qwen3_5_moe");
    assert_eq!(cfg["quantization_config"]["quant_method"], "eschamoe");
    assert_eq!(cfg["quantization_config"]["format_version"], "2.0");
    assert_eq!(cfg["quantization_config"]["ignore"], serde_json::json!(["model.layers.0.linear_attn.in_proj_a"]));
    assert_eq!(std::fs::read(output.join("tokenizer.json")).unwrap(), b"{\"tok\": 1}");
    assert!(o.stdout.contains("skipped") && o.stdout.contains("in_proj_a"), "{}", o.stdout);

    let tensors = read_header(&output.join("model.safetensors")).unwrap();
    let get = |n: &str| tensors.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n} missing"));
    for (name, _, _, bytes) in &src {
        if !name.contains("down_proj") && !name.contains("gate_up_proj") && !name.contains("q_proj") {
            assert_eq!(&get(name).read().unwrap(), bytes, "{name} copied");
        }
    }
    let mut decoded = Vec::new(); // (prefix, expert, shape, code, rin, rout) for the decode check below
    // Each coded prefix passes the crate's own leaf validation and decodes
    // back to its source weight.
    for (prefix, k, ic, oc, e, want) in [
        ("model.layers.0.self_attn.q_proj", 2usize, 128usize, 256usize, 1usize, via_f16(&q)),
        ("model.layers.0.mlp.down_proj", 3, 256, 128, 1, down.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()),
        ("model.layers.0.mlp.experts.gate_up_proj", 2, 128, 256, 2, experts.clone()),
    ] {
        assert!(tensors.iter().all(|t| t.name != format!("{prefix}.weight") && t.name != prefix), "{prefix}: source leaf must be gone");
        let mut leaves = BTreeMap::new();
        for leaf in ["escha_code", "escha_rin", "escha_rout", "escha_config"] {
            leaves.insert(leaf.to_string(), get(&format!("{prefix}.{leaf}")).leaf().unwrap());
        }
        let v = validate_leaves(prefix, &leaves).unwrap_or_else(|err| panic!("{prefix}: {err}"));
        assert_eq!((v.shape.k, v.shape.ic, v.shape.oc, v.experts.unwrap_or(1)), (k, ic, oc, e), "{prefix}");
        let code: Vec<i16> = get(&format!("{prefix}.escha_code")).read().unwrap().chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
        let rin = f16s(&get(&format!("{prefix}.escha_rin")).read().unwrap());
        let rout = f16s(&get(&format!("{prefix}.escha_rout")).read().unwrap());
        let shape = LinearShape::new(prefix, k, ic, oc).unwrap();
        for x in 0..e {
            let n = ic * oc;
            let got = f32s_of(&weff_spec(&code[x * shape.code_len()..(x + 1) * shape.code_len()], shape, &rin[x * ic..(x + 1) * ic], &rout[x * oc..(x + 1) * oc]).0);
            let err = rel_err(&got, &want[x * n..(x + 1) * n]);
            eprintln!("{prefix} expert {x}: K={k} rel err {err:.4}");
            assert!(err < if k == 2 { 0.30 } else { 0.16 }, "{prefix} expert {x}: {err}");
            let (c, ri, ro) = (&code[x * shape.code_len()..(x + 1) * shape.code_len()], &rin[x * ic..(x + 1) * ic], &rout[x * oc..(x + 1) * oc]);
            decoded.push((prefix, x, shape, c.to_vec(), ri.to_vec(), ro.to_vec()));
        }
    }
    // Per-channel scales on every coded linear (escha quantize writes none),
    // away from 1 and with IC != OC, so a fold on the wrong side, of the
    // wrong expert or not at all is a wrong weight.
    let mut scales: BTreeMap<String, (Vec<f32>, Vec<f32>)> = BTreeMap::new();
    {
        let mut all: Vec<(String, String, Vec<usize>, Vec<u8>)> =
            tensors.iter().map(|t| (t.name.clone(), t.dtype.clone(), t.shape.clone(), t.read().unwrap())).collect();
        let mut srng = Rng::new(23);
        for (prefix, _, shape, _, _, _) in &decoded {
            if scales.contains_key(*prefix) {
                continue;
            }
            let e = decoded.iter().filter(|d| d.0 == *prefix).count();
            let lead = if e > 1 { vec![e] } else { vec![] };
            let si: Vec<f32> = (0..e * shape.ic).map(|_| 0.5 + srng.uniform() * 1.5).collect();
            let so: Vec<f32> = (0..e * shape.oc).map(|_| 0.5 + srng.uniform() * 1.5).collect();
            all.push((format!("{prefix}.escha_s_in"), "F32".into(), [lead.clone(), vec![shape.ic]].concat(), f(&si)));
            all.push((format!("{prefix}.escha_s_out"), "F32".into(), [lead, vec![shape.oc]].concat(), f(&so)));
            scales.insert(prefix.to_string(), (si, so));
        }
        let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = all.iter().map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.clone(), b.clone())).collect();
        write_safetensors(&output.join("model.safetensors"), &refs);
    }
    // `escha decode` of the checkpoint: a plain checkpoint that any converter
    // reads, coded linears as their effective weights, int8 rows times scale.
    let plain = d.0.join("plain");
    let o = escha(&["decode", output.to_str().unwrap(), plain.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(plain.join("config.json")).unwrap()).unwrap();
    assert!(cfg.get("quantization_config").is_none() && cfg["model_type"] == "qwen3_5_moe", "{cfg}");
    let plain_t = read_header(&plain.join("model.safetensors")).unwrap();
    let pget = |n: &str| plain_t.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("decoded: {n} missing"));
    assert!(plain_t.iter().all(|t| !t.name.contains("escha_") && !t.name.contains("weight_int8") && !t.name.contains("weight_scale")));
    // Each decoded weight, [OC, IC] as in the checkpoint, must be the
    // effective weight of FORMAT.md §1 entry by entry (within the f32
    // rounding bound of weff_spec), and compute what the C reference's
    // forward computes from the coded leaves (to the f16 rounding of xh
    // and y) on random inputs. Neither expectation goes through the Rust
    // codec or the effective_weight function that decode calls.
    for (prefix, x, shape, code, rin, rout) in &decoded {
        let t = pget(&format!("{prefix}.weight"));
        let e = if t.shape.len() == 3 { t.shape[0] } else { 1 };
        assert_eq!(t.dtype, "F32", "{prefix}");
        let (ic, oc, m) = (shape.ic, shape.oc, 3);
        assert_eq!(t.shape, if e > 1 { vec![e, oc, ic] } else { vec![oc, ic] }, "{prefix}: [E?, OC, IC]");
        let v = t.read_f32().unwrap();
        let n = v.len() / e;
        let w = &v[x * n..(x + 1) * n];
        let (si_all, so_all) = &scales[*prefix];
        let (s_in, s_out) = (&si_all[x * ic..(x + 1) * ic], &so_all[x * oc..(x + 1) * oc]);
        let (spec, bound) = weff_spec_scaled(code, *shape, rin, rout, Some(s_in), Some(s_out));
        let mut worst = 0f64;
        for (j, ((&g, &s), &b)) in w.iter().zip(&spec).zip(&bound).enumerate() {
            let d = (g as f64 - s).abs();
            assert!(d <= b, "{prefix} expert {x}: decoded [{}, {}] = {g:e}, FORMAT.md's effective weight {s:e} (|diff| {d:e} > {b:e})", j / ic, j % ic);
            worst = worst.max(d / b);
        }
        // The bound above holds for any f32 evaluation order; in the mean an
        // f32 evaluation is far closer (relative RMS about 1e-7), while one
        // f16 rounding anywhere on the way gives about 1.4e-4.
        let rms = rel_err(w, &f32s_of(&spec));
        eprintln!("{prefix} expert {x}: decoded weight against the f64 effective weight: worst |diff|/bound {worst:.3}, relative RMS {rms:.2e}");
        assert!(rms < 1e-5, "{prefix} expert {x}: decoded weight {rms:e} (relative RMS) away from FORMAT.md's effective weight");
        let xin = Rng::new(77).f32s(m * ic, 0.0, 1.0);
        let l = Linear { name: prefix, shape: *shape, code, rin, rout, s_in: Some(s_in), s_out: Some(s_out), bias: None };
        let want = cref::linear(&l, &xin, m).unwrap();
        let (mut num, mut den) = (0f64, 0f64);
        for r in 0..m {
            for c in 0..oc {
                let y: f64 = (0..ic).map(|i| w[c * ic + i] as f64 * xin[r * ic + i] as f64).sum();
                num += (y - want[r * oc + c].to_f64()).powi(2);
                den += y * y;
            }
        }
        let rel = (num / den).sqrt();
        assert!(rel < 2e-3, "{prefix} expert {x}: the decoded weight computes {rel:e} away from the contract's forward");
    }
    let o_dec = pget("model.layers.0.self_attn.o_proj.weight").read_f32().unwrap();
    for (i, (&q, &w)) in o_int8.iter().zip(&o_dec).enumerate() {
        assert_eq!(w, (q as i8) as f32 * f16::from_f32(o_scale[i / 128]).to_f32(), "o_proj int8 row {}", i / 128);
    }
    assert_eq!(pget("model.layers.0.mlp.gate.weight").read().unwrap(), h(&router), "copied tensors stay byte for byte");
    // An existing output directory is not overwritten; an escha checkpoint is refused.
    let o = escha(&["quantize", input.to_str().unwrap(), output.to_str().unwrap()]);
    assert!(o.code == 1 && o.stderr.contains("already exists"), "{}", o.stderr);
    let o = escha(&["quantize", output.to_str().unwrap(), d.file("again").as_str()]);
    assert!(o.code == 1 && o.stderr.contains("already quantized"), "{}", o.stderr);
    // A truncated safetensors file names the tensor.
    let bad = d.0.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(input.join("config.json"), bad.join("config.json")).unwrap();
    let full = std::fs::read(input.join("model.safetensors")).unwrap();
    std::fs::write(bad.join("model.safetensors"), &full[..full.len() - 100]).unwrap();
    let o = escha(&["quantize", bad.to_str().unwrap(), d.file("o").as_str()]);
    assert!(o.code == 1 && o.stderr.contains("q_proj") && o.stderr.contains("truncated"), "{}", o.stderr);
}

/// `--random-codes` writes the layout `escha quantize` writes for the same
/// input (every tensor's name, type and shape, metadata included) in
/// seconds: the coded projections get random code words, rin 1 and rout
/// 0.02; everything else is copied byte for byte.
#[test]
fn quantize_random_codes_twin_has_the_real_layout() {
    let d = TempDir::new("quantrand");
    let mut rng = Rng::new(17);
    let a = random(&mut rng, 128 * 128, 0.02);
    let b = random(&mut rng, 128 * 256, 0.02);
    let n = random(&mut rng, 128, 1.0);
    let input = d.file("in.gguf");
    write_gguf(&input, &[f16_tensor("blk.0.attn_q.weight", &[128, 128], &a), f16_tensor("blk.0.ffn_up.weight", &[128, 256], &b), f32_tensor("blk.0.attn_norm.weight", &[128], &n)]);
    let (real, twin) = (d.file("real.gguf"), d.file("twin.gguf"));
    let o = escha(&["quantize", &input, &real, "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = escha(&["quantize", &input, &twin, "--random-codes", "--no-progress"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("random codes (--random-codes)"), "{}", o.stdout);
    let (r, t) = (GgufFile::open(&real).unwrap(), GgufFile::open(&twin).unwrap());
    let layout = |f: &GgufFile| f.tensors().iter().map(|t| (t.name.clone(), t.type_name(), t.ne)).collect::<Vec<_>>();
    assert_eq!(layout(&r), layout(&t));
    assert_eq!(r.get_u32("escha.format_version").unwrap(), t.get_u32("escha.format_version").unwrap());
    for info in t.tensors() {
        let (tb, rb) = (t.read(info).unwrap(), r.read(r.tensor(&info.name).unwrap()).unwrap());
        if info.name.ends_with(".escha_rin") {
            assert!(f16s(&tb).iter().all(|v| *v == f16::ONE), "{}", info.name);
        } else if info.name.ends_with(".escha_rout") {
            assert!(f16s(&tb).iter().all(|v| *v == f16::from_f32(0.02)), "{}", info.name);
        } else if info.name.ends_with(".escha_code") {
            assert_ne!(tb, rb, "{}: the twin's codes are the encoder's", info.name);
            let words: std::collections::HashSet<&[u8]> = tb.chunks(2).collect();
            assert!(words.len() > tb.len() / 4, "{}: {} distinct words in {} bytes: not random", info.name, words.len(), tb.len());
        } else {
            assert_eq!(tb, rb, "{}: not copied", info.name);
        }
    }
}
