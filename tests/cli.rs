//! The `escha` binary end to end: files in, files out, exit statuses and
//! error messages, checked against the library it wraps.

mod common;

use common::cli::{escha, Out, TempDir};
use common::Problem;
use escha_ggml::codec::reconstruct;
use escha_ggml::rawio;
use escha_ggml::reference::{self, Linear};
use escha_ggml::testutil::Rng;
use escha_ggml::LinearShape;
use half::f16;

fn read_f16(p: &str) -> Vec<f16> {
    rawio::read_f16(p.as_ref()).unwrap()
}

fn bits(v: &[f16]) -> Vec<u16> {
    v.iter().map(|h| h.to_bits()).collect()
}

fn widen(v: &[f16]) -> Vec<f32> {
    v.iter().map(|h| h.to_f32()).collect()
}

#[test]
fn reconstruct_matches_codec_and_compares() {
    for (seed, k, ic, oc) in [(1u64, 2usize, 256usize, 384usize), (2, 3, 384, 256)] {
        let d = TempDir::new("rec");
        let shape = LinearShape::new("t", k, ic, oc).unwrap();
        let code = Rng::new(seed).code(shape.code_len());
        let want = reconstruct(&code, shape);
        let (c, w, gold, bad) = (d.file("code.i16"), d.file("w.f16"), d.file("gold.f16"), d.file("bad.f16"));
        rawio::write_i16(c.as_ref(), &code).unwrap();
        rawio::write_f16(gold.as_ref(), &want).unwrap();

        let (ics, ocs) = (ic.to_string(), oc.to_string());
        let r = escha(&["reconstruct", &c, "--ic", &ics, "--oc", &ocs, "-o", &w]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let line = format!("K={k}, IC={ic}, OC={oc} (tiles {}x{}), {k}.00 bits/weight", ic / 16, oc / 16);
        assert!(r.stdout.contains(&line), "summary line: {}", r.stdout);
        assert_eq!(bits(&read_f16(&w)), bits(&want), "K={k}: W_bare differs from codec::reconstruct");

        // Shape from the lengths of rin / rout, with the comparison.
        let (rin, rout) = (d.file("rin.f16"), d.file("rout.f16"));
        rawio::write_f16(rin.as_ref(), &vec![f16::ONE; ic]).unwrap();
        rawio::write_f16(rout.as_ref(), &vec![f16::ONE; oc]).unwrap();
        let r = escha(&["reconstruct", &c, "--rin", &rin, "--rout", &rout, "-o", &w, "--compare", &gold]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains(&format!("identical ({} values)", ic * oc)), "{}", r.stdout);

        // One value off by one ulp: reported, exit 1.
        let mut flipped = want.clone();
        flipped[ic * oc / 2] = f16::from_bits(flipped[ic * oc / 2].to_bits() ^ 1);
        rawio::write_f16(bad.as_ref(), &flipped).unwrap();
        let r = escha(&["reconstruct", &c, "--ic", &ics, "--oc", &ocs, "-o", &w, "--compare", &bad]);
        assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains(&format!("1 of {} values differ", ic * oc)), "{}", r.stdout);
        assert!(r.stdout.contains("max 1 f16 ulp"), "{}", r.stdout);
    }
}

/// Files of a random problem with scales and an f16 bias; `x` as f32.
struct LinearFiles {
    dir: TempDir,
    p: Problem,
    x: Vec<f32>,
    m: usize,
}

impl LinearFiles {
    fn new(tag: &str, seed: u64, k: usize, ic: usize, oc: usize, m: usize) -> Self {
        let dir = TempDir::new(tag);
        let p = Problem::new(seed, k, ic, oc, true, true);
        let x = p.input(seed + 100, m);
        rawio::write_i16(dir.file("code.i16").as_ref(), &p.code).unwrap();
        rawio::write_f16(dir.file("rin.f16").as_ref(), &p.rin).unwrap();
        rawio::write_f16(dir.file("rout.f16").as_ref(), &p.rout).unwrap();
        rawio::write_f32(dir.file("s_in.f32").as_ref(), p.s_in.as_ref().unwrap()).unwrap();
        rawio::write_f32(dir.file("s_out.f32").as_ref(), p.s_out.as_ref().unwrap()).unwrap();
        // The bias values are f16 values, so the .f16 file is exact.
        let bias: Vec<f16> = p.bias.as_ref().unwrap().iter().map(|&b| f16::from_f32(b)).collect();
        rawio::write_f16(dir.file("bias.f16").as_ref(), &bias).unwrap();
        rawio::write_f32(dir.file("x.f32").as_ref(), &x).unwrap();
        LinearFiles { dir, p, x, m }
    }

    /// The full argument list of `escha linear` on these files plus `extra`.
    fn args(&self, out: &str, extra: &[&str]) -> Vec<String> {
        let f = |n: &str| self.dir.file(n);
        let mut a: Vec<String> = ["linear", "--code", &f("code.i16"), "--rin", &f("rin.f16"), "--rout", &f("rout.f16")]
            .into_iter()
            .map(String::from)
            .collect();
        for (flag, name) in [("--s-in", "s_in.f32"), ("--s-out", "s_out.f32"), ("--bias", "bias.f16"), ("--x", "x.f32")] {
            a.extend([flag.to_string(), f(name)]);
        }
        a.extend(["-o".to_string(), f(out)]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn run(&self, out: &str, extra: &[&str]) -> Out {
        let a = self.args(out, extra);
        escha(&a.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn reference(&self, l: &Linear) -> Vec<f16> {
        reference::linear(l, &self.x, self.m).unwrap()
    }
}

#[test]
fn linear_all_impls() {
    let t = LinearFiles::new("lin", 7, 2, 256, 384, 3);
    let want = t.reference(&t.p.linear());
    let gold = t.dir.file("gold.f16");
    rawio::write_f16(gold.as_ref(), &want).unwrap();

    for imp in ["reference", "c"] {
        let out = format!("y_{imp}.f16");
        let r = t.run(&out, &["--impl", imp, "--compare", &gold]);
        assert_eq!(r.code, 0, "{imp}: {}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains("K=2, IC=256, OC=384, M=3,"), "{}", r.stdout);
        assert!(r.stdout.contains("s_in=yes, s_out=yes, bias=applied"), "{}", r.stdout);
        assert!(r.stdout.contains(&format!("impl={imp}")), "{}", r.stdout);
        assert!(r.stdout.contains("identical (1152 values)"), "{}", r.stdout);
        assert_eq!(bits(&read_f16(&t.dir.file(&out))), bits(&want), "{imp}");
    }

    // The SIMD paths may sum in another order: every output within the
    // summation-order bound of the reference (tests/common/mod.rs) ...
    let r = t.run("y_cpu.f16", &["--impl", "cpu"]);
    assert_eq!(r.code, 0, "cpu: {}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("K=2, IC=256, OC=384, M=3,"), "{}", r.stdout);
    assert!(r.stdout.contains("impl=cpu/"), "{}", r.stdout);
    let got: Vec<f32> = read_f16(&t.dir.file("y_cpu.f16")).iter().map(|v| v.to_f32()).collect();
    let bound = common::order_bound(&t.p.linear(), &t.x, t.m);
    common::assert_within("escha linear --impl cpu", &got, &want, &bound);
    // and nearly all of them within 1 ulp (reordering rarely moves more).
    let close = got.iter().zip(&want).filter(|(g, w)| (**g as f64 - w.to_f64()).abs() <= common::ulp16(w.to_f64())).count();
    assert!(close * 100 >= got.len() * 99, "cpu: only {close} of {} values within 1 ulp", got.len());

    // The scalar path is the reference's twin: bit-exact.
    let r = t.run("y_scalar.f16", &["--impl", "cpu", "--isa", "scalar", "--compare", &gold]);
    assert_eq!(r.code, 0, "scalar: {}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("impl=cpu/scalar"), "{}", r.stdout);
}

#[test]
fn linear_no_bias_and_k3() {
    let t = LinearFiles::new("nobias", 11, 3, 384, 256, 2);
    let want = t.reference(&Linear { bias: None, ..t.p.linear() });
    let r = t.run("y.f16", &["--no-bias"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("K=3, IC=384, OC=256, M=2,"), "{}", r.stdout);
    assert!(r.stdout.contains("bias=ignored (--no-bias)"), "{}", r.stdout);
    assert_eq!(bits(&read_f16(&t.dir.file("y.f16"))), bits(&want));

    // x as f16 holding the same values.
    let x16: Vec<f16> = t.x.iter().map(|&v| f16::from_f32(v)).collect();
    rawio::write_f16(t.dir.file("x.f16").as_ref(), &x16).unwrap();
    let mut a = t.args("y16.f16", &[]);
    let xi = a.iter().position(|s| s == "--x").unwrap() + 1;
    a[xi] = t.dir.file("x.f16");
    let r = escha(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let want16 = reference::linear(&t.p.linear(), &widen(&x16), t.m).unwrap();
    assert_eq!(bits(&read_f16(&t.dir.file("y16.f16"))), bits(&want16));
}

#[test]
fn info_prints_first_tile() {
    let d = TempDir::new("info");
    let shape = LinearShape::new("t", 2, 128, 256).unwrap();
    let code = Rng::new(3).code(shape.code_len());
    let c = d.file("code.i16");
    rawio::write_i16(c.as_ref(), &code).unwrap();
    let r = escha(&["info", &c, "--ic", "128", "--oc", "256"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("K=2, IC=128, OC=256 (tiles 8x16)"), "{}", r.stdout);
    let w = reconstruct(&code, shape);
    let first_row: Vec<String> = w[..16].iter().map(|v| format!("{:.4}", v.to_f32())).collect();
    let grid: Vec<&str> = r.stdout.lines().rev().take(16).collect();
    assert_eq!(grid.len(), 16);
    assert_eq!(grid[15].split_whitespace().collect::<Vec<_>>(), first_row, "{}", r.stdout);
}

#[test]
fn errors() {
    let t = LinearFiles::new("err", 5, 2, 256, 128, 2);
    let d = &t.dir;
    let c = d.file("code.i16");

    // Missing file: named, exit 1.
    let missing = d.file("does_not_exist.i16");
    let r = escha(&["reconstruct", &missing, "--ic", "256", "--oc", "128", "-o", &d.file("w.f16")]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.starts_with("error: ") && r.stderr.contains(&missing), "{}", r.stderr);

    // A code length implying K=4.
    let k4 = d.file("k4.i16");
    rawio::write_i16(k4.as_ref(), &vec![0i16; 16 * 8 * 16 * 4]).unwrap();
    let r = escha(&["reconstruct", &k4, "--ic", "256", "--oc", "128", "-o", &d.file("w.f16")]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("K=4") && r.stderr.contains(&k4) && r.stderr.contains("8192"), "{}", r.stderr);

    // IC not a multiple of 128 (from a rin of 200 values).
    let rin200 = d.file("rin200.f16");
    rawio::write_f16(rin200.as_ref(), &vec![f16::ONE; 200]).unwrap();
    let mut a = t.args("y.f16", &[]);
    let ri = a.iter().position(|s| s == "--rin").unwrap() + 1;
    a[ri] = rin200.clone();
    let r = escha(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("multiples of 128"), "{}", r.stderr);

    // x with a partial row.
    let xbad = d.file("xbad.f16");
    rawio::write_f16(xbad.as_ref(), &vec![f16::ONE; 2 * 256 + 5]).unwrap();
    let mut a = t.args("y.f16", &[]);
    let xi = a.iter().position(|s| s == "--x").unwrap() + 1;
    a[xi] = xbad.clone();
    let r = escha(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains(&xbad) && r.stderr.contains("whole number of rows"), "{}", r.stderr);

    // Truncated .f16 (odd byte count).
    let odd = d.file("odd.f16");
    std::fs::write(&odd, vec![0u8; 2 * 128 + 1]).unwrap();
    let mut a = t.args("y.f16", &[]);
    let ro = a.iter().position(|s| s == "--rout").unwrap() + 1;
    a[ro] = odd.clone();
    let r = escha(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("truncated") || r.stderr.contains("whole number"), "{}", r.stderr);

    // s_in of the wrong length: the library's validation reports it.
    let s_short = d.file("s_short.f32");
    rawio::write_f32(s_short.as_ref(), &[1.0; 100]).unwrap();
    let mut a = t.args("y.f16", &[]);
    let si = a.iter().position(|s| s == "--s-in").unwrap() + 1;
    a[si] = s_short;
    let r = escha(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("s_in has 100 elements, expected 256"), "{}", r.stderr);

    // Command-line mistakes: exit 2 with a pointer to --help.
    for args in [
        vec!["reconstruct", &c, "--ic", "256", "--oc", "128", "-o", "w.f16", "--bogus"],
        vec!["frobnicate"],
        vec!["reconstruct", &c, "--ic", "256", "--oc"],
        vec!["reconstruct", &c, "--ic", "256", "-o", "w.f16"],
        vec!["reconstruct", &c, "--ic", "many", "--oc", "128", "-o", "w.f16"],
        vec!["linear", "--code", &c],
    ] {
        let r = escha(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("escha --help"), "{args:?}: {}", r.stderr);
    }
    let r = t.run("y.f16", &["--impl", "gpu"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = t.run("y.f16", &["--isa", "avx2"]);
    assert_eq!(r.code, 2, "--isa without --impl cpu: {}", r.stderr);

    // Help.
    for args in [vec![], vec!["--help"], vec!["help"], vec!["linear", "--help"]] {
        let r = escha(&args);
        assert_eq!(r.code, 0);
        assert!(r.stdout.contains("escha reconstruct") && r.stdout.contains("escha linear"), "{}", r.stdout);
    }
}
